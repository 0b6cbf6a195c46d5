-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_enqueue_declared_unscoped(p_job text, p_dates date[], p_payload jsonb DEFAULT '{}'::jsonb)
 RETURNS TABLE(job_key text, outcome text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    n_configs int;
    s jsonb;
    secs text[] := ARRAY['lease_ttl', 'stale_after', 'backoff', 'backoff_max'];
    k text;
    v_keys text[];
    v_reasons text[];
    v_ps timestamptz[];
    v_pe timestamptz[];
    inserted text[];
BEGIN
    IF p_job IS NULL OR p_job !~ '^[a-z0-9]+(-[a-z0-9]+)*$' OR char_length(p_job) > 64 THEN
        RAISE EXCEPTION 'batchonce_enqueue_declared: % is not a job name (lowercase letters and digits separated by single dashes, at most 64)',
            coalesce(quote_literal(p_job), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF p_dates IS NULL OR cardinality(p_dates) = 0 OR cardinality(p_dates) > 366 THEN
        RAISE EXCEPTION 'batchonce_enqueue_declared: give 1 to 366 dates, not %',
            coalesce(cardinality(p_dates), 0) USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_dates) d
               WHERE d IS NULL OR d < DATE '1970-01-01' OR d > DATE '2199-12-31') THEN
        RAISE EXCEPTION 'batchonce_enqueue_declared: every date must be between 1970-01-01 and 2199-12-31'
            USING ERRCODE = '22023';
    END IF;
    IF cardinality(ARRAY(SELECT DISTINCT unnest(p_dates))) <> cardinality(p_dates) THEN
        RAISE EXCEPTION 'batchonce_enqueue_declared: a date is given twice'
            USING ERRCODE = '22023';
    END IF;
    IF p_payload IS NULL OR octet_length(p_payload::text) > 65536 THEN
        RAISE EXCEPTION 'batchonce_enqueue_declared: the payload must be JSON of at most 65536 bytes'
            USING ERRCODE = '22023';
    END IF;

    SELECT count(DISTINCT c.fingerprint), min(c.settings::text)::jsonb INTO n_configs, s
    FROM batch_process_config c JOIN batch_worker w ON w.worker_id = c.process_id
    WHERE c.job_name = p_job AND w.live_until > now();
    IF n_configs = 0 THEN
        RAISE EXCEPTION 'no live batchonce process declares job %: start the producer or a worker with it in batchonce.toml first', p_job
            USING ERRCODE = 'BO002';
    ELSIF n_configs > 1 THEN
        RAISE EXCEPTION 'the live batchonce processes disagree on the configuration of job % (% fingerprints): see `batchonce status`, make them agree, then enqueue', p_job, n_configs
            USING ERRCODE = 'BO003';
    END IF;
    IF s->>'covers' = 'firing' THEN
        RAISE EXCEPTION 'job % runs per firing (covers = "firing"), not per date: enqueue its periods with `batchonce enqueue`', p_job
            USING ERRCODE = 'BO004';
    END IF;
    FOREACH k IN ARRAY secs LOOP
        IF (s->>k) IS NULL THEN
            RAISE EXCEPTION 'the declared configuration of job % has no %', p_job, k
                USING ERRCODE = 'BO003';
        END IF;
    END LOOP;

    SELECT array_agg(p_job || ':' || to_char(d, 'YYYY-MM-DD') ORDER BY o),
           array_agg(CASE
               WHEN s->'skip_dates' ? to_char(d, 'YYYY-MM-DD')
                   THEN format('business calendar: %s is in skip_dates', to_char(d, 'YYYY-MM-DD'))
               WHEN s->'skip_weekdays' ? to_char(d, 'Dy')
                   THEN format('business calendar: %s is a %s, in skip_weekdays',
                               to_char(d, 'YYYY-MM-DD'), to_char(d, 'Dy'))
               END ORDER BY o),
           array_agg(batchonce_start_of_day(d, s->>'timezone') ORDER BY o),
           array_agg(batchonce_start_of_day(d + 1, s->>'timezone') ORDER BY o)
    INTO v_keys, v_reasons, v_ps, v_pe
    FROM unnest(p_dates) WITH ORDINALITY AS u(d, o);

    SELECT array_agg(e) INTO inserted FROM batchonce_enqueue2(
        v_keys,
        array_fill(p_job, ARRAY[cardinality(v_keys)]),
        p_dates,
        array_fill((s->>'max_attempts')::int, ARRAY[cardinality(v_keys)]),
        array_fill(p_payload, ARRAY[cardinality(v_keys)]),
        NULL,
        v_reasons,
        array_fill(s->>'timezone', ARRAY[cardinality(v_keys)]),
        v_ps,
        v_pe,
        array_fill(s->>'covers', ARRAY[cardinality(v_keys)]),
        array_fill(extract(epoch FROM (s->>'lease_ttl')::interval)::float8, ARRAY[cardinality(v_keys)]),
        array_fill(extract(epoch FROM (s->>'stale_after')::interval)::float8, ARRAY[cardinality(v_keys)]),
        array_fill(s->>'on_lease_expiry', ARRAY[cardinality(v_keys)]),
        array_fill((s->>'chunk_size')::int, ARRAY[cardinality(v_keys)]),
        array_fill(extract(epoch FROM (s->>'backoff')::interval)::float8, ARRAY[cardinality(v_keys)]),
        array_fill(extract(epoch FROM (s->>'backoff_max')::interval)::float8, ARRAY[cardinality(v_keys)]),
        array_fill((s->>'max_item_failures')::bigint, ARRAY[cardinality(v_keys)]),
        array_fill((s->>'max_attempts')::int, ARRAY[cardinality(v_keys)]),
        -- The partitions the live processes declare (issue 23); none when
        -- their settings predate partitions.
        array_fill(NULLIF((s->>'partitions')::int, 1), ARRAY[cardinality(v_keys)])) AS e;

    RETURN QUERY
    SELECT u.k,
           CASE WHEN NOT (u.k = ANY(coalesce(inserted, '{}'))) THEN 'duplicate'
                WHEN u.why IS NOT NULL THEN 'skipped'
                ELSE 'enqueued' END
    FROM unnest(v_keys, v_reasons) WITH ORDINALITY AS u(k, why, o)
    ORDER BY u.o;
END;
$function$
