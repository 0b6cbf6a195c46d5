-- Issue 42, item 1: the engine's functions took their "now" from whoever
-- called them, so a worker login could claim runs that were not yet due,
-- recover leases that had not expired, and a producer could enqueue a run
-- that never becomes due. The clock a test injects (`Clock::At`) stays,
-- for the schema's owner only: a login that could write the tables
-- directly gains nothing by it. Every other caller gets the database's
-- clock, or one clear error if it names another.
--
-- Each engine function that a role may call reads its instant through
-- this function once, at its start (migrations 20261208000002 on).
-- Inside a SECURITY DEFINER function `current_user` is the function's
-- owner and `session_user` the login that called it; a superuser is a
-- member of every role.
CREATE FUNCTION batchonce_now(p_now timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_now IS NULL THEN
        RETURN now();
    END IF;
    IF pg_has_role(session_user, current_user, 'MEMBER') THEN
        RETURN p_now;
    END IF;
    RAISE EXCEPTION 'batchonce: % may not choose the engine''s clock: only the schema''s owner may (tests do); pass NULL and the database''s clock decides',
        session_user USING ERRCODE = '42501';
END;
$$;

COMMENT ON FUNCTION batchonce_now(timestamptz) IS
    'The instant an engine function decides with: now(), or p_now when the calling login is a member of the function owner''s role (tests'' injected clock); any other login naming an instant gets SQLSTATE 42501.';

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION batchonce_now(timestamptz) SET search_path = %I, pg_temp',
                   current_schema());
    REVOKE EXECUTE ON FUNCTION batchonce_now(timestamptz) FROM PUBLIC;
END
$$;

-- Issue 42, items 3 and 5: which transaction holds an open fence of which
-- run, recorded by the engine's fence functions (SECURITY DEFINER; no role
-- may read or write this table). A transaction is named by its backend's
-- pid and its start (`now()` inside it, `xact_start` in pg_stat_activity),
-- the pair `queue::blockers` names sessions by: a pid the server gives to
-- a later session never matches, because that session's transactions
-- start later. A row of a transaction that has ended means nothing and is
-- removed lazily. Unlogged: it describes live transactions only, which a
-- crash or a failover ends anyway, and it costs no WAL.
--   - `batchonce_require_fence()` (item tables' trigger) accepts a write
--     only if this transaction has a row for the written row's run;
--   - the operator's audited end of a session accepts only a session that
--     has a row for the run the operator acts on, in its current
--     transaction.
CREATE UNLOGGED TABLE batch_fence_held (
    pid        integer      NOT NULL,
    xact_start timestamptz  NOT NULL,
    job_key    varchar(120) NOT NULL,
    CONSTRAINT batch_fence_held_pkey PRIMARY KEY (pid, job_key)
);
COMMENT ON TABLE batch_fence_held IS
    'The open fences: backend pid and transaction start of the transaction that opened a fence of job_key (engine functions only; rows of ended transactions are stale and removed lazily).';
