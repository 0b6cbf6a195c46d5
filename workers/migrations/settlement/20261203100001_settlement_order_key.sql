-- An order is settled once, ever (issue 15): the item key names the order,
-- not the run or its business date. Under (business_date, order_id) alone,
-- two runs whose windows overlapped (a time zone changed between workers
-- mid-run, or between two periods) settled one order under two dates.
--
-- Rows that already break the rule are real double settlements that an
-- operator must look at, not something a migration may delete: the
-- migration stops and names them (docs/upgrading.md has the query).
DO $$
DECLARE
    n bigint;
    example bigint;
BEGIN
    SELECT count(*), min(order_id) INTO n, example FROM (
        SELECT order_id FROM settlement_item GROUP BY order_id HAVING count(*) > 1
    ) d;
    IF n > 0 THEN
        RAISE EXCEPTION 'settlement_item holds % order(s) settled under more than one business date (for example order %); resolve them before upgrading: see docs/upgrading.md', n, example;
    END IF;
END
$$;

ALTER TABLE settlement_item ADD CONSTRAINT settlement_item_order_key UNIQUE (order_id);

-- The old key stays until a later release: the previous release's workers,
-- still running during a rolling deploy, name it in ON CONFLICT. Their
-- inserts of an order already settled under another date now fail on the
-- new key instead of writing it twice.
