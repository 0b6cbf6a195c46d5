-- The tables of the example: the script's source and its output. An
-- application owns these; batchonce only runs the script.
CREATE TABLE IF NOT EXISTS subscription (
    customer_id bigint PRIMARY KEY,
    plan_minor  bigint NOT NULL CHECK (plan_minor >= 0)
);

CREATE TABLE IF NOT EXISTS invoice (
    business_date date   NOT NULL,
    customer_id   bigint NOT NULL,
    amount_minor  bigint NOT NULL,
    -- The attempt that wrote the row, for audits.
    job_key       text   NOT NULL,
    lease_token   bigint NOT NULL,
    CONSTRAINT invoice_once UNIQUE (business_date, customer_id)
);
