-- The trigger runs for every writer, the claim and the finish included.
CREATE TRIGGER probe_keep_in_step AFTER UPDATE OF status, next_run_at, lease_token, lease_expires_at
  ON batch_job_run FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.next_run_at IS DISTINCT FROM NEW.next_run_at
        OR OLD.lease_token IS DISTINCT FROM NEW.lease_token
        OR OLD.lease_expires_at IS DISTINCT FROM NEW.lease_expires_at)
  EXECUTE FUNCTION probe_keep_in_step();
