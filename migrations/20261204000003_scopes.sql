-- Issue 24: scoped runs. A job may declare `scopes` (a fixed list, or a SQL
-- query returning scope ids); its run for a period is then one run per
-- scope, keyed `<job>:<period>@<scope>`, each leased, retried, failed, found
-- stale and re-run on its own. The key is still the run's whole identity:
-- the unique key makes a second enqueue of a scope's period a no-op, and a
-- partitioned scoped run's partitions are `<job>:<period>@<scope>.p<n>`.
--
-- Expand only. The previous releases' workers cannot parse a scoped key, so
-- the picks they call (batchonce_due_runs, and batchonce_due_runs2 through
-- batchonce_claim2) now leave scoped runs out; this release claims through
-- batchonce_claim3, which takes them. Runs enqueued before keep a NULL scope.

-- The scope a run's key names, kept in a column of its own so that views
-- group and filter by it with an index. A trigger derives it from the key on
-- insert (whoever inserts: an enqueue, the partition trigger, a previous
-- release's enqueue), and a CHECK keeps the two equal.
ALTER TABLE batch_job_run ADD COLUMN scope varchar(36);

-- The key rule gains the optional `@<scope>` before the partition suffix.
ALTER TABLE batch_job_run ADD CONSTRAINT batch_job_run_job_key_check2
    CHECK (job_key ~ '^[a-z0-9-]+:[0-9T:-]+(@[a-z0-9]+(-[a-z0-9]+)*)?(\.p[1-9][0-9]{0,2})?$'
           AND starts_with(job_key, job_name || ':')) NOT VALID;
ALTER TABLE batch_job_run VALIDATE CONSTRAINT batch_job_run_job_key_check2;
ALTER TABLE batch_job_run DROP CONSTRAINT batch_job_run_job_key_check;
ALTER TABLE batch_job_run RENAME CONSTRAINT batch_job_run_job_key_check2 TO batch_job_run_job_key_check;

ALTER TABLE batch_job_run ADD CONSTRAINT batch_job_run_scope_check
    CHECK (scope IS NOT DISTINCT FROM substring(job_key FROM '@([a-z0-9-]+)')) NOT VALID;
ALTER TABLE batch_job_run VALIDATE CONSTRAINT batch_job_run_scope_check;

CREATE FUNCTION batch_job_run_scope() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.scope := substring(NEW.job_key FROM '@([a-z0-9-]+)');
    RETURN NEW;
END;
$$;

CREATE TRIGGER batch_job_run_scope
    BEFORE INSERT ON batch_job_run
    FOR EACH ROW WHEN (strpos(NEW.job_key, '@') > 0)
    EXECUTE FUNCTION batch_job_run_scope();

-- `runs list --scope`, the status and console views of a period's scopes.
CREATE INDEX batch_job_run_scope_idx ON batch_job_run (job_name, scope, business_date)
    WHERE scope IS NOT NULL;

-- This release's pick: batchonce_due_runs2 with scoped runs when p_scoped.
CREATE FUNCTION batchonce_due_runs3(p_jobs text[], p_limit bigint, p_now timestamptz,
                                    p_scoped boolean)
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
BEGIN
    RETURN QUERY
    SELECT r.job_key::text
    FROM batch_job_run r
    WHERE r.status = 'PENDING'
      AND r.next_run_at <= p_now
      AND r.job_name = ANY (p_jobs)
      AND (p_scoped OR r.scope IS NULL)
    ORDER BY r.next_run_at, r.job_key
    LIMIT p_limit
    FOR UPDATE SKIP LOCKED;
END;
$$;

-- The issue 23 release's pick (through batchonce_claim2): no scoped runs.
CREATE OR REPLACE FUNCTION batchonce_due_runs2(p_jobs text[], p_limit bigint, p_now timestamptz)
RETURNS SETOF text
LANGUAGE sql VOLATILE
AS $$
    SELECT batchonce_due_runs3(p_jobs, p_limit, p_now, false)
$$;

-- The earlier releases' pick: neither partitioned nor scoped runs.
CREATE OR REPLACE FUNCTION batchonce_due_runs(p_jobs text[], p_limit bigint, p_now timestamptz)
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
BEGIN
    RETURN QUERY
    SELECT r.job_key::text
    FROM batch_job_run r
    WHERE r.status = 'PENDING'
      AND r.next_run_at <= p_now
      AND r.job_name = ANY (p_jobs)
      AND r.partition_count IS NULL
      AND r.scope IS NULL
    ORDER BY r.next_run_at, r.job_key
    LIMIT p_limit
    FOR UPDATE SKIP LOCKED;
END;
$$;

-- The claim of batchonce_claim2 through batchonce_due_runs3: with
-- p_scoped, scoped runs too.
CREATE FUNCTION batchonce_claim3(p_jobs text[], p_ttls float8[], p_limit bigint,
                                 p_worker text, p_now timestamptz, p_scoped boolean)
RETURNS TABLE (job_key text, job_name text, business_date date, attempts integer,
               max_attempts integer, lease_token bigint, lease_expires_at timestamptz,
               processed_count bigint, payload jsonb, started_at timestamptz,
               timezone text, period_start timestamptz, period_end timestamptz, covers text,
               lease_ttl_s float8, stale_after_s float8, on_lease_expiry text,
               chunk_size integer, backoff_s float8, backoff_max_s float8,
               max_item_failures bigint, attempt_budget integer,
               partition_no integer, partition_count integer, partition_of text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
BEGIN
    IF p_worker IS NULL OR char_length(p_worker) NOT BETWEEN 1 AND 80 THEN
        RAISE EXCEPTION 'batchonce_claim3: a worker id of 1 to 80 characters is required';
    END IF;
    RETURN QUERY
    WITH picked AS (
        SELECT batchonce_due_runs3(p_jobs, p_limit, COALESCE(p_now, now()),
                                   COALESCE(p_scoped, false)) AS job_key
    ), claimed AS (
        UPDATE batch_job_run r
        SET status = 'RUNNING',
            attempts = r.attempts + 1,
            lease_token = batchonce_new_token(),
            lease_owner = p_worker,
            lease_expires_at = COALESCE(p_now, now()) + COALESCE(r.lease_ttl, make_interval(secs => (
                SELECT c.ttl FROM unnest(p_jobs, p_ttls) AS c(n, ttl)
                WHERE c.n = r.job_name LIMIT 1))),
            heartbeat_at = COALESCE(p_now, now()),
            heartbeat_processed = r.processed_count,
            started_at = COALESCE(p_now, now()),
            finished_at = NULL
        WHERE r.job_key = ANY (ARRAY(SELECT job_key FROM picked))
        RETURNING r.*
    ), attempt AS (
        INSERT INTO batch_job_attempt (job_key, attempt, lease_token, worker_id, started_at)
        SELECT c.job_key, c.attempts, c.lease_token, p_worker, c.started_at FROM claimed c
    )
    SELECT c.job_key::text, c.job_name::text, c.business_date, c.attempts, c.max_attempts,
           c.lease_token, c.lease_expires_at, c.processed_count, c.payload, c.started_at,
           c.timezone, c.period_start, c.period_end, c.covers::text,
           extract(epoch FROM c.lease_ttl)::float8, extract(epoch FROM c.stale_after)::float8,
           c.on_lease_expiry::text, c.chunk_size,
           extract(epoch FROM c.backoff)::float8, extract(epoch FROM c.backoff_max)::float8,
           c.max_item_failures, c.attempt_budget,
           c.partition_no::integer, c.partition_count::integer, c.partition_of::text
    FROM claimed c;
END;
$$;

-- The issue 23 release's claim: the same, without scoped runs.
CREATE OR REPLACE FUNCTION batchonce_claim2(p_jobs text[], p_ttls float8[], p_limit bigint,
                                            p_worker text, p_now timestamptz)
RETURNS TABLE (job_key text, job_name text, business_date date, attempts integer,
               max_attempts integer, lease_token bigint, lease_expires_at timestamptz,
               processed_count bigint, payload jsonb, started_at timestamptz,
               timezone text, period_start timestamptz, period_end timestamptz, covers text,
               lease_ttl_s float8, stale_after_s float8, on_lease_expiry text,
               chunk_size integer, backoff_s float8, backoff_max_s float8,
               max_item_failures bigint, attempt_budget integer,
               partition_no integer, partition_count integer, partition_of text)
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $$
    SELECT * FROM batchonce_claim3(p_jobs, p_ttls, p_limit, p_worker, p_now, false)
$$;

-- An application's enqueue by the declared configuration (the Node
-- package's `enqueue()`) does not know a scoped job's scopes: it is refused
-- with BO005 before anything is written, so no unscoped run of a scoped job
-- ever exists. The issue 23 body is kept under a new name and called; the
-- new function gets the grants the old one had, so the roles of a rolling
-- deploy keep calling it without `batchonce roles` being applied first.
ALTER FUNCTION batchonce_enqueue_declared(text, date[], jsonb)
    RENAME TO batchonce_enqueue_declared_unscoped;

CREATE FUNCTION batchonce_enqueue_declared(p_job text, p_dates date[],
                                           p_payload jsonb DEFAULT '{}')
RETURNS TABLE (job_key text, outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM batch_process_config c
               JOIN batch_worker w ON w.worker_id = c.process_id
               WHERE c.job_name = p_job AND w.live_until > now() AND c.settings ? 'scopes') THEN
        RAISE EXCEPTION 'job % runs per scope: enqueue its runs with `batchonce enqueue %` and --scope or --all-scopes', p_job, p_job
            USING ERRCODE = 'BO005';
    END IF;
    RETURN QUERY SELECT * FROM batchonce_enqueue_declared_unscoped(p_job, p_dates, p_payload);
END;
$$;

DO $$
DECLARE
    f regprocedure;
    g record;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = current_schema()::regnamespace
          AND p.proname IN ('batch_job_run_scope', 'batchonce_due_runs', 'batchonce_due_runs2',
                            'batchonce_due_runs3', 'batchonce_claim2', 'batchonce_claim3',
                            'batchonce_enqueue_declared')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
    -- Whoever could call the old enqueue_declared can call the new one.
    FOR g IN
        SELECT a.grantee FROM pg_proc p, aclexplode(p.proacl) a
        WHERE p.oid = 'batchonce_enqueue_declared_unscoped(text, date[], jsonb)'::regprocedure
          AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION batchonce_enqueue_declared(text, date[], jsonb) TO %s',
                       g.grantee::regrole);
    END LOOP;
END
$$;
