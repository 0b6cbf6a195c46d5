-- The pick locks due rows; a trigger deletes them as the runs leave PENDING.
CREATE FUNCTION probe_pick(p_limit bigint) RETURNS SETOF text LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off SET enable_sort = off AS $$
BEGIN
  RETURN QUERY SELECT d.job_key::text FROM probe_due d
    WHERE d.next_run_at <= now() AND d.job_name = 'bench-noop'
    ORDER BY d.next_run_at, d.job_key LIMIT p_limit FOR UPDATE SKIP LOCKED;
END $$;
