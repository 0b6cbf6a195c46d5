-- The database enforces who may change a run (issue 16). Until now every
-- role that takes part had UPDATE or INSERT on the run table, so a worker
-- could move a run it never claimed to SUCCEEDED, a producer could insert a
-- finished run, and an operator could change a status without an audit row:
-- only our code's good manners stood in the way.
--
-- Every change of state is now a function that checks what the caller
-- presents and runs with its owner's rights (SECURITY DEFINER, search path
-- pinned to the schema it lives in). `batchonce roles` grants each role
-- only its own functions and takes the direct writes away:
--
--   worker:   claim, heartbeat, fence (open, commit), finish, recover,
--             freeze a context; every one but claim and recover takes the
--             run's current lease token, which only its claimer learns;
--   producer: enqueue, which inserts PENDING runs, or SKIPPED ones with a
--             calendar reason, and nothing else;
--   operator: check, apply (state, attempt and audit row in one), and the
--             audited terminate-blocker row;
--   program:  the fence and progress functions for a command job's own
--             transactions (a command job's program, narrower than a worker).
--
-- The bodies are the statements `src/queue/` used to send; the queue module
-- now calls these functions, and it is still the only caller. Expand, then
-- contract: the previous release's workers keep sending their statements,
-- which work as long as their role keeps its old privileges; re-apply
-- `batchonce roles` only when the deploy is complete (docs/upgrading.md).

-- A lease token is the capability to change a run, so it is no longer a
-- counter a caller can guess from its own: 59 random bits from
-- gen_random_uuid (a strong source), unique by constraint. Nothing compares
-- tokens by size.
CREATE FUNCTION batchonce_new_token() RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT ('x' || substr(translate(gen_random_uuid()::text, '-', ''), 1, 16))::bit(64)::bigint
           & 9223372036854775807
$$;

-- The claim: the due PENDING runs of the caller's jobs (through
-- batchonce_due_runs), RUNNING with a new token, and their attempt rows.
CREATE FUNCTION batchonce_claim(p_jobs text[], p_ttls float8[], p_limit bigint,
                                p_worker text, p_now timestamptz)
RETURNS TABLE (job_key text, job_name text, business_date date, attempts integer,
               max_attempts integer, lease_token bigint, lease_expires_at timestamptz,
               processed_count bigint, payload jsonb, started_at timestamptz,
               timezone text, period_start timestamptz, period_end timestamptz, covers text,
               lease_ttl_s float8, stale_after_s float8, on_lease_expiry text,
               chunk_size integer, backoff_s float8, backoff_max_s float8,
               max_item_failures bigint, attempt_budget integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
BEGIN
    IF p_worker IS NULL OR char_length(p_worker) NOT BETWEEN 1 AND 80 THEN
        RAISE EXCEPTION 'batchonce_claim: a worker id of 1 to 80 characters is required';
    END IF;
    RETURN QUERY
    WITH picked AS (
        SELECT batchonce_due_runs(p_jobs, p_limit, COALESCE(p_now, now())) AS job_key
    ), claimed AS (
        UPDATE batch_job_run r
        SET status = 'RUNNING',
            attempts = r.attempts + 1,
            lease_token = batchonce_new_token(),
            lease_owner = p_worker,
            -- The run's own lease length; the claimer's only for a run the
            -- previous release enqueued without one.
            lease_expires_at = COALESCE(p_now, now()) + COALESCE(r.lease_ttl, make_interval(secs => (
                SELECT c.ttl FROM unnest(p_jobs, p_ttls) AS c(n, ttl)
                WHERE c.n = r.job_name LIMIT 1))),
            heartbeat_at = COALESCE(p_now, now()),
            heartbeat_processed = r.processed_count,
            started_at = COALESCE(p_now, now()),
            finished_at = NULL
        -- An array of keys, not a join: a join's estimate of the picked
        -- rows made the cached plan hash the whole table.
        WHERE r.job_key = ANY (ARRAY(SELECT job_key FROM picked))
        RETURNING r.*
    ), attempt AS (
        INSERT INTO batch_job_attempt (job_key, attempt, lease_token, worker_id, started_at)
        SELECT c.job_key, c.attempts, c.lease_token, p_worker, c.started_at FROM claimed c
    )
    SELECT c.job_key::text, c.job_name::text, c.business_date, c.attempts, c.max_attempts,
           c.lease_token, c.lease_expires_at, c.processed_count, c.payload, c.started_at,
           c.timezone, c.period_start, c.period_end, c.covers::text,
           extract(epoch FROM c.lease_ttl)::float8, extract(epoch FROM c.stale_after)::float8,
           c.on_lease_expiry::text, c.chunk_size,
           extract(epoch FROM c.backoff)::float8, extract(epoch FROM c.backoff_max)::float8,
           c.max_item_failures, c.attempt_budget
    FROM claimed c;
END;
$$;

-- The heartbeat: extends each lease the caller presents the current token
-- of; says of each whether it was extended, or is still the caller's but
-- its update lock is taken (busy), or is gone.
CREATE FUNCTION batchonce_heartbeat(p_keys text[], p_tokens bigint[], p_ttls float8[],
                                    p_now timestamptz)
RETURNS TABLE (job_key text, extended boolean, mine boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH h AS (
        SELECT * FROM unnest(p_keys, p_tokens, p_ttls) AS h(job_key, token, ttl)
    ), mine AS (
        SELECT r.job_key FROM batch_job_run r JOIN h
          ON r.job_key = h.job_key AND r.lease_token = h.token
        WHERE r.status = 'RUNNING'
    ), locked AS (
        SELECT r.job_key FROM batch_job_run r JOIN h
          ON r.job_key = h.job_key AND r.lease_token = h.token
        WHERE r.status = 'RUNNING'
        FOR NO KEY UPDATE OF r SKIP LOCKED
    ), ext AS (
        UPDATE batch_job_run r
        SET heartbeat_at = COALESCE(p_now, now()),
            heartbeat_processed = r.processed_count,
            lease_expires_at = COALESCE(p_now, now()) + make_interval(secs => h.ttl)
        FROM h, locked
        WHERE r.job_key = h.job_key AND r.job_key = locked.job_key
        RETURNING r.job_key
    )
    SELECT h.job_key::text,
           EXISTS (SELECT 1 FROM ext e WHERE e.job_key = h.job_key),
           EXISTS (SELECT 1 FROM mine m WHERE m.job_key = h.job_key)
    FROM h;
END;
$$;

-- Opens a fence: locks the run FOR KEY SHARE if and only if the caller
-- holds its lease, and names the session (pid, transaction start) so a
-- worker that abandons the transaction can end it. No row: lease lost.
CREATE FUNCTION batchonce_fence_open(p_key text, p_token bigint, p_now timestamptz)
RETURNS TABLE (pid integer, xact_start timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT pg_backend_pid(), now() FROM batch_job_run
    WHERE job_key = p_key AND lease_token = p_token AND status = 'RUNNING'
      AND lease_expires_at > COALESCE(p_now, now())
    FOR KEY SHARE;
END;
$$;

-- A fenced transaction's commit: the run's and the attempt's counters, and
-- the lease extended (progress is proof of life). Returns the runs updated:
-- 1, or 0 when the caller no longer holds the lease.
CREATE FUNCTION batchonce_fence_commit(p_key text, p_token bigint, p_processed bigint,
                                       p_failed bigint, p_ttl float8, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    n integer;
BEGIN
    UPDATE batch_job_run
    SET processed_count = processed_count + p_processed,
        failed_count = failed_count + p_failed,
        -- clock_timestamp(), not now(): now() is when this chunk's
        -- transaction began, and a long chunk must not commit an
        -- already-expired lease.
        heartbeat_at = COALESCE(p_now, clock_timestamp()),
        lease_expires_at = GREATEST(lease_expires_at,
                                    COALESCE(p_now, clock_timestamp())
                                    + make_interval(secs => p_ttl))
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

-- The fence for programs (command jobs), as before but able to lock the
-- row for roles without UPDATE on the table.
CREATE OR REPLACE FUNCTION batchonce_fence(p_job_key text, p_lease_token bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM 1 FROM batch_job_run
    WHERE job_key = p_job_key
      AND lease_token = p_lease_token
      AND status = 'RUNNING'
      AND lease_expires_at > clock_timestamp()
    FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'batchonce: lease lost for % (token %): the run was taken over, expired or finished; nothing in this transaction may commit',
            p_job_key, p_lease_token
            USING ERRCODE = 'BO001';
    END IF;
END;
$$;

-- A program's progress: adds to the run's and the attempt's counters, in
-- the caller's fenced transaction, if and only if it holds the lease.
-- Raises like batchonce_fence otherwise, so nothing of the transaction can
-- commit.
CREATE FUNCTION batchonce_progress(p_job_key text, p_lease_token bigint,
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

-- Ends attempts, each conditional on its own (job_key, lease_token); see
-- queue::finish_many_detailed for the kinds.
CREATE FUNCTION batchonce_finish(p_keys text[], p_tokens bigint[], p_kinds text[],
                                 p_messages text[], p_delays float8[], p_now timestamptz)
RETURNS TABLE (job_key text, status text, expired boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_kinds) k
               WHERE k NOT IN ('succeeded', 'skipped', 'retry', 'fatal', 'release')) THEN
        RAISE EXCEPTION 'batchonce_finish: unknown finish kind' USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    WITH f AS (
        SELECT * FROM unnest(p_keys, p_tokens, p_kinds, p_messages, p_delays)
            AS f(job_key, token, kind, message, delay)
    ), next AS (
        SELECT r.job_key, f.token, f.kind, f.message, f.delay,
               CASE
                 WHEN f.kind = 'succeeded' THEN 'SUCCEEDED'
                 WHEN f.kind = 'skipped' THEN 'SKIPPED'
                 WHEN f.kind = 'release' THEN 'PENDING'
                 WHEN f.kind = 'retry' AND r.attempts < r.max_attempts THEN 'PENDING'
                 ELSE 'FAILED'
               END AS status,
               r.lease_expires_at <= COALESCE(p_now, now()) AS expired
        FROM f
        JOIN batch_job_run r ON r.job_key = f.job_key AND r.lease_token = f.token
        WHERE r.status = 'RUNNING'
        -- Rows are locked in key order, so two batches can never wait on
        -- each other in a cycle.
        ORDER BY r.job_key
        FOR NO KEY UPDATE OF r
    ), upd AS (
        UPDATE batch_job_run r
        SET status = next.status,
            next_run_at = CASE WHEN next.status = 'PENDING'
                               THEN COALESCE(p_now, now()) + make_interval(secs => GREATEST(next.delay, 0))
                               ELSE r.next_run_at END,
            finished_at = CASE WHEN next.status = 'PENDING' THEN NULL
                               ELSE COALESCE(p_now, now()) END,
            lease_expires_at = NULL,
            -- A released run gets a new token at once, so nothing still
            -- running under the old one can commit.
            lease_token = CASE WHEN next.kind = 'release' THEN batchonce_new_token()
                               ELSE r.lease_token END,
            -- A release is not a failure: the budget grows by the attempt
            -- it used, so attempts never exceed max_attempts.
            max_attempts = CASE WHEN next.kind = 'release'
                                THEN LEAST(r.max_attempts + 1, 1000)
                                ELSE r.max_attempts END,
            error_message = CASE WHEN next.kind = 'succeeded' THEN NULL
                                 WHEN next.kind = 'release' THEN r.error_message
                                 ELSE left(next.message, 1000) END
        FROM next
        WHERE r.job_key = next.job_key
        RETURNING r.job_key, r.status, next.token, next.kind, next.message, next.expired
    ), attempt AS (
        UPDATE batch_job_attempt a
        SET finished_at = COALESCE(p_now, now()),
            outcome = CASE
                        WHEN upd.kind = 'retry' AND upd.status = 'PENDING' THEN 'retried'
                        WHEN upd.kind = 'retry' THEN 'failed'
                        WHEN upd.kind = 'release' THEN 'released'
                        ELSE upd.kind END,
            error_message = left(upd.message, 1000)
        FROM upd
        WHERE a.job_key = upd.job_key AND a.lease_token = upd.token
    )
    SELECT u.job_key::text, u.status::text, u.expired FROM upd u;
END;
$$;

-- Lease-expiry recovery of the caller's jobs, by each run's stored policy
-- (p_legacy: the jobs under `retry` in the caller's file, for runs that
-- store none). FOR UPDATE SKIP LOCKED leaves a run whose holder has a fence
-- open until the fence ends.
CREATE FUNCTION batchonce_recover_expired(p_jobs text[], p_legacy text[], p_now timestamptz)
RETURNS TABLE (job_key text, status text, old_owner text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH expired AS (
        SELECT r.job_key, r.lease_token AS old_token, r.lease_owner AS old_owner
        FROM batch_job_run r
        WHERE r.status = 'RUNNING'
          AND r.lease_expires_at <= COALESCE(p_now, now())
          AND r.job_name = ANY(p_jobs)
          AND COALESCE(r.on_lease_expiry,
                       CASE WHEN r.job_name = ANY(p_legacy) THEN 'retry' ELSE 'hold' END) = 'retry'
        FOR UPDATE SKIP LOCKED
    ), upd AS (
        UPDATE batch_job_run r
        SET status = CASE WHEN r.attempts < r.max_attempts THEN 'PENDING' ELSE 'FAILED' END,
            next_run_at = COALESCE(p_now, now()),
            finished_at = CASE WHEN r.attempts < r.max_attempts THEN NULL
                               ELSE COALESCE(p_now, now()) END,
            lease_token = batchonce_new_token(),
            lease_expires_at = NULL,
            error_message = left('lease expired: worker ' || coalesce(e.old_owner, '?')
                                 || ' stopped heartbeating', 1000)
        FROM expired e
        WHERE r.job_key = e.job_key
        RETURNING r.job_key, r.status, e.old_owner
    ), attempt AS (
        UPDATE batch_job_attempt a
        SET finished_at = COALESCE(p_now, now()),
            outcome = 'lease_expired',
            error_message = 'lease expired without a heartbeat'
        FROM expired e
        WHERE a.job_key = e.job_key AND a.lease_token = e.old_token
          AND a.finished_at IS NULL
    )
    SELECT u.job_key::text, u.status::text, u.old_owner::text FROM upd u;
END;
$$;

-- Freezes the context of a run the caller holds, if it has none (enqueued
-- by the previous release), and returns the run's context either way.
CREATE FUNCTION batchonce_freeze_context(p_key text, p_token bigint,
    p_tz text, p_ps timestamptz, p_pe timestamptz, p_cov text, p_ttl float8,
    p_stale float8, p_exp text, p_chunk integer, p_bo float8, p_bomax float8,
    p_mif bigint, p_budget integer)
RETURNS TABLE (timezone text, period_start timestamptz, period_end timestamptz, covers text,
               lease_ttl_s float8, stale_after_s float8, on_lease_expiry text,
               chunk_size integer, backoff_s float8, backoff_max_s float8,
               max_item_failures bigint, attempt_budget integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
BEGIN
    UPDATE batch_job_run r
    SET timezone = p_tz, period_start = p_ps, period_end = p_pe, covers = p_cov,
        lease_ttl = make_interval(secs => p_ttl), stale_after = make_interval(secs => p_stale),
        on_lease_expiry = p_exp, chunk_size = p_chunk, backoff = make_interval(secs => p_bo),
        backoff_max = make_interval(secs => p_bomax), max_item_failures = p_mif,
        attempt_budget = p_budget
    WHERE r.job_key = p_key AND r.lease_token = p_token AND r.timezone IS NULL;
    RETURN QUERY
    SELECT r.timezone, r.period_start, r.period_end, r.covers::text,
           extract(epoch FROM r.lease_ttl)::float8, extract(epoch FROM r.stale_after)::float8,
           r.on_lease_expiry::text, r.chunk_size,
           extract(epoch FROM r.backoff)::float8, extract(epoch FROM r.backoff_max)::float8,
           r.max_item_failures, r.attempt_budget
    FROM batch_job_run r WHERE r.job_key = p_key AND r.lease_token = p_token;
END;
$$;

-- Enqueue: inserts PENDING runs, or SKIPPED ones where a calendar reason is
-- given, never anything else; existing keys are left alone. Notifies idle
-- workers if anything was inserted. Returns the keys inserted.
CREATE FUNCTION batchonce_enqueue(p_keys text[], p_names text[], p_dates date[],
    p_maxes integer[], p_payloads jsonb[], p_now timestamptz, p_reasons text[],
    p_tz text[], p_ps timestamptz[], p_pe timestamptz[], p_cov text[], p_ttl float8[],
    p_stale float8[], p_exp text[], p_chunk integer[], p_bo float8[], p_bomax float8[],
    p_mif bigint[], p_budget integer[])
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    inserted text[];
BEGIN
    WITH ins AS (
        INSERT INTO batch_job_run
            (job_key, job_name, business_date, max_attempts, payload, next_run_at, enqueued_at,
             status, finished_at, error_message,
             timezone, period_start, period_end, covers, lease_ttl, stale_after,
             on_lease_expiry, chunk_size, backoff, backoff_max, max_item_failures,
             attempt_budget)
        SELECT k, n, d, m, p, COALESCE(p_now, now()), COALESCE(p_now, now()),
               CASE WHEN why IS NULL THEN 'PENDING' ELSE 'SKIPPED' END,
               CASE WHEN why IS NULL THEN NULL ELSE COALESCE(p_now, now()) END,
               left(why, 1000),
               tz, ps, pe, cov, make_interval(secs => ttl), make_interval(secs => stale),
               exp, chunk, make_interval(secs => bo), make_interval(secs => bomax), mif, budget
        FROM unnest(p_keys, p_names, p_dates, p_maxes, p_payloads, p_reasons,
                    p_tz, p_ps, p_pe, p_cov, p_ttl, p_stale, p_exp, p_chunk, p_bo, p_bomax,
                    p_mif, p_budget)
             AS c(k, n, d, m, p, why, tz, ps, pe, cov, ttl, stale, exp, chunk, bo, bomax,
                  mif, budget)
        ON CONFLICT (job_key) DO NOTHING
        RETURNING job_key
    )
    SELECT array_agg(job_key::text) INTO inserted FROM ins;
    IF inserted IS NOT NULL THEN
        PERFORM pg_notify('batchonce_run', '');
        RETURN QUERY SELECT unnest(inserted);
    END IF;
END;
$$;

-- The state of a run for an operator action, and whether it is past its
-- stale_after or its lease expired; locks the row FOR UPDATE when asked to
-- (to act), so it waits for the holder's open fence.
CREATE FUNCTION batchonce_operator_check(p_key text, p_stale_fallback float8,
                                         p_now timestamptz, p_lock boolean)
RETURNS TABLE (status text, stale boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
BEGIN
    IF p_lock THEN
        RETURN QUERY
        SELECT r.status::text,
               (r.lease_expires_at <= COALESCE(p_now, now())
                OR r.started_at < COALESCE(p_now, now())
                   - COALESCE(r.stale_after, make_interval(secs => p_stale_fallback))) IS TRUE
        FROM batch_job_run r WHERE r.job_key = p_key FOR UPDATE;
    ELSE
        RETURN QUERY
        SELECT r.status::text,
               (r.lease_expires_at <= COALESCE(p_now, now())
                OR r.started_at < COALESCE(p_now, now())
                   - COALESCE(r.stale_after, make_interval(secs => p_stale_fallback))) IS TRUE
        FROM batch_job_run r WHERE r.job_key = p_key;
    END IF;
END;
$$;

-- An operator action: the run's new state (fencing a RUNNING holder with a
-- new token), the open attempt closed for `fail`, and the audit row, in one
-- call, so no state changes without its row. Returns the key, or NULL when
-- the run was not in an allowed state.
CREATE FUNCTION batchonce_operator_apply(p_key text, p_action text, p_allowed text[],
    p_target text, p_message text, p_now timestamptz, p_budget_fallback integer,
    p_operator text, p_reason text, p_before text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    done text;
BEGIN
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
    WITH upd AS (
        UPDATE batch_job_run r
        SET status = p_target,
            finished_at = CASE WHEN p_target = 'PENDING' THEN NULL ELSE COALESCE(p_now, now()) END,
            next_run_at = CASE WHEN p_target = 'PENDING' THEN COALESCE(p_now, now()) ELSE r.next_run_at END,
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
        SET finished_at = COALESCE(p_now, now()), outcome = 'operator_failed',
            error_message = left(p_message, 1000)
        FROM upd
        WHERE a.job_key = upd.job_key AND a.finished_at IS NULL AND p_target = 'FAILED'
    )
    SELECT job_key::text INTO done FROM upd;
    IF done IS NOT NULL THEN
        INSERT INTO batch_operator_action
            (operator, action, job_key, reason, before_status, after_status)
        VALUES (p_operator, p_action, p_key, p_reason, p_before, p_target);
    END IF;
    RETURN done;
END;
$$;

-- The audit row of `--terminate-blocker`, committed before any session is
-- ended; it changes no state.
CREATE FUNCTION batchonce_operator_audit_terminate(p_key text, p_operator text,
                                                   p_reason text, p_detail text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
BEGIN
    INSERT INTO batch_operator_action
        (operator, action, job_key, reason, before_status, after_status, detail)
    SELECT p_operator, 'terminate-blocker', r.job_key, p_reason, r.status, r.status, p_detail
    FROM batch_job_run r WHERE r.job_key = p_key;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no run with key %', p_key USING ERRCODE = '22023';
    END IF;
END;
$$;

-- Takes the run's row FOR NO KEY UPDATE for `--terminate-blocker`, which
-- shares it with the fence it is about to end and makes every later writer
-- queue behind the operator's action (queue::blockers says why).
CREATE FUNCTION batchonce_operator_hold_row(p_key text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
BEGIN
    PERFORM 1 FROM batch_job_run WHERE job_key = p_key FOR NO KEY UPDATE;
END;
$$;

-- The audit row's time and session are the database's, whatever a client
-- sends, even the table owner.
CREATE FUNCTION batch_operator_action_stamp() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.at := now();
    NEW.session_user_name := session_user;
    RETURN NEW;
END;
$$;

CREATE TRIGGER batch_operator_action_stamp
    BEFORE INSERT ON batch_operator_action
    FOR EACH ROW EXECUTE FUNCTION batch_operator_action_stamp();

-- Every function resolves names in the schema it was created in, never
-- through the caller's search path; none is executable by PUBLIC: `batchonce
-- roles` grants each role its own.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = current_schema()::regnamespace
          AND (p.proname LIKE 'batchonce\_%' OR p.proname LIKE 'batch\_operator\_action\_%')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
