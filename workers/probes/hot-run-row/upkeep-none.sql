-- The claim and the finish leave the narrow tables (if any) alone.
CREATE FUNCTION probe_claimed(k text[], t bigint[], e timestamptz[]) RETURNS void
LANGUAGE sql AS $$ SELECT $$;
CREATE FUNCTION probe_finished(k text[]) RETURNS void LANGUAGE sql AS $$ SELECT $$;
