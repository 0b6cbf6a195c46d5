-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batch_job_run_failed_list()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    IF OLD.status = 'FAILED' THEN
        DELETE FROM batch_job_failed WHERE job_key = OLD.job_key;
    END IF;
    IF NEW.status = 'FAILED' THEN
        INSERT INTO batch_job_failed
        VALUES (NEW.job_key, NEW.job_name, NEW.business_date, NEW.partition_of IS NOT NULL,
                NEW.scope IS NOT NULL, NEW.period_start, NEW.finished_at)
        ON CONFLICT (job_key) DO UPDATE
        SET job_name = EXCLUDED.job_name, business_date = EXCLUDED.business_date,
            part = EXCLUDED.part, scoped = EXCLUDED.scoped,
            period_start = EXCLUDED.period_start, failed_at = EXCLUDED.failed_at;
    END IF;
    RETURN NULL;
END;
$function$
