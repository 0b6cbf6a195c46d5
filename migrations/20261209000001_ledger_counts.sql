-- Issue 43: a ledger of years. Every operator view, the exporter and the
-- claim cost what is open, not what is history.
--
-- The ledger keeps every run forever, and no index of batch_job_run may
-- name a column the claim or the finish changes (20261207000001: their
-- updates must stay HOT), so status cannot be indexed, not even in a
-- partial index's predicate. The views counted runs per job and status by
-- reading every run instead: 4 s for `status` at 2,000,000 runs. What they
-- need now lives in small tables kept in step in the transaction that
-- changes a run, like the due and running lists:
--
--   batch_job_failed  the FAILED runs (open work for an operator), so the
--                     views list and count them, and find the newest
--                     failure, without reading the ledger;
--   batch_job_tally   how many runs each job has SUCCEEDED and SKIPPED
--                     (partitions apart), as rows to be summed: a change
--                     appends a row (+n or -n), and batchonce_fold_tally
--                     folds them into one row per job, outcome and kind.
--                     Appending, not updating one counter row, is what
--                     keeps concurrent finishes from waiting on each
--                     other. Each row also keeps the newest finished_at
--                     it counted: when the job last succeeded.
--
-- PENDING and RUNNING runs are counted from the due and running lists.
-- Every count stays exact: the same transaction that changes a run writes
-- its rows, and testing::assert_lists_in_step compares them with the
-- ledger after every test that checks the lists (the fault suite's oracle
-- among them).
--
-- Who keeps them: the tally, the finish (which runs with `batchonce.in_step`
-- on, the row trigger skipped) for the runs it finishes, and the row
-- trigger batch_job_run_keep_lists for every other UPDATE (recovery, an
-- operator's action, a partitioned run's parent, the previous release's
-- statements); the failed list, the row trigger batch_job_run_failed_list
-- for every UPDATE into or out of FAILED; and for both, two statement
-- triggers for INSERT and DELETE, which see every inserted or deleted row
-- at once (an enqueue of calendar-skipped runs, an archive) and append one
-- row per job and outcome.
--
-- Expand only: the previous release's workers call the same functions
-- (batchonce_finish is replaced with the same signature and result) and
-- their direct statements are kept in step by the triggers.

-- Nobody changes a run while the tables are filled and the triggers
-- created; readers go on.
LOCK TABLE batch_job_run IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE batch_job_failed (
    job_key       varchar(120) NOT NULL,
    job_name      varchar(64)  NOT NULL,
    business_date date         NOT NULL,
    -- What the views need of a FAILED run besides its key, so that counting
    -- and dating the failures, and finding the periods they hold back,
    -- reads this list alone: a partition, a scoped run, its period, and
    -- when it failed (its finished_at).
    part          boolean      NOT NULL,
    scoped        boolean      NOT NULL,
    period_start  timestamptz,
    failed_at     timestamptz,
    CONSTRAINT batch_job_failed_pkey PRIMARY KEY (job_key)
);
-- The order every run list shows, newest business date first: a page of
-- FAILED runs reads the page, however many runs failed.
CREATE INDEX batch_job_failed_job_idx ON batch_job_failed (job_name, business_date DESC, job_key);
CREATE INDEX batch_job_failed_date_idx ON batch_job_failed (business_date DESC, job_key);
COMMENT ON TABLE batch_job_failed IS
    'The FAILED runs of batch_job_run (a list kept in step by the finish and the triggers of batch_job_run; the run row is the truth).';

CREATE TABLE batch_job_tally (
    job_name           varchar(64) NOT NULL,
    status             varchar(20) NOT NULL,
    -- Partitions of partitioned runs are counted apart from runs.
    part               boolean     NOT NULL,
    runs               bigint      NOT NULL,
    newest_finished_at timestamptz,
    CONSTRAINT batch_job_tally_status_check CHECK (status IN ('SUCCEEDED', 'SKIPPED'))
);
COMMENT ON TABLE batch_job_tally IS
    'Runs per job that SUCCEEDED or were SKIPPED, as rows to be summed (appended in the transaction that changes a run, folded by batchonce_fold_tally).';

INSERT INTO batch_job_failed
SELECT job_key, job_name, business_date, partition_of IS NOT NULL, scope IS NOT NULL,
       period_start, finished_at
FROM batch_job_run WHERE status = 'FAILED';
INSERT INTO batch_job_tally (job_name, status, part, runs, newest_finished_at)
SELECT job_name, status, partition_of IS NOT NULL, count(*), max(finished_at)
FROM batch_job_run WHERE status IN ('SUCCEEDED', 'SKIPPED') GROUP BY 1, 2, 3;

-- A scoped job's periods newest first, one probe a period: its newest
-- periods for the views, and its newest period done, the first one no open
-- scope holds back (skipping the periods the lists say are open) without
-- reading the runs of the ones it skips. An unscoped run adds no entry.
-- Neither column changes after enqueue (a legacy run's context is frozen
-- once), so the claim's and the finish's updates stay HOT. (An unscoped
-- job's newest period done is read through batch_job_run_job_name_idx.)
CREATE INDEX batch_job_run_scoped_period_idx ON batch_job_run (job_name, period_start)
    WHERE scope IS NOT NULL;

-- The row trigger's bookkeeping, now with the tally. Everything else is as
-- in 20261207000001.
CREATE OR REPLACE FUNCTION batch_job_run_keep_lists() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND (TG_OP = 'DELETE' OR OLD.job_key <> NEW.job_key
                                          OR (OLD.status = 'PENDING' AND NEW.status <> 'PENDING')) THEN
        DELETE FROM batch_job_due d WHERE d.job_key = ANY (ARRAY(
            SELECT d2.job_key FROM batch_job_due d2 WHERE d2.job_key = OLD.job_key
            FOR UPDATE SKIP LOCKED));
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') AND (TG_OP = 'DELETE' OR OLD.job_key <> NEW.job_key
                                          OR (OLD.status = 'RUNNING' AND NEW.status <> 'RUNNING')) THEN
        DELETE FROM batch_job_running WHERE job_key = OLD.job_key;
    END IF;
    -- Inserted and deleted runs are counted by the statement triggers.
    IF TG_OP = 'UPDATE' AND (OLD.status IS DISTINCT FROM NEW.status
                             OR OLD.job_key <> NEW.job_key OR OLD.job_name <> NEW.job_name
                             OR OLD.business_date <> NEW.business_date
                             OR (OLD.partition_of IS NULL) <> (NEW.partition_of IS NULL)) THEN
        IF OLD.status IN ('SUCCEEDED', 'SKIPPED') THEN
            INSERT INTO batch_job_tally VALUES (OLD.job_name, OLD.status, OLD.partition_of IS NOT NULL, -1, NULL);
        END IF;
        IF NEW.status IN ('SUCCEEDED', 'SKIPPED') THEN
            INSERT INTO batch_job_tally
            VALUES (NEW.job_name, NEW.status, NEW.partition_of IS NOT NULL, 1, NEW.finished_at);
        END IF;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN NULL;
    END IF;
    IF NEW.status = 'PENDING' THEN
        INSERT INTO batch_job_due VALUES (NEW.job_key, NEW.job_name, NEW.next_run_at, NEW.scope IS NOT NULL)
        ON CONFLICT (job_key) DO UPDATE
        SET job_name = EXCLUDED.job_name, next_run_at = EXCLUDED.next_run_at, scoped = EXCLUDED.scoped;
    ELSIF NEW.status = 'RUNNING' THEN
        INSERT INTO batch_job_running VALUES (NEW.job_key, NEW.job_name)
        ON CONFLICT (job_key) DO NOTHING;
    END IF;
    RETURN NULL;
END;
$$;

-- The same trigger, also fired by a change of the columns the tally is
-- keyed by (none of which the claim or the finish sets).
DROP TRIGGER batch_job_run_keep_lists ON batch_job_run;
CREATE TRIGGER batch_job_run_keep_lists
    AFTER INSERT OR UPDATE OF job_key, job_name, business_date, status, next_run_at, scope,
                              partition_of ON batch_job_run
    FOR EACH ROW WHEN (current_setting('batchonce.in_step', true) IS DISTINCT FROM 'on'
                       OR (NEW.partition_count IS NOT NULL AND NEW.partition_of IS NULL))
    EXECUTE FUNCTION batch_job_run_keep_lists();

-- The failed list, for every writer, the claim and the finish included: a
-- run that becomes FAILED, stops being FAILED, or changes what the list
-- says of it while FAILED. The WHEN is evaluated without calling the
-- function, so a run that neither was nor is FAILED costs nothing more.
CREATE FUNCTION batch_job_run_failed_list() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF OLD.status = 'FAILED' THEN
        DELETE FROM batch_job_failed WHERE job_key = OLD.job_key;
    END IF;
    IF NEW.status = 'FAILED' THEN
        INSERT INTO batch_job_failed
        VALUES (NEW.job_key, NEW.job_name, NEW.business_date, NEW.partition_of IS NOT NULL,
                NEW.scope IS NOT NULL, NEW.period_start, NEW.finished_at)
        ON CONFLICT (job_key) DO UPDATE
        SET job_name = EXCLUDED.job_name, business_date = EXCLUDED.business_date,
            part = EXCLUDED.part, scoped = EXCLUDED.scoped,
            period_start = EXCLUDED.period_start, failed_at = EXCLUDED.failed_at;
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER batch_job_run_failed_list
    AFTER UPDATE OF status, job_key, job_name, business_date, partition_of, scope,
                    period_start, finished_at ON batch_job_run
    FOR EACH ROW WHEN ((OLD.status = 'FAILED' OR NEW.status = 'FAILED')
                       AND (OLD.status IS DISTINCT FROM NEW.status
                            OR OLD.job_key <> NEW.job_key OR OLD.job_name <> NEW.job_name
                            OR OLD.business_date <> NEW.business_date
                            OR OLD.partition_of IS DISTINCT FROM NEW.partition_of
                            OR OLD.scope IS DISTINCT FROM NEW.scope
                            OR OLD.period_start IS DISTINCT FROM NEW.period_start
                            OR OLD.finished_at IS DISTINCT FROM NEW.finished_at))
    EXECUTE FUNCTION batch_job_run_failed_list();

-- Inserted runs, all of one statement at once: an enqueue of 10,000 runs
-- appends one tally row per job and outcome, not 10,000.
CREATE FUNCTION batch_job_run_tally_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    INSERT INTO batch_job_tally (job_name, status, part, runs, newest_finished_at)
    SELECT i.job_name, i.status, i.partition_of IS NOT NULL, count(*), max(i.finished_at)
    FROM inserted i WHERE i.status IN ('SUCCEEDED', 'SKIPPED') GROUP BY 1, 2, 3;
    INSERT INTO batch_job_failed
    SELECT i.job_key, i.job_name, i.business_date, i.partition_of IS NOT NULL,
           i.scope IS NOT NULL, i.period_start, i.finished_at
    FROM inserted i WHERE i.status = 'FAILED'
    ON CONFLICT (job_key) DO UPDATE
    SET job_name = EXCLUDED.job_name, business_date = EXCLUDED.business_date,
        part = EXCLUDED.part, scoped = EXCLUDED.scoped,
        period_start = EXCLUDED.period_start, failed_at = EXCLUDED.failed_at;
    RETURN NULL;
END;
$$;
CREATE TRIGGER batch_job_run_tally_insert
    AFTER INSERT ON batch_job_run REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION batch_job_run_tally_insert();

-- Deleted runs, likewise (a run deleted by `runs delete`, or archived).
CREATE FUNCTION batch_job_run_tally_delete() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    INSERT INTO batch_job_tally (job_name, status, part, runs, newest_finished_at)
    SELECT d.job_name, d.status, d.partition_of IS NOT NULL, -count(*), NULL
    FROM deleted d WHERE d.status IN ('SUCCEEDED', 'SKIPPED') GROUP BY 1, 2, 3;
    DELETE FROM batch_job_failed f
    WHERE f.job_key IN (SELECT d.job_key FROM deleted d WHERE d.status = 'FAILED');
    RETURN NULL;
END;
$$;
CREATE TRIGGER batch_job_run_tally_delete
    AFTER DELETE ON batch_job_run REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION batch_job_run_tally_delete();

-- Folds the tally into one row per job, outcome and kind, when it holds
-- more; returns how many rows it folded (0 when another fold holds the
-- lock, or there was nothing to fold). The sums never change, so any
-- worker may call it: each worker's recovery loop does. A reader sees the
-- rows before or after a fold, never a mix (one statement). Rows appended
-- by transactions still open are not seen, so not folded: they are folded
-- next time.
CREATE FUNCTION batchonce_fold_tally() RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    v_rows bigint;
    v_keys bigint;
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    IF NOT pg_try_advisory_xact_lock('batch_job_tally'::regclass::oid::integer, 43) THEN
        RETURN 0;
    END IF;
    SELECT count(*), count(DISTINCT (t.job_name, t.status, t.part)) INTO v_rows, v_keys
    FROM batch_job_tally t;
    IF v_rows <= v_keys THEN
        RETURN 0;
    END IF;
    WITH gone AS (
        DELETE FROM batch_job_tally RETURNING *
    ), kept AS (
        INSERT INTO batch_job_tally (job_name, status, part, runs, newest_finished_at)
        SELECT g.job_name, g.status, g.part, sum(g.runs), max(g.newest_finished_at)
        FROM gone g GROUP BY 1, 2, 3
        -- A job that has none left keeps its row while it says when the job
        -- last succeeded.
        HAVING sum(g.runs) <> 0 OR max(g.newest_finished_at) IS NOT NULL
    )
    SELECT count(*) INTO v_rows FROM gone;
    RETURN v_rows;
END;
$$;
COMMENT ON FUNCTION batchonce_fold_tally() IS
    'Folds batch_job_tally into one row per job, outcome and kind (the sums stay); called by every worker''s recovery loop.';

-- The finish of 20261208000002, also counting the SUCCEEDED and SKIPPED
-- runs it finishes in the tally. The failed list is the trigger's
-- (batch_job_run_failed_list), which opens it only when a run fails: a
-- relation the finish names is locked, with its indexes, on every call, and
-- past 16 of them a transaction's locks leave PostgreSQL's per-backend fast
-- path for the shared lock table, where 32 workers wait on each other.
CREATE OR REPLACE FUNCTION batchonce_finish(p_keys text[], p_tokens bigint[], p_kinds text[],
                                            p_messages text[], p_delays float8[], p_now timestamptz)
RETURNS TABLE (job_key text, status text, expired boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    v_now := batchonce_now(p_now);
    IF EXISTS (SELECT 1 FROM unnest(p_kinds) k
               WHERE k NOT IN ('succeeded', 'skipped', 'retry', 'fatal', 'release')) THEN
        RAISE EXCEPTION 'batchonce_finish: unknown finish kind' USING ERRCODE = '22023';
    END IF;
    PERFORM set_config('batchonce.in_step', 'on', true);
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
               r.lease_expires_at <= v_now AS expired
        FROM f
        JOIN batch_job_run r ON r.job_key = f.job_key AND r.lease_token = f.token
        -- The keys again, as a condition on the run table alone: whatever
        -- join the planner picks, it reads the run table by these keys.
        WHERE r.job_key = ANY (p_keys)
          AND r.status = 'RUNNING'
        -- Rows are locked in key order, so two batches can never wait on
        -- each other in a cycle.
        ORDER BY r.job_key
        FOR NO KEY UPDATE OF r
    ), upd AS (
        UPDATE batch_job_run r
        SET status = next.status,
            -- At most 7 days (604,800 s) later: the cap of backoff_max and
            -- of a handler's RetryAfter. NaN is greater than any number, so
            -- it is cut to the cap too.
            next_run_at = CASE WHEN next.status = 'PENDING'
                               THEN v_now + make_interval(secs => LEAST(
                                        GREATEST(COALESCE(next.delay, 0), 0), 604800))
                               ELSE r.next_run_at END,
            finished_at = CASE WHEN next.status = 'PENDING' THEN NULL
                               ELSE v_now END,
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
          AND r.job_key = ANY (p_keys)
        RETURNING r.job_key, r.job_name, r.status, r.next_run_at, r.scope,
                  r.business_date, r.finished_at, r.period_start,
                  -- A partitioned run's parent is counted by the trigger,
                  -- which keeps it in step whoever changes it.
                  (r.partition_count IS NOT NULL AND r.partition_of IS NULL) AS parent,
                  r.partition_of IS NOT NULL AS part,
                  next.token, next.kind, next.message, next.expired
    ), attempt AS (
        UPDATE batch_job_attempt a
        SET finished_at = v_now,
            outcome = CASE
                        WHEN upd.kind = 'retry' AND upd.status = 'PENDING' THEN 'retried'
                        WHEN upd.kind = 'retry' THEN 'failed'
                        WHEN upd.kind = 'release' THEN 'released'
                        ELSE upd.kind END,
            error_message = left(upd.message, 1000)
        FROM upd
        WHERE a.job_key = upd.job_key AND a.lease_token = upd.token
          AND a.job_key = ANY (p_keys)
    ), gone AS (
        DELETE FROM batch_job_running l USING upd
        WHERE l.job_key = upd.job_key AND l.job_key = ANY (p_keys)
    ), due AS (
        INSERT INTO batch_job_due (job_key, job_name, next_run_at, scoped)
        SELECT upd.job_key, upd.job_name, upd.next_run_at, upd.scope IS NOT NULL
        FROM upd WHERE upd.status = 'PENDING'
        ON CONFLICT (job_key) DO UPDATE SET next_run_at = EXCLUDED.next_run_at
    ), tally AS (
        -- One row per job and outcome of this call, however many runs it
        -- finished: concurrent finishes append and never wait on each other.
        INSERT INTO batch_job_tally (job_name, status, part, runs, newest_finished_at)
        SELECT upd.job_name, upd.status, upd.part, count(*), max(upd.finished_at)
        FROM upd WHERE upd.status IN ('SUCCEEDED', 'SKIPPED') AND NOT upd.parent
        GROUP BY 1, 2, 3
    )
    SELECT u.job_key::text, u.status::text, u.expired FROM upd u;
    PERFORM set_config('batchonce.in_step', 'off', true);
END;
$$;

-- Lease-expiry recovery: the listed keys first, then the runs by key

-- CREATE OR REPLACE keeps only the settings it names: the finish's plan
-- settings (20261207000002) and its pinned search path (20261208000005),
-- and the new functions' paths.
ALTER FUNCTION batchonce_finish(text[], bigint[], text[], text[], float8[], timestamptz)
    SET enable_seqscan = off;
ALTER FUNCTION batchonce_finish(text[], bigint[], text[], text[], float8[], timestamptz)
    SET enable_nestloop = off;
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'batchonce_finish(text[], bigint[], text[], text[], float8[], timestamptz)'::regprocedure,
        'batch_job_run_keep_lists()'::regprocedure,
        'batch_job_run_failed_list()'::regprocedure,
        'batch_job_run_tally_insert()'::regprocedure,
        'batch_job_run_tally_delete()'::regprocedure,
        'batchonce_fold_tally()'::regprocedure]
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
    -- Owner-rights functions are no one's to call but the roles'
    -- `roles --apply` grants them to (the fold: the worker).
    FOREACH f IN ARRAY ARRAY[
        'batch_job_run_failed_list()'::regprocedure,
        'batch_job_run_tally_insert()'::regprocedure,
        'batch_job_run_tally_delete()'::regprocedure,
        'batchonce_fold_tally()'::regprocedure]
    LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
