-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_operator_check(p_key text, p_stale_fallback double precision, p_now timestamp with time zone, p_lock boolean)
 RETURNS TABLE(status text, stale boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_now timestamptz := batchonce_now(p_now);
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    IF p_lock THEN
        PERFORM 1 FROM batch_job_run r WHERE r.partition_of = p_key
        ORDER BY r.job_key FOR UPDATE;
        RETURN QUERY
        SELECT r.status::text,
               (r.lease_expires_at <= v_now
                OR r.started_at < v_now
                   - COALESCE(r.stale_after, make_interval(secs => p_stale_fallback))) IS TRUE
        FROM batch_job_run r WHERE r.job_key = p_key FOR UPDATE;
    ELSE
        RETURN QUERY
        SELECT r.status::text,
               (r.lease_expires_at <= v_now
                OR r.started_at < v_now
                   - COALESCE(r.stale_after, make_interval(secs => p_stale_fallback))) IS TRUE
        FROM batch_job_run r WHERE r.job_key = p_key;
    END IF;
END;
$function$
