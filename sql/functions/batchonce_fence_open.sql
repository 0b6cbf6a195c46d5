-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_fence_open(p_key text, p_token bigint, p_now timestamp with time zone)
 RETURNS TABLE(pid integer, xact_start timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_now timestamptz := batchonce_now(p_now);
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    PERFORM 1 FROM batch_job_run
    WHERE job_key = p_key AND lease_token = p_token AND status = 'RUNNING'
      AND lease_expires_at > v_now
    FOR KEY SHARE;
    IF FOUND THEN
        PERFORM batchonce_fence_record(p_key);
        RETURN QUERY SELECT pg_backend_pid(), now();
    END IF;
END;
$function$
