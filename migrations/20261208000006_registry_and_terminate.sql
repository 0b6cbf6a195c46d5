-- Issue 42, item 5: registry rows and other sessions.
--
-- 1. Each process writes only its own registry rows. Any producer or worker
--    login could rewrite or delete other processes' `batch_worker` and
--    `batch_process_config` rows. Each row now records the login that wrote
--    it (`registered_by`, defaulting to session_user), and row-level
--    security lets a login other than the tables' owner insert, update and
--    delete only its own rows; every role still reads every row (the views
--    need them). The owner is not subject (the tables are not FORCEd).
--    The previous release's processes insert, update and delete their own
--    rows with plain SQL; the column default covers them.
-- 2. Ending a session is audited and limited to a fence holder.
--    `batchonce_operator_audit_terminate_sessions` writes the
--    `terminate-blocker` audit row naming each session (pid and transaction
--    start); `batchonce_operator_terminate` ends, in a later transaction,
--    only the sessions such a committed audit row names that hold the run's
--    row in that transaction, and refuses everything else. The operator role needs no
--    pg_signal_backend: `batchonce roles` makes the function's owner a role
--    no login holds, which has it.

-- Who wrote each row. Rows present now: the login of the process's live
-- session (the sessions carry the process id as application_name), so a
-- running process keeps its row through the upgrade; a row without one is
-- NULL ("unclaimed"), and the first login to write it claims it (below).
ALTER TABLE batch_worker ADD COLUMN registered_by text DEFAULT session_user;
ALTER TABLE batch_process_config ADD COLUMN registered_by text DEFAULT session_user;
UPDATE batch_worker SET registered_by = NULL;
UPDATE batch_worker w SET registered_by = a.usename
FROM (SELECT DISTINCT ON (application_name) application_name, usename::text AS usename
      FROM pg_stat_activity
      WHERE datname = current_database() AND usename IS NOT NULL
        AND pid <> pg_backend_pid()
      ORDER BY application_name, backend_start DESC) a
WHERE a.application_name = w.worker_id;
UPDATE batch_process_config c SET registered_by = w.registered_by
FROM batch_worker w WHERE w.worker_id = c.process_id;

-- An unclaimed row (one written before rows had writers) belongs to the
-- first login that updates it: a process restarted after the upgrade
-- re-registers under its id, whichever release it runs.
CREATE FUNCTION batch_registry_claim() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.registered_by IS NULL THEN
        NEW.registered_by := session_user;
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER batch_worker_claim BEFORE UPDATE ON batch_worker
    FOR EACH ROW EXECUTE FUNCTION batch_registry_claim();
CREATE TRIGGER batch_process_config_claim BEFORE UPDATE ON batch_process_config
    FOR EACH ROW EXECUTE FUNCTION batch_registry_claim();

ALTER TABLE batch_worker ENABLE ROW LEVEL SECURITY;
ALTER TABLE batch_process_config ENABLE ROW LEVEL SECURITY;

-- Every role that may read the table reads every row.
CREATE POLICY batch_worker_read ON batch_worker FOR SELECT USING (true);
-- A login writes rows only as itself.
CREATE POLICY batch_worker_insert ON batch_worker FOR INSERT
    WITH CHECK (registered_by = session_user);
CREATE POLICY batch_worker_update ON batch_worker FOR UPDATE
    USING (registered_by = session_user OR registered_by IS NULL)
    WITH CHECK (registered_by = session_user);
-- Its own rows, unclaimed ones, and those of processes whose promised
-- sign of life passed 30 days ago (each process prunes those at start;
-- worker_registry keeps them that long as evidence for `runs stale`).
CREATE POLICY batch_worker_delete ON batch_worker FOR DELETE
    USING (registered_by = session_user OR registered_by IS NULL
           OR live_until < now() - interval '30 days');

CREATE POLICY batch_process_config_read ON batch_process_config FOR SELECT USING (true);
-- A configuration row is written by the login of its process's row, so no
-- login records a configuration under another process's name.
CREATE POLICY batch_process_config_insert ON batch_process_config FOR INSERT
    WITH CHECK (registered_by = session_user
                AND EXISTS (SELECT 1 FROM batch_worker w
                            WHERE w.worker_id = process_id
                              AND w.registered_by = session_user));
CREATE POLICY batch_process_config_update ON batch_process_config FOR UPDATE
    USING (registered_by = session_user OR registered_by IS NULL)
    WITH CHECK (registered_by = session_user
                AND EXISTS (SELECT 1 FROM batch_worker w
                            WHERE w.worker_id = process_id
                              AND w.registered_by = session_user));
CREATE POLICY batch_process_config_delete ON batch_process_config FOR DELETE
    USING (registered_by = session_user OR registered_by IS NULL);

COMMENT ON COLUMN batch_worker.registered_by IS
    'The login that wrote the row (session_user); only it, or the table owner, may change or delete it. NULL: written before rows recorded their writer; the next login to update it claims it.';
COMMENT ON COLUMN batch_process_config.registered_by IS
    'The login that wrote the row (session_user), which is also its process row''s; only it, or the table owner, may change or delete it.';

-- The sessions a `terminate-blocker` audit row names, each by backend pid
-- and transaction start; NULL for every other action, and for audit rows
-- written by the earlier function (which names them in `detail` only).
ALTER TABLE batch_operator_action
    ADD COLUMN target_pids integer[],
    ADD COLUMN target_xact_starts timestamptz[];
ALTER TABLE batch_operator_action ADD CONSTRAINT batch_operator_action_targets_check
    CHECK ((target_pids IS NULL) = (target_xact_starts IS NULL)
           AND (target_pids IS NULL
                OR (cardinality(target_pids) BETWEEN 1 AND 100
                    AND cardinality(target_pids) = cardinality(target_xact_starts)
                    AND action = 'terminate-blocker')));

-- The audit row of `--terminate-blocker` that names the sessions to end
-- (pid and transaction start, as pg_stat_activity shows them), committed
-- before any is ended. Returns the audit row's id, which
-- `batchonce_operator_terminate` takes; that function decides which of
-- them may be ended.
CREATE FUNCTION batchonce_operator_audit_terminate_sessions(
    p_key text, p_operator text, p_reason text, p_detail text,
    p_pids integer[], p_xact_starts timestamptz[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
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
$$;

-- A named session may be ended only while it is still in the transaction
-- named and holds the run's row in it: the engine's record of open fences
-- says so (batch_fence_held, where another session can see it), or that
-- transaction is the row's locker (its xid is the row's xmax, or one of the
-- lockers of the multixact that xmax names once a heartbeat has locked the
-- row too). Only engine functions lock a run's row (no role may update the
-- table), so such a session is a fence holder or an engine call in
-- progress. Reading other roles' sessions needs pg_read_all_stats.
--
-- Ends the sessions a committed `terminate-blocker` audit row (`p_audit`,
-- written by this login) names, each only while it is still in the
-- transaction named and holds an open fence of the audited run in it.
-- Anything else is refused with one error and nothing is ended: another
-- login's audit row, one written in this very transaction (it could still
-- roll back: the audit must be committed first), one older than five
-- minutes, or a named session that now holds no fence of the run. A named
-- session that has ended or moved on is simply no longer there to end.
-- Returns the pids ended. `batchonce roles` makes a role that no login holds
-- and that has pg_signal_backend the owner of this function.
CREATE FUNCTION batchonce_operator_terminate(p_audit bigint)
RETURNS SETOF integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
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
$$;

DO $$
DECLARE
    f regprocedure;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'batchonce_operator_audit_terminate_sessions(text, text, text, text, integer[], timestamptz[])'::regprocedure,
        'batchonce_operator_terminate(bigint)'::regprocedure,
        'batch_registry_claim()'::regprocedure]
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
