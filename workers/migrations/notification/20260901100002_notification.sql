-- notification-send: the notifications to send per business date (the source,
-- normally filled by the application) and one delivery per
-- (business date, campaign, customer, channel), which is what makes a send
-- happen once however often the run is retried or re-run.

CREATE TABLE IF NOT EXISTS notification_request (
    request_id    bigserial PRIMARY KEY,
    business_date date   NOT NULL,
    campaign      text   NOT NULL CHECK (length(campaign) BETWEEN 1 AND 200),
    customer_id   bigint NOT NULL,
    channel       text   NOT NULL CHECK (channel IN ('email', 'sms', 'push')),
    address       text   NOT NULL CHECK (octet_length(address) <= 1024),
    body          text   NOT NULL CHECK (octet_length(body) <= 65536)
);

CREATE INDEX IF NOT EXISTS notification_request_date_idx
    ON notification_request (business_date, request_id);

CREATE TABLE notification_delivery (
    delivery_id         bigserial   PRIMARY KEY,
    business_date       date        NOT NULL,
    campaign            text        NOT NULL,
    customer_id         bigint      NOT NULL,
    channel             text        NOT NULL,
    address             text        NOT NULL,
    body                text        NOT NULL,
    request_id          bigint      NOT NULL,
    -- Derived from the delivery's unique key, so every attempt of every run
    -- gives the provider the same key for the same message.
    idempotency_key     text        NOT NULL,
    state               text        NOT NULL DEFAULT 'pending',
    attempts            integer     NOT NULL DEFAULT 0,
    provider_message_id text,
    last_error          text,
    -- The run and the lease token of the attempt that last changed the row.
    job_key             text        NOT NULL,
    lease_token         bigint      NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    sent_at             timestamptz,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT notification_delivery_key UNIQUE (business_date, campaign, customer_id, channel),
    CONSTRAINT notification_delivery_idempotency_key UNIQUE (idempotency_key),
    CONSTRAINT notification_delivery_state CHECK (state IN ('pending', 'sent', 'failed')),
    CONSTRAINT notification_delivery_sent_has_id
        CHECK (state <> 'sent' OR (provider_message_id IS NOT NULL AND sent_at IS NOT NULL))
);

CREATE INDEX notification_delivery_pending_idx
    ON notification_delivery (business_date, delivery_id) WHERE state = 'pending';
