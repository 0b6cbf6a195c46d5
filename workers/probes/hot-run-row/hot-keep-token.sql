-- The `hot-keep-token` variant of workers/probes/hot-run-row/run.sh: hot.sql
-- with the run row's token still a unique key, as the fences need today (a
-- takeover changes a key, so it waits for their FOR KEY SHARE locks). The
-- claim changes the token, so only the finish can be HOT.
DROP INDEX bench_bucket2_idx;
DROP INDEX batch_job_run_claim_idx;
DROP INDEX batch_job_run_lease_idx;
CREATE TABLE probe_due (job_key varchar(120) PRIMARY KEY, job_name varchar(64) NOT NULL,
                        next_run_at timestamptz NOT NULL);
CREATE INDEX probe_due_claim ON probe_due (next_run_at, job_key);
INSERT INTO probe_due SELECT job_key, job_name, next_run_at FROM batch_job_run WHERE status = 'PENDING';
CREATE TABLE probe_lease (job_key varchar(120) PRIMARY KEY, lease_token bigint NOT NULL,
                          lease_expires_at timestamptz NOT NULL);
CREATE INDEX probe_lease_expiry ON probe_lease (lease_expires_at);
CREATE FUNCTION probe_pick(p_limit bigint) RETURNS SETOF text LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off SET enable_sort = off AS $$
BEGIN
  RETURN QUERY DELETE FROM probe_due d WHERE d.job_key = ANY (ARRAY(
      SELECT d2.job_key FROM probe_due d2 WHERE d2.next_run_at <= now() AND d2.job_name = 'bench-noop'
      ORDER BY d2.next_run_at, d2.job_key LIMIT p_limit FOR UPDATE SKIP LOCKED))
    RETURNING d.job_key::text;
END $$;
CREATE FUNCTION probe_claim(p_limit bigint) RETURNS TABLE (job_key text, lease_token bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH picked AS (SELECT probe_pick(p_limit) AS job_key),
  claimed AS (
    UPDATE batch_job_run r SET status = 'RUNNING', attempts = r.attempts + 1,
      lease_token = batchonce_new_token(), lease_owner = 'probe',
      lease_expires_at = now() + r.lease_ttl, heartbeat_at = now(),
      heartbeat_processed = r.processed_count, started_at = now(), finished_at = NULL
    WHERE r.job_key = ANY (ARRAY(SELECT job_key FROM picked)) RETURNING r.*),
  lease AS (INSERT INTO probe_lease SELECT c.job_key, c.lease_token, c.lease_expires_at FROM claimed c),
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
  del AS (DELETE FROM probe_lease l USING upd WHERE l.job_key = upd.job_key),
  att AS (UPDATE batch_job_attempt a SET finished_at = now(), outcome = 'succeeded' FROM upd
          WHERE a.job_key = upd.job_key AND a.lease_token = upd.token)
  SELECT count(*) INTO n FROM upd;
  RETURN n;
END $$;
