-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_operator_resume(p_job text, p_reason text, p_operator text, p_now timestamp with time zone)
 RETURNS TABLE(paused_at timestamp with time zone, paused_seconds double precision, runs_released bigint, audit_id bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    v_reason text := btrim(p_reason);
    v_old record;
    v_released bigint;
    v_id bigint;
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    v_now := batchonce_now(p_now);
    PERFORM batchonce_operator_pause_check('resume', p_job, p_reason, p_operator);
    -- As for the pause: no writer's entry can land held after the job
    -- resumes.
    LOCK TABLE batch_job_due IN SHARE ROW EXCLUSIVE MODE;
    DELETE FROM batch_job_pause p WHERE p.job_name = p_job
    RETURNING p.paused_at, p.paused_by, p.reason INTO v_old;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'resume refused: job % is not paused; nothing changed', p_job
            USING ERRCODE = 'BO012';
    END IF;
    PERFORM batch_job_due_hold_paused_switch();
    WITH back AS (
        UPDATE batch_job_due d SET next_run_at = r.next_run_at
        FROM batch_job_run r
        WHERE d.job_name = p_job AND r.job_key = d.job_key
          AND d.next_run_at IS DISTINCT FROM r.next_run_at
        RETURNING d.job_key
    )
    SELECT count(*) INTO v_released FROM back;
    INSERT INTO batch_operator_action
        (operator, action, job_key, reason, before_status, after_status, detail)
    VALUES (p_operator, 'resume', p_job || ':*', v_reason, 'PAUSED', 'ACTIVE',
            left(format('resumed: %s PENDING runs claimable again; paused since %s by %s: %s',
                        v_released, v_old.paused_at, v_old.paused_by, v_old.reason), 1000))
    RETURNING id INTO v_id;
    IF v_released > 0 THEN
        PERFORM pg_notify('batchonce_run', '');
    END IF;
    paused_at := v_old.paused_at;
    paused_seconds := extract(epoch FROM v_now - v_old.paused_at)::float8;
    runs_released := v_released;
    audit_id := v_id;
    RETURN NEXT;
END;
$function$
