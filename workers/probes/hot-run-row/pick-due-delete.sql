-- The pick deletes the due rows it takes.
CREATE FUNCTION probe_pick(p_limit bigint) RETURNS SETOF text LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off SET enable_sort = off AS $$
BEGIN
  RETURN QUERY DELETE FROM probe_due d WHERE d.job_key = ANY (ARRAY(
      SELECT d2.job_key FROM probe_due d2 WHERE d2.next_run_at <= now() AND d2.job_name = 'bench-noop'
      ORDER BY d2.next_run_at, d2.job_key LIMIT p_limit FOR UPDATE SKIP LOCKED))
    RETURNING d.job_key::text;
END $$;
