-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batch_job_run_validate()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    broken text;
BEGIN
    -- Each test is the constraint's own expression; like a CHECK, a rule
    -- whose expression is NULL passes (IF treats NULL as false).
    IF NOT (NEW.job_name ~ '^[a-z0-9]+(-[a-z0-9]+)*$') THEN
        broken := 'batch_job_run_job_name_check';
    ELSIF NOT (NEW.job_key ~ '^[a-z0-9-]+:[0-9T:-]+(@[a-z0-9]+(-[a-z0-9]+)*)?(\.p[1-9][0-9]{0,2})?$'
               AND starts_with(NEW.job_key, NEW.job_name || ':')) THEN
        broken := 'batch_job_run_job_key_check';
    ELSIF NOT (NEW.scope IS NOT DISTINCT FROM substring(NEW.job_key FROM '@([a-z0-9-]+)')) THEN
        broken := 'batch_job_run_scope_check';
    ELSIF NOT (octet_length(NEW.payload::text) <= 65536) THEN
        broken := 'batch_job_run_payload_check';
    ELSIF NOT (
        (NEW.partition_count IS NULL AND NEW.partition_no IS NULL AND NEW.partition_of IS NULL)
        OR (NEW.partition_count BETWEEN 2 AND 256 AND NEW.partition_no IS NULL
            AND NEW.partition_of IS NULL)
        OR (NEW.partition_count BETWEEN 2 AND 256
            AND NEW.partition_no BETWEEN 1 AND NEW.partition_count
            AND NEW.partition_of IS NOT NULL
            AND NEW.job_key = NEW.partition_of || '.p' || NEW.partition_no)) THEN
        broken := 'batch_job_run_partition_check';
    ELSIF NOT (
        (NEW.timezone IS NULL AND NEW.period_start IS NULL AND NEW.period_end IS NULL
         AND NEW.covers IS NULL AND NEW.lease_ttl IS NULL AND NEW.stale_after IS NULL
         AND NEW.on_lease_expiry IS NULL AND NEW.chunk_size IS NULL AND NEW.backoff IS NULL
         AND NEW.backoff_max IS NULL AND NEW.attempt_budget IS NULL
         AND NEW.max_item_failures IS NULL)
        OR
        (NEW.timezone IS NOT NULL AND char_length(NEW.timezone) BETWEEN 1 AND 64
         AND NEW.period_start IS NOT NULL AND NEW.period_end IS NOT NULL
         AND NEW.period_start < NEW.period_end
         AND NEW.covers IN ('same-day', 'previous-day', 'firing')
         AND NEW.lease_ttl > interval '0' AND NEW.stale_after > interval '0'
         AND NEW.on_lease_expiry IN ('retry', 'hold')
         AND NEW.chunk_size BETWEEN 1 AND 100000
         AND NEW.backoff > interval '0' AND NEW.backoff_max >= NEW.backoff
         AND NEW.attempt_budget BETWEEN 1 AND 1000
         AND (NEW.max_item_failures IS NULL OR NEW.max_item_failures >= 0))) THEN
        broken := 'batch_job_run_context_check';
    END IF;
    IF broken IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "batch_job_run" violates check constraint "%"', broken
            USING ERRCODE = 'check_violation', CONSTRAINT = broken,
                  TABLE = 'batch_job_run', SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    RETURN NEW;
END;
$function$
