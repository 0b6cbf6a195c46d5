-- Issue 42, items 1, 2 and 6, for the producer's and the operator's
-- functions, assuming a stolen producer or operator login:
--
--   1. each function decides with batchonce_now(p_now), computed once: the
--      database's clock for every login but the schema's owner;
--   2. each turns `batchonce.in_step` off before it writes, so a caller's
--      `SET batchonce.in_step = on` can no longer keep the list-keeping
--      trigger from putting an enqueued or re-run PENDING run on
--      batch_job_due;
--   6. the database records what it can compute rather than what the
--      caller claims: the audit row's state before an operator's action
--      comes from the locked row, and a producer enqueues only jobs that
--      `batchonce migrate` declared (batch_job_declared), with the stored
--      calendar's skips and a context inside the documented bounds.
--
-- Signatures are kept (the previous releases call them); only bodies and
-- settings change.

-- The jobs the last `batchonce migrate` was given a configuration file for,
-- with what the database checks of a producer's enqueue: the time zone,
-- covers, partitions, whether it is scoped, and the business calendar
-- (plus the policies, for readers). Written only by `migrate`
-- (src/queue/declared.rs), which replaces the whole set each time.
CREATE TABLE batch_job_declared (
    job_name    varchar(64) NOT NULL,
    settings    jsonb       NOT NULL,
    declared_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT batch_job_declared_pkey PRIMARY KEY (job_name),
    CONSTRAINT batch_job_declared_name_check
        CHECK (job_name ~ '^[a-z0-9]+(-[a-z0-9]+)*$'),
    CONSTRAINT batch_job_declared_settings_check
        CHECK (jsonb_typeof(settings) = 'object'
               AND jsonb_typeof(settings->'timezone') = 'string'
               AND settings->>'covers' IN ('same-day', 'previous-day', 'firing')
               AND (settings->>'partitions')::int BETWEEN 1 AND 256
               AND jsonb_typeof(settings->'scoped') = 'boolean'
               AND jsonb_typeof(settings->'skip_dates') = 'array'
               AND jsonb_typeof(settings->'skip_weekdays') = 'array')
);
COMMENT ON TABLE batch_job_declared IS
    'The jobs `batchonce migrate` was last given a configuration for (settings: timezone, covers, partitions, scoped, skip_dates, skip_weekdays, policies); a login that does not own the schema enqueues only these, as declared.';

-- Enqueue, with its checks (see the file's head). The owner's enqueue
-- (tests, and anyone who may write the table directly anyway) skips the
-- checks against the declaration; the bounds apply to every caller. All
-- checks are set-based over the whole arrays: 10,000 keys are one call.
CREATE OR REPLACE FUNCTION batchonce_enqueue2(p_keys text[], p_names text[], p_dates date[],
    p_maxes integer[], p_payloads jsonb[], p_now timestamptz, p_reasons text[],
    p_tz text[], p_ps timestamptz[], p_pe timestamptz[], p_cov text[], p_ttl float8[],
    p_stale float8[], p_exp text[], p_chunk integer[], p_bo float8[], p_bomax float8[],
    p_mif bigint[], p_budget integer[], p_parts integer[])
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_now timestamptz := batchonce_now(p_now);
    -- Inside a SECURITY DEFINER function current_user is its owner.
    trusted boolean := pg_has_role(session_user, current_user, 'MEMBER');
    v_reasons text[] := p_reasons;
    bad record;
    zone text;
    inserted text[];
BEGIN
    -- Item 2 (see the end of this file): the list-keeping trigger runs.
    PERFORM set_config('batchonce.in_step', 'off', true);
    IF EXISTS (SELECT 1 FROM unnest(p_parts) n WHERE n IS NOT NULL AND n NOT BETWEEN 1 AND 256) THEN
        RAISE EXCEPTION 'batchonce_enqueue2: partitions must be 1 to 256' USING ERRCODE = '22023';
    END IF;

    -- A time zone the database does not know would fail every period
    -- check below with PostgreSQL's own message; this names the rule.
    FOR zone IN SELECT DISTINCT z FROM unnest(p_tz) z WHERE z IS NOT NULL LOOP
        BEGIN
            PERFORM v_now AT TIME ZONE zone;
        EXCEPTION WHEN invalid_parameter_value THEN
            RAISE EXCEPTION 'batchonce_enqueue2: % is not a time zone PostgreSQL knows', quote_literal(zone)
                USING ERRCODE = '22023';
        END;
    END LOOP;

    -- The documented bounds (docs/configuration.md), for every caller but
    -- the owner, who could write the table directly anyway (the test suite
    -- enqueues sub-second leases and hand-made periods as the owner). A
    -- run without a context is the previous release's kind. A daily period is its business date's local day (the rule of
    -- schedule::day_bounds, within the few hours by which PostgreSQL's and
    -- the engine's zone rules may extrapolate apart after 2037); a firing
    -- begins on its business date and ends within 32 days.
    SELECT c.k, c.why_bad INTO bad FROM (
        SELECT k, CASE
            WHEN k IS NULL OR n IS NULL THEN 'no key or job name'
            WHEN d IS NULL OR d < DATE '1970-01-01' OR d > DATE '2199-12-31'
                THEN 'a business date outside 1970-01-01..2199-12-31'
            WHEN m IS NULL OR m NOT BETWEEN 1 AND 1000 THEN 'max_attempts outside 1..=1000'
            WHEN tz IS NULL THEN 'no run context'
            WHEN budget IS NULL OR budget NOT BETWEEN 1 AND 1000 THEN 'max_attempts outside 1..=1000'
            WHEN ttl IS NULL OR NOT ttl BETWEEN 1 AND 86400 THEN 'lease_ttl outside 1s..=24h'
            WHEN stale IS NULL OR stale < ttl OR stale > 2592000
                THEN 'stale_after outside lease_ttl..=30d'
            WHEN chunk IS NULL OR chunk NOT BETWEEN 1 AND 100000 THEN 'chunk_size outside 1..=100000'
            WHEN bo IS NULL OR bomax IS NULL OR NOT bo > 0 OR bo > bomax OR bomax > 604800
                THEN 'backoff outside 0 < backoff <= backoff_max <= 7d'
            WHEN exp IS NULL OR exp NOT IN ('retry', 'hold') THEN 'on_lease_expiry not retry or hold'
            WHEN mif < 0 THEN 'a negative max_item_failures'
            WHEN cov IS NULL OR cov NOT IN ('same-day', 'previous-day', 'firing')
                THEN 'covers not same-day, previous-day or firing'
            WHEN ps IS NULL OR pe IS NULL OR NOT ps < pe THEN 'a period that does not end after it starts'
            WHEN cov <> 'firing' AND NOT (
                    (ps AT TIME ZONE tz) BETWEEN d::timestamp - interval '3 hours'
                                             AND d::timestamp + interval '3 hours'
                    AND pe - ps BETWEEN interval '20 hours' AND interval '28 hours')
                THEN format('a period that is not %s''s local day in %s', d, tz)
            WHEN cov = 'firing' AND NOT (
                    (ps AT TIME ZONE tz) BETWEEN d::timestamp - interval '3 hours'
                                             AND d::timestamp + interval '27 hours'
                    AND pe - ps <= interval '32 days')
                THEN format('a firing period that does not begin on %s in %s', d, tz)
            END AS why_bad
        FROM unnest(p_keys, p_names, p_dates, p_maxes, p_tz, p_ps, p_pe, p_cov, p_ttl,
                    p_stale, p_exp, p_chunk, p_bo, p_bomax, p_mif, p_budget)
             AS u(k, n, d, m, tz, ps, pe, cov, ttl, stale, exp, chunk, bo, bomax, mif, budget)
    ) c WHERE c.why_bad IS NOT NULL AND NOT trusted LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'batchonce_enqueue2: the run % has %; nothing was enqueued', bad.k, bad.why_bad
            USING ERRCODE = '22023';
    END IF;

    IF NOT trusted THEN
        -- Only jobs `batchonce migrate` declared, as declared: the key
        -- names its business date and is no partition's (a key holds a dot
        -- only in a partition's suffix), the zone, covers, partitions and
        -- scoping are the declaration's, and a calendar skip is one the
        -- stored calendar makes. The declarations are read once, typed.
        WITH j AS MATERIALIZED (
            SELECT job_name::text AS n, settings->>'timezone' AS tz, settings->>'covers' AS cov,
                   (settings->>'partitions')::int AS parts, (settings->>'scoped')::boolean AS scoped,
                   settings->'skip_dates' AS skip_dates, settings->'skip_weekdays' AS skip_weekdays
            FROM batch_job_declared WHERE job_name = ANY (p_names)
        )
        SELECT c.k, c.n, c.why_bad INTO bad FROM (
            SELECT u.k, u.n, CASE
                WHEN j.n IS NULL THEN NULL
                WHEN substr(u.k, char_length(u.n) + 2, 10) IS DISTINCT FROM to_char(u.d, 'YYYY-MM-DD')
                    THEN format('a key that does not name its business date %s', u.d)
                WHEN strpos(u.k, '.') > 0 THEN 'a partition''s key (partitions come with their run)'
                WHEN u.tz IS DISTINCT FROM j.tz
                    THEN format('time zone %s, not the declared %s', u.tz, j.tz)
                WHEN u.cov IS DISTINCT FROM j.cov
                    THEN format('covers %s, not the declared %s', u.cov, j.cov)
                WHEN (strpos(u.k, 'T') > 0) <> (u.cov = 'firing')
                    THEN 'a key whose period does not match its covers'
                WHEN COALESCE(u.parts, 1) <> j.parts
                    THEN format('%s partitions, not the declared %s', COALESCE(u.parts, 1), j.parts)
                WHEN (strpos(u.k, '@') > 0) <> j.scoped
                    THEN CASE WHEN j.scoped THEN 'no scope, but the job is declared scoped'
                              ELSE 'a scope, but the job is not declared scoped' END
                WHEN u.why IS NOT NULL
                     AND NOT (j.skip_dates ? to_char(u.d, 'YYYY-MM-DD')
                              OR j.skip_weekdays ? to_char(u.d, 'Dy'))
                    THEN format('a calendar skip of %s, which the declared calendar does not skip', u.d)
                END AS why_bad, j.n IS NULL AS undeclared
            FROM unnest(p_keys, p_names, p_dates, p_tz, p_cov, p_parts, p_reasons)
                 AS u(k, n, d, tz, cov, parts, why)
            LEFT JOIN j ON j.n = u.n
        ) c WHERE c.undeclared OR c.why_bad IS NOT NULL
        ORDER BY c.undeclared DESC LIMIT 1;
        IF FOUND AND bad.why_bad IS NULL THEN
            RAISE EXCEPTION 'job % is not declared: run `batchonce migrate` with the configuration file that declares it, then enqueue', bad.n
                USING ERRCODE = 'BO008';
        ELSIF FOUND THEN
            RAISE EXCEPTION 'batchonce_enqueue2: the run % has %; nothing was enqueued', bad.k, bad.why_bad
                USING ERRCODE = '22023';
        END IF;
        -- A skip's reason is the database's, in the producer's words.
        IF EXISTS (SELECT 1 FROM unnest(p_reasons) w WHERE w IS NOT NULL) THEN
            v_reasons := ARRAY(
                SELECT CASE
                    WHEN u.why IS NULL THEN NULL
                    WHEN j.settings->'skip_dates' ? to_char(u.d, 'YYYY-MM-DD')
                        THEN format('business calendar: %s is in skip_dates', to_char(u.d, 'YYYY-MM-DD'))
                    ELSE format('business calendar: %s is a %s, in skip_weekdays',
                                to_char(u.d, 'YYYY-MM-DD'), to_char(u.d, 'Dy'))
                    END
                FROM unnest(p_names, p_dates, p_reasons) WITH ORDINALITY AS u(n, d, why, o)
                LEFT JOIN batch_job_declared j ON j.job_name = u.n
                ORDER BY u.o);
        END IF;
    END IF;

    WITH ins AS (
        INSERT INTO batch_job_run
            (job_key, job_name, business_date, max_attempts, payload, next_run_at, enqueued_at,
             status, finished_at, error_message,
             timezone, period_start, period_end, covers, lease_ttl, stale_after,
             on_lease_expiry, chunk_size, backoff, backoff_max, max_item_failures,
             attempt_budget, partition_count)
        SELECT k, n, d, m, p, v_now, v_now,
               CASE WHEN why IS NULL THEN 'PENDING' ELSE 'SKIPPED' END,
               CASE WHEN why IS NULL THEN NULL ELSE v_now END,
               left(why, 1000),
               tz, ps, pe, cov, make_interval(secs => ttl), make_interval(secs => stale),
               exp, chunk, make_interval(secs => bo), make_interval(secs => bomax), mif, budget,
               NULLIF(parts, 1)
        FROM unnest(p_keys, p_names, p_dates, p_maxes, p_payloads, v_reasons,
                    p_tz, p_ps, p_pe, p_cov, p_ttl, p_stale, p_exp, p_chunk, p_bo, p_bomax,
                    p_mif, p_budget, p_parts)
             AS c(k, n, d, m, p, why, tz, ps, pe, cov, ttl, stale, exp, chunk, bo, bomax,
                  mif, budget, parts)
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

-- The first enqueue (whole runs only) is batchonce_enqueue2 without
-- partitions, so its callers meet the same clock and checks.
CREATE OR REPLACE FUNCTION batchonce_enqueue(p_keys text[], p_names text[], p_dates date[],
    p_maxes integer[], p_payloads jsonb[], p_now timestamptz, p_reasons text[],
    p_tz text[], p_ps timestamptz[], p_pe timestamptz[], p_cov text[], p_ttl float8[],
    p_stale float8[], p_exp text[], p_chunk integer[], p_bo float8[], p_bomax float8[],
    p_mif bigint[], p_budget integer[])
RETURNS SETOF text
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $$
    SELECT batchonce_enqueue2(p_keys, p_names, p_dates, p_maxes, p_payloads, p_now, p_reasons,
                              p_tz, p_ps, p_pe, p_cov, p_ttl, p_stale, p_exp, p_chunk, p_bo,
                              p_bomax, p_mif, p_budget, NULL::integer[])
$$;

-- The operator's check, on the database's clock (batchonce_now).
CREATE OR REPLACE FUNCTION batchonce_operator_check(p_key text, p_stale_fallback float8,
                                                    p_now timestamptz, p_lock boolean)
RETURNS TABLE (status text, stale boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := batchonce_now(p_now);
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    IF p_lock THEN
        PERFORM 1 FROM batch_job_run r WHERE r.partition_of = p_key
        ORDER BY r.job_key FOR UPDATE;
        RETURN QUERY
        SELECT r.status::text,
               (r.lease_expires_at <= v_now
                OR r.started_at < v_now
                   - COALESCE(r.stale_after, make_interval(secs => p_stale_fallback))) IS TRUE
        FROM batch_job_run r WHERE r.job_key = p_key FOR UPDATE;
    ELSE
        RETURN QUERY
        SELECT r.status::text,
               (r.lease_expires_at <= v_now
                OR r.started_at < v_now
                   - COALESCE(r.stale_after, make_interval(secs => p_stale_fallback))) IS TRUE
        FROM batch_job_run r WHERE r.job_key = p_key;
    END IF;
END;
$$;

-- An operator's action, as before (20261204000002), on the database's
-- clock, and audited with the state the run was in: read from the row,
-- locked, rather than taken from the caller. p_before is kept for the
-- signature's sake (earlier releases pass it) and ignored.
CREATE OR REPLACE FUNCTION batchonce_operator_apply(p_key text, p_action text, p_allowed text[],
    p_target text, p_message text, p_now timestamptz, p_budget_fallback integer,
    p_operator text, p_reason text, p_before text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
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
$$;

-- The audit row of `--terminate-blocker` and the row hold, as before
-- (20261203000004), with item 2's first statement.
CREATE OR REPLACE FUNCTION batchonce_operator_audit_terminate(p_key text, p_operator text,
                                                              p_reason text, p_detail text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    INSERT INTO batch_operator_action
        (operator, action, job_key, reason, before_status, after_status, detail)
    SELECT p_operator, 'terminate-blocker', r.job_key, p_reason, r.status, r.status, p_detail
    FROM batch_job_run r WHERE r.job_key = p_key;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no run with key %', p_key USING ERRCODE = '22023';
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION batchonce_operator_hold_row(p_key text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    PERFORM 1 FROM batch_job_run WHERE job_key = p_key FOR NO KEY UPDATE;
END;
$$;

-- Item 2: a caller's `SET batchonce.in_step = on` made the list-keeping
-- trigger skip, so an enqueued or re-run PENDING run could be left off
-- batch_job_due, where no claim finds it. Each function above turns the
-- setting off, for the rest of the transaction, before it writes: the
-- engine's claim and finish, which alone turn it on, turn it off again
-- before they return, so no engine call relies on it staying on. It is
-- set in the body, not with `ALTER FUNCTION … SET`: PostgreSQL lets only
-- a superuser (or a role granted SET on it) attach a setting that no
-- extension defines to a function, and the migrator is neither.
-- batchonce_enqueue, batchonce_enqueue_declared and
-- batchonce_enqueue_declared_unscoped write only through
-- batchonce_enqueue2. Search paths are pinned again (CREATE OR REPLACE
-- keeps them, but the new table must resolve in this schema), and PUBLIC
-- may execute none of them.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = current_schema()::regnamespace
          AND p.proname IN ('batchonce_enqueue', 'batchonce_enqueue2',
                            'batchonce_enqueue_declared', 'batchonce_enqueue_declared_unscoped',
                            'batchonce_operator_check', 'batchonce_operator_apply',
                            'batchonce_operator_audit_terminate', 'batchonce_operator_hold_row')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
