-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batch_job_run_tally_delete()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO batch_job_tally (job_name, status, part, runs, newest_finished_at)
    SELECT d.job_name, d.status, d.partition_of IS NOT NULL, -count(*), NULL
    FROM deleted d WHERE d.status IN ('SUCCEEDED', 'SKIPPED') GROUP BY 1, 2, 3;
    DELETE FROM batch_job_failed f
    WHERE f.job_key IN (SELECT d.job_key FROM deleted d WHERE d.status = 'FAILED');
    RETURN NULL;
END;
$function$
