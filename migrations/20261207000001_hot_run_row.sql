-- Issue 25: the claim and the finish update a run row in place (HOT).
--
-- A claim and a finish each wrote a new version of the run row and, because
-- the row's state and lease were indexed, an entry for it in every index of
-- the table: eight index entries a run, 31 % of the server's time in a
-- drain at 32 workers (BENCHMARKS.md, "Drain, ninth round"). No index of the
-- run table now names a column either statement changes, so PostgreSQL
-- writes the new version on the same page and no index entry at all. What
-- those indexes answered moves to two narrow tables:
--
--   batch_job_due      the PENDING runs, in claim order: the claim picks
--                      and deletes its entries in its own statement;
--   batch_job_running  the RUNNING runs: lease recovery, the stale views
--                      and the gauges.
--
-- They are lists, not state: the run row stays the one truth of a run, and
-- every reader checks it (a listed run whose row says otherwise is skipped,
-- and the claim drops it). What must never happen is a PENDING run missing
-- from batch_job_due, which no claim would ever find. So every writer keeps
-- the lists in step: the claim (batchonce_claim3) and the finish
-- (batchonce_finish), which are most of the writes, do it themselves; a row
-- trigger does it for every other writer, including the previous release's
-- statements, an operator's action and a migration. The trigger is skipped,
-- without calling its function, while those two run (they set
-- `batchonce.in_step` for their own transaction).
--
-- The fence. A fenced transaction locks the run row FOR KEY SHARE, and a
-- takeover (recovery, a release, an operator's `fail`, the previous
-- release's statements) had to wait for it because the lease token was a
-- unique key: PostgreSQL takes FOR UPDATE for an UPDATE that changes one.
-- A unique index on the token is an index the claim changes, so it goes,
-- and a BEFORE trigger takes that FOR UPDATE lock instead, for every UPDATE
-- that changes a RUNNING run's token, whoever sends it. The engine's own
-- takeovers lock FOR UPDATE before they update, as they did before, so they
-- wait for a fence before holding anything it needs. Tokens stay 59 random
-- bits; a token names a lease together with its run's key, and no reader
-- looks a run up by its token alone.
--
-- Expand and contract at once, on purpose: the previous release's workers
-- keep working on this schema (workers/tests/upgrade.rs runs them), but
-- their claim reads the run table without the claim index, so it scans the
-- table until the deploy is done (docs/upgrading.md).

CREATE TABLE batch_job_due (
    job_key     varchar(120) NOT NULL,
    job_name    varchar(64)  NOT NULL,
    next_run_at timestamptz  NOT NULL,
    -- A scoped run (`job@scope:date`), which only this release's claim takes.
    scoped      boolean      NOT NULL,
    CONSTRAINT batch_job_due_pkey PRIMARY KEY (job_key)
);
CREATE INDEX batch_job_due_claim_idx ON batch_job_due (next_run_at, job_key);
COMMENT ON TABLE batch_job_due IS
    'The PENDING runs of batch_job_run in claim order (a list kept in step by the claim, the finish and batch_job_run_keep_lists; the run row is the truth).';

CREATE TABLE batch_job_running (
    job_key  varchar(120) NOT NULL,
    job_name varchar(64)  NOT NULL,
    CONSTRAINT batch_job_running_pkey PRIMARY KEY (job_key)
);
COMMENT ON TABLE batch_job_running IS
    'The RUNNING runs of batch_job_run (a list kept in step by the claim, the finish and batch_job_run_keep_lists; the run row is the truth).';

INSERT INTO batch_job_due
SELECT job_key, job_name, next_run_at, scope IS NOT NULL FROM batch_job_run WHERE status = 'PENDING';
INSERT INTO batch_job_running
SELECT job_key, job_name FROM batch_job_run WHERE status = 'RUNNING';

-- Keeps the two lists in step with a run row for every writer but the claim
-- and the finish. A due entry that a claim has locked is left to that claim,
-- which deletes every entry it picks (and takes the run only if it is still
-- PENDING), so this never waits for a claim that waits for this row.
CREATE FUNCTION batch_job_run_keep_lists() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND (TG_OP = 'DELETE' OR OLD.job_key <> NEW.job_key
                                          OR (OLD.status = 'PENDING' AND NEW.status <> 'PENDING')) THEN
        DELETE FROM batch_job_due d WHERE d.job_key = ANY (ARRAY(
            SELECT d2.job_key FROM batch_job_due d2 WHERE d2.job_key = OLD.job_key
            FOR UPDATE SKIP LOCKED));
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') AND (TG_OP = 'DELETE' OR OLD.job_key <> NEW.job_key
                                          OR (OLD.status = 'RUNNING' AND NEW.status <> 'RUNNING')) THEN
        DELETE FROM batch_job_running WHERE job_key = OLD.job_key;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN NULL;
    END IF;
    IF NEW.status = 'PENDING' THEN
        INSERT INTO batch_job_due VALUES (NEW.job_key, NEW.job_name, NEW.next_run_at, NEW.scope IS NOT NULL)
        ON CONFLICT (job_key) DO UPDATE
        SET job_name = EXCLUDED.job_name, next_run_at = EXCLUDED.next_run_at, scoped = EXCLUDED.scoped;
    ELSIF NEW.status = 'RUNNING' THEN
        INSERT INTO batch_job_running VALUES (NEW.job_key, NEW.job_name)
        ON CONFLICT (job_key) DO NOTHING;
    END IF;
    RETURN NULL;
END;
$$;

-- The WHEN is evaluated without calling the function, so the claim and the
-- finish pay nothing for these triggers. A partitioned run's parent is kept
-- in step here whoever writes it: when the claim or the finish changes a
-- partition's status, batch_job_run_partition_settle changes the parent's
-- in the same statement, and neither of them knows it. For the parent's
-- own claim and finish the trigger repeats what they did, which changes
-- nothing.
CREATE TRIGGER batch_job_run_keep_lists
    AFTER INSERT OR UPDATE OF job_key, status, next_run_at, scope ON batch_job_run
    FOR EACH ROW WHEN (current_setting('batchonce.in_step', true) IS DISTINCT FROM 'on'
                       OR (NEW.partition_count IS NOT NULL AND NEW.partition_of IS NULL))
    EXECUTE FUNCTION batch_job_run_keep_lists();
CREATE TRIGGER batch_job_run_keep_lists_delete
    AFTER DELETE ON batch_job_run
    FOR EACH ROW EXECUTE FUNCTION batch_job_run_keep_lists();

-- A takeover waits for the holder's open fences: the lock PostgreSQL took
-- for a token-changing UPDATE while the token was a unique key. Only an
-- UPDATE that changes a RUNNING run's token calls it (a claim changes a
-- PENDING run's token, a finish keeps it), so the claim and the finish pay
-- nothing for it either.
CREATE FUNCTION batch_job_run_takeover_waits() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM 1 FROM batch_job_run r WHERE r.job_key = OLD.job_key FOR UPDATE;
    RETURN NEW;
END;
$$;
CREATE TRIGGER batch_job_run_takeover_waits
    BEFORE UPDATE OF lease_token ON batch_job_run
    FOR EACH ROW WHEN (OLD.status = 'RUNNING' AND OLD.lease_token IS DISTINCT FROM NEW.lease_token)
    EXECUTE FUNCTION batch_job_run_takeover_waits();

DROP INDEX batch_job_run_claim_idx;
DROP INDEX batch_job_run_lease_idx;
ALTER TABLE batch_job_run DROP CONSTRAINT batch_job_run_lease_token_key;
-- Room on each page for the claim's and the finish's new versions of a
-- row, so that they are HOT. Pages written before keep their packing;
-- rows enqueued from now on get the room.
ALTER TABLE batch_job_run SET (fillfactor = 45);

-- The pick of the due list for any caller but batchonce_claim3, which
-- picks inside its own statement (below): the due entries in claim order,
-- locked, skipping those another claimer holds. It deletes nothing: a
-- function called from a statement reads with a snapshot of its own, newer
-- than the statement's, so the caller's UPDATE may not see a run this pick
-- saw enqueued a moment ago, and a deleted entry would be lost with it. The
-- caller's update of the run takes its entry off the list (the trigger).
CREATE OR REPLACE FUNCTION batchonce_due_runs3(p_jobs text[], p_limit bigint, p_now timestamptz,
                                               p_scoped boolean)
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
BEGIN
    RETURN QUERY
    SELECT d.job_key::text FROM batch_job_due d
    WHERE d.next_run_at <= p_now
      AND d.job_name = ANY (p_jobs)
      AND (p_scoped OR NOT d.scoped)
    ORDER BY d.next_run_at, d.job_key
    LIMIT p_limit
    FOR UPDATE SKIP LOCKED;
END;
$$;

-- The earliest releases' pick (through batchonce_claim): neither
-- partitioned nor scoped runs. batchonce_claim updates every key it is
-- given without looking at the status, so this pick locks the run rows too
-- and returns only PENDING ones, as it did when it read the run table; like
-- batchonce_due_runs3 it deletes nothing.
CREATE OR REPLACE FUNCTION batchonce_due_runs(p_jobs text[], p_limit bigint, p_now timestamptz)
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
BEGIN
    RETURN QUERY
    SELECT d.job_key::text FROM batch_job_due d
    JOIN batch_job_run r ON r.job_key = d.job_key
    WHERE d.next_run_at <= p_now
      AND d.job_name = ANY (p_jobs)
      AND NOT d.scoped
      AND r.status = 'PENDING'
      AND r.partition_count IS NULL
    ORDER BY d.next_run_at, d.job_key
    LIMIT p_limit
    FOR UPDATE OF d, r SKIP LOCKED;
END;
$$;

-- The claim, keeping the lists in step itself (the trigger skips it). Its
-- pick is its own (batchonce_due_runs3 is for other callers).
CREATE OR REPLACE FUNCTION batchonce_claim3(p_jobs text[], p_ttls float8[], p_limit bigint,
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
    PERFORM set_config('batchonce.in_step', 'on', true);
    RETURN QUERY
    -- The pick takes the due entries it returns, in claim order, skipping
    -- those another claimer holds. It is part of this statement, so it reads
    -- with the snapshot the update of the runs reads with: an entry it sees,
    -- it sees the run of (both are written in one transaction), and an entry
    -- whose run is no longer PENDING is dropped here, harming nothing.
    WITH picked AS (
        DELETE FROM batch_job_due d WHERE d.job_key = ANY (ARRAY(
            SELECT d2.job_key FROM batch_job_due d2
            WHERE d2.next_run_at <= COALESCE(p_now, now())
              AND d2.job_name = ANY (p_jobs)
              AND (COALESCE(p_scoped, false) OR NOT d2.scoped)
            ORDER BY d2.next_run_at, d2.job_key
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED))
        RETURNING d.job_key
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
        -- An array of keys, not a join: a join's estimate of the picked
        -- rows made the cached plan hash the whole table.
        WHERE r.job_key = ANY (ARRAY(SELECT job_key FROM picked))
          AND r.status = 'PENDING'
        RETURNING r.*
    ), running AS (
        INSERT INTO batch_job_running (job_key, job_name)
        SELECT c.job_key, c.job_name FROM claimed c
        ON CONFLICT (job_key) DO NOTHING
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
    PERFORM set_config('batchonce.in_step', 'off', true);
END;
$$;

-- The finish, keeping the lists in step itself; otherwise as before.
CREATE OR REPLACE FUNCTION batchonce_finish(p_keys text[], p_tokens bigint[], p_kinds text[],
                                            p_messages text[], p_delays float8[], p_now timestamptz)
RETURNS TABLE (job_key text, status text, expired boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_kinds) k
               WHERE k NOT IN ('succeeded', 'skipped', 'retry', 'fatal', 'release')) THEN
        RAISE EXCEPTION 'batchonce_finish: unknown finish kind' USING ERRCODE = '22023';
    END IF;
    PERFORM set_config('batchonce.in_step', 'on', true);
    RETURN QUERY
    WITH f AS (
        SELECT * FROM unnest(p_keys, p_tokens, p_kinds, p_messages, p_delays)
            AS f(job_key, token, kind, message, delay)
    ), next AS (
        SELECT r.job_key, f.token, f.kind, f.message, f.delay,
               CASE
                 WHEN f.kind = 'succeeded' THEN 'SUCCEEDED'
                 WHEN f.kind = 'skipped' THEN 'SKIPPED'
                 WHEN f.kind = 'release' THEN 'PENDING'
                 WHEN f.kind = 'retry' AND r.attempts < r.max_attempts THEN 'PENDING'
                 ELSE 'FAILED'
               END AS status,
               r.lease_expires_at <= COALESCE(p_now, now()) AS expired
        FROM f
        JOIN batch_job_run r ON r.job_key = f.job_key AND r.lease_token = f.token
        WHERE r.status = 'RUNNING'
        -- Rows are locked in key order, so two batches can never wait on
        -- each other in a cycle.
        ORDER BY r.job_key
        FOR NO KEY UPDATE OF r
    ), upd AS (
        UPDATE batch_job_run r
        SET status = next.status,
            next_run_at = CASE WHEN next.status = 'PENDING'
                               THEN COALESCE(p_now, now()) + make_interval(secs => GREATEST(next.delay, 0))
                               ELSE r.next_run_at END,
            finished_at = CASE WHEN next.status = 'PENDING' THEN NULL
                               ELSE COALESCE(p_now, now()) END,
            lease_expires_at = NULL,
            -- A released run gets a new token at once, so nothing still
            -- running under the old one can commit.
            lease_token = CASE WHEN next.kind = 'release' THEN batchonce_new_token()
                               ELSE r.lease_token END,
            -- A release is not a failure: the budget grows by the attempt
            -- it used, so attempts never exceed max_attempts.
            max_attempts = CASE WHEN next.kind = 'release'
                                THEN LEAST(r.max_attempts + 1, 1000)
                                ELSE r.max_attempts END,
            error_message = CASE WHEN next.kind = 'succeeded' THEN NULL
                                 WHEN next.kind = 'release' THEN r.error_message
                                 ELSE left(next.message, 1000) END
        FROM next
        WHERE r.job_key = next.job_key
        RETURNING r.job_key, r.job_name, r.status, r.next_run_at, r.scope,
                  next.token, next.kind, next.message, next.expired
    ), attempt AS (
        UPDATE batch_job_attempt a
        SET finished_at = COALESCE(p_now, now()),
            outcome = CASE
                        WHEN upd.kind = 'retry' AND upd.status = 'PENDING' THEN 'retried'
                        WHEN upd.kind = 'retry' THEN 'failed'
                        WHEN upd.kind = 'release' THEN 'released'
                        ELSE upd.kind END,
            error_message = left(upd.message, 1000)
        FROM upd
        WHERE a.job_key = upd.job_key AND a.lease_token = upd.token
    ), gone AS (
        DELETE FROM batch_job_running l USING upd WHERE l.job_key = upd.job_key
    ), due AS (
        INSERT INTO batch_job_due (job_key, job_name, next_run_at, scoped)
        SELECT upd.job_key, upd.job_name, upd.next_run_at, upd.scope IS NOT NULL
        FROM upd WHERE upd.status = 'PENDING'
        ON CONFLICT (job_key) DO UPDATE SET next_run_at = EXCLUDED.next_run_at
    )
    SELECT u.job_key::text, u.status::text, u.expired FROM upd u;
    PERFORM set_config('batchonce.in_step', 'off', true);
END;
$$;

-- Lease-expiry recovery reads the RUNNING runs through their list; the
-- trigger keeps the lists in step for its updates (recovery is rare).
CREATE OR REPLACE FUNCTION batchonce_recover_expired(p_jobs text[], p_legacy text[], p_now timestamptz)
RETURNS TABLE (job_key text, status text, old_owner text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH expired AS (
        SELECT r.job_key, r.lease_token AS old_token, r.lease_owner AS old_owner
        FROM batch_job_running l
        JOIN batch_job_run r ON r.job_key = l.job_key
        WHERE r.status = 'RUNNING'
          AND r.lease_expires_at <= COALESCE(p_now, now())
          AND l.job_name = ANY(p_jobs)
          AND COALESCE(r.on_lease_expiry,
                       CASE WHEN r.job_name = ANY(p_legacy) THEN 'retry' ELSE 'hold' END) = 'retry'
        FOR UPDATE OF r SKIP LOCKED
    ), upd AS (
        UPDATE batch_job_run r
        SET status = CASE WHEN r.attempts < r.max_attempts THEN 'PENDING' ELSE 'FAILED' END,
            next_run_at = COALESCE(p_now, now()),
            finished_at = CASE WHEN r.attempts < r.max_attempts THEN NULL
                               ELSE COALESCE(p_now, now()) END,
            lease_token = batchonce_new_token(),
            lease_expires_at = NULL,
            error_message = left('lease expired: worker ' || coalesce(e.old_owner, '?')
                                 || ' stopped heartbeating', 1000)
        FROM expired e
        WHERE r.job_key = e.job_key
        RETURNING r.job_key, r.status, e.old_owner
    ), attempt AS (
        UPDATE batch_job_attempt a
        SET finished_at = COALESCE(p_now, now()),
            outcome = 'lease_expired',
            error_message = 'lease expired without a heartbeat'
        FROM expired e
        WHERE a.job_key = e.job_key AND a.lease_token = e.old_token
          AND a.finished_at IS NULL
    )
    SELECT u.job_key::text, u.status::text, u.old_owner::text FROM upd u;
END;
$$;

-- Names resolve in this schema only; PUBLIC calls none of them.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOREACH f IN ARRAY ARRAY['batch_job_run_keep_lists()', 'batch_job_run_takeover_waits()',
                             'batchonce_due_runs3(text[], bigint, timestamptz, boolean)',
                             'batchonce_due_runs(text[], bigint, timestamptz)',
                             'batchonce_claim3(text[], float8[], bigint, text, timestamptz, boolean)',
                             'batchonce_finish(text[], bigint[], text[], text[], float8[], timestamptz)',
                             'batchonce_recover_expired(text[], text[], timestamptz)']::regprocedure[]
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
