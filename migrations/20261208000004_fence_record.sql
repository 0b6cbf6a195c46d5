-- Issue 42, item 3: the database checks item writes, and no raw lease
-- token is stored where another role can read it.
--
-- 1. The fence functions record the fence they open in batch_fence_held
--    (migration 20261208000001): this backend's pid, this transaction's
--    start and the run. Each first removes this backend's rows of earlier
--    transactions; a backend's first fence also sweeps the rows of
--    sessions that are gone, skipping rows another sweep holds, so no fence
--    ever waits for another. A row of a committed transaction stays until
--    its backend fences again: it names a transaction that has ended, and
--    nothing matches it. Each function takes its instant once, from
--    batchonce_now (the database's clock for every login but the owner),
--    and resets `batchonce.in_step` for its transaction first, so a
--    caller's value never reaches its statements (not a function SET
--    clause: only a superuser may attach a custom parameter to a function,
--    and the migrator is not one).
-- 2. batchonce_require_fence(): a BEFORE INSERT OR UPDATE row trigger for
--    item tables that refuses a write (SQLSTATE BO010) unless this
--    transaction holds an open fence of the row's run.
-- 3. batchonce_item_attempt(): the bundled kinds' tables name the attempt
--    that wrote a row by its number; this trigger turns a previous-release
--    write that still carries the raw token into its attempt (the token is
--    a fence: a live one records one), and stores no token.
--
-- Expand only: every signature stays, so the previous release's workers
-- run unchanged (workers/tests/upgrade.rs).

-- The open fence of p_key in this transaction, recorded. The engine's
-- fence functions call it; no role may.
CREATE FUNCTION batchonce_fence_record(p_key text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    v_new boolean;
    v_old integer;
BEGIN
    -- An update of the same run's row (a chunk after a chunk) stays on its
    -- page and writes no index entry.
    INSERT INTO batch_fence_held (pid, xact_start, job_key)
    VALUES (pg_backend_pid(), now(), p_key)
    ON CONFLICT (pid, job_key) DO UPDATE SET xact_start = EXCLUDED.xact_start
    RETURNING xmax = 0 INTO v_new;
    DELETE FROM batch_fence_held
    WHERE pid = pg_backend_pid() AND xact_start <> now();
    GET DIAGNOSTICS v_old = ROW_COUNT;
    IF v_new AND v_old = 0 THEN
        -- This backend held no row: its first fence (or its first since a
        -- rollback). Rows of backends that no longer exist go; a row
        -- another sweep has locked is left to it.
        DELETE FROM batch_fence_held h
        WHERE h.ctid = ANY (ARRAY(
            SELECT g.ctid FROM batch_fence_held g
            WHERE g.pid <> pg_backend_pid()
              AND NOT EXISTS (SELECT 1 FROM pg_stat_get_activity(NULL) a WHERE a.pid = g.pid)
            FOR UPDATE SKIP LOCKED));
    END IF;
END;
$$;

-- Opens a fence: locks the run FOR KEY SHARE if and only if the caller
-- holds its lease, records it, and names the session (pid, transaction
-- start) so a worker that abandons the transaction can end it. No row:
-- lease lost.
CREATE OR REPLACE FUNCTION batchonce_fence_open(p_key text, p_token bigint, p_now timestamptz)
RETURNS TABLE (pid integer, xact_start timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := batchonce_now(p_now);
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    PERFORM 1 FROM batch_job_run
    WHERE job_key = p_key AND lease_token = p_token AND status = 'RUNNING'
      AND lease_expires_at > v_now
    FOR KEY SHARE;
    IF FOUND THEN
        PERFORM batchonce_fence_record(p_key);
        RETURN QUERY SELECT pg_backend_pid(), now();
    END IF;
END;
$$;

-- A fenced transaction's commit: the run's and the attempt's counters, and
-- the lease extended by the run's own lease length (progress is proof of
-- life). The caller's p_ttl counts only for a run the previous release
-- enqueued, which stores none, and then within 1 s to 24 h. Returns the
-- runs updated: 1, or 0 when the caller no longer holds the lease.
CREATE OR REPLACE FUNCTION batchonce_fence_commit(p_key text, p_token bigint, p_processed bigint,
                                                  p_failed bigint, p_ttl float8, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    -- The commit, not the transaction's start: a long chunk must not commit
    -- an already-expired lease.
    v_now timestamptz := CASE WHEN p_now IS NULL THEN clock_timestamp()
                              ELSE batchonce_now(p_now) END;
    v_ttl interval := make_interval(secs => LEAST(GREATEST(COALESCE(p_ttl, 1), 1), 86400));
    n integer;
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    IF p_processed < 0 OR p_failed < 0 THEN
        RAISE EXCEPTION 'batchonce_fence_commit: counts cannot be negative (% processed, % failed)',
            p_processed, p_failed USING ERRCODE = '22023';
    END IF;
    UPDATE batch_job_run
    SET processed_count = processed_count + p_processed,
        failed_count = failed_count + p_failed,
        heartbeat_at = v_now,
        lease_expires_at = GREATEST(lease_expires_at, v_now + COALESCE(lease_ttl, v_ttl))
    WHERE job_key = p_key AND lease_token = p_token AND status = 'RUNNING';
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n = 1 THEN
        UPDATE batch_job_attempt
        SET processed_count = processed_count + p_processed,
            failed_count = failed_count + p_failed
        WHERE job_key = p_key AND lease_token = p_token;
    END IF;
    RETURN n;
END;
$$;

-- The fence for programs (command jobs): as before, and recorded.
CREATE OR REPLACE FUNCTION batchonce_fence(p_job_key text, p_lease_token bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    PERFORM 1 FROM batch_job_run
    WHERE job_key = p_job_key
      AND lease_token = p_lease_token
      AND status = 'RUNNING'
      AND lease_expires_at > v_now
    FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'batchonce: lease lost for % (token %): the run was taken over, expired or finished; nothing in this transaction may commit',
            p_job_key, p_lease_token
            USING ERRCODE = 'BO001';
    END IF;
    PERFORM batchonce_fence_record(p_job_key);
END;
$$;

-- A program's progress: adds to the run's and the attempt's counters, in
-- the caller's fenced transaction, if and only if it holds the lease.
CREATE OR REPLACE FUNCTION batchonce_progress(p_job_key text, p_lease_token bigint,
                                              p_processed bigint, p_failed bigint DEFAULT 0)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF p_processed < 0 OR p_failed < 0 THEN
        RAISE EXCEPTION 'batchonce_progress: counts cannot be negative (% processed, % failed)',
            p_processed, p_failed USING ERRCODE = '22023';
    END IF;
    PERFORM batchonce_fence(p_job_key, p_lease_token);
    UPDATE batch_job_run
    SET processed_count = processed_count + p_processed,
        failed_count = failed_count + p_failed
    WHERE job_key = p_job_key AND lease_token = p_lease_token AND status = 'RUNNING';
    UPDATE batch_job_attempt
    SET processed_count = processed_count + p_processed,
        failed_count = failed_count + p_failed
    WHERE job_key = p_job_key AND lease_token = p_lease_token;
END;
$$;

-- Records an attempt's output, named by its own token (it decides nothing
-- by time); the body of 20261203000005 after the reset of the setting.
CREATE OR REPLACE FUNCTION batchonce_attempt_output(p_key text, p_token bigint, p_output text)
RETURNS TABLE (processed bigint, failed bigint)
LANGUAGE sql VOLATILE SECURITY DEFINER AS $$
    SELECT set_config('batchonce.in_step', 'off', true);
    UPDATE batch_job_attempt
    SET output_tail = COALESCE(left(p_output, 4000), output_tail)
    WHERE job_key = p_key AND lease_token = p_token
    RETURNING processed_count, failed_count;
$$;

-- The fence the database checks. Attach it to an item table:
--
--   CREATE TRIGGER my_item_fence BEFORE INSERT OR UPDATE ON my_item
--       FOR EACH ROW EXECUTE FUNCTION batchonce_require_fence();          -- key in job_key
--       FOR EACH ROW EXECUTE FUNCTION batchonce_require_fence('run_key');  -- or another column
--
-- A write is accepted only if this transaction holds an open fence of the
-- row's run (batchonce_fence_open, batchonce_fence or batchonce_progress
-- recorded it). A row whose key is NULL (the previous release's writes to
-- a table that gained the column) takes the key of the one run this
-- transaction holds a fence of. A login that may update the run table
-- itself (the previous release's workers during the expand step of an
-- upgrade, and the owner) fenced the old way, by locking the run row: a
-- RUNNING run this transaction has locked counts as its fence. The owner
-- may write unfenced on purpose (batchonce_unfenced).
CREATE FUNCTION batchonce_require_fence() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_col text := COALESCE(TG_ARGV[0], 'job_key');
    v_key text;
    v_held text;
    v_n integer;
BEGIN
    IF TG_NARGS = 0 THEN
        v_key := NEW.job_key;
    ELSE
        IF NOT (to_jsonb(NEW) ? v_col) THEN
            RAISE EXCEPTION 'batchonce_require_fence: table %.% has no column % (the trigger''s argument names the column that holds the run''s key)',
                TG_TABLE_SCHEMA, TG_TABLE_NAME, v_col USING ERRCODE = '42703';
        END IF;
        v_key := to_jsonb(NEW) ->> v_col;
    END IF;
    IF v_key IS NOT NULL THEN
        PERFORM 1 FROM batch_fence_held
        WHERE pid = pg_backend_pid() AND job_key = v_key AND xact_start = now();
        IF FOUND THEN
            RETURN NEW;
        END IF;
        IF batchonce_legacy_fence() IS NOT DISTINCT FROM v_key OR batchonce_unfenced() THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'batchonce: a write to %.% for run % outside its fence: this transaction holds no open fence of that run (open one with batchonce_fence(job_key, lease_token) first; only the attempt holding the lease may write its items)',
            TG_TABLE_SCHEMA, TG_TABLE_NAME, v_key USING ERRCODE = 'BO010';
    END IF;
    SELECT min(job_key), count(*) INTO v_held, v_n FROM batch_fence_held
    WHERE pid = pg_backend_pid() AND xact_start = now();
    IF v_n = 0 THEN
        v_held := batchonce_legacy_fence();
        v_n := CASE WHEN v_held IS NULL THEN 0 ELSE 1 END;
    END IF;
    IF v_n <> 1 AND batchonce_unfenced() THEN
        RETURN NEW;
    END IF;
    IF v_n <> 1 THEN
        RAISE EXCEPTION 'batchonce: a write to %.% without a run key (column %) and % open fences in this transaction: it takes the key of the one run whose fence this transaction holds',
            TG_TABLE_SCHEMA, TG_TABLE_NAME, v_col, v_n USING ERRCODE = 'BO010';
    END IF;
    IF TG_NARGS = 0 THEN
        NEW.job_key := v_held;
    ELSE
        NEW := jsonb_populate_record(NEW, jsonb_build_object(v_col, v_held));
    END IF;
    RETURN NEW;
END;
$$;

COMMENT ON FUNCTION batchonce_require_fence() IS
    'Row trigger for item tables (BEFORE INSERT OR UPDATE; optional argument: the column holding the run key, default job_key): refuses a write with SQLSTATE BO010 unless this transaction holds an open fence of the row''s run.';

-- The schema's owner may write outside a fence on purpose, in one
-- transaction, by `SET LOCAL batchonce.unfenced = on` (a demo's seed, a
-- test that damages data to see the oracle catch it). The owner could drop
-- the trigger anyway; for any other login the setting means nothing.
CREATE FUNCTION batchonce_unfenced() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT COALESCE(current_setting('batchonce.unfenced', true) = 'on', false)
           AND pg_has_role(session_user, current_user, 'MEMBER')
$$;

-- The previous release's fence: a login that may update the run table
-- itself locked the run row (FOR NO KEY UPDATE) and never recorded it.
-- Returns the key of the one RUNNING run this transaction has locked, and
-- records its fence; NULL for any other login, or without such a lock.
CREATE FUNCTION batchonce_legacy_fence() RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
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
$$;

-- The bundled kinds' item tables (and any table with job_key, attempt and
-- lease_token columns) name the attempt that wrote a row by its number.
-- The previous release's workers still send the raw token: it becomes the
-- attempt's number, and the row stores no token. A token that is the run's
-- live lease is that worker's fence (it locked the run row), recorded here
-- so batchonce_require_fence accepts its rows. An update that keeps the
-- attempt (the previous release's upserts copy the token, which arrives
-- here already converted) gets the attempt holding the fence.
CREATE FUNCTION batchonce_item_attempt() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_attempt integer;
BEGIN
    IF NEW.lease_token IS NOT NULL THEN
        SELECT a.attempt INTO v_attempt FROM batch_job_attempt a
        WHERE a.job_key = NEW.job_key AND a.lease_token = NEW.lease_token;
        PERFORM 1 FROM batch_job_run r
        WHERE r.job_key = NEW.job_key AND r.lease_token = NEW.lease_token
          AND r.status = 'RUNNING' AND r.lease_expires_at > now()
        FOR KEY SHARE;
        IF FOUND THEN
            PERFORM batchonce_fence_record(NEW.job_key);
        END IF;
        NEW.attempt := v_attempt;
        NEW.lease_token := NULL;
    ELSIF TG_OP = 'UPDATE' THEN
        SELECT r.attempts INTO v_attempt FROM batch_job_run r
        WHERE r.job_key = NEW.job_key AND r.status = 'RUNNING'
          AND EXISTS (SELECT 1 FROM batch_fence_held h
                      WHERE h.pid = pg_backend_pid() AND h.job_key = r.job_key
                        AND h.xact_start = now());
        IF FOUND THEN
            NEW.attempt := v_attempt;
        END IF;
    END IF;
    RETURN NEW;
END;
$$;

COMMENT ON FUNCTION batchonce_item_attempt() IS
    'Row trigger for the bundled kinds'' item tables: a previous-release write carrying lease_token stores its attempt number instead (and records its fence if the token is the live lease).';

-- Every function above resolves names in this schema and is closed to
-- PUBLIC; `batchonce roles` grants the worker and program roles their own.
-- The trigger functions run as their owner whoever writes the table.
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'batchonce_fence_record(text)',
        'batchonce_fence_open(text, bigint, timestamptz)',
        'batchonce_fence_commit(text, bigint, bigint, bigint, float8, timestamptz)',
        'batchonce_fence(text, bigint)',
        'batchonce_progress(text, bigint, bigint, bigint)',
        'batchonce_attempt_output(text, bigint, text)',
        'batchonce_require_fence()',
        'batchonce_legacy_fence()',
        'batchonce_unfenced()',
        'batchonce_item_attempt()'
    ] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
