-- Issue 22: the operator console. Its audit rows say where the operator
-- acted from. Expand only: one nullable column that the previous release
-- never writes, and the stamp trigger (which already overrides the time and
-- session a client sends) filling it from a setting the console sets for
-- its own action's transaction; the command line leaves it NULL.
ALTER TABLE batch_operator_action ADD COLUMN remote_addr varchar(200);

CREATE OR REPLACE FUNCTION batch_operator_action_stamp() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.at := now();
    NEW.session_user_name := session_user;
    NEW.remote_addr := NULLIF(left(current_setting('batchonce.remote_addr', true), 200), '');
    RETURN NEW;
END;
$$;

-- As for every function of the schema: names resolve in this schema, and
-- PUBLIC may not call it.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION batch_operator_action_stamp() SET search_path = %I, pg_temp',
                   current_schema());
    REVOKE EXECUTE ON FUNCTION batch_operator_action_stamp() FROM PUBLIC;
END
$$;
