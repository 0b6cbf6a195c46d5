-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batch_operator_action_stamp()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    NEW.at := now();
    NEW.session_user_name := session_user;
    NEW.remote_addr := NULLIF(left(current_setting('batchonce.remote_addr', true), 200), '');
    RETURN NEW;
END;
$function$
