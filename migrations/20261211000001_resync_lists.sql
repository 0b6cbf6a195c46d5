-- The due and running lists again, with every writer stopped.
--
-- 20261207000001 filled batch_job_due and batch_job_running from the run
-- table before it created the row trigger that keeps them in step, and
-- without stopping writers. A rolling upgrade migrates under the previous
-- release's running workers, so a run one of them changed in between
-- could be left out: a run put back to PENDING for its retry with no due
-- entry (no claim would ever find it), or a run claimed with no running
-- entry (lease recovery would never see it). The rolling-upgrade test met
-- it once. Now the trigger exists, so with writers stopped for one
-- statement each, whatever is missing is added, and every later change is
-- kept by the trigger.
--
-- Entries too many go too (a run changed the other way in between). They
-- are harmless by design, since every reader checks the run row and the
-- claim drops a due entry whose run is not PENDING, so an entry a claim
-- has locked is skipped rather than waited for while that claim waits for
-- this lock. A paused job's new due entries are parked by the pause's
-- trigger on batch_job_due, as every insert there is.
LOCK TABLE batch_job_run IN SHARE ROW EXCLUSIVE MODE;

INSERT INTO batch_job_due (job_key, job_name, next_run_at, scoped)
SELECT r.job_key, r.job_name, r.next_run_at, r.scope IS NOT NULL
FROM batch_job_run r
WHERE r.status = 'PENDING'
  AND NOT EXISTS (SELECT 1 FROM batch_job_due d WHERE d.job_key = r.job_key)
ON CONFLICT (job_key) DO NOTHING;

INSERT INTO batch_job_running (job_key, job_name)
SELECT r.job_key, r.job_name
FROM batch_job_run r
WHERE r.status = 'RUNNING'
  AND NOT EXISTS (SELECT 1 FROM batch_job_running g WHERE g.job_key = r.job_key)
ON CONFLICT (job_key) DO NOTHING;

DELETE FROM batch_job_due d WHERE d.job_key IN (
    SELECT d2.job_key FROM batch_job_due d2
    WHERE NOT EXISTS (SELECT 1 FROM batch_job_run r
                      WHERE r.job_key = d2.job_key AND r.status = 'PENDING')
    FOR UPDATE SKIP LOCKED);

DELETE FROM batch_job_running g WHERE g.job_key IN (
    SELECT g2.job_key FROM batch_job_running g2
    WHERE NOT EXISTS (SELECT 1 FROM batch_job_run r
                      WHERE r.job_key = g2.job_key AND r.status = 'RUNNING')
    FOR UPDATE SKIP LOCKED);
