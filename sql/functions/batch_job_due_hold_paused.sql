-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batch_job_due_hold_paused()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    -- Nothing listed that is still due (an upsert's empty half, a finish
    -- that re-queued nothing, this function's own update): the pause table
    -- is not read at all.
    IF NOT EXISTS (SELECT FROM batch_job_due_listed n
                   WHERE n.next_run_at <> '9999-12-31T00:00:00Z') THEN
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT FROM batch_job_pause) THEN
        RETURN NULL;
    END IF;
    UPDATE batch_job_due d SET next_run_at = '9999-12-31T00:00:00Z'
    WHERE d.job_key = ANY (ARRAY(
            SELECT n.job_key FROM batch_job_due_listed n
            JOIN batch_job_pause p ON p.job_name = n.job_name
            WHERE n.next_run_at <> '9999-12-31T00:00:00Z'))
      AND d.next_run_at <> '9999-12-31T00:00:00Z';
    RETURN NULL;
END;
$function$
