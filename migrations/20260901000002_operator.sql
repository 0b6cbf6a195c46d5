-- Evidence for stale runs and outcomes of operator actions.

-- processed_count as of the last heartbeat: `runs stale` shows whether a run
-- is still making progress between heartbeats.
ALTER TABLE batch_job_run ADD COLUMN heartbeat_processed bigint NOT NULL DEFAULT 0;

-- An attempt ended by an operator's `runs fail`.
ALTER TABLE batch_job_attempt DROP CONSTRAINT batch_job_attempt_outcome_check;
ALTER TABLE batch_job_attempt ADD CONSTRAINT batch_job_attempt_outcome_check
    CHECK (outcome IN ('succeeded', 'skipped', 'retried', 'failed', 'fatal',
                       'lease_lost', 'lease_expired', 'released', 'operator_failed'));

ALTER TABLE batch_operator_action ADD CONSTRAINT batch_operator_action_reason_check
    CHECK (char_length(reason) BETWEEN 1 AND 500);

CREATE INDEX batch_operator_action_job_key_idx ON batch_operator_action (job_key, at);
