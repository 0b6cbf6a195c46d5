-- Issue 23: partitioned runs. A job may declare `partitions = N`; its run
-- for a period is then one parent row and N partition rows in this table,
-- created together when the run is enqueued, so the partitioning is fixed
-- with the run. A partition is a run of its own for leasing: it is claimed,
-- heartbeated, fenced (its own token fences only its own writes), retried
-- and recovered by the statements every run goes through. The parent waits
-- (PENDING, due at 9999-12-31, never in practice) until every partition has succeeded; it is
-- then due, and its claim runs the job's final step once, fenced by the
-- parent's token. A FAILED partition makes the parent FAILED.
--
-- Expand only. The previous release's workers pick runs through
-- batchonce_due_runs, which now leaves partitioned runs (parents and
-- partitions) out, so they never claim work they do not understand; this
-- release claims through batchonce_claim2. The previous release's recovery
-- of an expired lease, a plain UPDATE, may still move a partition whose
-- holder died to PENDING or FAILED; that is the right transition, and the
-- trigger below keeps the parent in step whoever makes it.

ALTER TABLE batch_job_run
    ADD COLUMN partition_count smallint,
    ADD COLUMN partition_no    smallint,
    ADD COLUMN partition_of    varchar(120);

-- A parent has a count and no number; a partition has both, its parent's
-- key, and the key `<parent>.p<no>`; a whole run has none of them.
ALTER TABLE batch_job_run ADD CONSTRAINT batch_job_run_partition_check CHECK (
    (partition_count IS NULL AND partition_no IS NULL AND partition_of IS NULL)
    OR (partition_count BETWEEN 2 AND 256 AND partition_no IS NULL AND partition_of IS NULL)
    OR (partition_count BETWEEN 2 AND 256 AND partition_no BETWEEN 1 AND partition_count
        AND partition_of IS NOT NULL AND job_key = partition_of || '.p' || partition_no)
) NOT VALID;
ALTER TABLE batch_job_run VALIDATE CONSTRAINT batch_job_run_partition_check;

ALTER TABLE batch_job_run ADD CONSTRAINT batch_job_run_partition_of_fkey
    FOREIGN KEY (partition_of) REFERENCES batch_job_run (job_key) NOT VALID;
ALTER TABLE batch_job_run VALIDATE CONSTRAINT batch_job_run_partition_of_fkey;

-- A partition's key is its parent's with `.p<no>`.
ALTER TABLE batch_job_run ADD CONSTRAINT batch_job_run_job_key_check2
    CHECK (job_key ~ '^[a-z0-9-]+:[0-9T:-]+(\.p[1-9][0-9]{0,2})?$'
           AND starts_with(job_key, job_name || ':')) NOT VALID;
ALTER TABLE batch_job_run VALIDATE CONSTRAINT batch_job_run_job_key_check2;
ALTER TABLE batch_job_run DROP CONSTRAINT batch_job_run_job_key_check;
ALTER TABLE batch_job_run RENAME CONSTRAINT batch_job_run_job_key_check2 TO batch_job_run_job_key_check;

CREATE INDEX batch_job_run_partition_of_idx ON batch_job_run (partition_of)
    WHERE partition_of IS NOT NULL;

-- The partition (1..n) an item key belongs to: the first 31 bits of its
-- MD5, modulo n. MD5 is the same on every PostgreSQL version and in every
-- language, so a command job, a Rust kind and SQL agree, and an item never
-- moves between partitions of a run.
-- It has no pinned search path, unlike every other function here, so that
-- the planner inlines it into a partition's scan (a pinned path would make
-- it a function call per row); it names only pg_catalog's functions, which
-- are found first whatever the caller's path.
CREATE FUNCTION batchonce_partition(p_item_key text, p_partitions integer) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT ((('x' OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.md5(p_item_key), 1, 8))::bit(32)::integer
             OPERATOR(pg_catalog.&) 2147483647) OPERATOR(pg_catalog.%) p_partitions) OPERATOR(pg_catalog.+) 1
$$;

-- A partitioned parent is enqueued waiting: due at 9999-12-31 until its
-- partitions have all succeeded. A finite instant, not '9999-12-31T00:00:00Z': every
-- reader of next_run_at (the previous release's too) decodes it as a date,
-- and a due-age computed from it stays finite.
CREATE FUNCTION batch_job_run_partition_parent() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'PENDING' THEN
        NEW.next_run_at := '9999-12-31T00:00:00Z';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER batch_job_run_partition_parent
    BEFORE INSERT ON batch_job_run
    FOR EACH ROW WHEN (NEW.partition_count IS NOT NULL AND NEW.partition_of IS NULL)
    EXECUTE FUNCTION batch_job_run_partition_parent();

-- Its partitions are inserted with it, in its state, with its context and
-- attempt budget.
CREATE FUNCTION batch_job_run_partition_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO batch_job_run
        (job_key, job_name, business_date, status, max_attempts, next_run_at, enqueued_at,
         finished_at, error_message, payload,
         timezone, period_start, period_end, covers, lease_ttl, stale_after, on_lease_expiry,
         chunk_size, backoff, backoff_max, max_item_failures, attempt_budget,
         partition_count, partition_no, partition_of)
    SELECT NEW.job_key || '.p' || g, NEW.job_name, NEW.business_date, NEW.status,
           NEW.max_attempts, NEW.enqueued_at, NEW.enqueued_at, NEW.finished_at,
           NEW.error_message, NEW.payload,
           NEW.timezone, NEW.period_start, NEW.period_end, NEW.covers, NEW.lease_ttl,
           NEW.stale_after, NEW.on_lease_expiry, NEW.chunk_size, NEW.backoff, NEW.backoff_max,
           NEW.max_item_failures, NEW.attempt_budget,
           NEW.partition_count, g, NEW.job_key
    FROM generate_series(1, NEW.partition_count) AS g;
    RETURN NULL;
END;
$$;

CREATE TRIGGER batch_job_run_partition_rows
    AFTER INSERT ON batch_job_run
    FOR EACH ROW WHEN (NEW.partition_count IS NOT NULL AND NEW.partition_of IS NULL)
    EXECUTE FUNCTION batch_job_run_partition_rows();

-- Keeps a parent in step with its partitions, whoever changed one (a
-- finish, a recovery, an operator): any partition FAILED makes the parent
-- FAILED; all SUCCEEDED (or SKIPPED) makes it due for its final step; else
-- it waits. A parent that is running its final step, has succeeded or was
-- skipped is left alone. The parent row is locked first, so concurrent
-- partitions settle it one after the other, each seeing the others' commits.
-- Times come from the partition's own finish, which the caller's clock set
-- (the database's, or a test's injected one).
CREATE FUNCTION batch_job_run_partition_settle() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    p_status text;
    n_failed integer;
    n_done integer;
    first_failed record;
BEGIN
    SELECT r.status INTO p_status FROM batch_job_run r
    WHERE r.job_key = NEW.partition_of FOR NO KEY UPDATE;
    IF p_status IS NULL OR p_status IN ('RUNNING', 'SUCCEEDED', 'SKIPPED') THEN
        RETURN NULL;
    END IF;
    SELECT count(*) FILTER (WHERE r.status = 'FAILED'),
           count(*) FILTER (WHERE r.status IN ('SUCCEEDED', 'SKIPPED'))
    INTO n_failed, n_done
    FROM batch_job_run r WHERE r.partition_of = NEW.partition_of;
    IF n_failed > 0 THEN
        IF p_status <> 'FAILED' THEN
            SELECT r.partition_no, r.error_message INTO first_failed FROM batch_job_run r
            WHERE r.partition_of = NEW.partition_of AND r.status = 'FAILED'
            ORDER BY r.partition_no LIMIT 1;
            UPDATE batch_job_run
            SET status = 'FAILED', finished_at = COALESCE(NEW.finished_at, now()),
                error_message = left(format('partition %s of %s failed: %s',
                    first_failed.partition_no, NEW.partition_count,
                    coalesce(first_failed.error_message, '?')), 1000)
            WHERE job_key = NEW.partition_of;
        END IF;
    ELSIF n_done = NEW.partition_count THEN
        UPDATE batch_job_run
        SET status = 'PENDING', next_run_at = COALESCE(NEW.finished_at, now()),
            finished_at = NULL, error_message = NULL
        WHERE job_key = NEW.partition_of;
        PERFORM pg_notify('batchonce_run', '');
    ELSIF p_status <> 'PENDING' THEN
        UPDATE batch_job_run
        SET status = 'PENDING', next_run_at = '9999-12-31T00:00:00Z', finished_at = NULL, error_message = NULL
        WHERE job_key = NEW.partition_of;
    ELSE
        UPDATE batch_job_run SET next_run_at = '9999-12-31T00:00:00Z'
        WHERE job_key = NEW.partition_of AND next_run_at <> '9999-12-31T00:00:00Z';
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER batch_job_run_partition_settle
    AFTER UPDATE OF status ON batch_job_run
    FOR EACH ROW WHEN (NEW.partition_of IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION batch_job_run_partition_settle();

-- The previous release's pick leaves partitioned runs alone.
CREATE OR REPLACE FUNCTION batchonce_due_runs(p_jobs text[], p_limit bigint, p_now timestamptz)
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
BEGIN
    RETURN QUERY
    SELECT r.job_key::text
    FROM batch_job_run r
    WHERE r.status = 'PENDING'
      AND r.next_run_at <= p_now
      AND r.job_name = ANY (p_jobs)
      AND r.partition_count IS NULL
    ORDER BY r.next_run_at, r.job_key
    LIMIT p_limit
    FOR UPDATE SKIP LOCKED;
END;
$$;

-- This release's pick: every due run, partitions and due parents included.
CREATE FUNCTION batchonce_due_runs2(p_jobs text[], p_limit bigint, p_now timestamptz)
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
BEGIN
    RETURN QUERY
    SELECT r.job_key::text
    FROM batch_job_run r
    WHERE r.status = 'PENDING'
      AND r.next_run_at <= p_now
      AND r.job_name = ANY (p_jobs)
    ORDER BY r.next_run_at, r.job_key
    LIMIT p_limit
    FOR UPDATE SKIP LOCKED;
END;
$$;

-- The claim of batchonce_claim, through batchonce_due_runs2, also saying
-- which step a run is: its partition number and count (a partition), its
-- count alone (a parent's final step), or neither (a whole run).
CREATE FUNCTION batchonce_claim2(p_jobs text[], p_ttls float8[], p_limit bigint,
                                 p_worker text, p_now timestamptz)
RETURNS TABLE (job_key text, job_name text, business_date date, attempts integer,
               max_attempts integer, lease_token bigint, lease_expires_at timestamptz,
               processed_count bigint, payload jsonb, started_at timestamptz,
               timezone text, period_start timestamptz, period_end timestamptz, covers text,
               lease_ttl_s float8, stale_after_s float8, on_lease_expiry text,
               chunk_size integer, backoff_s float8, backoff_max_s float8,
               max_item_failures bigint, attempt_budget integer,
               partition_no integer, partition_count integer, partition_of text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
BEGIN
    IF p_worker IS NULL OR char_length(p_worker) NOT BETWEEN 1 AND 80 THEN
        RAISE EXCEPTION 'batchonce_claim2: a worker id of 1 to 80 characters is required';
    END IF;
    RETURN QUERY
    WITH picked AS (
        SELECT batchonce_due_runs2(p_jobs, p_limit, COALESCE(p_now, now())) AS job_key
    ), claimed AS (
        UPDATE batch_job_run r
        SET status = 'RUNNING',
            attempts = r.attempts + 1,
            lease_token = batchonce_new_token(),
            lease_owner = p_worker,
            lease_expires_at = COALESCE(p_now, now()) + COALESCE(r.lease_ttl, make_interval(secs => (
                SELECT c.ttl FROM unnest(p_jobs, p_ttls) AS c(n, ttl)
                WHERE c.n = r.job_name LIMIT 1))),
            heartbeat_at = COALESCE(p_now, now()),
            heartbeat_processed = r.processed_count,
            started_at = COALESCE(p_now, now()),
            finished_at = NULL
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
           c.max_item_failures, c.attempt_budget,
           c.partition_no::integer, c.partition_count::integer, c.partition_of::text
    FROM claimed c;
END;
$$;

-- batchonce_enqueue with one more array: each run's partition count (NULL
-- or 1: a whole run). The partitions are inserted by the trigger above.
CREATE FUNCTION batchonce_enqueue2(p_keys text[], p_names text[], p_dates date[],
    p_maxes integer[], p_payloads jsonb[], p_now timestamptz, p_reasons text[],
    p_tz text[], p_ps timestamptz[], p_pe timestamptz[], p_cov text[], p_ttl float8[],
    p_stale float8[], p_exp text[], p_chunk integer[], p_bo float8[], p_bomax float8[],
    p_mif bigint[], p_budget integer[], p_parts integer[])
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    inserted text[];
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_parts) n WHERE n IS NOT NULL AND n NOT BETWEEN 1 AND 256) THEN
        RAISE EXCEPTION 'batchonce_enqueue2: partitions must be 1 to 256' USING ERRCODE = '22023';
    END IF;
    WITH ins AS (
        INSERT INTO batch_job_run
            (job_key, job_name, business_date, max_attempts, payload, next_run_at, enqueued_at,
             status, finished_at, error_message,
             timezone, period_start, period_end, covers, lease_ttl, stale_after,
             on_lease_expiry, chunk_size, backoff, backoff_max, max_item_failures,
             attempt_budget, partition_count)
        SELECT k, n, d, m, p, COALESCE(p_now, now()), COALESCE(p_now, now()),
               CASE WHEN why IS NULL THEN 'PENDING' ELSE 'SKIPPED' END,
               CASE WHEN why IS NULL THEN NULL ELSE COALESCE(p_now, now()) END,
               left(why, 1000),
               tz, ps, pe, cov, make_interval(secs => ttl), make_interval(secs => stale),
               exp, chunk, make_interval(secs => bo), make_interval(secs => bomax), mif, budget,
               NULLIF(parts, 1)
        FROM unnest(p_keys, p_names, p_dates, p_maxes, p_payloads, p_reasons,
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

-- The operator's check, as before, but for a partitioned run it first locks
-- the run's partitions (in key order), then the run: the order in which a
-- partition's own change takes them (its row, then the run's through the
-- trigger). Locking the run first would deadlock with a partition finishing
-- at that moment.
CREATE OR REPLACE FUNCTION batchonce_operator_check(p_key text, p_stale_fallback float8,
                                                    p_now timestamptz, p_lock boolean)
RETURNS TABLE (status text, stale boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
BEGIN
    IF p_lock THEN
        PERFORM 1 FROM batch_job_run r WHERE r.partition_of = p_key
        ORDER BY r.job_key FOR UPDATE;
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

-- An operator's action on a parent reaches its partitions: `fail` fails
-- the unfinished ones (fencing any holder), `skip` skips the ones not yet
-- run or failed, and `rerun` re-runs only what must: the FAILED and
-- SKIPPED partitions, all of them after a SUCCEEDED run, none when only
-- the final step failed (the parent is then due at once). The audit row is
-- the parent's. An action on one partition is that partition's alone; the
-- trigger keeps the parent in step.
CREATE OR REPLACE FUNCTION batchonce_operator_apply(p_key text, p_action text, p_allowed text[],
    p_target text, p_message text, p_now timestamptz, p_budget_fallback integer,
    p_operator text, p_reason text, p_before text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    done text;
    parts smallint;
    child_from text[];
    child_to text;
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
    SELECT r.partition_count INTO parts FROM batch_job_run r
    WHERE r.job_key = p_key AND r.partition_of IS NULL;
    -- The partitions are locked before the parent, the order in which a
    -- partition's own change (through the trigger) takes them.
    IF parts IS NOT NULL THEN
        PERFORM 1 FROM batch_job_run r WHERE r.partition_of = p_key
        ORDER BY r.job_key FOR UPDATE;
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
    IF done IS NOT NULL AND parts IS NOT NULL THEN
        child_from := CASE p_action
            WHEN 'fail' THEN ARRAY['RUNNING', 'PENDING']
            WHEN 'skip' THEN ARRAY['PENDING', 'FAILED']
            WHEN 'rerun' THEN CASE WHEN p_before = 'SUCCEEDED'
                                   THEN ARRAY['FAILED', 'SKIPPED', 'SUCCEEDED']
                                   ELSE ARRAY['FAILED', 'SKIPPED'] END
            END;
        WITH c AS (
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
                error_message = left(format('%s of %s: %s', p_action, p_key, p_message), 1000)
            WHERE r.partition_of = p_key AND r.status = ANY(child_from)
            RETURNING r.job_key
        )
        UPDATE batch_job_attempt a
        SET finished_at = COALESCE(p_now, now()), outcome = 'operator_failed',
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
                THEN COALESCE(p_now, now()) ELSE '9999-12-31T00:00:00Z' END
            WHERE r.job_key = p_key;
        END IF;
    END IF;
    IF done IS NOT NULL THEN
        INSERT INTO batch_operator_action
            (operator, action, job_key, reason, before_status, after_status)
        VALUES (p_operator, p_action, p_key, p_reason, p_before, p_target);
    END IF;
    RETURN done;
END;
$$;

CREATE OR REPLACE FUNCTION batchonce_enqueue_declared(p_job text, p_dates date[],
                                           p_payload jsonb DEFAULT '{}')
RETURNS TABLE (job_key text, outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    n_configs int;
    s jsonb;
    secs text[] := ARRAY['lease_ttl', 'stale_after', 'backoff', 'backoff_max'];
    k text;
    v_keys text[];
    v_reasons text[];
    v_ps timestamptz[];
    v_pe timestamptz[];
    inserted text[];
BEGIN
    IF p_job IS NULL OR p_job !~ '^[a-z0-9]+(-[a-z0-9]+)*$' OR char_length(p_job) > 64 THEN
        RAISE EXCEPTION 'batchonce_enqueue_declared: % is not a job name (lowercase letters and digits separated by single dashes, at most 64)',
            coalesce(quote_literal(p_job), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF p_dates IS NULL OR cardinality(p_dates) = 0 OR cardinality(p_dates) > 366 THEN
        RAISE EXCEPTION 'batchonce_enqueue_declared: give 1 to 366 dates, not %',
            coalesce(cardinality(p_dates), 0) USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_dates) d
               WHERE d IS NULL OR d < DATE '1970-01-01' OR d > DATE '2199-12-31') THEN
        RAISE EXCEPTION 'batchonce_enqueue_declared: every date must be between 1970-01-01 and 2199-12-31'
            USING ERRCODE = '22023';
    END IF;
    IF cardinality(ARRAY(SELECT DISTINCT unnest(p_dates))) <> cardinality(p_dates) THEN
        RAISE EXCEPTION 'batchonce_enqueue_declared: a date is given twice'
            USING ERRCODE = '22023';
    END IF;
    IF p_payload IS NULL OR octet_length(p_payload::text) > 65536 THEN
        RAISE EXCEPTION 'batchonce_enqueue_declared: the payload must be JSON of at most 65536 bytes'
            USING ERRCODE = '22023';
    END IF;

    SELECT count(DISTINCT c.fingerprint), min(c.settings::text)::jsonb INTO n_configs, s
    FROM batch_process_config c JOIN batch_worker w ON w.worker_id = c.process_id
    WHERE c.job_name = p_job AND w.live_until > now();
    IF n_configs = 0 THEN
        RAISE EXCEPTION 'no live batchonce process declares job %: start the producer or a worker with it in batchonce.toml first', p_job
            USING ERRCODE = 'BO002';
    ELSIF n_configs > 1 THEN
        RAISE EXCEPTION 'the live batchonce processes disagree on the configuration of job % (% fingerprints): see `batchonce status`, make them agree, then enqueue', p_job, n_configs
            USING ERRCODE = 'BO003';
    END IF;
    IF s->>'covers' = 'firing' THEN
        RAISE EXCEPTION 'job % runs per firing (covers = "firing"), not per date: enqueue its periods with `batchonce enqueue`', p_job
            USING ERRCODE = 'BO004';
    END IF;
    FOREACH k IN ARRAY secs LOOP
        IF (s->>k) IS NULL THEN
            RAISE EXCEPTION 'the declared configuration of job % has no %', p_job, k
                USING ERRCODE = 'BO003';
        END IF;
    END LOOP;

    SELECT array_agg(p_job || ':' || to_char(d, 'YYYY-MM-DD') ORDER BY o),
           array_agg(CASE
               WHEN s->'skip_dates' ? to_char(d, 'YYYY-MM-DD')
                   THEN format('business calendar: %s is in skip_dates', to_char(d, 'YYYY-MM-DD'))
               WHEN s->'skip_weekdays' ? to_char(d, 'Dy')
                   THEN format('business calendar: %s is a %s, in skip_weekdays',
                               to_char(d, 'YYYY-MM-DD'), to_char(d, 'Dy'))
               END ORDER BY o),
           array_agg(batchonce_start_of_day(d, s->>'timezone') ORDER BY o),
           array_agg(batchonce_start_of_day(d + 1, s->>'timezone') ORDER BY o)
    INTO v_keys, v_reasons, v_ps, v_pe
    FROM unnest(p_dates) WITH ORDINALITY AS u(d, o);

    SELECT array_agg(e) INTO inserted FROM batchonce_enqueue2(
        v_keys,
        array_fill(p_job, ARRAY[cardinality(v_keys)]),
        p_dates,
        array_fill((s->>'max_attempts')::int, ARRAY[cardinality(v_keys)]),
        array_fill(p_payload, ARRAY[cardinality(v_keys)]),
        NULL,
        v_reasons,
        array_fill(s->>'timezone', ARRAY[cardinality(v_keys)]),
        v_ps,
        v_pe,
        array_fill(s->>'covers', ARRAY[cardinality(v_keys)]),
        array_fill(extract(epoch FROM (s->>'lease_ttl')::interval)::float8, ARRAY[cardinality(v_keys)]),
        array_fill(extract(epoch FROM (s->>'stale_after')::interval)::float8, ARRAY[cardinality(v_keys)]),
        array_fill(s->>'on_lease_expiry', ARRAY[cardinality(v_keys)]),
        array_fill((s->>'chunk_size')::int, ARRAY[cardinality(v_keys)]),
        array_fill(extract(epoch FROM (s->>'backoff')::interval)::float8, ARRAY[cardinality(v_keys)]),
        array_fill(extract(epoch FROM (s->>'backoff_max')::interval)::float8, ARRAY[cardinality(v_keys)]),
        array_fill((s->>'max_item_failures')::bigint, ARRAY[cardinality(v_keys)]),
        array_fill((s->>'max_attempts')::int, ARRAY[cardinality(v_keys)]),
        -- The partitions the live processes declare (issue 23); none when
        -- their settings predate partitions.
        array_fill(NULLIF((s->>'partitions')::int, 1), ARRAY[cardinality(v_keys)])) AS e;

    RETURN QUERY
    SELECT u.k,
           CASE WHEN NOT (u.k = ANY(coalesce(inserted, '{}'))) THEN 'duplicate'
                WHEN u.why IS NOT NULL THEN 'skipped'
                ELSE 'enqueued' END
    FROM unnest(v_keys, v_reasons) WITH ORDINALITY AS u(k, why, o)
    ORDER BY u.o;
END;
$$;
-- As for every engine function: a pinned search path, and no PUBLIC execute
-- (`batchonce roles` grants them), except the partition function, which
-- reads nothing and which a command job's program calls in its queries.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = current_schema()::regnamespace
          AND p.proname IN ('batch_job_run_partition_parent',
                            'batch_job_run_partition_rows', 'batch_job_run_partition_settle',
                            'batchonce_due_runs', 'batchonce_due_runs2', 'batchonce_claim2',
                            'batchonce_enqueue2', 'batchonce_operator_apply',
                            'batchonce_operator_check',
                            'batchonce_enqueue_declared')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
    EXECUTE 'GRANT EXECUTE ON FUNCTION batchonce_partition(text, integer) TO PUBLIC';
END
$$;
