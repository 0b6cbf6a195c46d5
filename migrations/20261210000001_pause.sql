-- Issue 44: pause and resume a job. `batchonce jobs pause JOB` (or the
-- console's button) stops the job's runs from being claimed; the producer
-- still enqueues them, so nothing is missed, and a run already RUNNING
-- finishes as usual. `batchonce jobs resume JOB` makes them claimable again,
-- in their claim order. Both are audited like every operator action.
--
-- How. Every claim, of this release and of the previous ones
-- (batchonce_claim3, batchonce_claim2 through it, batchonce_claim through
-- batchonce_due_runs, batchonce_due_runs3 for other callers), picks from the
-- due list batch_job_due and takes only entries whose next_run_at has come.
-- While a job is paused, its entries there carry next_run_at = 9999-12-31
-- (a finite instant every release decodes, the one a partitioned parent
-- waits at), so no claim takes them. Nothing in the claim or the finish
-- changes, and neither of them gains a relation to lock. The run rows keep
-- their real next_run_at, which stays the truth: resume puts each entry
-- back to its run's.
--
-- Who holds an entry out. A paused job's runs reach the due list from
-- every writer: an enqueue, an operator's rerun, lease-expiry recovery and
-- a partitioned parent whose partitions are done (all through the row
-- trigger batch_job_run_keep_lists), and a retry or a release re-queued by
-- the finish, which writes the list itself. Two statement triggers on
-- batch_job_due (one per event, the rule for transition tables) push the
-- new and upserted entries of paused jobs to the far date at the end of
-- each statement. They return at once when the statement listed nothing
-- still due (an upsert's empty half, a finish that re-queued nothing, their
-- own update: the pause table is not read) and when no job is paused, and
-- they update only entries not already at the far date.
--
-- The triggers are enabled only while a job is paused: the pause enables
-- them and the resume of the last paused job disables them, each under the
-- lock below, in the same transaction as its change of the pause table. A
-- disabled trigger is never called, so while no job is paused the due list
-- costs what it did. Enabled, they cost a call per statement, and the list-
-- keeping trigger lists each run in a statement of its own: an enqueue of
-- 10,000 runs through `batchonce_enqueue2` took 1.2-1.8 s instead of
-- 0.7-1.0 s on one busy machine (and a probe of the pause table inside the
-- list-keeping trigger, the other way considered, cost 30 % of an enqueue
-- with no job paused).
--
-- Races. The pause locks batch_job_due in SHARE ROW EXCLUSIVE mode before it
-- pushes the job's entries out, and so does the resume before it puts them
-- back: every transaction that has written the list commits first (and its
-- entries are seen), and every one that writes it next waits, then meets
-- the triggers as the pause or resume left them and reads the pause row as
-- it committed. The lock
-- also holds claims back for the moment the pause takes; the command line
-- waits for it at most a few seconds (src/queue/pause.rs). A writer in a
-- REPEATABLE READ transaction that began before a pause committed would not
-- see it; no engine writer uses one.
--
-- Expand only: the previous release's processes never read the pause table;
-- their claims skip a paused job's entries by the date alone. This
-- migration widens the audit table's action check, so with the
-- least-privilege roles in use it needs the administrator first
-- (docs/upgrading.md), as 20261209000002 did.

CREATE TABLE batch_job_pause (
    job_name  varchar(64)  NOT NULL,
    paused_at timestamptz  NOT NULL,
    paused_by varchar(80)  NOT NULL,
    reason    varchar(500) NOT NULL,
    CONSTRAINT batch_job_pause_pkey PRIMARY KEY (job_name),
    CONSTRAINT batch_job_pause_job_name_check
        CHECK (job_name ~ '^[a-z0-9]+(-[a-z0-9]+)*$'),
    CONSTRAINT batch_job_pause_paused_at_check
        CHECK (isfinite(paused_at) AND paused_at >= '2000-01-01'),
    -- The audit table's rules for who and why (20260901000002,
    -- 20261203000002): printable, bounded, not blank.
    CONSTRAINT batch_job_pause_paused_by_check
        CHECK (char_length(paused_by) BETWEEN 1 AND 80
               AND paused_by !~ '[\u0001-\u001f\u007f-\u009f\u00ad\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069\ufeff]'),
    CONSTRAINT batch_job_pause_reason_check
        CHECK (char_length(btrim(reason)) BETWEEN 1 AND 500
               AND reason !~ '[\u0001-\u001f\u007f-\u009f\u00ad\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069\ufeff]')
);
COMMENT ON TABLE batch_job_pause IS
    'Paused jobs (`batchonce jobs pause`): their entries in batch_job_due are held at 9999-12-31 so no claim takes them; written only by batchonce_operator_pause and batchonce_operator_resume.';

-- The pause and resume actions. Every existing row satisfies the wider
-- check, so the new constraint is added before the old one is dropped.
ALTER TABLE batch_operator_action ADD CONSTRAINT batch_operator_action_action_check3
    CHECK (action IN ('fail', 'rerun', 'skip', 'terminate-blocker', 'archive', 'pause', 'resume'));
ALTER TABLE batch_operator_action DROP CONSTRAINT batch_operator_action_action_check2;

-- Pushes the entries a statement listed or upserted, of jobs that are
-- paused, to the far date. Only rows of the transition table are updated,
-- which this transaction has just written and so already holds: it never
-- waits for another session.
CREATE FUNCTION batch_job_due_hold_paused() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    -- Nothing listed that is still due (an upsert's empty half, a finish
    -- that re-queued nothing, this function's own update): the pause table
    -- is not read at all.
    IF NOT EXISTS (SELECT FROM batch_job_due_listed n
                   WHERE n.next_run_at <> '9999-12-31T00:00:00Z') THEN
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT FROM batch_job_pause) THEN
        RETURN NULL;
    END IF;
    UPDATE batch_job_due d SET next_run_at = '9999-12-31T00:00:00Z'
    WHERE d.job_key = ANY (ARRAY(
            SELECT n.job_key FROM batch_job_due_listed n
            JOIN batch_job_pause p ON p.job_name = n.job_name
            WHERE n.next_run_at <> '9999-12-31T00:00:00Z'))
      AND d.next_run_at <> '9999-12-31T00:00:00Z';
    RETURN NULL;
END;
$$;

CREATE TRIGGER batch_job_due_hold_paused_insert
    AFTER INSERT ON batch_job_due
    REFERENCING NEW TABLE AS batch_job_due_listed
    FOR EACH STATEMENT EXECUTE FUNCTION batch_job_due_hold_paused();
CREATE TRIGGER batch_job_due_hold_paused_update
    AFTER UPDATE ON batch_job_due
    REFERENCING NEW TABLE AS batch_job_due_listed
    FOR EACH STATEMENT EXECUTE FUNCTION batch_job_due_hold_paused();
-- No job is paused yet.
ALTER TABLE batch_job_due DISABLE TRIGGER batch_job_due_hold_paused_insert;
ALTER TABLE batch_job_due DISABLE TRIGGER batch_job_due_hold_paused_update;

-- Enables the two triggers above while a job is paused and disables them
-- while none is: the caller holds the due list's lock and has just changed
-- the pause table. (ALTER TABLE … TRIGGER takes the same lock the caller
-- holds, and only the table's owner may run it: the pause and the resume
-- run as the owner.)
CREATE FUNCTION batch_job_due_hold_paused_switch() RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_on boolean := EXISTS (SELECT FROM batch_job_pause);
    v_trigger text;
BEGIN
    FOREACH v_trigger IN ARRAY ARRAY['batch_job_due_hold_paused_insert',
                                     'batch_job_due_hold_paused_update'] LOOP
        IF EXISTS (SELECT FROM pg_trigger t
                   WHERE t.tgrelid = 'batch_job_due'::regclass AND t.tgname = v_trigger
                     AND (t.tgenabled <> 'D') <> v_on) THEN
            EXECUTE format('ALTER TABLE batch_job_due %s TRIGGER %I',
                           CASE WHEN v_on THEN 'ENABLE' ELSE 'DISABLE' END, v_trigger);
        END IF;
    END LOOP;
END;
$$;

-- Checks what a pause or a resume is given (SQLSTATE 22023, writing
-- nothing): a job name, a job the database knows (declared by `migrate`, or
-- with runs), a reason of 1 to 500 characters after trimming and an
-- operator of 1 to 80. The audit row's constraints refuse unprintable text.
-- Called only by the two functions below, which run as the owner.
CREATE FUNCTION batchonce_operator_pause_check(p_verb text, p_job text, p_reason text,
                                               p_operator text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF p_job IS NULL OR char_length(p_job) > 64 OR p_job !~ '^[a-z0-9]+(-[a-z0-9]+)*$' THEN
        RAISE EXCEPTION '% refused: % is not a job name (1-64 lowercase letters, digits and single dashes)',
            p_verb, coalesce(quote_literal(left(p_job, 80)), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF p_reason IS NULL OR char_length(btrim(p_reason)) NOT BETWEEN 1 AND 500 THEN
        RAISE EXCEPTION '% refused: a reason of 1 to 500 characters is required', p_verb
            USING ERRCODE = '22023';
    END IF;
    IF p_operator IS NULL OR char_length(p_operator) NOT BETWEEN 1 AND 80 THEN
        RAISE EXCEPTION '% refused: an operator of 1 to 80 characters is required', p_verb
            USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT FROM batch_job_declared j WHERE j.job_name = p_job)
       AND NOT EXISTS (SELECT FROM batch_job_run r WHERE r.job_name = p_job)
       AND NOT EXISTS (SELECT FROM batch_job_pause p WHERE p.job_name = p_job) THEN
        RAISE EXCEPTION '% refused: unknown job %: it is not declared (`batchonce migrate`) and has no runs',
            p_verb, p_job USING ERRCODE = '22023';
    END IF;
END;
$$;

-- Pauses p_job: records who, when (the database clock) and why, holds
-- every due entry of the job at the far date and writes one audit row
-- (`job:*`, ACTIVE -> PAUSED). A job already paused is refused with
-- SQLSTATE BO012, naming who paused it, and nothing is written.
CREATE FUNCTION batchonce_operator_pause(p_job text, p_reason text, p_operator text,
                                         p_now timestamptz)
RETURNS TABLE (paused_at timestamptz, runs_held bigint, audit_id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
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
$$;

-- Resumes p_job: deletes its pause row, puts each of its due entries back
-- to its run's next_run_at (claimable in claim order again), wakes idle
-- workers and writes one audit row (`job:*`, PAUSED -> ACTIVE). A job that
-- is not paused is refused with SQLSTATE BO012 and nothing is written.
CREATE FUNCTION batchonce_operator_resume(p_job text, p_reason text, p_operator text,
                                          p_now timestamptz)
RETURNS TABLE (paused_at timestamptz, paused_seconds float8, runs_released bigint,
               audit_id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
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
$$;

-- Pinned, like every engine function, and for no caller but the roles
-- `batchonce roles` grants (pause and resume: the operator and the
-- console).
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = current_schema()::regnamespace
          AND p.proname IN ('batch_job_due_hold_paused', 'batch_job_due_hold_paused_switch',
                            'batchonce_operator_pause_check',
                            'batchonce_operator_pause', 'batchonce_operator_resume')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
