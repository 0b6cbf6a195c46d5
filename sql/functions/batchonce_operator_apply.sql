-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_operator_apply(p_key text, p_action text, p_allowed text[], p_target text, p_message text, p_now timestamp with time zone, p_budget_fallback integer, p_operator text, p_reason text, p_before text)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    v_now timestamptz := batchonce_now(p_now);
    v_before text;
    done text;
    parts smallint;
    child_from text[];
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    IF (p_action, p_target) NOT IN (('fail', 'FAILED'), ('rerun', 'PENDING'), ('skip', 'SKIPPED')) THEN
        RAISE EXCEPTION 'batchonce_operator_apply: % cannot lead to %', p_action, p_target
            USING ERRCODE = '22023';
    END IF;
    IF NOT p_allowed <@ (CASE p_action
            WHEN 'fail' THEN ARRAY['RUNNING', 'PENDING']
            WHEN 'rerun' THEN ARRAY['FAILED', 'SUCCEEDED', 'SKIPPED']
            ELSE ARRAY['PENDING', 'FAILED'] END) THEN
        RAISE EXCEPTION 'batchonce_operator_apply: % is not allowed from %', p_action, p_allowed
            USING ERRCODE = '22023';
    END IF;
    SELECT r.partition_count INTO parts FROM batch_job_run r
    WHERE r.job_key = p_key AND r.partition_of IS NULL;
    -- The partitions are locked before the parent, the order in which a
    -- partition's own change (through the trigger) takes them.
    IF parts IS NOT NULL THEN
        PERFORM 1 FROM batch_job_run r WHERE r.partition_of = p_key
        ORDER BY r.job_key FOR UPDATE;
    END IF;
    -- The state before, under the lock the update below keeps, so no
    -- other change can come between what is audited and what is done.
    SELECT r.status INTO v_before FROM batch_job_run r WHERE r.job_key = p_key FOR UPDATE;
    WITH upd AS (
        UPDATE batch_job_run r
        SET status = p_target,
            finished_at = CASE WHEN p_target = 'PENDING' THEN NULL ELSE v_now END,
            next_run_at = CASE WHEN p_target = 'PENDING' THEN v_now ELSE r.next_run_at END,
            lease_token = CASE WHEN r.status = 'RUNNING' THEN batchonce_new_token()
                               ELSE r.lease_token END,
            lease_expires_at = NULL,
            max_attempts = CASE WHEN p_target = 'PENDING'
                                THEN LEAST(r.attempts + COALESCE(r.attempt_budget, p_budget_fallback), 1000)
                                ELSE r.max_attempts END,
            error_message = left(p_message, 1000)
        WHERE r.job_key = p_key AND r.status = ANY(p_allowed)
        RETURNING r.job_key
    ), attempt AS (
        UPDATE batch_job_attempt a
        SET finished_at = v_now, outcome = 'operator_failed',
            error_message = left(p_message, 1000)
        FROM upd
        WHERE a.job_key = upd.job_key AND a.finished_at IS NULL AND p_target = 'FAILED'
    )
    SELECT job_key::text INTO done FROM upd;
    IF done IS NOT NULL AND parts IS NOT NULL THEN
        child_from := CASE p_action
            WHEN 'fail' THEN ARRAY['RUNNING', 'PENDING']
            WHEN 'skip' THEN ARRAY['PENDING', 'FAILED']
            WHEN 'rerun' THEN CASE WHEN v_before = 'SUCCEEDED'
                                   THEN ARRAY['FAILED', 'SKIPPED', 'SUCCEEDED']
                                   ELSE ARRAY['FAILED', 'SKIPPED'] END
            END;
        WITH c AS (
            UPDATE batch_job_run r
            SET status = p_target,
                finished_at = CASE WHEN p_target = 'PENDING' THEN NULL ELSE v_now END,
                next_run_at = CASE WHEN p_target = 'PENDING' THEN v_now ELSE r.next_run_at END,
                lease_token = CASE WHEN r.status = 'RUNNING' THEN batchonce_new_token()
                                   ELSE r.lease_token END,
                lease_expires_at = NULL,
                max_attempts = CASE WHEN p_target = 'PENDING'
                                    THEN LEAST(r.attempts + COALESCE(r.attempt_budget, p_budget_fallback), 1000)
                                    ELSE r.max_attempts END,
                error_message = left(format('%s of %s: %s', p_action, p_key, p_message), 1000)
            WHERE r.partition_of = p_key AND r.status = ANY(child_from)
            RETURNING r.job_key
        )
        UPDATE batch_job_attempt a
        SET finished_at = v_now, outcome = 'operator_failed',
            error_message = left(p_message, 1000)
        FROM c
        WHERE a.job_key = c.job_key AND a.finished_at IS NULL AND p_target = 'FAILED';
        -- A rerun whose partitions all stand succeeded runs the final step
        -- at once; otherwise the parent waits for them.
        IF p_action = 'rerun' THEN
            UPDATE batch_job_run r
            SET next_run_at = CASE WHEN NOT EXISTS (
                    SELECT 1 FROM batch_job_run c
                    WHERE c.partition_of = p_key AND c.status NOT IN ('SUCCEEDED', 'SKIPPED'))
                THEN v_now ELSE '9999-12-31T00:00:00Z' END
            WHERE r.job_key = p_key;
        END IF;
    END IF;
    IF done IS NOT NULL THEN
        INSERT INTO batch_operator_action
            (operator, action, job_key, reason, before_status, after_status)
        VALUES (p_operator, p_action, p_key, p_reason, v_before, p_target);
    END IF;
    RETURN done;
END;
$function$
