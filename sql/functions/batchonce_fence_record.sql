-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_fence_record(p_key text)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    v_new boolean;
    v_old integer;
BEGIN
    -- An update of the same run's row (a chunk after a chunk) stays on its
    -- page and writes no index entry.
    INSERT INTO batch_fence_held (pid, xact_start, job_key)
    VALUES (pg_backend_pid(), now(), p_key)
    ON CONFLICT (pid, job_key) DO UPDATE SET xact_start = EXCLUDED.xact_start
    RETURNING xmax = 0 INTO v_new;
    DELETE FROM batch_fence_held
    WHERE pid = pg_backend_pid() AND xact_start <> now();
    GET DIAGNOSTICS v_old = ROW_COUNT;
    IF v_new AND v_old = 0 THEN
        -- This backend held no row: its first fence (or its first since a
        -- rollback). Rows of backends that no longer exist go; a row
        -- another sweep has locked is left to it.
        DELETE FROM batch_fence_held h
        WHERE h.ctid = ANY (ARRAY(
            SELECT g.ctid FROM batch_fence_held g
            WHERE g.pid <> pg_backend_pid()
              AND NOT EXISTS (SELECT 1 FROM pg_stat_get_activity(NULL) a WHERE a.pid = g.pid)
            FOR UPDATE SKIP LOCKED));
    END IF;
END;
$function$
