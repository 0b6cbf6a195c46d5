-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_item_attempt()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    v_attempt integer;
BEGIN
    IF NEW.lease_token IS NOT NULL THEN
        SELECT a.attempt INTO v_attempt FROM batch_job_attempt a
        WHERE a.job_key = NEW.job_key AND a.lease_token = NEW.lease_token;
        PERFORM 1 FROM batch_job_run r
        WHERE r.job_key = NEW.job_key AND r.lease_token = NEW.lease_token
          AND r.status = 'RUNNING' AND r.lease_expires_at > now()
        FOR KEY SHARE;
        IF FOUND THEN
            PERFORM batchonce_fence_record(NEW.job_key);
        END IF;
        NEW.attempt := v_attempt;
        NEW.lease_token := NULL;
    ELSIF TG_OP = 'UPDATE' THEN
        SELECT r.attempts INTO v_attempt FROM batch_job_run r
        WHERE r.job_key = NEW.job_key AND r.status = 'RUNNING'
          AND EXISTS (SELECT 1 FROM batch_fence_held h
                      WHERE h.pid = pg_backend_pid() AND h.job_key = r.job_key
                        AND h.xact_start = now());
        IF FOUND THEN
            NEW.attempt := v_attempt;
        END IF;
    END IF;
    RETURN NEW;
END;
$function$
