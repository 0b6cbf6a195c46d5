-- Indexes that hold only the live runs they serve, and a claim whose scan
-- cannot fall back to reading every pending run (issue 8).
--
-- Every state change of a run is a non-HOT update (status is indexed), so
-- PostgreSQL adds an entry for the new row version to every index whose
-- predicate that version satisfies. The full (status, next_run_at) and
-- (status, started_at) indexes took two entries per state change, for every
-- finished run too, and only ever served PENDING and RUNNING lookups.
DROP INDEX batch_job_run_status_next_run_idx;
DROP INDEX batch_job_run_status_started_idx;

-- A run holds a lease expiry exactly while it is RUNNING. Every writer that
-- ends a lease already clears it; the constraint makes it a rule, so the
-- partial index below holds the RUNNING runs and nothing else.
UPDATE batch_job_run SET lease_expires_at = NULL
WHERE status <> 'RUNNING' AND lease_expires_at IS NOT NULL;
ALTER TABLE batch_job_run ADD CONSTRAINT batch_job_run_lease_expiry_check
    CHECK ((status = 'RUNNING') = (lease_expires_at IS NOT NULL));

-- Lease recovery, stale checks and the gauges read RUNNING runs through this
-- index. Its predicate is deliberately not `status = 'RUNNING'`: the hot
-- statements that look runs up by key (heartbeat, finish, fence) filter on
-- status, and with such a predicate the planner scanned this whole index
-- (dead entries of every run finished since the last vacuum included)
-- instead of looking the keys up: 3 ms per finish of 8 runs with 7,840 dead
-- entries, measured with auto_explain during `batchonce-bench drain`.
CREATE INDEX batch_job_run_lease_idx ON batch_job_run (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;

-- The claim's pick: the due PENDING runs of the given jobs in claim order,
-- locked, skipping rows another claimer holds. It must read
-- batch_job_run_claim_idx in order and stop at the limit. Under statistics
-- that say few runs are pending (the usual state, since most rows are
-- history), the planner chose a bitmap scan of every pending row plus a
-- sort instead, so after an outage each claim read the whole backlog:
-- 3 ms per claim of 10 at 20,000 pending, quadratic over a drain. The
-- function's settings rule those plans out for this one query.
CREATE FUNCTION batchonce_due_runs(p_jobs text[], p_limit bigint, p_now timestamptz)
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
BEGIN
    RETURN QUERY
    SELECT r.job_key::text
    FROM batch_job_run r
    WHERE r.status = 'PENDING'
      AND r.next_run_at <= p_now
      AND r.job_name = ANY (p_jobs)
    ORDER BY r.next_run_at, r.job_key
    LIMIT p_limit
    FOR UPDATE SKIP LOCKED;
END;
$$;

COMMENT ON FUNCTION batchonce_due_runs(text[], bigint, timestamptz) IS
    'The claim''s pick (queue::claim): due PENDING runs in claim order, locked with SKIP LOCKED, always through batch_job_run_claim_idx.';
