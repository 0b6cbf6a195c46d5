-- Issue 42, item 3. A lease token is a capability: the worker role reads
-- this table, so it must hold no raw token. Rows name the attempt that
-- wrote them by its number (`attempt`, with `job_key`), and the database
-- refuses a write that does not hold the fence of the row's run
-- (batchonce_require_fence, migration 20261208000004).
--
-- Existing rows get their attempt from batch_job_attempt and lose their
-- token. During the rolling upgrade the previous release's workers keep
-- sending lease_token: batchonce_item_attempt turns it into the attempt
-- (a live token is that worker's fence) and stores NULL.
ALTER TABLE settlement_item ADD COLUMN attempt integer;
ALTER TABLE settlement_item ALTER COLUMN lease_token DROP NOT NULL;
UPDATE settlement_item i SET attempt = a.attempt
FROM batch_job_attempt a
WHERE a.job_key = i.job_key AND a.lease_token = i.lease_token;
UPDATE settlement_item SET lease_token = NULL WHERE lease_token IS NOT NULL;
ALTER TABLE settlement_item ADD CONSTRAINT settlement_item_no_token CHECK (lease_token IS NULL) NOT VALID;

-- The summary names the run that wrote it last, so the fence can be
-- checked; NULL on the rows written before, and on the previous release's
-- writes, which take the key of the run whose fence they hold.
ALTER TABLE settlement_summary ADD COLUMN job_key varchar(120);

-- Triggers fire in name order: the token's conversion (which may record
-- the previous release's fence) before the check.
CREATE TRIGGER settlement_item_attempt_insert BEFORE INSERT ON settlement_item
    FOR EACH ROW WHEN (NEW.lease_token IS NOT NULL) EXECUTE FUNCTION batchonce_item_attempt();
CREATE TRIGGER settlement_item_attempt_update BEFORE UPDATE ON settlement_item
    FOR EACH ROW WHEN (NEW.lease_token IS NOT NULL OR NEW.attempt IS NOT DISTINCT FROM OLD.attempt)
    EXECUTE FUNCTION batchonce_item_attempt();
CREATE TRIGGER settlement_item_fence BEFORE INSERT OR UPDATE ON settlement_item
    FOR EACH ROW EXECUTE FUNCTION batchonce_require_fence();
CREATE TRIGGER settlement_summary_fence BEFORE INSERT OR UPDATE ON settlement_summary
    FOR EACH ROW EXECUTE FUNCTION batchonce_require_fence();
