-- Issue 42, item 4: every function of the engine resolves names in the
-- schema it was created in (and pg_catalog, which PostgreSQL searches
-- first), never through the caller's search_path. Some trigger functions
-- ran unpinned, batch_job_run_validate among them: it runs inside the
-- SECURITY DEFINER enqueue, as the migrator, and calls `starts_with` on a
-- varchar, which a `starts_with(varchar, text)` of the caller's making
-- matched better than pg_catalog's. Pinning costs each call a setting saved
-- and restored (3-4 µs an insert, BENCHMARKS.md's sixth round): the price
-- of not having to prove, function by function, that no name can be taken.
-- Pinning alone does not stop a function planted in this schema itself:
-- `batchonce roles --apply` takes CREATE on it from every role but the
-- migrator, and `batchonce preflight` warns while another role has it.
--
-- Two functions stay unpinned on purpose, because a SET clause stops the
-- planner from inlining a SQL function into its caller's statement (a call
-- per row instead): batchonce_new_token (drawn once per claimed run) and
-- batchonce_partition (once per item of a partition's scan). Every
-- function, operator and type in their bodies is pg_catalog's, named so or
-- by an SQL keyword (`bit`, `integer`), which always means pg_catalog's;
-- workers/tests/stolen_roles.rs checks both, and that no other function
-- of the schema is unpinned.
--
-- Only the engine's own functions (named batch_* or batchonce_*) are
-- altered; a function an application keeps in the same schema is its own.
-- A later migration that replaces one of them must pin it again (CREATE OR
-- REPLACE keeps only the settings it names).
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = current_schema()::regnamespace
          AND p.prokind IN ('f', 'p')
          AND (p.proname LIKE 'batch\_%' OR p.proname LIKE 'batchonce\_%')
          AND p.proname NOT IN ('batchonce_new_token', 'batchonce_partition')
          AND NOT EXISTS (SELECT 1 FROM unnest(coalesce(p.proconfig, '{}')) c
                          WHERE c LIKE 'search\_path=%')
          AND NOT EXISTS (SELECT 1 FROM pg_depend d
                          WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                            AND d.deptype = 'e')
    LOOP
        EXECUTE format('ALTER ROUTINE %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
END
$$;
