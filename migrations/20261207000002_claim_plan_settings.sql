-- Issue 25: the claim, the finish and lease-expiry recovery read every
-- table by key (the claim's pick: the head of the due list's index),
-- whatever the statistics say. Each part below says what it read before.
--
-- Until 20261207000001 the claim picked through batchonce_due_runs, whose
-- `SET enable_bitmapscan = off, enable_sort = off` leave the planner only
-- the ordered index scan that stops at the limit (20260901000005). That
-- migration moved the pick into batchonce_claim3's own statement, so that
-- the pick and the update read with one snapshot, and the pick lost those
-- settings. A due list analyzed while it was empty, which is its usual
-- state on a quiet system, or while it held other jobs' runs, then made the
-- planner expect a row or two of a backlog and read and sort every due
-- entry on each claim: 18 ms a claim of 32 at the start of a 60,000-run
-- drain, the sort spilling to disk (auto_explain), and quadratic over an
-- outage's backlog.
--
-- The claim now runs with those settings, and with `enable_seqscan = off`:
-- under the same statistics its delete of the entries it took scanned the
-- whole list too. Nothing in a claim needs a sequential scan, a bitmap scan
-- or a sort: the pick reads its index in order, and the delete, the update
-- and the inserts look rows up by key. ALTER FUNCTION … SET adds to the
-- function's settings and keeps its pinned search path.
ALTER FUNCTION batchonce_claim3(text[], float8[], bigint, text, timestamptz, boolean)
    SET enable_bitmapscan = off;
ALTER FUNCTION batchonce_claim3(text[], float8[], bigint, text, timestamptz, boolean)
    SET enable_sort = off;
ALTER FUNCTION batchonce_claim3(text[], float8[], bigint, text, timestamptz, boolean)
    SET enable_seqscan = off;

-- The finish has the same hazard on the run table, and a worse one. It
-- joins its input (the keys and tokens, unnested) to the run table to lock
-- the runs, then to update them, and the attempts and the running list to
-- the runs it updated. Under a run table whose statistics call it small, a
-- plan read all of it for each finish: a nested loop with every run on the
-- outer side and the batch on the inner, which made one finish of 596 runs
-- take 3 s in a drain whose run table autovacuum had analyzed just after
-- the bench emptied it (auto_explain; BENCHMARKS.md, eleventh round; the
-- drain then ran at a quarter of its speed, or a fiftieth), or a merge join
-- over the whole primary key. Now every table the finish reads is read by
-- `job_key = ANY (p_keys)`, a condition on that table alone, so every plan
-- reads it by those keys; the joins between the rows so read are hashed or
-- merged (`enable_nestloop = off`), because a nested loop over an estimate
-- of ten rows repeated the key lookup for every input row (200 × 200
-- entries read under the generic plan); and `enable_seqscan = off` keeps a
-- table analyzed while empty from being scanned. The rest of the body is
-- 20261207000001's.
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
        -- The keys again, as a condition on the run table alone: whatever
        -- join the planner picks, it reads the run table by these keys.
        WHERE r.job_key = ANY (p_keys)
          AND r.status = 'RUNNING'
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
          AND r.job_key = ANY (p_keys)
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
          AND a.job_key = ANY (p_keys)
    ), gone AS (
        DELETE FROM batch_job_running l USING upd
        WHERE l.job_key = upd.job_key AND l.job_key = ANY (p_keys)
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

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION batchonce_finish(text[], bigint[], text[], text[], float8[], timestamptz) '
                   'SET search_path = %I, pg_temp', current_schema());
END
$$;
ALTER FUNCTION batchonce_finish(text[], bigint[], text[], text[], float8[], timestamptz)
    SET enable_seqscan = off;
ALTER FUNCTION batchonce_finish(text[], bigint[], text[], text[], float8[], timestamptz)
    SET enable_nestloop = off;

-- Lease-expiry recovery, which every worker runs on a timer, joined the
-- running list to the run table and read all of the run table's primary
-- key under the same statistics (5,001 entries for 200 running runs in
-- tests/plans.rs). It now takes the listed keys first and reads the runs,
-- and their attempts, by those keys, with the same settings as the finish.
-- The rest of the body is 20261207000001's.
CREATE OR REPLACE FUNCTION batchonce_recover_expired(p_jobs text[], p_legacy text[], p_now timestamptz)
RETURNS TABLE (job_key text, status text, old_owner text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH expired AS (
        SELECT r.job_key, r.lease_token AS old_token, r.lease_owner AS old_owner
        FROM batch_job_run r
        -- The listed keys first, then the runs by key, not a join of the
        -- two tables, which a run table called small by its statistics
        -- made a read of all of it.
        WHERE r.job_key = ANY (ARRAY(SELECT l.job_key FROM batch_job_running l
                                     WHERE l.job_name = ANY (p_jobs)))
          AND r.status = 'RUNNING'
          AND r.lease_expires_at <= COALESCE(p_now, now())
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
          AND r.job_key = ANY (ARRAY(SELECT job_key FROM expired))
        RETURNING r.job_key, r.status, e.old_owner
    ), attempt AS (
        UPDATE batch_job_attempt a
        SET finished_at = COALESCE(p_now, now()),
            outcome = 'lease_expired',
            error_message = 'lease expired without a heartbeat'
        FROM expired e
        WHERE a.job_key = e.job_key AND a.lease_token = e.old_token
          AND a.job_key = ANY (ARRAY(SELECT job_key FROM expired))
          AND a.finished_at IS NULL
    )
    SELECT u.job_key::text, u.status::text, u.old_owner::text FROM upd u;
END;
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION batchonce_recover_expired(text[], text[], timestamptz) '
                   'SET search_path = %I, pg_temp', current_schema());
END
$$;
ALTER FUNCTION batchonce_recover_expired(text[], text[], timestamptz)
    SET enable_seqscan = off;
ALTER FUNCTION batchonce_recover_expired(text[], text[], timestamptz)
    SET enable_nestloop = off;
