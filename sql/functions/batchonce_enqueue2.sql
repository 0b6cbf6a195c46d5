-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_enqueue2(p_keys text[], p_names text[], p_dates date[], p_maxes integer[], p_payloads jsonb[], p_now timestamp with time zone, p_reasons text[], p_tz text[], p_ps timestamp with time zone[], p_pe timestamp with time zone[], p_cov text[], p_ttl double precision[], p_stale double precision[], p_exp text[], p_chunk integer[], p_bo double precision[], p_bomax double precision[], p_mif bigint[], p_budget integer[], p_parts integer[])
 RETURNS SETOF text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    v_now timestamptz := batchonce_now(p_now);
    -- Inside a SECURITY DEFINER function current_user is its owner.
    trusted boolean := pg_has_role(session_user, current_user, 'MEMBER');
    v_reasons text[] := p_reasons;
    bad record;
    zone text;
    inserted text[];
BEGIN
    -- Item 2 (see the end of this file): the list-keeping trigger runs.
    PERFORM set_config('batchonce.in_step', 'off', true);
    IF EXISTS (SELECT 1 FROM unnest(p_parts) n WHERE n IS NOT NULL AND n NOT BETWEEN 1 AND 256) THEN
        RAISE EXCEPTION 'batchonce_enqueue2: partitions must be 1 to 256' USING ERRCODE = '22023';
    END IF;

    -- A time zone the database does not know would fail every period
    -- check below with PostgreSQL's own message; this names the rule.
    FOR zone IN SELECT DISTINCT z FROM unnest(p_tz) z WHERE z IS NOT NULL LOOP
        BEGIN
            PERFORM v_now AT TIME ZONE zone;
        EXCEPTION WHEN invalid_parameter_value THEN
            RAISE EXCEPTION 'batchonce_enqueue2: % is not a time zone PostgreSQL knows', quote_literal(zone)
                USING ERRCODE = '22023';
        END;
    END LOOP;

    -- The documented bounds (docs/configuration.md), for every caller but
    -- the owner, who could write the table directly anyway (the test suite
    -- enqueues sub-second leases and hand-made periods as the owner). A
    -- run without a context is the previous release's kind. A daily period is its business date's local day (the rule of
    -- schedule::day_bounds, within the few hours by which PostgreSQL's and
    -- the engine's zone rules may extrapolate apart after 2037); a firing
    -- begins on its business date and ends within 32 days.
    SELECT c.k, c.why_bad INTO bad FROM (
        SELECT k, CASE
            WHEN k IS NULL OR n IS NULL THEN 'no key or job name'
            WHEN d IS NULL OR d < DATE '1970-01-01' OR d > DATE '2199-12-31'
                THEN 'a business date outside 1970-01-01..2199-12-31'
            WHEN m IS NULL OR m NOT BETWEEN 1 AND 1000 THEN 'max_attempts outside 1..=1000'
            WHEN tz IS NULL THEN 'no run context'
            WHEN budget IS NULL OR budget NOT BETWEEN 1 AND 1000 THEN 'max_attempts outside 1..=1000'
            WHEN ttl IS NULL OR NOT ttl BETWEEN 1 AND 86400 THEN 'lease_ttl outside 1s..=24h'
            WHEN stale IS NULL OR stale < ttl OR stale > 2592000
                THEN 'stale_after outside lease_ttl..=30d'
            WHEN chunk IS NULL OR chunk NOT BETWEEN 1 AND 100000 THEN 'chunk_size outside 1..=100000'
            WHEN bo IS NULL OR bomax IS NULL OR NOT bo > 0 OR bo > bomax OR bomax > 604800
                THEN 'backoff outside 0 < backoff <= backoff_max <= 7d'
            WHEN exp IS NULL OR exp NOT IN ('retry', 'hold') THEN 'on_lease_expiry not retry or hold'
            WHEN mif < 0 THEN 'a negative max_item_failures'
            WHEN cov IS NULL OR cov NOT IN ('same-day', 'previous-day', 'firing')
                THEN 'covers not same-day, previous-day or firing'
            WHEN ps IS NULL OR pe IS NULL OR NOT ps < pe THEN 'a period that does not end after it starts'
            WHEN cov <> 'firing' AND NOT (
                    (ps AT TIME ZONE tz) BETWEEN d::timestamp - interval '3 hours'
                                             AND d::timestamp + interval '3 hours'
                    AND pe - ps BETWEEN interval '20 hours' AND interval '28 hours')
                THEN format('a period that is not %s''s local day in %s', d, tz)
            WHEN cov = 'firing' AND NOT (
                    (ps AT TIME ZONE tz) BETWEEN d::timestamp - interval '3 hours'
                                             AND d::timestamp + interval '27 hours'
                    AND pe - ps <= interval '32 days')
                THEN format('a firing period that does not begin on %s in %s', d, tz)
            END AS why_bad
        FROM unnest(p_keys, p_names, p_dates, p_maxes, p_tz, p_ps, p_pe, p_cov, p_ttl,
                    p_stale, p_exp, p_chunk, p_bo, p_bomax, p_mif, p_budget)
             AS u(k, n, d, m, tz, ps, pe, cov, ttl, stale, exp, chunk, bo, bomax, mif, budget)
    ) c WHERE c.why_bad IS NOT NULL AND NOT trusted LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'batchonce_enqueue2: the run % has %; nothing was enqueued', bad.k, bad.why_bad
            USING ERRCODE = '22023';
    END IF;

    IF NOT trusted THEN
        -- Only jobs `batchonce migrate` declared, as declared: the key
        -- names its business date and is no partition's (a key holds a dot
        -- only in a partition's suffix), the zone, covers, partitions and
        -- scoping are the declaration's, and a calendar skip is one the
        -- stored calendar makes. The declarations are read once, typed.
        WITH j AS MATERIALIZED (
            SELECT job_name::text AS n, settings->>'timezone' AS tz, settings->>'covers' AS cov,
                   (settings->>'partitions')::int AS parts, (settings->>'scoped')::boolean AS scoped,
                   settings->'skip_dates' AS skip_dates, settings->'skip_weekdays' AS skip_weekdays
            FROM batch_job_declared WHERE job_name = ANY (p_names)
        )
        SELECT c.k, c.n, c.why_bad INTO bad FROM (
            SELECT u.k, u.n, CASE
                WHEN j.n IS NULL THEN NULL
                WHEN substr(u.k, char_length(u.n) + 2, 10) IS DISTINCT FROM to_char(u.d, 'YYYY-MM-DD')
                    THEN format('a key that does not name its business date %s', u.d)
                WHEN strpos(u.k, '.') > 0 THEN 'a partition''s key (partitions come with their run)'
                WHEN u.tz IS DISTINCT FROM j.tz
                    THEN format('time zone %s, not the declared %s', u.tz, j.tz)
                WHEN u.cov IS DISTINCT FROM j.cov
                    THEN format('covers %s, not the declared %s', u.cov, j.cov)
                WHEN (strpos(u.k, 'T') > 0) <> (u.cov = 'firing')
                    THEN 'a key whose period does not match its covers'
                WHEN COALESCE(u.parts, 1) <> j.parts
                    THEN format('%s partitions, not the declared %s', COALESCE(u.parts, 1), j.parts)
                WHEN (strpos(u.k, '@') > 0) <> j.scoped
                    THEN CASE WHEN j.scoped THEN 'no scope, but the job is declared scoped'
                              ELSE 'a scope, but the job is not declared scoped' END
                WHEN u.why IS NOT NULL
                     AND NOT (j.skip_dates ? to_char(u.d, 'YYYY-MM-DD')
                              OR j.skip_weekdays ? to_char(u.d, 'Dy'))
                    THEN format('a calendar skip of %s, which the declared calendar does not skip', u.d)
                END AS why_bad, j.n IS NULL AS undeclared
            FROM unnest(p_keys, p_names, p_dates, p_tz, p_cov, p_parts, p_reasons)
                 AS u(k, n, d, tz, cov, parts, why)
            LEFT JOIN j ON j.n = u.n
        ) c WHERE c.undeclared OR c.why_bad IS NOT NULL
        ORDER BY c.undeclared DESC LIMIT 1;
        IF FOUND AND bad.why_bad IS NULL THEN
            RAISE EXCEPTION 'job % is not declared: run `batchonce migrate` with the configuration file that declares it, then enqueue', bad.n
                USING ERRCODE = 'BO008';
        ELSIF FOUND THEN
            RAISE EXCEPTION 'batchonce_enqueue2: the run % has %; nothing was enqueued', bad.k, bad.why_bad
                USING ERRCODE = '22023';
        END IF;
        -- A skip's reason is the database's, in the producer's words.
        IF EXISTS (SELECT 1 FROM unnest(p_reasons) w WHERE w IS NOT NULL) THEN
            v_reasons := ARRAY(
                SELECT CASE
                    WHEN u.why IS NULL THEN NULL
                    WHEN j.settings->'skip_dates' ? to_char(u.d, 'YYYY-MM-DD')
                        THEN format('business calendar: %s is in skip_dates', to_char(u.d, 'YYYY-MM-DD'))
                    ELSE format('business calendar: %s is a %s, in skip_weekdays',
                                to_char(u.d, 'YYYY-MM-DD'), to_char(u.d, 'Dy'))
                    END
                FROM unnest(p_names, p_dates, p_reasons) WITH ORDINALITY AS u(n, d, why, o)
                LEFT JOIN batch_job_declared j ON j.job_name = u.n
                ORDER BY u.o);
        END IF;
    END IF;

    WITH ins AS (
        INSERT INTO batch_job_run
            (job_key, job_name, business_date, max_attempts, payload, next_run_at, enqueued_at,
             status, finished_at, error_message,
             timezone, period_start, period_end, covers, lease_ttl, stale_after,
             on_lease_expiry, chunk_size, backoff, backoff_max, max_item_failures,
             attempt_budget, partition_count)
        SELECT k, n, d, m, p, v_now, v_now,
               CASE WHEN why IS NULL THEN 'PENDING' ELSE 'SKIPPED' END,
               CASE WHEN why IS NULL THEN NULL ELSE v_now END,
               left(why, 1000),
               tz, ps, pe, cov, make_interval(secs => ttl), make_interval(secs => stale),
               exp, chunk, make_interval(secs => bo), make_interval(secs => bomax), mif, budget,
               NULLIF(parts, 1)
        FROM unnest(p_keys, p_names, p_dates, p_maxes, p_payloads, v_reasons,
                    p_tz, p_ps, p_pe, p_cov, p_ttl, p_stale, p_exp, p_chunk, p_bo, p_bomax,
                    p_mif, p_budget, p_parts)
             AS c(k, n, d, m, p, why, tz, ps, pe, cov, ttl, stale, exp, chunk, bo, bomax,
                  mif, budget, parts)
        -- Issue 43: an archived key is a duplicate, as a live one is.
        WHERE NOT EXISTS (SELECT FROM batch_job_run_archive a WHERE a.job_key = c.k)
        ON CONFLICT (job_key) DO NOTHING
        RETURNING job_key
    )
    SELECT array_agg(job_key::text) INTO inserted FROM ins;
    IF inserted IS NOT NULL THEN
        PERFORM pg_notify('batchonce_run', '');
        RETURN QUERY SELECT unnest(inserted);
    END IF;
END;
$function$
