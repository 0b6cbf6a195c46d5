-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_operator_archive(p_before date, p_job text, p_limit bigint, p_operator text, p_reason text, p_dry_run boolean, p_now timestamp with time zone)
 RETURNS TABLE(job text, runs_moved bigint, attempts_moved bigint, audit_id bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
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
$function$
