-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_start_of_day(p_date date, p_tz text)
 RETURNS timestamp with time zone
 LANGUAGE sql
 STABLE
 SET search_path TO 'public', 'pg_temp'
AS $function$
    SELECT min(i)
    FROM generate_series((p_date::timestamp AT TIME ZONE p_tz) - interval '3 hours',
                         (p_date::timestamp AT TIME ZONE p_tz) + interval '3 hours',
                         interval '1 minute') AS i
    WHERE (i AT TIME ZONE p_tz) >= p_date::timestamp;
$function$
