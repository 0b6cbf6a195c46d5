-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_claim3(p_jobs text[], p_ttls double precision[], p_limit bigint, p_worker text, p_now timestamp with time zone, p_scoped boolean)
 RETURNS TABLE(job_key text, job_name text, business_date date, attempts integer, max_attempts integer, lease_token bigint, lease_expires_at timestamp with time zone, processed_count bigint, payload jsonb, started_at timestamp with time zone, timezone text, period_start timestamp with time zone, period_end timestamp with time zone, covers text, lease_ttl_s double precision, stale_after_s double precision, on_lease_expiry text, chunk_size integer, backoff_s double precision, backoff_max_s double precision, max_item_failures bigint, attempt_budget integer, partition_no integer, partition_count integer, partition_of text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
 SET enable_bitmapscan TO 'off'
 SET enable_sort TO 'off'
 SET enable_seqscan TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    v_now := batchonce_now(p_now);
    IF p_worker IS NULL OR char_length(p_worker) NOT BETWEEN 1 AND 80 THEN
        RAISE EXCEPTION 'batchonce_claim3: a worker id of 1 to 80 characters is required';
    END IF;
    PERFORM set_config('batchonce.in_step', 'on', true);
    RETURN QUERY
    -- The pick takes the due entries it returns, in claim order, skipping
    -- those another claimer holds. It is part of this statement, so it reads
    -- with the snapshot the update of the runs reads with: an entry it sees,
    -- it sees the run of (both are written in one transaction), and an entry
    -- whose run is no longer PENDING is dropped here, harming nothing.
    WITH picked AS (
        DELETE FROM batch_job_due d WHERE d.job_key = ANY (ARRAY(
            SELECT d2.job_key FROM batch_job_due d2
            WHERE d2.next_run_at <= v_now
              AND d2.job_name = ANY (p_jobs)
              AND (COALESCE(p_scoped, false) OR NOT d2.scoped)
            ORDER BY d2.next_run_at, d2.job_key
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED))
        RETURNING d.job_key
    ), claimed AS (
        UPDATE batch_job_run r
        SET status = 'RUNNING',
            attempts = r.attempts + 1,
            lease_token = batchonce_new_token(),
            lease_owner = p_worker,
            -- The run's own lease length; the claimer's, within the bounds
            -- of lease_ttl, only for a run enqueued without one.
            lease_expires_at = v_now + COALESCE(r.lease_ttl, make_interval(secs => (
                SELECT LEAST(GREATEST(COALESCE(c.ttl, 30), 1), 86400)
                FROM unnest(p_jobs, p_ttls) AS c(n, ttl)
                WHERE c.n = r.job_name LIMIT 1))),
            heartbeat_at = v_now,
            heartbeat_processed = r.processed_count,
            started_at = v_now,
            finished_at = NULL
        -- An array of keys, not a join: a join's estimate of the picked
        -- rows made the cached plan hash the whole table.
        WHERE r.job_key = ANY (ARRAY(SELECT job_key FROM picked))
          AND r.status = 'PENDING'
        RETURNING r.*
    ), running AS (
        INSERT INTO batch_job_running (job_key, job_name)
        SELECT c.job_key, c.job_name FROM claimed c
        ON CONFLICT (job_key) DO NOTHING
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
    PERFORM set_config('batchonce.in_step', 'off', true);
END;
$function$
