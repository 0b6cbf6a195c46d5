-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_freeze_context(p_key text, p_token bigint, p_tz text, p_ps timestamp with time zone, p_pe timestamp with time zone, p_cov text, p_ttl double precision, p_stale double precision, p_exp text, p_chunk integer, p_bo double precision, p_bomax double precision, p_mif bigint, p_budget integer)
 RETURNS TABLE(timezone text, period_start timestamp with time zone, period_end timestamp with time zone, covers text, lease_ttl_s double precision, stale_after_s double precision, on_lease_expiry text, chunk_size integer, backoff_s double precision, backoff_max_s double precision, max_item_failures bigint, attempt_budget integer)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    -- NaN is outside every range; NULLs are left to the context's check.
    IF NOT (p_ttl BETWEEN 1 AND 86400) OR NOT (p_stale BETWEEN p_ttl AND 2592000)
       OR NOT (p_bomax BETWEEN 0 AND 604800) OR NOT (p_bo BETWEEN 0 AND p_bomax) THEN
        RAISE EXCEPTION 'batchonce_freeze_context: a context needs lease_ttl of 1s to 24h, stale_after from lease_ttl to 30d and backoff up to backoff_max up to 7d (got %, %, %, % seconds)',
            p_ttl, p_stale, p_bo, p_bomax USING ERRCODE = '22023';
    END IF;
    UPDATE batch_job_run r
    SET timezone = p_tz, period_start = p_ps, period_end = p_pe, covers = p_cov,
        lease_ttl = make_interval(secs => p_ttl), stale_after = make_interval(secs => p_stale),
        on_lease_expiry = p_exp, chunk_size = p_chunk, backoff = make_interval(secs => p_bo),
        backoff_max = make_interval(secs => p_bomax), max_item_failures = p_mif,
        attempt_budget = p_budget
    WHERE r.job_key = p_key AND r.lease_token = p_token AND r.timezone IS NULL;
    RETURN QUERY
    SELECT r.timezone, r.period_start, r.period_end, r.covers::text,
           extract(epoch FROM r.lease_ttl)::float8, extract(epoch FROM r.stale_after)::float8,
           r.on_lease_expiry::text, r.chunk_size,
           extract(epoch FROM r.backoff)::float8, extract(epoch FROM r.backoff_max)::float8,
           r.max_item_failures, r.attempt_budget
    FROM batch_job_run r WHERE r.job_key = p_key AND r.lease_token = p_token;
END;
$function$
