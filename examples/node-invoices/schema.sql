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
    -- The run and the attempt (its number, never its lease token: a token
    -- is the capability to change the run) that wrote the row, for audits.
    job_key       text    NOT NULL,
    attempt       integer NOT NULL,
    CONSTRAINT invoice_once UNIQUE (business_date, customer_id)
);

-- The database refuses an invoice written outside the fence of its run
-- (job_key): only the attempt holding the lease may write, inside
-- batchonce.fenced(). batchonce's migrations define the function.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgrelid = 'invoice'::regclass AND tgname = 'invoice_fence') THEN
        CREATE TRIGGER invoice_fence BEFORE INSERT OR UPDATE ON invoice
            FOR EACH ROW EXECUTE FUNCTION batchonce_require_fence();
    END IF;
END
$$;
