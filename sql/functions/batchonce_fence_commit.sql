-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_fence_commit(p_key text, p_token bigint, p_processed bigint, p_failed bigint, p_ttl double precision, p_now timestamp with time zone)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    -- The commit, not the transaction's start: a long chunk must not commit
    -- an already-expired lease.
    v_now timestamptz := CASE WHEN p_now IS NULL THEN clock_timestamp()
                              ELSE batchonce_now(p_now) END;
    v_ttl interval := make_interval(secs => LEAST(GREATEST(COALESCE(p_ttl, 1), 1), 86400));
    n integer;
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    IF p_processed < 0 OR p_failed < 0 THEN
        RAISE EXCEPTION 'batchonce_fence_commit: counts cannot be negative (% processed, % failed)',
            p_processed, p_failed USING ERRCODE = '22023';
    END IF;
    UPDATE batch_job_run
    SET processed_count = processed_count + p_processed,
        failed_count = failed_count + p_failed,
        heartbeat_at = v_now,
        lease_expires_at = GREATEST(lease_expires_at, v_now + COALESCE(lease_ttl, v_ttl))
    WHERE job_key = p_key AND lease_token = p_token AND status = 'RUNNING';
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n = 1 THEN
        UPDATE batch_job_attempt
        SET processed_count = processed_count + p_processed,
            failed_count = failed_count + p_failed
        WHERE job_key = p_key AND lease_token = p_token;
    END IF;
    RETURN n;
END;
$function$
