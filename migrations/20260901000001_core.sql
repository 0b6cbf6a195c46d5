-- The engine's tables (docs/schema.md). Constraint names are part of the
-- contract: the queue module matches errors by them.

CREATE SEQUENCE batch_lease_token_seq AS bigint;

CREATE TABLE batch_job_run (
    job_key          varchar(120) NOT NULL,
    job_name         varchar(64)  NOT NULL,
    business_date    date         NOT NULL,
    status           varchar(20)  NOT NULL DEFAULT 'PENDING',
    attempts         integer      NOT NULL DEFAULT 0,
    max_attempts     integer      NOT NULL,
    next_run_at      timestamptz  NOT NULL DEFAULT now(),
    lease_owner      varchar(80),
    lease_token      bigint,
    lease_expires_at timestamptz,
    heartbeat_at     timestamptz,
    enqueued_at      timestamptz  NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    processed_count  bigint       NOT NULL DEFAULT 0,
    failed_count     bigint       NOT NULL DEFAULT 0,
    error_message    text,
    payload          jsonb        NOT NULL DEFAULT '{}'::jsonb,
    CONSTRAINT batch_job_run_pkey PRIMARY KEY (job_key),
    CONSTRAINT batch_job_run_status_check
        CHECK (status IN ('PENDING', 'RUNNING', 'SUCCEEDED', 'FAILED', 'SKIPPED')),
    CONSTRAINT batch_job_run_job_name_check
        CHECK (job_name ~ '^[a-z0-9]+(-[a-z0-9]+)*$'),
    CONSTRAINT batch_job_run_job_key_check
        CHECK (job_key ~ '^[a-z0-9-]+:[0-9T:-]+$'
               AND starts_with(job_key, job_name || ':')),
    CONSTRAINT batch_job_run_attempts_check
        CHECK (attempts >= 0 AND max_attempts >= 1 AND max_attempts <= 1000),
    CONSTRAINT batch_job_run_counts_check
        CHECK (processed_count >= 0 AND failed_count >= 0),
    CONSTRAINT batch_job_run_error_message_check
        CHECK (char_length(error_message) <= 1000),
    CONSTRAINT batch_job_run_lease_owner_check
        CHECK (char_length(lease_owner) <= 80),
    CONSTRAINT batch_job_run_payload_check
        CHECK (octet_length(payload::text) <= 65536),
    -- A RUNNING run always has a lease; the fencing rule depends on it.
    CONSTRAINT batch_job_run_lease_check
        CHECK (status <> 'RUNNING'
               OR (lease_token IS NOT NULL AND lease_owner IS NOT NULL
                   AND lease_expires_at IS NOT NULL))
);

CREATE INDEX batch_job_run_status_next_run_idx ON batch_job_run (status, next_run_at);
CREATE INDEX batch_job_run_status_started_idx ON batch_job_run (status, started_at);
CREATE INDEX batch_job_run_job_name_idx ON batch_job_run (job_name, business_date);

CREATE TABLE batch_job_attempt (
    job_key         varchar(120) NOT NULL,
    attempt         integer      NOT NULL,
    lease_token     bigint       NOT NULL,
    worker_id       varchar(80)  NOT NULL,
    started_at      timestamptz  NOT NULL,
    finished_at     timestamptz,
    outcome         varchar(20),
    error_message   text,
    processed_count bigint       NOT NULL DEFAULT 0,
    failed_count    bigint       NOT NULL DEFAULT 0,
    CONSTRAINT batch_job_attempt_pkey PRIMARY KEY (job_key, attempt),
    CONSTRAINT batch_job_attempt_run_fkey FOREIGN KEY (job_key)
        REFERENCES batch_job_run (job_key),
    CONSTRAINT batch_job_attempt_outcome_check
        CHECK (outcome IN ('succeeded', 'skipped', 'retried', 'failed', 'fatal',
                           'lease_lost', 'lease_expired', 'released')),
    CONSTRAINT batch_job_attempt_error_message_check
        CHECK (char_length(error_message) <= 1000)
);

CREATE TABLE batch_worker (
    worker_id  varchar(80)  NOT NULL,
    host       varchar(255) NOT NULL,
    pid        integer      NOT NULL,
    version    varchar(64)  NOT NULL,
    started_at timestamptz  NOT NULL DEFAULT now(),
    last_seen  timestamptz  NOT NULL DEFAULT now(),
    CONSTRAINT batch_worker_pkey PRIMARY KEY (worker_id)
);

CREATE TABLE batch_operator_action (
    id            bigint GENERATED ALWAYS AS IDENTITY,
    at            timestamptz  NOT NULL DEFAULT now(),
    operator      varchar(80)  NOT NULL,
    session_user_name text     NOT NULL DEFAULT session_user,
    action        varchar(20)  NOT NULL,
    job_key       varchar(120) NOT NULL,
    reason        varchar(500) NOT NULL,
    before_status varchar(20)  NOT NULL,
    after_status  varchar(20)  NOT NULL,
    CONSTRAINT batch_operator_action_pkey PRIMARY KEY (id),
    CONSTRAINT batch_operator_action_run_fkey FOREIGN KEY (job_key)
        REFERENCES batch_job_run (job_key),
    CONSTRAINT batch_operator_action_action_check
        CHECK (action IN ('fail', 'rerun', 'skip'))
);

-- The audit trail is append-only: history cannot be rewritten through SQL
-- that goes around the command line either.
CREATE FUNCTION batch_operator_action_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'batch_operator_action is append-only';
END;
$$;

CREATE TRIGGER batch_operator_action_no_change
    BEFORE UPDATE OR DELETE ON batch_operator_action
    FOR EACH ROW EXECUTE FUNCTION batch_operator_action_append_only();

CREATE TRIGGER batch_operator_action_no_truncate
    BEFORE TRUNCATE ON batch_operator_action
    FOR EACH STATEMENT EXECUTE FUNCTION batch_operator_action_append_only();
