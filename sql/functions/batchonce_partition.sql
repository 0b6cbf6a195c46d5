-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_partition(p_item_key text, p_partitions integer)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
AS $function$
    SELECT ((('x' OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.md5(p_item_key), 1, 8))::bit(32)::integer
             OPERATOR(pg_catalog.&) 2147483647) OPERATOR(pg_catalog.%) p_partitions) OPERATOR(pg_catalog.+) 1
$function$
