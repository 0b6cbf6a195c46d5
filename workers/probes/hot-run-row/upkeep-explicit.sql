-- The claim inserts the lease rows; the finish deletes them.
CREATE FUNCTION probe_claimed(k text[], t bigint[], e timestamptz[]) RETURNS void
LANGUAGE sql AS $$ INSERT INTO probe_lease SELECT * FROM unnest(k, t, e) $$;
CREATE FUNCTION probe_finished(k text[]) RETURNS void
LANGUAGE sql AS $$ DELETE FROM probe_lease l USING unnest(k) AS u(job_key) WHERE l.job_key = u.job_key $$;
