-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_progress(p_job_key text, p_lease_token bigint, p_processed bigint, p_failed bigint DEFAULT 0)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    IF p_processed < 0 OR p_failed < 0 THEN
        RAISE EXCEPTION 'batchonce_progress: counts cannot be negative (% processed, % failed)',
            p_processed, p_failed USING ERRCODE = '22023';
    END IF;
    PERFORM batchonce_fence(p_job_key, p_lease_token);
    UPDATE batch_job_run
    SET processed_count = processed_count + p_processed,
        failed_count = failed_count + p_failed
    WHERE job_key = p_job_key AND lease_token = p_lease_token AND status = 'RUNNING';
    UPDATE batch_job_attempt
    SET processed_count = processed_count + p_processed,
        failed_count = failed_count + p_failed
    WHERE job_key = p_job_key AND lease_token = p_lease_token;
END;
$function$
