-- The control of workers/probes/hot-run-row/run.sh: today's schema, with the
-- claim and finish cut down to the writes the engine's own make (the run
-- row, the attempt row), so that the only difference from hot.sql is where
-- the PENDING and RUNNING runs are indexed.
DROP INDEX bench_bucket2_idx;
CREATE FUNCTION probe_claim(p_limit bigint) RETURNS TABLE (job_key text, lease_token bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH picked AS (SELECT batchonce_due_runs3(ARRAY['bench-noop'], p_limit, now(), false) AS job_key),
  claimed AS (
    UPDATE batch_job_run r SET status = 'RUNNING', attempts = r.attempts + 1,
      lease_token = batchonce_new_token(), lease_owner = 'probe',
      lease_expires_at = now() + r.lease_ttl, heartbeat_at = now(),
      heartbeat_processed = r.processed_count, started_at = now(), finished_at = NULL
    WHERE r.job_key = ANY (ARRAY(SELECT job_key FROM picked)) RETURNING r.*),
  attempt AS (INSERT INTO batch_job_attempt (job_key, attempt, lease_token, worker_id, started_at)
    SELECT c.job_key, c.attempts, c.lease_token, 'probe', c.started_at FROM claimed c)
  SELECT c.job_key::text, c.lease_token FROM claimed c;
END $$;
CREATE FUNCTION probe_finish(k text[], t bigint[]) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
  WITH f AS (SELECT * FROM unnest(k, t) f(job_key, token)),
  next AS (SELECT r.job_key, f.token FROM f
           JOIN batch_job_run r ON r.job_key = f.job_key AND r.lease_token = f.token
           WHERE r.status = 'RUNNING' ORDER BY r.job_key FOR NO KEY UPDATE OF r),
  upd AS (UPDATE batch_job_run r SET status = 'SUCCEEDED', finished_at = now(),
                 lease_expires_at = NULL, error_message = NULL
          FROM next WHERE r.job_key = next.job_key RETURNING r.job_key, next.token),
  att AS (UPDATE batch_job_attempt a SET finished_at = now(), outcome = 'succeeded' FROM upd
          WHERE a.job_key = upd.job_key AND a.lease_token = upd.token)
  SELECT count(*) INTO n FROM upd;
  RETURN n;
END $$;
