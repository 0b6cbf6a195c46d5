-- The probe's tables, runs and procedures (workers/probes/claim-streams/run.sh).
-- Runs carry the context a real enqueue stores, so rows are as wide as in a drain.
INSERT INTO batch_job_run (job_key, job_name, business_date, status, max_attempts, next_run_at,
  timezone, period_start, period_end, covers, lease_ttl, stale_after, on_lease_expiry, chunk_size,
  backoff, backoff_max, attempt_budget)
SELECT 'bench-noop:' || lpad(g::text, 9, '0'), 'bench-noop', '2026-01-01', 'PENDING', 3, now() - interval '1 minute',
  'UTC', '2026-01-01', '2026-01-02', 'same-day', '30 s', '1 h', 'retry', 500, '1 s', '1 h', 3
FROM generate_series(1, 60000) g;
CREATE INDEX bench_bucket2_idx ON batch_job_run (((hashtext(job_key) & 2147483647) % 2), next_run_at, job_key) WHERE status = 'PENDING';
CREATE FUNCTION bench_due2(p_limit bigint, p_bucket int) RETURNS SETOF text LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off SET enable_sort = off AS $$
BEGIN
  RETURN QUERY SELECT r.job_key::text FROM batch_job_run r
  WHERE r.status = 'PENDING' AND r.next_run_at <= now() AND r.job_name = 'bench-noop'
    AND ((hashtext(r.job_key) & 2147483647) % 2) = p_bucket
  ORDER BY r.next_run_at, r.job_key LIMIT p_limit FOR UPDATE SKIP LOCKED;
END $$;
CREATE FUNCTION bench_claim2(p_limit bigint, p_bucket int) RETURNS TABLE (job_key text, lease_token bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH picked AS (SELECT bench_due2(p_limit, p_bucket) AS job_key),
  claimed AS (
    UPDATE batch_job_run r SET status = 'RUNNING', attempts = r.attempts + 1, lease_token = batchonce_new_token(),
      lease_owner = 'probe', lease_expires_at = now() + r.lease_ttl, heartbeat_at = now(),
      heartbeat_processed = r.processed_count, started_at = now(), finished_at = NULL
    WHERE r.job_key = ANY (ARRAY(SELECT job_key FROM picked)) RETURNING r.*),
  attempt AS (INSERT INTO batch_job_attempt (job_key, attempt, lease_token, worker_id, started_at)
    SELECT c.job_key, c.attempts, c.lease_token, 'probe', c.started_at FROM claimed c)
  SELECT c.job_key::text, c.lease_token FROM claimed c;
END $$;
CREATE PROCEDURE bench_cycle(p_mode int, p_bucket int, p_limit int) LANGUAGE plpgsql AS $$
DECLARE k text[]; t bigint[];
BEGIN
  IF p_mode = 0 THEN
    SELECT array_agg(c.job_key), array_agg(c.lease_token) INTO k, t
    FROM batchonce_claim3(ARRAY['bench-noop'], ARRAY[30::float8], p_limit, 'probe', now(), false) c;
  ELSE
    SELECT array_agg(c.job_key), array_agg(c.lease_token) INTO k, t FROM bench_claim2(p_limit, p_bucket) c;
  END IF;
  COMMIT;
  IF k IS NOT NULL THEN
    PERFORM count(*) FROM batchonce_finish(k, t, array_fill('succeeded'::text, ARRAY[cardinality(k)]),
      array_fill(NULL::text, ARRAY[cardinality(k)]), array_fill(0::float8, ARRAY[cardinality(k)]), now());
  END IF;
  COMMIT;
END $$;
VACUUM ANALYZE batch_job_run;
CREATE TABLE bench_q (id bigint PRIMARY KEY, state text NOT NULL, token bigint);
CREATE INDEX bench_q_pending ON bench_q (id) WHERE state = 'pending';
CREATE SEQUENCE bench_q_token;
INSERT INTO bench_q SELECT g, 'pending', NULL FROM generate_series(1, 60000) g;
VACUUM ANALYZE bench_q;
CREATE PROCEDURE bench_bare(p_limit int) LANGUAGE plpgsql AS $$
DECLARE k bigint[]; t bigint[];
BEGIN
  WITH c AS (SELECT id FROM bench_q WHERE state = 'pending' ORDER BY id LIMIT p_limit FOR UPDATE SKIP LOCKED),
  u AS (UPDATE bench_q q SET state = 'running', token = nextval('bench_q_token') FROM c WHERE q.id = c.id RETURNING q.id, q.token)
  SELECT array_agg(u.id), array_agg(u.token) INTO k, t FROM u;
  COMMIT;
  UPDATE bench_q q SET state = 'done' FROM unnest(k, t) AS u(id, token)
  WHERE q.id = u.id AND q.token = u.token AND q.state = 'running';
  COMMIT;
END $$;
