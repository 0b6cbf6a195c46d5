-- An operator may end the session that holds a run (issue 15, item 4):
-- `runs fail|rerun|skip --terminate-blocker` writes a `terminate-blocker`
-- row, commits it, and only then calls pg_terminate_backend on the session
-- it names, so the audit trail records every session an operator ended,
-- even if the command dies right after.
--
-- Every existing row satisfies the wider CHECK, so replacing it cannot
-- fail; the table holds human actions only, so its scan is short.

ALTER TABLE batch_operator_action DROP CONSTRAINT batch_operator_action_action_check;
ALTER TABLE batch_operator_action ADD CONSTRAINT batch_operator_action_action_check
    CHECK (action IN ('fail', 'rerun', 'skip', 'terminate-blocker'));

-- What the action did beyond its before and after status: for
-- `terminate-blocker`, the session ended (pid, application_name, user,
-- state, time in its transaction, what it waited for). NULL for the other
-- actions. Written by the command line only, from pg_stat_activity, but
-- held to the same printable rule as the reason all the same.
ALTER TABLE batch_operator_action ADD COLUMN detail varchar(1000);
ALTER TABLE batch_operator_action ADD CONSTRAINT batch_operator_action_detail_check
    CHECK (detail !~ '[\u0001-\u001f\u007f-\u009f\u00ad\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069\ufeff]');
