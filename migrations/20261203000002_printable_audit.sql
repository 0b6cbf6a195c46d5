-- Operator identities and reasons are printable text (issue 15). The command
-- line refuses every control, format, separator, private-use and unassigned
-- character (src/text.rs). These constraints make the database refuse,
-- whatever client writes the row, the characters that can disguise an audit
-- row: C0 and C1 controls, the soft hyphen, the Arabic letter mark, the
-- zero-width characters and directional marks U+200B-U+200F, the line and
-- paragraph separators and the bidi embeddings and overrides U+2028-U+202E,
-- the word joiner and invisible operators U+2060-U+2064, the bidi isolates
-- U+2066-U+2069 and the byte order mark U+FEFF. Each is a subset of what
-- src/text.rs refuses, so the command line never meets these errors.
--
-- NOT VALID: new rows are checked from now on, and the rows already there
-- are not. The table is append-only: a row written before this migration is
-- history that must not be rewritten, and a row holding such a character is
-- evidence of what was done, so validating would only make the migration
-- fail on it. Skipping validation also keeps the lock this takes short,
-- with no scan of the table, so a rolling upgrade does not stall the
-- operator actions of the binaries still running; those binaries get the
-- constraint's error for such input, as the new ones refuse it earlier.

ALTER TABLE batch_operator_action ADD CONSTRAINT batch_operator_action_operator_printable
    CHECK (operator !~ '[\u0001-\u001f\u007f-\u009f\u00ad\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069\ufeff]')
    NOT VALID;

ALTER TABLE batch_operator_action ADD CONSTRAINT batch_operator_action_reason_printable
    CHECK (reason !~ '[\u0001-\u001f\u007f-\u009f\u00ad\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069\ufeff]')
    NOT VALID;
