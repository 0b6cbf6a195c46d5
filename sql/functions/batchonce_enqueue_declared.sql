-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_enqueue_declared(p_job text, p_dates date[], p_payload jsonb DEFAULT '{}'::jsonb)
 RETURNS TABLE(job_key text, outcome text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    IF EXISTS (SELECT 1 FROM batch_process_config c
               JOIN batch_worker w ON w.worker_id = c.process_id
               WHERE c.job_name = p_job AND w.live_until > now() AND c.settings ? 'scopes') THEN
        RAISE EXCEPTION 'job % runs per scope: enqueue its runs with `batchonce enqueue %` and --scope or --all-scopes', p_job, p_job
            USING ERRCODE = 'BO005';
    END IF;
    RETURN QUERY SELECT * FROM batchonce_enqueue_declared_unscoped(p_job, p_dates, p_payload);
END;
$function$
