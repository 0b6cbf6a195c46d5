-- Issue 25: two costs every run pays, taken out of the claim and the finish.
-- Measured over 50,000 runs claimed and finished 250 at a time on one
-- stream (BENCHMARKS.md, "Drain, sixth round"): 58.7 µs a run before, 54.8
-- with the first change, 52.5 with both (medians of five).
--
-- Expand only. Both releases call the same functions and write the same
-- rows, so the previous release's workers run unchanged on the migrated
-- schema (workers/tests/upgrade.rs runs them).

-- 1. Room on each page of batch_job_attempt for the finish's update of the
-- attempt row, so that it is a HOT update (it changes no indexed column:
-- only finished_at, outcome and error_message) and adds no primary-key
-- entry: 86 % of them were HOT at 50 (11 % at 90, none at the default), and
-- the table kept the size it had at the default, where every update leaves
-- a dead version behind until vacuum. A storage parameter takes a brief
-- SHARE UPDATE EXCLUSIVE lock, which neither waits for nor stops the
-- workers' statements, and rewrites nothing: pages written before keep
-- their packing.
ALTER TABLE batch_job_attempt SET (fillfactor = 50);

-- 2. The token is drawn in the claim's own statement. A SQL function with a
-- SET clause is called through the function manager, which saves and
-- restores the setting on every call (3–4 µs a claimed run); without one
-- the planner inlines the body into the caller's statement. The body is
-- the same draw as before (59 random bits of gen_random_uuid, unique by
-- constraint), with every function, operator and type named in pg_catalog,
-- so no search_path can change what it calls; no role but the owner may
-- execute it, and the SECURITY DEFINER functions that call it pin their own.
CREATE OR REPLACE FUNCTION batchonce_new_token() RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT ('x' OPERATOR(pg_catalog.||)
            pg_catalog.substr(pg_catalog.translate(pg_catalog.gen_random_uuid()::pg_catalog.text,
                                                   '-', ''), 1, 16)
           )::pg_catalog.bit(64)::pg_catalog.int8 OPERATOR(pg_catalog.&) 9223372036854775807
$$;
ALTER FUNCTION batchonce_new_token() RESET ALL;
