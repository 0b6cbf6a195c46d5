-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_recover_expired(p_jobs text[], p_legacy text[], p_now timestamp with time zone)
 RETURNS TABLE(job_key text, status text, old_owner text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
 SET enable_seqscan TO 'off'
 SET enable_nestloop TO 'off'
AS $function$
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
$function$
