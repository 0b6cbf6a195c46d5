-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batch_job_run_partition_settle()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    p_status text;
    n_failed integer;
    n_done integer;
    first_failed record;
BEGIN
    SELECT r.status INTO p_status FROM batch_job_run r
    WHERE r.job_key = NEW.partition_of FOR NO KEY UPDATE;
    IF p_status IS NULL OR p_status IN ('RUNNING', 'SUCCEEDED', 'SKIPPED') THEN
        RETURN NULL;
    END IF;
    SELECT count(*) FILTER (WHERE r.status = 'FAILED'),
           count(*) FILTER (WHERE r.status IN ('SUCCEEDED', 'SKIPPED'))
    INTO n_failed, n_done
    FROM batch_job_run r WHERE r.partition_of = NEW.partition_of;
    IF n_failed > 0 THEN
        IF p_status <> 'FAILED' THEN
            SELECT r.partition_no, r.error_message INTO first_failed FROM batch_job_run r
            WHERE r.partition_of = NEW.partition_of AND r.status = 'FAILED'
            ORDER BY r.partition_no LIMIT 1;
            UPDATE batch_job_run
            SET status = 'FAILED', finished_at = COALESCE(NEW.finished_at, now()),
                error_message = left(format('partition %s of %s failed: %s',
                    first_failed.partition_no, NEW.partition_count,
                    coalesce(first_failed.error_message, '?')), 1000)
            WHERE job_key = NEW.partition_of;
        END IF;
    ELSIF n_done = NEW.partition_count THEN
        UPDATE batch_job_run
        SET status = 'PENDING', next_run_at = COALESCE(NEW.finished_at, now()),
            finished_at = NULL, error_message = NULL
        WHERE job_key = NEW.partition_of;
        PERFORM pg_notify('batchonce_run', '');
    ELSIF p_status <> 'PENDING' THEN
        UPDATE batch_job_run
        SET status = 'PENDING', next_run_at = '9999-12-31T00:00:00Z', finished_at = NULL, error_message = NULL
        WHERE job_key = NEW.partition_of;
    ELSE
        UPDATE batch_job_run SET next_run_at = '9999-12-31T00:00:00Z'
        WHERE job_key = NEW.partition_of AND next_run_at <> '9999-12-31T00:00:00Z';
    END IF;
    RETURN NULL;
END;
$function$
