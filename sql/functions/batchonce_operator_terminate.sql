-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_operator_terminate(p_audit bigint)
 RETURNS SETOF integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    a record;
    t record;
    v_bad text;
    v_xid xid;
    v_xmax xid;
    v_holds boolean;
    v_pids integer[] := '{}';
    v_starts timestamptz[] := '{}';
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    SELECT o.job_key, o.target_pids, o.target_xact_starts, o.session_user_name, o.at
    INTO a
    FROM batch_operator_action o
    WHERE o.id = p_audit AND o.action = 'terminate-blocker' AND o.target_pids IS NOT NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'refused: % is not a committed terminate-blocker audit row naming sessions (batchonce_operator_audit_terminate_sessions writes one; commit it first); nothing was terminated',
            coalesce(p_audit::text, 'NULL') USING ERRCODE = '42501';
    END IF;
    IF a.session_user_name IS DISTINCT FROM session_user::text THEN
        RAISE EXCEPTION 'refused: audit row % was written by %, not by %; nothing was terminated',
            p_audit, a.session_user_name, session_user USING ERRCODE = '42501';
    END IF;
    -- The audit row's time is its transaction's start (the stamp trigger):
    -- a row written in this transaction has this transaction's start, and
    -- one from another transaction is visible only once committed.
    IF a.at >= now() THEN
        RAISE EXCEPTION 'refused: audit row % is not committed yet: commit it before ending a session; nothing was terminated',
            p_audit USING ERRCODE = '42501';
    END IF;
    IF a.at < now() - interval '5 minutes' THEN
        RAISE EXCEPTION 'refused: audit row % is older than five minutes: write a new one; nothing was terminated',
            p_audit USING ERRCODE = '42501';
    END IF;
    -- Each named session still in the named transaction must hold the
    -- run's row in it.
    FOR t IN SELECT u.pid, u.xs FROM unnest(a.target_pids, a.target_xact_starts) AS u(pid, xs) LOOP
        SELECT s.backend_xid INTO v_xid FROM pg_stat_activity s
        WHERE s.pid = t.pid AND s.xact_start = t.xs AND s.backend_type = 'client backend';
        IF NOT FOUND THEN
            CONTINUE;  -- ended, or moved on: no longer there to end
        END IF;
        v_holds := EXISTS (SELECT 1 FROM batch_fence_held f
                           WHERE f.pid = t.pid AND f.xact_start = t.xs AND f.job_key = a.job_key);
        IF NOT v_holds AND v_xid IS NOT NULL THEN
            SELECT r.xmax INTO v_xmax FROM batch_job_run r WHERE r.job_key = a.job_key;
            v_holds := coalesce(v_xmax = v_xid, false);
            IF NOT v_holds AND v_xmax IS NOT NULL AND v_xmax <> '0'::xid THEN
                -- SQL cannot tell a multixact from a transaction id; an
                -- xmax that is no multixact raises, and then the session is
                -- not the locker.
                BEGIN
                    v_holds := EXISTS (SELECT 1 FROM pg_get_multixact_members(v_xmax) m
                                       WHERE m.xid = v_xid);
                EXCEPTION WHEN OTHERS THEN
                    v_holds := false;
                END;
            END IF;
        END IF;
        IF v_holds THEN
            v_pids := v_pids || t.pid;
            v_starts := v_starts || t.xs;
        ELSE
            v_bad := concat_ws('; ', v_bad, format('session %s', t.pid));
        END IF;
    END LOOP;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'refused: % holds no open fence of run % in the transaction audited; nothing was terminated',
            v_bad, a.job_key USING ERRCODE = '42501';
    END IF;
    -- MATERIALIZED: the sessions are chosen before pg_terminate_backend is
    -- called, never pushed onto every session of the server.
    RETURN QUERY
    WITH target AS MATERIALIZED (
        SELECT s.pid FROM pg_stat_activity s
        JOIN unnest(v_pids, v_starts) AS u(pid, xs) ON s.pid = u.pid AND s.xact_start = u.xs
    )
    SELECT target.pid FROM target WHERE pg_terminate_backend(target.pid);
END;
$function$
