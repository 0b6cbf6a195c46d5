-- Issue 42, item 3: no raw lease token in a table the worker role reads,
-- and the database checks the fence of every write. See settlement's
-- 20261208100001_settlement_fence.sql, which this follows.
ALTER TABLE inventory_level ADD COLUMN attempt integer;
ALTER TABLE inventory_level ALTER COLUMN lease_token DROP NOT NULL;
UPDATE inventory_level l SET attempt = a.attempt
FROM batch_job_attempt a
WHERE a.job_key = l.job_key AND a.lease_token = l.lease_token;
UPDATE inventory_level SET lease_token = NULL WHERE lease_token IS NOT NULL;
ALTER TABLE inventory_level ADD CONSTRAINT inventory_level_no_token CHECK (lease_token IS NULL) NOT VALID;

CREATE TRIGGER inventory_level_attempt_insert BEFORE INSERT ON inventory_level
    FOR EACH ROW WHEN (NEW.lease_token IS NOT NULL) EXECUTE FUNCTION batchonce_item_attempt();
CREATE TRIGGER inventory_level_attempt_update BEFORE UPDATE ON inventory_level
    FOR EACH ROW WHEN (NEW.lease_token IS NOT NULL OR NEW.attempt IS NOT DISTINCT FROM OLD.attempt)
    EXECUTE FUNCTION batchonce_item_attempt();
CREATE TRIGGER inventory_level_fence BEFORE INSERT OR UPDATE ON inventory_level
    FOR EACH ROW EXECUTE FUNCTION batchonce_require_fence();
