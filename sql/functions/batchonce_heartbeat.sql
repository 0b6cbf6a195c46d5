-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_heartbeat(p_keys text[], p_tokens bigint[], p_ttls double precision[], p_now timestamp with time zone)
 RETURNS TABLE(job_key text, extended boolean, mine boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
BEGIN
    PERFORM set_config('batchonce.in_step', 'off', true);
    v_now := batchonce_now(p_now);
    RETURN QUERY
    WITH h AS (
        SELECT * FROM unnest(p_keys, p_tokens, p_ttls) AS h(job_key, token, ttl)
    ), mine AS (
        SELECT r.job_key FROM batch_job_run r JOIN h
          ON r.job_key = h.job_key AND r.lease_token = h.token
        WHERE r.status = 'RUNNING'
    ), locked AS (
        SELECT r.job_key FROM batch_job_run r JOIN h
          ON r.job_key = h.job_key AND r.lease_token = h.token
        WHERE r.status = 'RUNNING'
        FOR NO KEY UPDATE OF r SKIP LOCKED
    ), ext AS (
        UPDATE batch_job_run r
        SET heartbeat_at = v_now,
            heartbeat_processed = r.processed_count,
            -- The caller's ttl, within the bounds of lease_ttl, only for a
            -- run that stores none.
            lease_expires_at = v_now + COALESCE(r.lease_ttl, make_interval(
                secs => LEAST(GREATEST(COALESCE(h.ttl, 30), 1), 86400)))
        FROM h, locked
        WHERE r.job_key = h.job_key AND r.job_key = locked.job_key
        RETURNING r.job_key
    )
    SELECT h.job_key::text,
           EXISTS (SELECT 1 FROM ext e WHERE e.job_key = h.job_key),
           EXISTS (SELECT 1 FROM mine m WHERE m.job_key = h.job_key)
    FROM h;
END;
$function$
