-- Issue 25, seventh round: what never changes after a run is written is
-- checked when it is written, not again at every change of its state; and
-- a claim's attempts are checked against their runs in one query, not one
-- query each. On one stream of claims and finishes, the constraints took
-- a fifth of the server's time, and the triggers that replace them take a
-- twelfth (BENCHMARKS.md, "Drain, seventh round").
--
-- Expand only: no statement of either release changes, the rules and the
-- errors (SQLSTATE and constraint name) are the same, and every existing row
-- was validated under them; the previous release's workers run unchanged on
-- the migrated schema (workers/tests/upgrade.rs runs them).

-- 1. PostgreSQL evaluates every CHECK constraint of a table on every
-- UPDATE, whichever columns the UPDATE sets. So the claim and the finish,
-- which set only the state, the lease and the counters, re-checked the
-- key's and the name's regular expressions, the scope's, the payload's size
-- (casting the whole payload to text) and the context's twenty conditions,
-- twice a run: 12 % of the server's time. The same six rules now live in
-- one trigger that fires on INSERT and on an UPDATE that sets any column
-- they read (`UPDATE OF`: PostgreSQL decides from the statement's SET list,
-- so a claim or a finish never calls it). It raises what the constraint
-- raised: SQLSTATE 23514 with the constraint's name. The rules that read
-- the state, the lease and the counters stay CHECK constraints.

CREATE FUNCTION batch_job_run_validate() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    broken text;
BEGIN
    -- Each test is the constraint's own expression; like a CHECK, a rule
    -- whose expression is NULL passes (IF treats NULL as false).
    IF NOT (NEW.job_name ~ '^[a-z0-9]+(-[a-z0-9]+)*$') THEN
        broken := 'batch_job_run_job_name_check';
    ELSIF NOT (NEW.job_key ~ '^[a-z0-9-]+:[0-9T:-]+(@[a-z0-9]+(-[a-z0-9]+)*)?(\.p[1-9][0-9]{0,2})?$'
               AND starts_with(NEW.job_key, NEW.job_name || ':')) THEN
        broken := 'batch_job_run_job_key_check';
    ELSIF NOT (NEW.scope IS NOT DISTINCT FROM substring(NEW.job_key FROM '@([a-z0-9-]+)')) THEN
        broken := 'batch_job_run_scope_check';
    ELSIF NOT (octet_length(NEW.payload::text) <= 65536) THEN
        broken := 'batch_job_run_payload_check';
    ELSIF NOT (
        (NEW.partition_count IS NULL AND NEW.partition_no IS NULL AND NEW.partition_of IS NULL)
        OR (NEW.partition_count BETWEEN 2 AND 256 AND NEW.partition_no IS NULL
            AND NEW.partition_of IS NULL)
        OR (NEW.partition_count BETWEEN 2 AND 256
            AND NEW.partition_no BETWEEN 1 AND NEW.partition_count
            AND NEW.partition_of IS NOT NULL
            AND NEW.job_key = NEW.partition_of || '.p' || NEW.partition_no)) THEN
        broken := 'batch_job_run_partition_check';
    ELSIF NOT (
        (NEW.timezone IS NULL AND NEW.period_start IS NULL AND NEW.period_end IS NULL
         AND NEW.covers IS NULL AND NEW.lease_ttl IS NULL AND NEW.stale_after IS NULL
         AND NEW.on_lease_expiry IS NULL AND NEW.chunk_size IS NULL AND NEW.backoff IS NULL
         AND NEW.backoff_max IS NULL AND NEW.attempt_budget IS NULL
         AND NEW.max_item_failures IS NULL)
        OR
        (NEW.timezone IS NOT NULL AND char_length(NEW.timezone) BETWEEN 1 AND 64
         AND NEW.period_start IS NOT NULL AND NEW.period_end IS NOT NULL
         AND NEW.period_start < NEW.period_end
         AND NEW.covers IN ('same-day', 'previous-day', 'firing')
         AND NEW.lease_ttl > interval '0' AND NEW.stale_after > interval '0'
         AND NEW.on_lease_expiry IN ('retry', 'hold')
         AND NEW.chunk_size BETWEEN 1 AND 100000
         AND NEW.backoff > interval '0' AND NEW.backoff_max >= NEW.backoff
         AND NEW.attempt_budget BETWEEN 1 AND 1000
         AND (NEW.max_item_failures IS NULL OR NEW.max_item_failures >= 0))) THEN
        broken := 'batch_job_run_context_check';
    END IF;
    IF broken IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "batch_job_run" violates check constraint "%"', broken
            USING ERRCODE = 'check_violation', CONSTRAINT = broken,
                  TABLE = 'batch_job_run', SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    RETURN NEW;
END;
$$;

COMMENT ON FUNCTION batch_job_run_validate() IS
    'The rules on what a run is (key, name, scope, payload, partitions, context), checked on insert and on an update that sets a column they read.';

-- BEFORE triggers fire in name order, and this one must see the row as the
-- others leave it (batch_job_run_scope sets the scope, and
-- batch_job_run_partition_parent the due time): "validate" sorts after
-- both, as a CHECK is evaluated after every BEFORE trigger.
CREATE TRIGGER batch_job_run_validate
    BEFORE INSERT OR UPDATE OF job_key, job_name, scope, payload,
        partition_count, partition_no, partition_of,
        timezone, period_start, period_end, covers, lease_ttl, stale_after, on_lease_expiry,
        chunk_size, backoff, backoff_max, attempt_budget, max_item_failures
    ON batch_job_run
    FOR EACH ROW EXECUTE FUNCTION batch_job_run_validate();

ALTER TABLE batch_job_run
    DROP CONSTRAINT batch_job_run_job_name_check,
    DROP CONSTRAINT batch_job_run_job_key_check,
    DROP CONSTRAINT batch_job_run_scope_check,
    DROP CONSTRAINT batch_job_run_payload_check,
    DROP CONSTRAINT batch_job_run_partition_check,
    DROP CONSTRAINT batch_job_run_context_check;

-- 2. An attempt names a run that exists, checked once per statement.
-- The foreign key checked each inserted attempt row with a query of its own
-- (a lookup and a lock of the run, through SPI): 9 % of a drain's server
-- time on one stream. The statement trigger below does the same for all of
-- a claim's attempts in one query: it takes the same FOR KEY SHARE lock on
-- each run (a no-op for the runs the claim itself just updated), so a
-- concurrent delete of the run waits for the inserting transaction and then
-- finds the attempt, as it did behind the foreign key. The other direction
-- (a run that has attempts is never deleted nor re-keyed) is a row trigger
-- on the run's DELETE and key change, which no engine statement performs
-- (only `preflight` deletes its scratch runs, their attempts first). Like
-- a foreign key's checks, these run as the tables' owner (SECURITY
-- DEFINER), so a role that may insert an attempt (the previous release's
-- worker under `roles --keep-direct-writes`) needs no right to lock runs.
CREATE FUNCTION batch_job_attempt_run_exists() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    inserted bigint;
    found bigint;
    missing text;
BEGIN
    -- One lookup and lock per attempt, by key: a locking subquery is never
    -- flattened, so the planner cannot turn this into a hash join over the
    -- whole run table (which it did as `job_key IN (…)`, knowing nothing of
    -- the transition table: 2 ms a claim of 250 at 60,000 runs).
    SELECT count(*) INTO inserted FROM batch_job_attempt_new;
    SELECT count(*) INTO found
    FROM batch_job_attempt_new a
    CROSS JOIN LATERAL (SELECT FROM batch_job_run r WHERE r.job_key = a.job_key
                        FOR KEY SHARE OF r) AS run;
    IF found = inserted THEN
        RETURN NULL;
    END IF;
    SELECT a.job_key INTO missing FROM batch_job_attempt_new a
    WHERE NOT EXISTS (SELECT FROM batch_job_run r WHERE r.job_key = a.job_key)
    LIMIT 1;
    RAISE EXCEPTION 'insert or update on table "batch_job_attempt" violates foreign key constraint "batch_job_attempt_run_fkey"'
        USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'batch_job_attempt_run_fkey',
              TABLE = 'batch_job_attempt', SCHEMA = TG_TABLE_SCHEMA,
              DETAIL = format('Key (job_key)=(%s) is not present in table "batch_job_run".', missing);
END;
$$;

CREATE TRIGGER batch_job_attempt_run_exists
    AFTER INSERT ON batch_job_attempt
    REFERENCING NEW TABLE AS batch_job_attempt_new
    FOR EACH STATEMENT EXECUTE FUNCTION batch_job_attempt_run_exists();

-- An attempt never moves to another run; if one did, the run it names must
-- exist, locked as above. (A transition table cannot go with a column list,
-- so this is a row trigger, and no engine statement sets the column.)
CREATE FUNCTION batch_job_attempt_rekeyed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM FROM batch_job_run r WHERE r.job_key = NEW.job_key FOR KEY SHARE OF r;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'insert or update on table "batch_job_attempt" violates foreign key constraint "batch_job_attempt_run_fkey"'
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'batch_job_attempt_run_fkey',
                  TABLE = 'batch_job_attempt', SCHEMA = TG_TABLE_SCHEMA,
                  DETAIL = format('Key (job_key)=(%s) is not present in table "batch_job_run".', NEW.job_key);
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER batch_job_attempt_rekeyed
    BEFORE UPDATE OF job_key ON batch_job_attempt
    FOR EACH ROW WHEN (NEW.job_key IS DISTINCT FROM OLD.job_key)
    EXECUTE FUNCTION batch_job_attempt_rekeyed();

-- A run with attempts keeps its key and is never deleted: the attempts
-- would name nothing. An update that sets the key to what it was changes
-- nothing and passes, as it did the foreign key.
CREATE FUNCTION batch_job_run_has_attempts() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.job_key IS NOT DISTINCT FROM OLD.job_key THEN
        RETURN NEW;
    END IF;
    IF EXISTS (SELECT FROM batch_job_attempt a WHERE a.job_key = OLD.job_key) THEN
        RAISE EXCEPTION 'update or delete on table "batch_job_run" violates foreign key constraint "batch_job_attempt_run_fkey" on table "batch_job_attempt"'
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'batch_job_attempt_run_fkey',
                  TABLE = 'batch_job_attempt', SCHEMA = TG_TABLE_SCHEMA,
                  DETAIL = format('Key (job_key)=(%s) is still referenced from table "batch_job_attempt".', OLD.job_key);
    END IF;
    RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
END;
$$;

CREATE TRIGGER batch_job_run_has_attempts
    BEFORE DELETE OR UPDATE OF job_key ON batch_job_run
    FOR EACH ROW EXECUTE FUNCTION batch_job_run_has_attempts();

ALTER TABLE batch_job_attempt DROP CONSTRAINT batch_job_attempt_run_fkey;

-- The three SECURITY DEFINER functions run as the owner, so their names
-- resolve in this schema only (pg_catalog is searched first), as for every
-- function of the schema. batch_job_run_validate runs as whoever writes the
-- row and reads no table, so a search_path could only ever mislead that
-- writer's own statement; pinning it would cost every insert a setting
-- saved and restored (3-4 µs, the sixth round measured), so it is not
-- pinned. PUBLIC may call none of them.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOREACH f IN ARRAY ARRAY['batch_job_attempt_run_exists()', 'batch_job_attempt_rekeyed()',
                             'batch_job_run_has_attempts()']::regprocedure[]
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
    REVOKE EXECUTE ON FUNCTION batch_job_run_validate(), batch_job_attempt_run_exists(),
        batch_job_attempt_rekeyed(), batch_job_run_has_attempts() FROM PUBLIC;
END
$$;
