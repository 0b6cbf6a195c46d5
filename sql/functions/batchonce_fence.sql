-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_fence(p_job_key text, p_lease_token bigint)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    PERFORM 1 FROM batch_job_run
    WHERE job_key = p_job_key
      AND lease_token = p_lease_token
      AND status = 'RUNNING'
      AND lease_expires_at > v_now
    FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'batchonce: lease lost for % (token %): the run was taken over, expired or finished; nothing in this transaction may commit',
            p_job_key, p_lease_token
            USING ERRCODE = 'BO001';
    END IF;
    PERFORM batchonce_fence_record(p_job_key);
END;
$function$
