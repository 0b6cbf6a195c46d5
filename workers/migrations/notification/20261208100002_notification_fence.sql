-- Issue 42, item 3: no raw lease token in a table the worker role reads
-- (a worker login finished a notification run it did not hold with a token
-- read here), and the database checks the fence of every write. See
-- settlement's 20261208100001_settlement_fence.sql, which this follows.
ALTER TABLE notification_delivery ADD COLUMN attempt integer;
ALTER TABLE notification_delivery ALTER COLUMN lease_token DROP NOT NULL;
UPDATE notification_delivery d SET attempt = a.attempt
FROM batch_job_attempt a
WHERE a.job_key = d.job_key AND a.lease_token = d.lease_token;
UPDATE notification_delivery SET lease_token = NULL WHERE lease_token IS NOT NULL;
ALTER TABLE notification_delivery ADD CONSTRAINT notification_delivery_no_token CHECK (lease_token IS NULL) NOT VALID;

CREATE TRIGGER notification_delivery_attempt_insert BEFORE INSERT ON notification_delivery
    FOR EACH ROW WHEN (NEW.lease_token IS NOT NULL) EXECUTE FUNCTION batchonce_item_attempt();
CREATE TRIGGER notification_delivery_attempt_update BEFORE UPDATE ON notification_delivery
    FOR EACH ROW WHEN (NEW.lease_token IS NOT NULL OR NEW.attempt IS NOT DISTINCT FROM OLD.attempt)
    EXECUTE FUNCTION batchonce_item_attempt();
CREATE TRIGGER notification_delivery_fence BEFORE INSERT OR UPDATE ON notification_delivery
    FOR EACH ROW EXECUTE FUNCTION batchonce_require_fence();
