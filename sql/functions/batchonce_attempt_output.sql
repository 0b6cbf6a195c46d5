-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_attempt_output(p_key text, p_token bigint, p_output text)
 RETURNS TABLE(processed bigint, failed bigint)
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
    SELECT set_config('batchonce.in_step', 'off', true);
    UPDATE batch_job_attempt
    SET output_tail = COALESCE(left(p_output, 4000), output_tail)
    WHERE job_key = p_key AND lease_token = p_token
    RETURNING processed_count, failed_count;
$function$
