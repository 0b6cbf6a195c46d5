-- A run is defined when it is enqueued (issue 15). Until now a run's time
-- zone, period and policies came from the configuration file of whichever
-- worker or operator touched it, so a rolling deploy that changed
-- `timezone` settled one business date under two windows. These columns
-- hold what the producer (or `enqueue`) decided, and every later reader
-- takes them from here.
--
-- Expand, then contract: the columns are nullable because the previous
-- release's producers keep inserting rows without them during a deploy, and
-- its workers never read them. A run without a context is one enqueued by
-- that release: `batchonce migrate` freezes the context of the live ones
-- from the configuration it is given, and a worker of this release freezes
-- it from its own configuration when it claims such a run, before the
-- handler starts (docs/upgrading.md). A later release may make them NOT
-- NULL once no such row is live.
ALTER TABLE batch_job_run
    ADD COLUMN timezone        text,
    ADD COLUMN period_start    timestamptz,
    ADD COLUMN period_end      timestamptz,
    ADD COLUMN covers          varchar(16),
    ADD COLUMN lease_ttl       interval,
    ADD COLUMN stale_after     interval,
    ADD COLUMN on_lease_expiry varchar(8),
    ADD COLUMN chunk_size      integer,
    ADD COLUMN backoff         interval,
    ADD COLUMN backoff_max     interval,
    ADD COLUMN max_item_failures bigint,
    -- The job's max_attempts when the run was enqueued: `max_attempts` itself
    -- grows with releases and reruns, and a rerun renews this budget.
    ADD COLUMN attempt_budget  integer;

-- All of the context or none of it (max_item_failures may be unset: no limit).
ALTER TABLE batch_job_run ADD CONSTRAINT batch_job_run_context_check CHECK (
    (timezone IS NULL AND period_start IS NULL AND period_end IS NULL AND covers IS NULL
     AND lease_ttl IS NULL AND stale_after IS NULL AND on_lease_expiry IS NULL
     AND chunk_size IS NULL AND backoff IS NULL AND backoff_max IS NULL
     AND attempt_budget IS NULL AND max_item_failures IS NULL)
    OR
    (timezone IS NOT NULL AND char_length(timezone) BETWEEN 1 AND 64
     AND period_start IS NOT NULL AND period_end IS NOT NULL AND period_start < period_end
     AND covers IN ('same-day', 'previous-day', 'firing')
     AND lease_ttl > interval '0' AND stale_after > interval '0'
     AND on_lease_expiry IN ('retry', 'hold')
     AND chunk_size BETWEEN 1 AND 100000
     AND backoff > interval '0' AND backoff_max >= backoff
     AND attempt_budget BETWEEN 1 AND 1000
     AND (max_item_failures IS NULL OR max_item_failures >= 0))
);

-- A lease token names one claim of one run. As a unique key it also decides
-- how PostgreSQL locks: an UPDATE that changes a key column takes FOR UPDATE,
-- which waits for a fenced transaction's FOR KEY SHARE, while the heartbeat,
-- which changes no key, takes FOR NO KEY UPDATE and does not. So every
-- takeover (claim, recovery, release, an operator's fail) waits for the
-- holder's open fenced transactions, and the holder's heartbeat never does:
-- a command job whose script holds its fence for most of its lease keeps
-- the lease. The database enforces this, whatever the statement says.
ALTER TABLE batch_job_run ADD CONSTRAINT batch_job_run_lease_token_key UNIQUE (lease_token);

-- The fence for programs not written in Rust: the same check and lock as
-- `queue::begin_fenced`, now FOR KEY SHARE (see above).
CREATE OR REPLACE FUNCTION batchonce_fence(p_job_key text, p_lease_token bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM batch_job_run
    WHERE job_key = p_job_key
      AND lease_token = p_lease_token
      AND status = 'RUNNING'
      AND lease_expires_at > clock_timestamp()
    FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'batchonce: lease lost for % (token %): the run was taken over, expired or finished; nothing in this transaction may commit',
            p_job_key, p_lease_token
            USING ERRCODE = 'BO001';
    END IF;
END;
$$;

-- Both functions resolve `batch_job_run` in the schema they were created
-- in, never through the caller's search path, where a schema or temporary
-- table of the caller's could stand in for it.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION batchonce_fence(text, bigint) SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION batchonce_due_runs(text[], bigint, timestamptz) SET search_path = %I, pg_temp',
                   current_schema());
END
$$;

-- The processes of a deployment, and the configuration each runs with, so
-- that `status`, `runs stale` and the exporter can say when live processes
-- disagree about a job (which processes, which keys). `role` tells workers
-- from producers; `live_until` is how long the process promised to be back
-- (a worker's next heartbeat, a producer's next tick), so a process counts
-- as live without a fixed window that suits no one.
ALTER TABLE batch_worker
    ADD COLUMN role       varchar(16) NOT NULL DEFAULT 'worker',
    ADD COLUMN live_until timestamptz;
ALTER TABLE batch_worker ADD CONSTRAINT batch_worker_role_check
    CHECK (role IN ('worker', 'producer'));

CREATE TABLE batch_process_config (
    process_id  varchar(80) NOT NULL,
    job_name    varchar(64) NOT NULL,
    -- The first 16 hex digits of the md5 of `settings` as jsonb renders it
    -- (keys sorted), so equal settings give equal fingerprints everywhere.
    fingerprint varchar(16) NOT NULL,
    settings    jsonb       NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT batch_process_config_pkey PRIMARY KEY (process_id, job_name),
    CONSTRAINT batch_process_config_process_fkey FOREIGN KEY (process_id)
        REFERENCES batch_worker (worker_id) ON DELETE CASCADE,
    CONSTRAINT batch_process_config_settings_check CHECK (octet_length(settings::text) <= 65536)
);
