-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batch_job_due_hold_paused_switch()
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    v_on boolean := EXISTS (SELECT FROM batch_job_pause);
    v_trigger text;
BEGIN
    FOREACH v_trigger IN ARRAY ARRAY['batch_job_due_hold_paused_insert',
                                     'batch_job_due_hold_paused_update'] LOOP
        IF EXISTS (SELECT FROM pg_trigger t
                   WHERE t.tgrelid = 'batch_job_due'::regclass AND t.tgname = v_trigger
                     AND (t.tgenabled <> 'D') <> v_on) THEN
            EXECUTE format('ALTER TABLE batch_job_due %s TRIGGER %I',
                           CASE WHEN v_on THEN 'ENABLE' ELSE 'DISABLE' END, v_trigger);
        END IF;
    END LOOP;
END;
$function$
