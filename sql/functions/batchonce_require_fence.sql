-- Generated from the database after `batchonce migrate --contract` by
-- `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`; do not edit.

CREATE OR REPLACE FUNCTION public.batchonce_require_fence()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    v_col text := COALESCE(TG_ARGV[0], 'job_key');
    v_key text;
    v_held text;
    v_n integer;
BEGIN
    IF TG_NARGS = 0 THEN
        v_key := NEW.job_key;
    ELSE
        IF NOT (to_jsonb(NEW) ? v_col) THEN
            RAISE EXCEPTION 'batchonce_require_fence: table %.% has no column % (the trigger''s argument names the column that holds the run''s key)',
                TG_TABLE_SCHEMA, TG_TABLE_NAME, v_col USING ERRCODE = '42703';
        END IF;
        v_key := to_jsonb(NEW) ->> v_col;
    END IF;
    IF v_key IS NOT NULL THEN
        PERFORM 1 FROM batch_fence_held
        WHERE pid = pg_backend_pid() AND job_key = v_key AND xact_start = now();
        IF FOUND THEN
            RETURN NEW;
        END IF;
        IF batchonce_legacy_fence() IS NOT DISTINCT FROM v_key OR batchonce_unfenced() THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'batchonce: a write to %.% for run % outside its fence: this transaction holds no open fence of that run (open one with batchonce_fence(job_key, lease_token) first; only the attempt holding the lease may write its items)',
            TG_TABLE_SCHEMA, TG_TABLE_NAME, v_key USING ERRCODE = 'BO010';
    END IF;
    SELECT min(job_key), count(*) INTO v_held, v_n FROM batch_fence_held
    WHERE pid = pg_backend_pid() AND xact_start = now();
    IF v_n = 0 THEN
        v_held := batchonce_legacy_fence();
        v_n := CASE WHEN v_held IS NULL THEN 0 ELSE 1 END;
    END IF;
    IF v_n <> 1 AND batchonce_unfenced() THEN
        RETURN NEW;
    END IF;
    IF v_n <> 1 THEN
        RAISE EXCEPTION 'batchonce: a write to %.% without a run key (column %) and % open fences in this transaction: it takes the key of the one run whose fence this transaction holds',
            TG_TABLE_SCHEMA, TG_TABLE_NAME, v_col, v_n USING ERRCODE = 'BO010';
    END IF;
    IF TG_NARGS = 0 THEN
        NEW.job_key := v_held;
    ELSE
        NEW := jsonb_populate_record(NEW, jsonb_build_object(v_col, v_held));
    END IF;
    RETURN NEW;
END;
$function$
