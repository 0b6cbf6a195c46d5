-- Issue 43: retention, for those who want it. `batchonce runs archive
-- --before DATE` moves finished runs (SUCCEEDED or SKIPPED, a partitioned
-- run only as a whole) and their attempts out of the live ledger into two
-- archive tables, in batches, each batch one transaction with its audit
-- rows. Off by default: nothing archives unless an operator runs it.
--
-- Expand only: the previous release's workers, producers and operators keep
-- working on this schema. They never read the archive; what changes for
-- them is that an archived key is refused by `batchonce_enqueue2` as a
-- duplicate (their enqueue goes through it) and by a direct INSERT with
-- BO011 (the release before the state functions, under
-- `roles --keep-direct-writes`).
--
-- This migration changes the audit table (it drops a foreign key and
-- widens the action check), so with the least-privilege roles in use it
-- needs the administrator first (docs/upgrading.md).

-- The archive tables have the live tables' columns, with their defaults,
-- plus when and under which audit row a run was archived. No CHECK or
-- trigger of the live tables comes along: rows arrive only from the live
-- tables, where they were checked, and never change afterwards.
CREATE TABLE batch_job_run_archive (
    LIKE batch_job_run INCLUDING DEFAULTS,
    archived_at timestamptz NOT NULL,
    archived_by bigint      NOT NULL,
    CONSTRAINT batch_job_run_archive_pkey PRIMARY KEY (job_key)
);
CREATE INDEX batch_job_run_archive_job_name_idx
    ON batch_job_run_archive (job_name, business_date);
COMMENT ON TABLE batch_job_run_archive IS
    'Finished runs moved out of batch_job_run by `batchonce runs archive` (archived_by: the batch_operator_action row); an archived key is never enqueued again.';

CREATE TABLE batch_job_attempt_archive (
    LIKE batch_job_attempt INCLUDING DEFAULTS,
    archived_at timestamptz NOT NULL,
    archived_by bigint      NOT NULL,
    CONSTRAINT batch_job_attempt_archive_pkey PRIMARY KEY (job_key, attempt),
    CONSTRAINT batch_job_attempt_archive_run_fkey FOREIGN KEY (job_key)
        REFERENCES batch_job_run_archive (job_key)
);
COMMENT ON TABLE batch_job_attempt_archive IS
    'The attempts of the runs in batch_job_run_archive, moved with them.';

-- Audit rows are kept forever and never move, so one may name a run that
-- is now in the archive: the key names a run in the ledger or in the
-- archive, and no single table can be the foreign key's target. (Every
-- audit row is written by an engine function that has just read the run,
-- so the key was checked when the row was written.) Nothing matches on
-- this constraint's name.
ALTER TABLE batch_operator_action DROP CONSTRAINT batch_operator_action_run_fkey;

-- The archive action. Every existing row satisfies the wider check, so the
-- new constraint is added before the old one is dropped.
ALTER TABLE batch_operator_action ADD CONSTRAINT batch_operator_action_action_check2
    CHECK (action IN ('fail', 'rerun', 'skip', 'terminate-blocker', 'archive'));
ALTER TABLE batch_operator_action DROP CONSTRAINT batch_operator_action_action_check;

-- An archived key still refuses a second enqueue. This is an AFTER trigger
-- on purpose: a BEFORE trigger reads the archive before the insert waits on
-- the unique index for an archive in progress (which is deleting the same
-- key), so it would let the key in once that archive commits. After the
-- rows are inserted, the probe below takes a new snapshot and sees the
-- committed archive. It runs once per statement, one query over the
-- inserted rows, without a function call per row: measured on
-- 10,000 new keys against an archive of 100,000 runs, a row trigger cost
-- about 6 µs a run (60 ms), this about 2 µs (20 ms), on an insert of about
-- 470 ms (docs/operations.md).
CREATE FUNCTION batch_job_run_not_archived() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_key text;
BEGIN
    SELECT n.job_key INTO v_key FROM batch_job_run_inserted n
    WHERE EXISTS (SELECT FROM batch_job_run_archive a WHERE a.job_key = n.job_key)
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'run % is archived (batchonce runs archive): an archived key is never enqueued again', v_key
            USING ERRCODE = 'BO011', TABLE = 'batch_job_run', SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER batch_job_run_not_archived
    AFTER INSERT ON batch_job_run
    REFERENCING NEW TABLE AS batch_job_run_inserted
    FOR EACH STATEMENT EXECUTE FUNCTION batch_job_run_not_archived();

-- Enqueue, as in 20261208000003, except that a key in the archive is
-- left out of the insert and so reported as a duplicate, exactly as a key
-- in the ledger is. (A key archived by a batch that commits while this
-- insert runs is refused by the trigger above instead, with BO011; the
-- next try reports it as a duplicate.)
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
        -- Issue 43: an archived key is a duplicate, as a live one is.
        WHERE NOT EXISTS (SELECT FROM batch_job_run_archive a WHERE a.job_key = c.k)
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

-- Archives one batch: at most p_limit finished runs (SUCCEEDED or SKIPPED,
-- a partitioned run only with all its partitions finished, counted as one)
-- whose business date is before p_before, of p_job or of every job, with
-- their partitions and attempts. The runs are copied into the archive and
-- deleted from the ledger, through the ledger's normal triggers, in the
-- caller's one transaction, with one audit row per job. Returns one row per
-- job: the runs (partitions included) and attempts moved, and the audit
-- row's id. With p_dry_run it writes nothing and counts every run that
-- would be archived, over all batches, with a NULL audit id.
--
-- Rows another session holds are skipped, not waited for (a second archive
-- at once takes other runs), and the state is checked again under the
-- lock, so a run that an operator re-ran meanwhile stays. Partitions are
-- locked before their parent, the order of batchonce_operator_apply.
CREATE FUNCTION batchonce_operator_archive(p_before date, p_job text, p_limit bigint,
    p_operator text, p_reason text, p_dry_run boolean, p_now timestamptz)
RETURNS TABLE (job text, runs_moved bigint, attempts_moved bigint, audit_id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_now timestamptz := batchonce_now(p_now);
    v_missing text;
    v_keys text[];
    v_all text[];
    v_job record;
    v_job_keys text[];
    v_attempts bigint;
    v_id bigint;
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    IF p_before IS NULL OR p_before >= (v_now AT TIME ZONE 'UTC')::date THEN
        RAISE EXCEPTION 'archive refused: --before % is not in the past (today is % in UTC by the database clock)',
            coalesce(p_before::text, 'NULL'), (v_now AT TIME ZONE 'UTC')::date
            USING ERRCODE = '22023';
    END IF;
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'archive refused: a batch is 1 to 100000 runs, not %', coalesce(p_limit::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_job IS NOT NULL
       AND NOT EXISTS (SELECT FROM batch_job_run r WHERE r.job_name = p_job)
       AND NOT EXISTS (SELECT FROM batch_job_run_archive a WHERE a.job_name = p_job) THEN
        RAISE EXCEPTION 'archive refused: unknown job %: it has no runs, live or archived', p_job
            USING ERRCODE = '22023';
    END IF;
    -- The copy below names its columns. A column a later migration adds to
    -- a live table would be lost by it, so the archive refuses until that
    -- migration has added the column to the archive table and to the copy
    -- (the list here), rather than drop data without a word.
    SELECT string_agg(l.attrelid::regclass::text || '.' || l.attname, ', ') INTO v_missing
    FROM pg_attribute l
    WHERE l.attrelid IN ('batch_job_run'::regclass, 'batch_job_attempt'::regclass)
      AND l.attnum > 0 AND NOT l.attisdropped
      AND (NOT l.attname = ANY (CASE WHEN l.attrelid = 'batch_job_run'::regclass
               THEN ARRAY['job_key', 'job_name', 'business_date', 'status', 'attempts',
                          'max_attempts', 'next_run_at', 'lease_owner', 'lease_token',
                          'lease_expires_at', 'heartbeat_at', 'enqueued_at', 'started_at',
                          'finished_at', 'processed_count', 'failed_count', 'error_message',
                          'payload', 'heartbeat_processed', 'timezone', 'period_start',
                          'period_end', 'covers', 'lease_ttl', 'stale_after', 'on_lease_expiry',
                          'chunk_size', 'backoff', 'backoff_max', 'max_item_failures',
                          'attempt_budget', 'partition_count', 'partition_no', 'partition_of',
                          'scope']::name[]
               ELSE ARRAY['job_key', 'attempt', 'lease_token', 'worker_id', 'started_at',
                          'finished_at', 'outcome', 'error_message', 'processed_count',
                          'failed_count', 'output_tail']::name[] END)
           OR NOT EXISTS (
               SELECT FROM pg_attribute a
               WHERE a.attrelid = CASE WHEN l.attrelid = 'batch_job_run'::regclass
                                       THEN 'batch_job_run_archive'::regclass
                                       ELSE 'batch_job_attempt_archive'::regclass END
                 AND a.attname = l.attname AND a.attnum > 0 AND NOT a.attisdropped));
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'archive refused: % would not be archived; a migration must add it to the archive table and to batchonce_operator_archive first', v_missing
            USING ERRCODE = '55000';
    END IF;

    IF p_dry_run THEN
        RETURN QUERY
        WITH top AS (
            SELECT r.job_key, r.job_name FROM batch_job_run r
            WHERE r.partition_of IS NULL AND r.status IN ('SUCCEEDED', 'SKIPPED')
              AND r.business_date < p_before AND (p_job IS NULL OR r.job_name = p_job)
              AND NOT EXISTS (SELECT FROM batch_job_run c
                              WHERE c.partition_of = r.job_key
                                AND c.status NOT IN ('SUCCEEDED', 'SKIPPED'))
        ), moved AS (
            SELECT top.job_key, top.job_name FROM top
            UNION ALL
            SELECT c.job_key, top.job_name FROM batch_job_run c JOIN top ON c.partition_of = top.job_key
        )
        SELECT m.job_name::text, count(*)::bigint, sum(t.n)::bigint, NULL::bigint
        FROM moved m
        CROSS JOIN LATERAL (SELECT count(*) AS n FROM batch_job_attempt a
                            WHERE a.job_key = m.job_key) t
        GROUP BY m.job_name ORDER BY m.job_name;
        RETURN;
    END IF;

    -- The candidates, oldest first.
    v_keys := ARRAY(
        SELECT r.job_key FROM batch_job_run r
        WHERE r.partition_of IS NULL AND r.status IN ('SUCCEEDED', 'SKIPPED')
          AND r.business_date < p_before AND (p_job IS NULL OR r.job_name = p_job)
          AND NOT EXISTS (SELECT FROM batch_job_run c
                          WHERE c.partition_of = r.job_key
                            AND c.status NOT IN ('SUCCEEDED', 'SKIPPED'))
        ORDER BY r.business_date, r.job_key
        LIMIT p_limit);
    IF cardinality(v_keys) = 0 THEN
        RETURN;
    END IF;
    -- Their partitions first (waiting: a finished partition is held only
    -- for a moment, by an operator's action or another archive), then the
    -- runs themselves, skipping any another session holds. The state is
    -- checked again under the lock, by a statement that sees every commit
    -- made before the partitions were locked.
    PERFORM 1 FROM batch_job_run c WHERE c.partition_of = ANY (v_keys)
    ORDER BY c.job_key FOR UPDATE;
    v_keys := ARRAY(
        SELECT r.job_key FROM batch_job_run r
        WHERE r.job_key = ANY (v_keys) AND r.status IN ('SUCCEEDED', 'SKIPPED')
          AND NOT EXISTS (SELECT FROM batch_job_run c
                          WHERE c.partition_of = r.job_key
                            AND c.status NOT IN ('SUCCEEDED', 'SKIPPED'))
        ORDER BY r.job_key
        FOR UPDATE OF r SKIP LOCKED);
    IF cardinality(v_keys) = 0 THEN
        RETURN;
    END IF;
    v_all := v_keys || ARRAY(SELECT c.job_key::text FROM batch_job_run c
                             WHERE c.partition_of = ANY (v_keys));

    -- Per job: the audit row, with what this batch moves, then the copies.
    FOR v_job IN
        SELECT r.job_name::text AS name, count(*) AS n FROM batch_job_run r
        WHERE r.job_key = ANY (v_all) GROUP BY r.job_name ORDER BY r.job_name
    LOOP
        v_job_keys := ARRAY(SELECT r.job_key FROM batch_job_run r
                            WHERE r.job_key = ANY (v_all) AND r.job_name = v_job.name);
        SELECT count(*) INTO v_attempts FROM batch_job_attempt a WHERE a.job_key = ANY (v_job_keys);
        INSERT INTO batch_operator_action
            (operator, action, job_key, reason, before_status, after_status, detail)
        VALUES (p_operator, 'archive', v_job.name || ':*', p_reason, 'FINISHED', 'ARCHIVED',
                format('archived %s runs (partitions included) and %s attempts with business_date before %s',
                       v_job.n, v_attempts, p_before))
        RETURNING id INTO v_id;
        INSERT INTO batch_job_run_archive
            (job_key, job_name, business_date, status, attempts, max_attempts, next_run_at,
             lease_owner, lease_token, lease_expires_at, heartbeat_at, enqueued_at, started_at,
             finished_at, processed_count, failed_count, error_message, payload,
             heartbeat_processed, timezone, period_start, period_end, covers, lease_ttl,
             stale_after, on_lease_expiry, chunk_size, backoff, backoff_max, max_item_failures,
             attempt_budget, partition_count, partition_no, partition_of, scope,
             archived_at, archived_by)
        SELECT r.job_key, r.job_name, r.business_date, r.status, r.attempts, r.max_attempts,
               r.next_run_at, r.lease_owner, r.lease_token, r.lease_expires_at, r.heartbeat_at,
               r.enqueued_at, r.started_at, r.finished_at, r.processed_count, r.failed_count,
               r.error_message, r.payload, r.heartbeat_processed, r.timezone, r.period_start,
               r.period_end, r.covers, r.lease_ttl, r.stale_after, r.on_lease_expiry,
               r.chunk_size, r.backoff, r.backoff_max, r.max_item_failures, r.attempt_budget,
               r.partition_count, r.partition_no, r.partition_of, r.scope,
               v_now, v_id
        FROM batch_job_run r WHERE r.job_key = ANY (v_job_keys);
        INSERT INTO batch_job_attempt_archive
            (job_key, attempt, lease_token, worker_id, started_at, finished_at, outcome,
             error_message, processed_count, failed_count, output_tail,
             archived_at, archived_by)
        SELECT a.job_key, a.attempt, a.lease_token, a.worker_id, a.started_at, a.finished_at,
               a.outcome, a.error_message, a.processed_count, a.failed_count, a.output_tail,
               v_now, v_id
        FROM batch_job_attempt a WHERE a.job_key = ANY (v_job_keys);
        job := v_job.name;
        runs_moved := v_job.n;
        attempts_moved := v_attempts;
        audit_id := v_id;
        RETURN NEXT;
    END LOOP;
    -- Attempts first (a run with attempts is never deleted), then the runs,
    -- partitions and parents in one statement (the partition_of key is
    -- checked at its end). The ledger's triggers run as for any delete.
    DELETE FROM batch_job_attempt a WHERE a.job_key = ANY (v_all);
    DELETE FROM batch_job_run r WHERE r.job_key = ANY (v_all);
END;
$$;

-- Pinned, like every engine function (20261208000005; CREATE OR REPLACE
-- keeps only the settings it names), and for no caller but the roles
-- `batchonce roles` grants.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = current_schema()::regnamespace
          AND p.proname IN ('batchonce_enqueue2', 'batchonce_operator_archive',
                            'batch_job_run_not_archived')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
