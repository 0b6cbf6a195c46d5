-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_fold_tally()
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    v_rows bigint;
    v_keys bigint;
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    IF NOT pg_try_advisory_xact_lock('batch_job_tally'::regclass::oid::integer, 43) THEN
        RETURN 0;
    END IF;
    SELECT count(*), count(DISTINCT (t.job_name, t.status, t.part)) INTO v_rows, v_keys
    FROM batch_job_tally t;
    IF v_rows <= v_keys THEN
        RETURN 0;
    END IF;
    WITH gone AS (
        DELETE FROM batch_job_tally RETURNING *
    ), kept AS (
        INSERT INTO batch_job_tally (job_name, status, part, runs, newest_finished_at)
        SELECT g.job_name, g.status, g.part, sum(g.runs), max(g.newest_finished_at)
        FROM gone g GROUP BY 1, 2, 3
        -- A job that has none left keeps its row while it says when the job
        -- last succeeded.
        HAVING sum(g.runs) <> 0 OR max(g.newest_finished_at) IS NOT NULL
    )
    SELECT count(*) INTO v_rows FROM gone;
    RETURN v_rows;
END;
$function$
