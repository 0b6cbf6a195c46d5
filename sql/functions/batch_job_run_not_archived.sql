-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batch_job_run_not_archived()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    v_key text;
BEGIN
    SELECT n.job_key INTO v_key FROM batch_job_run_inserted n
    WHERE EXISTS (SELECT FROM batch_job_run_archive a WHERE a.job_key = n.job_key)
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'run % is archived (batchonce runs archive): an archived key is never enqueued again', v_key
            USING ERRCODE = 'BO011', TABLE = 'batch_job_run', SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    RETURN NULL;
END;
$function$
