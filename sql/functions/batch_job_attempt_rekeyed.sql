-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batch_job_attempt_rekeyed()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    PERFORM FROM batch_job_run r WHERE r.job_key = NEW.job_key FOR KEY SHARE OF r;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'insert or update on table "batch_job_attempt" violates foreign key constraint "batch_job_attempt_run_fkey"'
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'batch_job_attempt_run_fkey',
                  TABLE = 'batch_job_attempt', SCHEMA = TG_TABLE_SCHEMA,
                  DETAIL = format('Key (job_key)=(%s) is not present in table "batch_job_run".', NEW.job_key);
    END IF;
    RETURN NEW;
END;
$function$
