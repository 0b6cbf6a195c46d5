-- The contract of release 0.2.0: the engine functions that only releases
-- before 0.2.0 call, which `batchonce migrate --contract` drops once no
-- live process of such a release is registered (src/ops/contract.rs owns
-- this file, reads one `DROP FUNCTION IF EXISTS <signature>;` per line and
-- reports each function it dropped). Nothing in 0.2.0 calls any of them:
-- its worker claims through batchonce_claim3, its producer, `enqueue` and
-- console enqueue through batchonce_enqueue2, and its operator records a
-- `terminate-blocker` through batchonce_operator_audit_terminate_sessions.
-- Callers first, so each drop finds no caller left.

-- The claims before batchonce_claim3 (an unreleased 0.1.x build's); the
-- first calls batchonce_due_runs, the second batchonce_claim3.
DROP FUNCTION IF EXISTS batchonce_claim(text[], double precision[], bigint, text, timestamp with time zone);
DROP FUNCTION IF EXISTS batchonce_claim2(text[], double precision[], bigint, text, timestamp with time zone);
-- The picks: batchonce_due_runs is 0.1.0's (its claim statement calls it);
-- batchonce_due_runs2 calls batchonce_due_runs3, which nothing else calls
-- since batchonce_claim3 holds its own pick (migration 20261207000001).
DROP FUNCTION IF EXISTS batchonce_due_runs(text[], bigint, timestamp with time zone);
DROP FUNCTION IF EXISTS batchonce_due_runs2(text[], bigint, timestamp with time zone);
DROP FUNCTION IF EXISTS batchonce_due_runs3(text[], bigint, timestamp with time zone, boolean);
-- The enqueue without partitions, a call of batchonce_enqueue2.
DROP FUNCTION IF EXISTS batchonce_enqueue(text[], text[], date[], integer[], jsonb[], timestamp with time zone, text[], text[], timestamp with time zone[], timestamp with time zone[], text[], double precision[], double precision[], text[], integer[], double precision[], double precision[], bigint[], integer[]);
-- The `terminate-blocker` audit row without the sessions it names.
DROP FUNCTION IF EXISTS batchonce_operator_audit_terminate(text, text, text, text);
