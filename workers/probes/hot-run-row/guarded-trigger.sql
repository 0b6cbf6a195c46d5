-- The trigger runs for every writer but the claim and the finish, which
-- keep the tables in step themselves: its WHEN skips the rows they change
-- (without calling the function) while they set probe.in_step.
CREATE TRIGGER probe_keep_in_step AFTER UPDATE OF status, next_run_at, lease_token, lease_expires_at
  ON batch_job_run FOR EACH ROW
  WHEN (current_setting('probe.in_step', true) IS DISTINCT FROM 'on'
        AND (OLD.status IS DISTINCT FROM NEW.status OR OLD.next_run_at IS DISTINCT FROM NEW.next_run_at
             OR OLD.lease_token IS DISTINCT FROM NEW.lease_token
             OR OLD.lease_expires_at IS DISTINCT FROM NEW.lease_expires_at))
  EXECUTE FUNCTION probe_keep_in_step();
