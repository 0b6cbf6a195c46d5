-- No index of the run row names its state or its lease expiry: the PENDING
-- runs are listed in probe_due, the RUNNING ones in probe_lease.
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
