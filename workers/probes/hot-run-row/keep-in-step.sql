-- A row trigger's function that keeps the narrow tables in step with a run
-- row's state, due time, token and lease expiry, whoever inserted or changed
-- them.
CREATE FUNCTION probe_keep_in_step() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'UPDATE' AND OLD.status = 'PENDING' AND NEW.status <> 'PENDING' THEN
    DELETE FROM probe_due WHERE job_key = OLD.job_key;
  ELSIF NEW.status = 'PENDING' THEN
    INSERT INTO probe_due VALUES (NEW.job_key, NEW.job_name, NEW.next_run_at)
    ON CONFLICT (job_key) DO UPDATE SET next_run_at = EXCLUDED.next_run_at;
  END IF;
  IF NEW.status = 'RUNNING' THEN
    INSERT INTO probe_lease VALUES (NEW.job_key, NEW.lease_token, NEW.lease_expires_at)
    ON CONFLICT (job_key) DO UPDATE SET lease_token = EXCLUDED.lease_token,
                                        lease_expires_at = EXCLUDED.lease_expires_at;
  ELSIF TG_OP = 'UPDATE' AND OLD.status = 'RUNNING' THEN
    DELETE FROM probe_lease WHERE job_key = OLD.job_key;
  END IF;
  RETURN NULL;
END $$;
