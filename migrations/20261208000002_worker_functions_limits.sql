-- Issue 42, items 1 and 2, for the functions a worker login calls: the
-- claims, the heartbeat, the finish, lease-expiry recovery and the freeze
-- of a legacy run's context. A stolen worker login called them with its
-- own clock and durations and with the engine's bookkeeping switched off.
--
-- 1. The clock. Each function computes its instant once, at its start, as
--    batchonce_now(p_now) (migration 20261208000001): the database's clock
--    for every login but the schema's owner, and SQLSTATE 42501 for any
--    other login that names an instant. A caller's durations move no time
--    either: a claim and a heartbeat extend a lease by the run's stored
--    lease_ttl (fixed at enqueue), and the caller's ttl serves only a run
--    enqueued without one, cut to the bounds of `lease_ttl` (1 s to 24 h,
--    docs/configuration.md); a finish puts a run off by at most 7 days, the
--    cap of every retry delay a worker computes (`backoff_max`, and a
--    handler's `RetryAfter`, which may exceed the run's backoff_max); and a
--    legacy run's frozen context must lie inside the bounds a configuration
--    file is held to. Before, a worker claimed runs due in 2999, recovered
--    every live lease, pushed its own lease past the year 3000 and could
--    park a run for centuries.
--
-- 2. The bookkeeping. The trigger batch_job_run_keep_lists skips while
--    `batchonce.in_step` is 'on', which the claim and the finish set while
--    they keep the run lists in step themselves. Any login can set that
--    parameter for its session, and it reached every function it called: a
--    claim through batchonce_claim left a RUNNING run off the running list
--    (its lease never recovered), a recovery left a PENDING run off the due
--    list (never claimed). Each function below now resets it for its
--    transaction as its first statement (`set_config(…, 'off', true)`;
--    the claim and the finish then set it 'on' and 'off' again as before),
--    so the caller's value never reaches the engine's statements. Not a
--    function SET clause: PostgreSQL lets only a superuser attach a custom
--    parameter to a function, and the migrator is not one
--    (workers/tests/roles.rs); and the reset leaves the setting 'off' for
--    the rest of the caller's transaction, which only makes the trigger
--    keep the lists for its writes.
--
-- Signatures, bodies and planner settings are otherwise those of
-- 20261207000001 and 20261207000002; CREATE OR REPLACE drops a function's
-- settings, so each one's are set again below. The previous release's
-- workers call these functions with NULL for p_now and ttls inside the
-- bounds, and see no change (workers/tests/upgrade.rs).

-- The earliest releases' claim (through batchonce_due_runs). It relies on
-- the trigger for the lists.
CREATE OR REPLACE FUNCTION batchonce_claim(p_jobs text[], p_ttls float8[], p_limit bigint,
                                           p_worker text, p_now timestamptz)
RETURNS TABLE (job_key text, job_name text, business_date date, attempts integer,
               max_attempts integer, lease_token bigint, lease_expires_at timestamptz,
               processed_count bigint, payload jsonb, started_at timestamptz,
               timezone text, period_start timestamptz, period_end timestamptz, covers text,
               lease_ttl_s float8, stale_after_s float8, on_lease_expiry text,
               chunk_size integer, backoff_s float8, backoff_max_s float8,
               max_item_failures bigint, attempt_budget integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    v_now := batchonce_now(p_now);
    IF p_worker IS NULL OR char_length(p_worker) NOT BETWEEN 1 AND 80 THEN
        RAISE EXCEPTION 'batchonce_claim: a worker id of 1 to 80 characters is required';
    END IF;
    RETURN QUERY
    WITH picked AS (
        SELECT batchonce_due_runs(p_jobs, p_limit, v_now) AS job_key
    ), claimed AS (
        UPDATE batch_job_run r
        SET status = 'RUNNING',
            attempts = r.attempts + 1,
            lease_token = batchonce_new_token(),
            lease_owner = p_worker,
            -- The run's own lease length; the claimer's, within the bounds
            -- of lease_ttl, only for a run enqueued without one.
            lease_expires_at = v_now + COALESCE(r.lease_ttl, make_interval(secs => (
                SELECT LEAST(GREATEST(COALESCE(c.ttl, 30), 1), 86400)
                FROM unnest(p_jobs, p_ttls) AS c(n, ttl)
                WHERE c.n = r.job_name LIMIT 1))),
            heartbeat_at = v_now,
            heartbeat_processed = r.processed_count,
            started_at = v_now,
            finished_at = NULL
        -- An array of keys, not a join: a join's estimate of the picked
        -- rows made the cached plan hash the whole table.
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
           c.max_item_failures, c.attempt_budget
    FROM claimed c;
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
DECLARE
    v_now timestamptz;
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    v_now := batchonce_now(p_now);
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
            WHERE d2.next_run_at <= v_now
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
            -- The run's own lease length; the claimer's, within the bounds
            -- of lease_ttl, only for a run enqueued without one.
            lease_expires_at = v_now + COALESCE(r.lease_ttl, make_interval(secs => (
                SELECT LEAST(GREATEST(COALESCE(c.ttl, 30), 1), 86400)
                FROM unnest(p_jobs, p_ttls) AS c(n, ttl)
                WHERE c.n = r.job_name LIMIT 1))),
            heartbeat_at = v_now,
            heartbeat_processed = r.processed_count,
            started_at = v_now,
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

-- The issue 23 release's claim: batchonce_claim3 without scoped runs
-- (which resets the parameter and reads the clock itself; the reset here
-- keeps the rule every SECURITY DEFINER function follows).
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
    SELECT set_config('batchonce.in_step', 'off', true);
    SELECT * FROM batchonce_claim3(p_jobs, p_ttls, p_limit, p_worker, p_now, false)
$$;

-- The heartbeat: extends each lease the caller presents the current token
-- of, by the run's own lease length; says of each whether it was extended,
-- or is still the caller's but its update lock is taken (busy), or is gone.
CREATE OR REPLACE FUNCTION batchonce_heartbeat(p_keys text[], p_tokens bigint[], p_ttls float8[],
                                               p_now timestamptz)
RETURNS TABLE (job_key text, extended boolean, mine boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    v_now := batchonce_now(p_now);
    RETURN QUERY
    WITH h AS (
        SELECT * FROM unnest(p_keys, p_tokens, p_ttls) AS h(job_key, token, ttl)
    ), mine AS (
        SELECT r.job_key FROM batch_job_run r JOIN h
          ON r.job_key = h.job_key AND r.lease_token = h.token
        WHERE r.status = 'RUNNING'
    ), locked AS (
        SELECT r.job_key FROM batch_job_run r JOIN h
          ON r.job_key = h.job_key AND r.lease_token = h.token
        WHERE r.status = 'RUNNING'
        FOR NO KEY UPDATE OF r SKIP LOCKED
    ), ext AS (
        UPDATE batch_job_run r
        SET heartbeat_at = v_now,
            heartbeat_processed = r.processed_count,
            -- The caller's ttl, within the bounds of lease_ttl, only for a
            -- run that stores none.
            lease_expires_at = v_now + COALESCE(r.lease_ttl, make_interval(
                secs => LEAST(GREATEST(COALESCE(h.ttl, 30), 1), 86400)))
        FROM h, locked
        WHERE r.job_key = h.job_key AND r.job_key = locked.job_key
        RETURNING r.job_key
    )
    SELECT h.job_key::text,
           EXISTS (SELECT 1 FROM ext e WHERE e.job_key = h.job_key),
           EXISTS (SELECT 1 FROM mine m WHERE m.job_key = h.job_key)
    FROM h;
END;
$$;

-- The finish, keeping the lists in step itself; reading every table by key
-- (20261207000002); a run put off by at most 7 days.
CREATE OR REPLACE FUNCTION batchonce_finish(p_keys text[], p_tokens bigint[], p_kinds text[],
                                            p_messages text[], p_delays float8[], p_now timestamptz)
RETURNS TABLE (job_key text, status text, expired boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    v_now := batchonce_now(p_now);
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
               r.lease_expires_at <= v_now AS expired
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
            -- At most 7 days (604,800 s) later: the cap of backoff_max and
            -- of a handler's RetryAfter. NaN is greater than any number, so
            -- it is cut to the cap too.
            next_run_at = CASE WHEN next.status = 'PENDING'
                               THEN v_now + make_interval(secs => LEAST(
                                        GREATEST(COALESCE(next.delay, 0), 0), 604800))
                               ELSE r.next_run_at END,
            finished_at = CASE WHEN next.status = 'PENDING' THEN NULL
                               ELSE v_now END,
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
        SET finished_at = v_now,
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

-- Lease-expiry recovery: the listed keys first, then the runs by key
-- (20261207000002). It relies on the trigger for the lists.
CREATE OR REPLACE FUNCTION batchonce_recover_expired(p_jobs text[], p_legacy text[], p_now timestamptz)
RETURNS TABLE (job_key text, status text, old_owner text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    v_now := batchonce_now(p_now);
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
          AND r.lease_expires_at <= v_now
          AND COALESCE(r.on_lease_expiry,
                       CASE WHEN r.job_name = ANY(p_legacy) THEN 'retry' ELSE 'hold' END) = 'retry'
        FOR UPDATE OF r SKIP LOCKED
    ), upd AS (
        UPDATE batch_job_run r
        SET status = CASE WHEN r.attempts < r.max_attempts THEN 'PENDING' ELSE 'FAILED' END,
            next_run_at = v_now,
            finished_at = CASE WHEN r.attempts < r.max_attempts THEN NULL
                               ELSE v_now END,
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
        SET finished_at = v_now,
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

-- Freezes the context of a run the caller holds, if it has none (enqueued
-- by the previous release), and returns the run's context either way. The
-- durations must lie inside the bounds a configuration file is held to
-- (src/config/job_table.rs), which a worker's own context always does: a
-- frozen lease_ttl is what every later heartbeat extends by.
CREATE OR REPLACE FUNCTION batchonce_freeze_context(p_key text, p_token bigint,
    p_tz text, p_ps timestamptz, p_pe timestamptz, p_cov text, p_ttl float8,
    p_stale float8, p_exp text, p_chunk integer, p_bo float8, p_bomax float8,
    p_mif bigint, p_budget integer)
RETURNS TABLE (timezone text, period_start timestamptz, period_end timestamptz, covers text,
               lease_ttl_s float8, stale_after_s float8, on_lease_expiry text,
               chunk_size integer, backoff_s float8, backoff_max_s float8,
               max_item_failures bigint, attempt_budget integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    -- NaN is outside every range; NULLs are left to the context's check.
    IF NOT (p_ttl BETWEEN 1 AND 86400) OR NOT (p_stale BETWEEN p_ttl AND 2592000)
       OR NOT (p_bomax BETWEEN 0 AND 604800) OR NOT (p_bo BETWEEN 0 AND p_bomax) THEN
        RAISE EXCEPTION 'batchonce_freeze_context: a context needs lease_ttl of 1s to 24h, stale_after from lease_ttl to 30d and backoff up to backoff_max up to 7d (got %, %, %, % seconds)',
            p_ttl, p_stale, p_bo, p_bomax USING ERRCODE = '22023';
    END IF;
    UPDATE batch_job_run r
    SET timezone = p_tz, period_start = p_ps, period_end = p_pe, covers = p_cov,
        lease_ttl = make_interval(secs => p_ttl), stale_after = make_interval(secs => p_stale),
        on_lease_expiry = p_exp, chunk_size = p_chunk, backoff = make_interval(secs => p_bo),
        backoff_max = make_interval(secs => p_bomax), max_item_failures = p_mif,
        attempt_budget = p_budget
    WHERE r.job_key = p_key AND r.lease_token = p_token AND r.timezone IS NULL;
    RETURN QUERY
    SELECT r.timezone, r.period_start, r.period_end, r.covers::text,
           extract(epoch FROM r.lease_ttl)::float8, extract(epoch FROM r.stale_after)::float8,
           r.on_lease_expiry::text, r.chunk_size,
           extract(epoch FROM r.backoff)::float8, extract(epoch FROM r.backoff_max)::float8,
           r.max_item_failures, r.attempt_budget
    FROM batch_job_run r WHERE r.job_key = p_key AND r.lease_token = p_token;
END;
$$;

-- CREATE OR REPLACE dropped each function's settings: names resolve in
-- this schema only, and the planner settings of 20261207000002 (the claim
-- reads its tables by key and its due list's index in order; the finish
-- and recovery read every table by key) are set again. The grants stay
-- (CREATE OR REPLACE keeps them): PUBLIC calls none of these.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'batchonce_claim(text[], float8[], bigint, text, timestamptz)',
        'batchonce_claim2(text[], float8[], bigint, text, timestamptz)',
        'batchonce_claim3(text[], float8[], bigint, text, timestamptz, boolean)',
        'batchonce_heartbeat(text[], bigint[], float8[], timestamptz)',
        'batchonce_finish(text[], bigint[], text[], text[], float8[], timestamptz)',
        'batchonce_recover_expired(text[], text[], timestamptz)',
        'batchonce_freeze_context(text, bigint, text, timestamptz, timestamptz, text, float8, float8, text, integer, float8, float8, bigint, integer)'
    ]::regprocedure[]
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
END
$$;
ALTER FUNCTION batchonce_claim3(text[], float8[], bigint, text, timestamptz, boolean)
    SET enable_bitmapscan = off;
ALTER FUNCTION batchonce_claim3(text[], float8[], bigint, text, timestamptz, boolean)
    SET enable_sort = off;
ALTER FUNCTION batchonce_claim3(text[], float8[], bigint, text, timestamptz, boolean)
    SET enable_seqscan = off;
ALTER FUNCTION batchonce_finish(text[], bigint[], text[], text[], float8[], timestamptz)
    SET enable_seqscan = off;
ALTER FUNCTION batchonce_finish(text[], bigint[], text[], text[], float8[], timestamptz)
    SET enable_nestloop = off;
ALTER FUNCTION batchonce_recover_expired(text[], text[], timestamptz)
    SET enable_seqscan = off;
ALTER FUNCTION batchonce_recover_expired(text[], text[], timestamptz)
    SET enable_nestloop = off;
