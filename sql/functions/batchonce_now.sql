-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_now(p_now timestamp with time zone)
 RETURNS timestamp with time zone
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    IF p_now IS NULL THEN
        RETURN now();
    END IF;
    IF pg_has_role(session_user, current_user, 'MEMBER') THEN
        RETURN p_now;
    END IF;
    RAISE EXCEPTION 'batchonce: % may not choose the engine''s clock: only the schema''s owner may (tests do); pass NULL and the database''s clock decides',
        session_user USING ERRCODE = '42501';
END;
$function$
