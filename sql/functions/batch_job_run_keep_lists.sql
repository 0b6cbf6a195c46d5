-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batch_job_run_keep_lists()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND (TG_OP = 'DELETE' OR OLD.job_key <> NEW.job_key
                                          OR (OLD.status = 'PENDING' AND NEW.status <> 'PENDING')) THEN
        DELETE FROM batch_job_due d WHERE d.job_key = ANY (ARRAY(
            SELECT d2.job_key FROM batch_job_due d2 WHERE d2.job_key = OLD.job_key
            FOR UPDATE SKIP LOCKED));
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') AND (TG_OP = 'DELETE' OR OLD.job_key <> NEW.job_key
                                          OR (OLD.status = 'RUNNING' AND NEW.status <> 'RUNNING')) THEN
        DELETE FROM batch_job_running WHERE job_key = OLD.job_key;
    END IF;
    -- Inserted and deleted runs are counted by the statement triggers.
    IF TG_OP = 'UPDATE' AND (OLD.status IS DISTINCT FROM NEW.status
                             OR OLD.job_key <> NEW.job_key OR OLD.job_name <> NEW.job_name
                             OR OLD.business_date <> NEW.business_date
                             OR (OLD.partition_of IS NULL) <> (NEW.partition_of IS NULL)) THEN
        IF OLD.status IN ('SUCCEEDED', 'SKIPPED') THEN
            INSERT INTO batch_job_tally VALUES (OLD.job_name, OLD.status, OLD.partition_of IS NOT NULL, -1, NULL);
        END IF;
        IF NEW.status IN ('SUCCEEDED', 'SKIPPED') THEN
            INSERT INTO batch_job_tally
            VALUES (NEW.job_name, NEW.status, NEW.partition_of IS NOT NULL, 1, NEW.finished_at);
        END IF;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN NULL;
    END IF;
    IF NEW.status = 'PENDING' THEN
        INSERT INTO batch_job_due VALUES (NEW.job_key, NEW.job_name, NEW.next_run_at, NEW.scope IS NOT NULL)
        ON CONFLICT (job_key) DO UPDATE
        SET job_name = EXCLUDED.job_name, next_run_at = EXCLUDED.next_run_at, scoped = EXCLUDED.scoped;
    ELSIF NEW.status = 'RUNNING' THEN
        INSERT INTO batch_job_running VALUES (NEW.job_key, NEW.job_name)
        ON CONFLICT (job_key) DO NOTHING;
    END IF;
    RETURN NULL;
END;
$function$
