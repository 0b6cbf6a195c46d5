-- The `hot-guarded` design under the worker, for workers/probes/hot-run-row/
-- under-worker.sh, which adds this file as the last migration of a
-- throw-away build. Not a migration of the product: it leaves the fences,
-- heartbeats, recovery and every reader on the run row, and only the claim
-- and the finish (wrapped, not rewritten) keep the two narrow tables in step
-- themselves; the guarded trigger keeps them in step for every other writer
-- (the bench's enqueue among them).
DROP INDEX batch_job_run_claim_idx;
DROP INDEX batch_job_run_lease_idx;
ALTER TABLE batch_job_run DROP CONSTRAINT batch_job_run_lease_token_key;
ALTER TABLE batch_job_run SET (fillfactor = 45);
CREATE TABLE probe_due (job_key varchar(120) PRIMARY KEY, job_name varchar(64) NOT NULL,
                        next_run_at timestamptz NOT NULL,
                        scoped boolean GENERATED ALWAYS AS (strpos(job_key, '@') > 0) STORED);
CREATE INDEX probe_due_claim ON probe_due (next_run_at, job_key);
CREATE TABLE probe_lease (job_key varchar(120) PRIMARY KEY, lease_token bigint NOT NULL UNIQUE,
                          lease_expires_at timestamptz NOT NULL);
CREATE INDEX probe_lease_expiry ON probe_lease (lease_expires_at);
INSERT INTO probe_due SELECT job_key, job_name, next_run_at
    FROM batch_job_run WHERE status = 'PENDING';
INSERT INTO probe_lease SELECT job_key, lease_token, lease_expires_at
    FROM batch_job_run WHERE status = 'RUNNING';

-- probe_keep_in_step() is keep-in-step.sql's, which under-worker.sh adds first.
CREATE TRIGGER probe_keep_in_step
  AFTER INSERT OR UPDATE OF status, next_run_at, lease_token, lease_expires_at ON batch_job_run
  FOR EACH ROW WHEN (current_setting('batchonce.in_step', true) IS DISTINCT FROM 'on')
  EXECUTE FUNCTION probe_keep_in_step();

-- The pick takes the due rows it returns.
CREATE OR REPLACE FUNCTION batchonce_due_runs3(p_jobs text[], p_limit bigint, p_now timestamptz,
                                               p_scoped boolean)
RETURNS SETOF text LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off SET enable_sort = off AS $$
BEGIN
  RETURN QUERY DELETE FROM probe_due d WHERE d.job_key = ANY (ARRAY(
      SELECT d2.job_key FROM probe_due d2
      WHERE d2.next_run_at <= p_now AND d2.job_name = ANY (p_jobs) AND (p_scoped OR NOT d2.scoped)
      ORDER BY d2.next_run_at, d2.job_key LIMIT p_limit FOR UPDATE SKIP LOCKED))
    RETURNING d.job_key::text;
END $$;

-- The claim and the finish, wrapped: each sets batchonce.in_step for its own
-- work (the guarded trigger skips it) and keeps the two tables in step.
-- The claim's result type is read from the catalog, not written again here.
ALTER FUNCTION batchonce_claim3(text[], float8[], bigint, text, timestamptz, boolean)
    RENAME TO probe_claim3_inner;
DO $do$
BEGIN
  EXECUTE format($f$
    CREATE FUNCTION batchonce_claim3(p_jobs text[], p_ttls float8[], p_limit bigint,
                                     p_worker text, p_now timestamptz, p_scoped boolean)
    RETURNS %s LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $b$
    #variable_conflict use_column
    BEGIN
      PERFORM set_config('batchonce.in_step', 'on', true);
      RETURN QUERY
        WITH c AS (SELECT * FROM probe_claim3_inner(p_jobs, p_ttls, p_limit, p_worker, p_now, p_scoped)),
        l AS (INSERT INTO probe_lease SELECT c.job_key, c.lease_token, c.lease_expires_at FROM c)
        SELECT * FROM c;
      PERFORM set_config('batchonce.in_step', 'off', true);
    END $b$ $f$,
    pg_get_function_result('probe_claim3_inner(text[], float8[], bigint, text, timestamptz, boolean)'::regprocedure));
END
$do$;

ALTER FUNCTION batchonce_finish(text[], bigint[], text[], text[], float8[], timestamptz)
    RENAME TO probe_finish_inner;
CREATE FUNCTION batchonce_finish(p_keys text[], p_tokens bigint[], p_kinds text[],
                                 p_messages text[], p_delays float8[], p_now timestamptz)
RETURNS TABLE (job_key text, status text, expired boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE k text[]; s text[]; e boolean[];
BEGIN
  PERFORM set_config('batchonce.in_step', 'on', true);
  SELECT array_agg(f.job_key), array_agg(f.status), array_agg(f.expired) INTO k, s, e
  FROM probe_finish_inner(p_keys, p_tokens, p_kinds, p_messages, p_delays, p_now) f;
  DELETE FROM probe_lease l USING unnest(k) AS u(key) WHERE l.job_key = u.key;
  -- A run back to PENDING (a retry, a release) is due again: a statement of
  -- its own, so it reads the run rows as the finish left them.
  INSERT INTO probe_due
  SELECT r.job_key, r.job_name, r.next_run_at
  FROM unnest(k, s) AS u(key, st) JOIN batch_job_run r ON r.job_key = u.key
  WHERE u.st = 'PENDING';
  PERFORM set_config('batchonce.in_step', 'off', true);
  RETURN QUERY SELECT * FROM unnest(k, s, e);
END $$;
