-- Issue 44: an operator enqueues the periods a job's schedule expected and
-- that have no run at all (MISSING on the console's calendar), with a
-- reason, audited one row per run. Expand only: one new function and a
-- wider action check; the previous release never calls the one nor writes
-- the new action.
--
-- Like 20261209000002, this changes the audit table (its action check),
-- so with the least-privilege roles in use it needs the administrator
-- first (docs/upgrading.md).

-- The enqueue action, beside the pause and resume actions of
-- 20261210000001. Every existing row satisfies the wider check, so the new
-- constraint is added before the old one is dropped.
ALTER TABLE batch_operator_action ADD CONSTRAINT batch_operator_action_action_check4
    CHECK (action IN ('fail', 'rerun', 'skip', 'terminate-blocker', 'archive', 'pause', 'resume',
                      'enqueue'));
ALTER TABLE batch_operator_action DROP CONSTRAINT batch_operator_action_action_check3;

-- An operator's enqueue of whole, unscoped runs: through batchonce_enqueue2,
-- so its checks are the producer's. That function decides whom to trust by
-- `session_user`, which a SECURITY DEFINER function does not change: an
-- operator's or the console's login is checked against the declaration
-- (batch_job_declared) and the documented bounds exactly as a producer's
-- login is, although this function runs as the owner. The payload is
-- always empty, and the clock always the database's (batchonce_now(NULL)).
-- One audit row per run inserted, in this transaction: the state before is
-- MISSING (there was no run), after it the run's (PENDING, or SKIPPED for a
-- period the stored calendar skips). A key that exists already (live or
-- archived) is a duplicate: no run, no audit row. Returns the runs
-- inserted.
CREATE FUNCTION batchonce_operator_enqueue(p_keys text[], p_names text[], p_dates date[],
    p_maxes integer[], p_reasons text[],
    p_tz text[], p_ps timestamptz[], p_pe timestamptz[], p_cov text[], p_ttl float8[],
    p_stale float8[], p_exp text[], p_chunk integer[], p_bo float8[], p_bomax float8[],
    p_mif bigint[], p_budget integer[], p_parts integer[],
    p_operator text, p_reason text)
RETURNS TABLE (job_key text, status text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    inserted text[];
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    IF cardinality(p_keys) IS NULL OR cardinality(p_keys) NOT BETWEEN 1 AND 400 THEN
        RAISE EXCEPTION 'batchonce_operator_enqueue: give 1 to 400 runs, not %',
            COALESCE(cardinality(p_keys), 0) USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_keys) k WHERE strpos(k, '@') > 0 OR strpos(k, '.') > 0) THEN
        RAISE EXCEPTION 'batchonce_operator_enqueue: whole, unscoped runs only (no scope or partition in a key)'
            USING ERRCODE = '22023';
    END IF;
    IF p_operator IS NULL OR char_length(p_operator) NOT BETWEEN 1 AND 80
       OR p_reason IS NULL OR char_length(p_reason) NOT BETWEEN 1 AND 500 THEN
        RAISE EXCEPTION 'batchonce_operator_enqueue: an operator (1 to 80 characters) and a reason (1 to 500) are required'
            USING ERRCODE = '22023';
    END IF;
    inserted := ARRAY(
        SELECT e FROM batchonce_enqueue2(
            p_keys, p_names, p_dates, p_maxes,
            array_fill('{}'::jsonb, ARRAY[cardinality(p_keys)]),
            NULL::timestamptz, p_reasons, p_tz, p_ps, p_pe, p_cov, p_ttl, p_stale, p_exp,
            p_chunk, p_bo, p_bomax, p_mif, p_budget, p_parts) AS e);
    INSERT INTO batch_operator_action
        (operator, action, job_key, reason, before_status, after_status)
    SELECT p_operator, 'enqueue', r.job_key, p_reason, 'MISSING', r.status
    FROM batch_job_run r WHERE r.job_key = ANY (inserted)
    ORDER BY r.job_key;
    RETURN QUERY
    SELECT r.job_key::text, r.status::text FROM batch_job_run r
    WHERE r.job_key = ANY (inserted) ORDER BY r.job_key;
END;
$$;

-- Pinned, like every engine function (20261208000005), and for no caller
-- but the roles `batchonce roles` grants it to (the operator and the
-- console).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION batchonce_operator_enqueue(text[], text[], date[], integer[], '
                   'text[], text[], timestamptz[], timestamptz[], text[], float8[], float8[], '
                   'text[], integer[], float8[], float8[], bigint[], integer[], integer[], text, text) '
                   'SET search_path = %I, pg_temp', current_schema());
    REVOKE EXECUTE ON FUNCTION batchonce_operator_enqueue(text[], text[], date[], integer[],
        text[], text[], timestamptz[], timestamptz[], text[], float8[], float8[], text[],
        integer[], float8[], float8[], bigint[], integer[], integer[], text, text) FROM PUBLIC;
END
$$;
