-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_operator_hold_row(p_key text)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    PERFORM 1 FROM batch_job_run WHERE job_key = p_key FOR NO KEY UPDATE;
END;
$function$
