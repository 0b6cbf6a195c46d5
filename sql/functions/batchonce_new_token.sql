-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_new_token()
 RETURNS bigint
 LANGUAGE sql
AS $function$
    SELECT ('x' OPERATOR(pg_catalog.||)
            pg_catalog.substr(pg_catalog.translate(pg_catalog.gen_random_uuid()::pg_catalog.text,
                                                   '-', ''), 1, 16)
           )::pg_catalog.bit(64)::pg_catalog.int8 OPERATOR(pg_catalog.&) 9223372036854775807
$function$
