-- Tables of the daily-settlement job kind. `orders` is the source; a real
-- deployment points the job at its own orders table with these columns.

CREATE TABLE IF NOT EXISTS orders (
    order_id     bigint      PRIMARY KEY,
    merchant_id  bigint      NOT NULL,
    amount_minor bigint      NOT NULL,
    paid_at      timestamptz NOT NULL
);

CREATE INDEX IF NOT EXISTS orders_paid_at_idx ON orders (paid_at, order_id);

CREATE TABLE settlement_item (
    business_date date         NOT NULL,
    order_id      bigint       NOT NULL,
    merchant_id   bigint       NOT NULL,
    amount_minor  bigint       NOT NULL,
    job_key       varchar(120) NOT NULL,
    lease_token   bigint       NOT NULL,
    created_at    timestamptz  NOT NULL DEFAULT now(),
    CONSTRAINT settlement_item_business_date_order_id_key UNIQUE (business_date, order_id)
);

CREATE TABLE settlement_summary (
    business_date date   NOT NULL,
    merchant_id   bigint NOT NULL,
    order_count   bigint NOT NULL,
    total_minor   bigint NOT NULL,
    CONSTRAINT settlement_summary_pkey PRIMARY KEY (business_date, merchant_id)
);
