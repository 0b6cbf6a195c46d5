-- A fence for programs that are not written in Rust (command jobs): called
-- first inside a transaction, it locks the run row if and only if the caller
-- still holds the lease, exactly like the engine's own fenced transactions,
-- and raises otherwise, so the transaction cannot commit. It reads the run
-- table and writes nothing.
CREATE FUNCTION batchonce_fence(p_job_key text, p_lease_token bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM batch_job_run
    WHERE job_key = p_job_key
      AND lease_token = p_lease_token
      AND status = 'RUNNING'
      AND lease_expires_at > clock_timestamp()
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'batchonce: lease lost for % (token %): the run was taken over, expired or finished; nothing in this transaction may commit',
            p_job_key, p_lease_token
            USING ERRCODE = 'BO001';
    END IF;
END;
$$;

COMMENT ON FUNCTION batchonce_fence(text, bigint) IS
    'Call first in every transaction a command job writes in: SELECT batchonce_fence($BATCHONCE_JOB_KEY, $BATCHONCE_LEASE_TOKEN). Raises SQLSTATE BO001 unless the lease is still held.';
