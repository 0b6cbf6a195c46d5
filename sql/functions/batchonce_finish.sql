-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_finish(p_keys text[], p_tokens bigint[], p_kinds text[], p_messages text[], p_delays double precision[], p_now timestamp with time zone)
 RETURNS TABLE(job_key text, status text, expired boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET enable_nestloop TO 'off'
 SET search_path TO 'public', 'pg_temp'
AS $function$
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
                  r.business_date, r.finished_at, r.period_start,
                  -- A partitioned run's parent is counted by the trigger,
                  -- which keeps it in step whoever changes it.
                  (r.partition_count IS NOT NULL AND r.partition_of IS NULL) AS parent,
                  r.partition_of IS NOT NULL AS part,
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
    ), tally AS (
        -- One row per job and outcome of this call, however many runs it
        -- finished: concurrent finishes append and never wait on each other.
        INSERT INTO batch_job_tally (job_name, status, part, runs, newest_finished_at)
        SELECT upd.job_name, upd.status, upd.part, count(*), max(upd.finished_at)
        FROM upd WHERE upd.status IN ('SUCCEEDED', 'SKIPPED') AND NOT upd.parent
        GROUP BY 1, 2, 3
    )
    SELECT u.job_key::text, u.status::text, u.expired FROM upd u;
    PERFORM set_config('batchonce.in_step', 'off', true);
END;
$function$
