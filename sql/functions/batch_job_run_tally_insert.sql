-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batch_job_run_tally_insert()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO batch_job_tally (job_name, status, part, runs, newest_finished_at)
    SELECT i.job_name, i.status, i.partition_of IS NOT NULL, count(*), max(i.finished_at)
    FROM inserted i WHERE i.status IN ('SUCCEEDED', 'SKIPPED') GROUP BY 1, 2, 3;
    INSERT INTO batch_job_failed
    SELECT i.job_key, i.job_name, i.business_date, i.partition_of IS NOT NULL,
           i.scope IS NOT NULL, i.period_start, i.finished_at
    FROM inserted i WHERE i.status = 'FAILED'
    ON CONFLICT (job_key) DO UPDATE
    SET job_name = EXCLUDED.job_name, business_date = EXCLUDED.business_date,
        part = EXCLUDED.part, scoped = EXCLUDED.scoped,
        period_start = EXCLUDED.period_start, failed_at = EXCLUDED.failed_at;
    RETURN NULL;
END;
$function$
