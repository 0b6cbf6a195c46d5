-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_operator_enqueue(p_keys text[], p_names text[], p_dates date[], p_maxes integer[], p_reasons text[], p_tz text[], p_ps timestamp with time zone[], p_pe timestamp with time zone[], p_cov text[], p_ttl double precision[], p_stale double precision[], p_exp text[], p_chunk integer[], p_bo double precision[], p_bomax double precision[], p_mif bigint[], p_budget integer[], p_parts integer[], p_operator text, p_reason text)
 RETURNS TABLE(job_key text, status text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    inserted text[];
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    IF cardinality(p_keys) IS NULL OR cardinality(p_keys) NOT BETWEEN 1 AND 400 THEN
        RAISE EXCEPTION 'batchonce_operator_enqueue: give 1 to 400 runs, not %',
            COALESCE(cardinality(p_keys), 0) USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_keys) k WHERE strpos(k, '@') > 0 OR strpos(k, '.') > 0) THEN
        RAISE EXCEPTION 'batchonce_operator_enqueue: whole, unscoped runs only (no scope or partition in a key)'
            USING ERRCODE = '22023';
    END IF;
    IF p_operator IS NULL OR char_length(p_operator) NOT BETWEEN 1 AND 80
       OR p_reason IS NULL OR char_length(p_reason) NOT BETWEEN 1 AND 500 THEN
        RAISE EXCEPTION 'batchonce_operator_enqueue: an operator (1 to 80 characters) and a reason (1 to 500) are required'
            USING ERRCODE = '22023';
    END IF;
    inserted := ARRAY(
        SELECT e FROM batchonce_enqueue2(
            p_keys, p_names, p_dates, p_maxes,
            array_fill('{}'::jsonb, ARRAY[cardinality(p_keys)]),
            NULL::timestamptz, p_reasons, p_tz, p_ps, p_pe, p_cov, p_ttl, p_stale, p_exp,
            p_chunk, p_bo, p_bomax, p_mif, p_budget, p_parts) AS e);
    INSERT INTO batch_operator_action
        (operator, action, job_key, reason, before_status, after_status)
    SELECT p_operator, 'enqueue', r.job_key, p_reason, 'MISSING', r.status
    FROM batch_job_run r WHERE r.job_key = ANY (inserted)
    ORDER BY r.job_key;
    RETURN QUERY
    SELECT r.job_key::text, r.status::text FROM batch_job_run r
    WHERE r.job_key = ANY (inserted) ORDER BY r.job_key;
END;
$function$
