-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batch_job_run_partition_rows()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO batch_job_run
        (job_key, job_name, business_date, status, max_attempts, next_run_at, enqueued_at,
         finished_at, error_message, payload,
         timezone, period_start, period_end, covers, lease_ttl, stale_after, on_lease_expiry,
         chunk_size, backoff, backoff_max, max_item_failures, attempt_budget,
         partition_count, partition_no, partition_of)
    SELECT NEW.job_key || '.p' || g, NEW.job_name, NEW.business_date, NEW.status,
           NEW.max_attempts, NEW.enqueued_at, NEW.enqueued_at, NEW.finished_at,
           NEW.error_message, NEW.payload,
           NEW.timezone, NEW.period_start, NEW.period_end, NEW.covers, NEW.lease_ttl,
           NEW.stale_after, NEW.on_lease_expiry, NEW.chunk_size, NEW.backoff, NEW.backoff_max,
           NEW.max_item_failures, NEW.attempt_budget,
           NEW.partition_count, g, NEW.job_key
    FROM generate_series(1, NEW.partition_count) AS g;
    RETURN NULL;
END;
$function$
