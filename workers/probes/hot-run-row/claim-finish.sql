-- The claim and the finish of every variant, with the writes the engine's
-- own make (the run row, the attempt row); probe_claimed and probe_finished
-- are the variant's upkeep of the narrow tables. Both set probe.in_step for
-- their own work, which a guarded trigger reads.
CREATE FUNCTION probe_claim(p_limit bigint) RETURNS TABLE (job_key text, lease_token bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE k text[]; t bigint[]; e timestamptz[];
BEGIN
  PERFORM set_config('probe.in_step', 'on', true);
  WITH picked AS (SELECT probe_pick(p_limit) AS job_key),
  claimed AS (
    UPDATE batch_job_run r SET status = 'RUNNING', attempts = r.attempts + 1,
      lease_token = batchonce_new_token(), lease_owner = 'probe',
      lease_expires_at = now() + r.lease_ttl, heartbeat_at = now(),
      heartbeat_processed = r.processed_count, started_at = now(), finished_at = NULL
    WHERE r.job_key = ANY (ARRAY(SELECT p.job_key FROM picked p)) RETURNING r.*),
  attempt AS (INSERT INTO batch_job_attempt (job_key, attempt, lease_token, worker_id, started_at)
    SELECT c.job_key, c.attempts, c.lease_token, 'probe', c.started_at FROM claimed c)
  SELECT array_agg(c.job_key), array_agg(c.lease_token), array_agg(c.lease_expires_at)
  INTO k, t, e FROM claimed c;
  PERFORM probe_claimed(k, t, e);
  PERFORM set_config('probe.in_step', 'off', true);
  RETURN QUERY SELECT * FROM unnest(k, t);
END $$;
CREATE FUNCTION probe_finish(p_keys text[], p_tokens bigint[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE k text[];
BEGIN
  PERFORM set_config('probe.in_step', 'on', true);
  WITH f AS (SELECT * FROM unnest(p_keys, p_tokens) f(job_key, token)),
  next AS (SELECT r.job_key, f.token FROM f
           JOIN batch_job_run r ON r.job_key = f.job_key AND r.lease_token = f.token
           WHERE r.status = 'RUNNING' ORDER BY r.job_key FOR NO KEY UPDATE OF r),
  upd AS (UPDATE batch_job_run r SET status = 'SUCCEEDED', finished_at = now(),
                 lease_expires_at = NULL, error_message = NULL
          FROM next WHERE r.job_key = next.job_key RETURNING r.job_key, next.token),
  att AS (UPDATE batch_job_attempt a SET finished_at = now(), outcome = 'succeeded' FROM upd
          WHERE a.job_key = upd.job_key AND a.lease_token = upd.token)
  SELECT array_agg(u.job_key) INTO k FROM upd u;
  PERFORM probe_finished(k);
  PERFORM set_config('probe.in_step', 'off', true);
  RETURN cardinality(k);
END $$;
