-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batch_job_run_has_attempts()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.job_key IS NOT DISTINCT FROM OLD.job_key THEN
        RETURN NEW;
    END IF;
    IF EXISTS (SELECT FROM batch_job_attempt a WHERE a.job_key = OLD.job_key) THEN
        RAISE EXCEPTION 'update or delete on table "batch_job_run" violates foreign key constraint "batch_job_attempt_run_fkey" on table "batch_job_attempt"'
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'batch_job_attempt_run_fkey',
                  TABLE = 'batch_job_attempt', SCHEMA = TG_TABLE_SCHEMA,
                  DETAIL = format('Key (job_key)=(%s) is still referenced from table "batch_job_attempt".', OLD.job_key);
    END IF;
    RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
END;
$function$
