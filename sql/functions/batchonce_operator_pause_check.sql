-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_operator_pause_check(p_verb text, p_job text, p_reason text, p_operator text)
 RETURNS void
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    IF p_job IS NULL OR char_length(p_job) > 64 OR p_job !~ '^[a-z0-9]+(-[a-z0-9]+)*$' THEN
        RAISE EXCEPTION '% refused: % is not a job name (1-64 lowercase letters, digits and single dashes)',
            p_verb, coalesce(quote_literal(left(p_job, 80)), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF p_reason IS NULL OR char_length(btrim(p_reason)) NOT BETWEEN 1 AND 500 THEN
        RAISE EXCEPTION '% refused: a reason of 1 to 500 characters is required', p_verb
            USING ERRCODE = '22023';
    END IF;
    IF p_operator IS NULL OR char_length(p_operator) NOT BETWEEN 1 AND 80 THEN
        RAISE EXCEPTION '% refused: an operator of 1 to 80 characters is required', p_verb
            USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT FROM batch_job_declared j WHERE j.job_name = p_job)
       AND NOT EXISTS (SELECT FROM batch_job_run r WHERE r.job_name = p_job)
       AND NOT EXISTS (SELECT FROM batch_job_pause p WHERE p.job_name = p_job) THEN
        RAISE EXCEPTION '% refused: unknown job %: it is not declared (`batchonce migrate`) and has no runs',
            p_verb, p_job USING ERRCODE = '22023';
    END IF;
END;
$function$
