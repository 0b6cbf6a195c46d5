-- One trigger a statement, reading its old and new rows as transition
-- tables, keeps the narrow tables in step for every writer.
CREATE FUNCTION probe_keep_in_step() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM probe_due d USING probe_new n, probe_old o
    WHERE d.job_key = n.job_key AND o.job_key = n.job_key AND o.status = 'PENDING' AND n.status <> 'PENDING';
  INSERT INTO probe_due SELECT n.job_key, n.job_name, n.next_run_at FROM probe_new n JOIN probe_old o USING (job_key)
    WHERE n.status = 'PENDING' AND (o.status <> 'PENDING' OR o.next_run_at <> n.next_run_at)
    ON CONFLICT (job_key) DO UPDATE SET next_run_at = EXCLUDED.next_run_at;
  INSERT INTO probe_lease SELECT n.job_key, n.lease_token, n.lease_expires_at FROM probe_new n JOIN probe_old o USING (job_key)
    WHERE n.status = 'RUNNING' AND (o.status <> 'RUNNING' OR o.lease_token <> n.lease_token
                                    OR o.lease_expires_at <> n.lease_expires_at)
    ON CONFLICT (job_key) DO UPDATE SET lease_token = EXCLUDED.lease_token,
                                        lease_expires_at = EXCLUDED.lease_expires_at;
  DELETE FROM probe_lease l USING probe_new n, probe_old o
    WHERE l.job_key = n.job_key AND o.job_key = n.job_key AND o.status = 'RUNNING' AND n.status <> 'RUNNING';
  RETURN NULL;
END $$;
CREATE TRIGGER probe_keep_in_step AFTER UPDATE ON batch_job_run
  REFERENCING OLD TABLE AS probe_old NEW TABLE AS probe_new
  FOR EACH STATEMENT EXECUTE FUNCTION probe_keep_in_step();
