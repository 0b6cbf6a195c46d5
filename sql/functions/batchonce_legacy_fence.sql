-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_legacy_fence()
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    v_xid xid := pg_current_xact_id_if_assigned()::xid;
    v_key text;
    v_n integer;
BEGIN
    IF v_xid IS NULL OR NOT has_table_privilege(session_user, 'batch_job_run', 'UPDATE') THEN
        RETURN NULL;
    END IF;
    SELECT min(r.job_key), count(*) INTO v_key, v_n
    FROM batch_job_running l JOIN batch_job_run r ON r.job_key = l.job_key
    WHERE r.status = 'RUNNING' AND r.xmax = v_xid;
    IF v_n <> 1 THEN
        RETURN NULL;
    END IF;
    PERFORM batchonce_fence_record(v_key);
    RETURN v_key;
END;
$function$
