-- The token is a unique key of the lease row, no longer of the run row, so
-- a claim changes no indexed column of the run row (a fence would lock the
-- lease row).
ALTER TABLE batch_job_run DROP CONSTRAINT batch_job_run_lease_token_key;
CREATE UNIQUE INDEX probe_lease_token ON probe_lease (lease_token);
