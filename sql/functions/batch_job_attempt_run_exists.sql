-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batch_job_attempt_run_exists()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    inserted bigint;
    found bigint;
    missing text;
BEGIN
    -- One lookup and lock per attempt, by key: a locking subquery is never
    -- flattened, so the planner cannot turn this into a hash join over the
    -- whole run table (which it did as `job_key IN (…)`, knowing nothing of
    -- the transition table: 2 ms a claim of 250 at 60,000 runs).
    SELECT count(*) INTO inserted FROM batch_job_attempt_new;
    SELECT count(*) INTO found
    FROM batch_job_attempt_new a
    CROSS JOIN LATERAL (SELECT FROM batch_job_run r WHERE r.job_key = a.job_key
                        FOR KEY SHARE OF r) AS run;
    IF found = inserted THEN
        RETURN NULL;
    END IF;
    SELECT a.job_key INTO missing FROM batch_job_attempt_new a
    WHERE NOT EXISTS (SELECT FROM batch_job_run r WHERE r.job_key = a.job_key)
    LIMIT 1;
    RAISE EXCEPTION 'insert or update on table "batch_job_attempt" violates foreign key constraint "batch_job_attempt_run_fkey"'
        USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'batch_job_attempt_run_fkey',
              TABLE = 'batch_job_attempt', SCHEMA = TG_TABLE_SCHEMA,
              DETAIL = format('Key (job_key)=(%s) is not present in table "batch_job_run".', missing);
END;
$function$
