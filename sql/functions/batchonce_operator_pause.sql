-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_operator_pause(p_job text, p_reason text, p_operator text, p_now timestamp with time zone)
 RETURNS TABLE(paused_at timestamp with time zone, runs_held bigint, audit_id bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    v_reason text := btrim(p_reason);
    v_old record;
    v_held bigint;
    v_id bigint;
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    v_now := batchonce_now(p_now);
    PERFORM batchonce_operator_pause_check('pause', p_job, p_reason, p_operator);
    -- Every writer of the list in flight commits first; every later one
    -- waits, then sees the pause row (see the top of this file).
    LOCK TABLE batch_job_due IN SHARE ROW EXCLUSIVE MODE;
    SELECT p.paused_at, p.paused_by, p.reason INTO v_old
    FROM batch_job_pause p WHERE p.job_name = p_job;
    IF FOUND THEN
        RAISE EXCEPTION 'pause refused: job % is already paused (since % by %: %); nothing changed',
            p_job, v_old.paused_at, v_old.paused_by, v_old.reason USING ERRCODE = 'BO012';
    END IF;
    INSERT INTO batch_job_pause (job_name, paused_at, paused_by, reason)
    VALUES (p_job, v_now, p_operator, v_reason);
    PERFORM batch_job_due_hold_paused_switch();
    UPDATE batch_job_due d SET next_run_at = '9999-12-31T00:00:00Z'
    WHERE d.job_name = p_job AND d.next_run_at <> '9999-12-31T00:00:00Z';
    -- The runs held: the job's PENDING runs, read by key from the list.
    SELECT count(*) INTO v_held FROM batch_job_run r
    WHERE r.job_key = ANY (ARRAY(SELECT d.job_key FROM batch_job_due d WHERE d.job_name = p_job))
      AND r.status = 'PENDING';
    INSERT INTO batch_operator_action
        (operator, action, job_key, reason, before_status, after_status, detail)
    VALUES (p_operator, 'pause', p_job || ':*', v_reason, 'ACTIVE', 'PAUSED',
            format('paused: %s PENDING runs held, no new claim until `batchonce jobs resume %s`; RUNNING runs finish',
                   v_held, p_job))
    RETURNING id INTO v_id;
    paused_at := v_now;
    runs_held := v_held;
    audit_id := v_id;
    RETURN NEXT;
END;
$function$
