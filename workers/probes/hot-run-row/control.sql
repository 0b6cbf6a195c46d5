-- control: today's schema; the claim's pick is the engine's own.
DROP INDEX bench_bucket2_idx;
CREATE FUNCTION probe_pick(p_limit bigint) RETURNS SETOF text LANGUAGE sql VOLATILE AS $$
  SELECT batchonce_due_runs3(ARRAY['bench-noop'], p_limit, now(), false)
$$;
