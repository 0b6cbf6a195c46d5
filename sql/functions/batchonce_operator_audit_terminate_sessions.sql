-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_operator_audit_terminate_sessions(p_key text, p_operator text, p_reason text, p_detail text, p_pids integer[], p_xact_starts timestamp with time zone[])
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    v_status text;
    v_id bigint;
BEGIN
    -- No caller's setting switches the engine's bookkeeping off in here
    -- (a function's own SET of a custom setting needs a superuser on
    -- PostgreSQL 15, so it is set here, and off is the default anyway).
    PERFORM set_config('batchonce.in_step', 'off', true);
    IF p_pids IS NULL OR p_xact_starts IS NULL
       OR cardinality(p_pids) NOT BETWEEN 1 AND 100
       OR cardinality(p_pids) <> cardinality(p_xact_starts)
       OR array_position(p_pids, NULL) IS NOT NULL
       OR array_position(p_xact_starts, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'batchonce_operator_audit_terminate_sessions: name 1 to 100 sessions, each by pid and transaction start'
            USING ERRCODE = '22023';
    END IF;
    SELECT r.status INTO v_status FROM batch_job_run r WHERE r.job_key = p_key;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no run with key %', p_key USING ERRCODE = '22023';
    END IF;
    INSERT INTO batch_operator_action
        (operator, action, job_key, reason, before_status, after_status, detail,
         target_pids, target_xact_starts)
    VALUES (p_operator, 'terminate-blocker', p_key, p_reason, v_status, v_status, p_detail,
            p_pids, p_xact_starts)
    RETURNING id INTO v_id;
    RETURN v_id;
END;
$function$
