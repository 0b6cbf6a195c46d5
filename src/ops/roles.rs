//! `batchonce roles`: least-privilege database roles, as SQL to review or to apply; what each
//! role may do is the table of docs/security.md (docs/security.md#database-roles), which
//! `workers/tests/stolen_roles.rs` compares with the catalog. `sql(prefix, schema, RolesOptions
//! { output_tables, keep_direct_writes })` builds it; `check_prefix` accepts 1–40 characters of
//! `a-z`, `0-9` and `_` starting with a letter, the schema must be ASCII letters, digits and `_`,
//! and every identifier is quoted all the same (`ident`).
//!
//! - Seven `NOLOGIN` group roles an administrator grants to logins, `<prefix>_migrator`,
//!   `_producer`, `_worker`, `_operator`, `_readonly`, `_program` and `_console`, and two that no
//!   login may hold (every membership in them is revoked on each apply): `_guard`, which owns the
//!   audit table and its trigger functions, so that the migrator can neither alter, disable,
//!   truncate nor drop them, and `_terminator`, which owns the audited end of a session
//!   (`batchonce_operator_terminate`) and alone holds `pg_signal_backend`. Guard owns no code
//!   that runs as it: a function of its own that read the migrator's tables could be made to run
//!   the migrator's code as the audit table's owner.
//! - Only the migrator (and the schema's owner) may `CREATE` in the schema: `PUBLIC` and every
//!   other role lose it, so no login can plant a function or operator that a better match makes
//!   an engine function call (`PostgreSQL` 14 and older let `PUBLIC` create in `public`).
//! - Once the schema holds `batchonce_claim3` (this release's migrations ran), it grants on what
//!   exists: every role but the program reads the tables but `batch_fence_held`, except that the
//!   worker reads no engine table but `_sqlx_migrations` and its registry rows (so it never learns
//!   a run's token); nobody deletes or truncates; nobody writes runs, attempts or the audit table;
//!   the worker inserts and updates only the registered kinds' output tables; the worker and
//!   producer write their own `batch_worker` and `batch_process_config` rows; each role executes
//!   its own functions (`WORKER_FUNCTIONS` …) and no function of the schema is executable by
//!   `PUBLIC` but `batchonce_partition`. A function `migrate --contract` drops
//!   (`ops::contract::dropped_names`) is granted only while it exists. The operator and console get `pg_signal_backend` only
//!   while `batchonce_operator_terminate` does not exist (a schema of an earlier release).
//! - `keep_direct_writes` (`--keep-direct-writes`) adds back the direct writes the previous
//!   release's processes make, for the expand step of a rolling upgrade.
//! - Default privileges keyed on the migrator let the roles read tables it creates later.
//!
//! `apply(pool, prefix, opts)` runs the SQL in one transaction in the session's `current_schema()`;
//! every statement can be repeated.

use sqlx::PgPool;

/// The engine's tables, which get per-role grants; every other table of the
/// schema belongs to a job kind (sources and items). A table a later
/// migration adds is granted on only once it exists.
pub const ENGINE_TABLES: &[&str] = &[
    "batch_job_run",
    "batch_job_attempt",
    "batch_job_run_archive",
    "batch_job_attempt_archive",
    "batch_job_due",
    "batch_job_running",
    "batch_worker",
    "batch_process_config",
    "batch_operator_action",
    "batch_job_declared",
    "batch_fence_held",
    "batch_job_failed",
    "batch_job_tally",
    "batch_job_pause",
    "_sqlx_migrations",
];

/// The engine tables no role reads or writes: the engine's functions do.
const ENGINE_ONLY_TABLES: &[&str] = &["batch_fence_held"];

/// The audit table and its trigger functions, which `<prefix>_guard` owns.
const AUDIT_TABLE: &str = "batch_operator_action";
const AUDIT_FUNCTIONS: &[&str] = &[
    "batch_operator_action_append_only()",
    "batch_operator_action_stamp()",
];

/// The audited end of a session that blocks a run (issue 42, item 5), which
/// `<prefix>_terminator` owns whatever its signature; while no function of
/// this name exists, the operator and console keep `pg_signal_backend`.
const TERMINATE_FUNCTION: &str = "batchonce_operator_terminate";

/// Operator functions a later migration adds (with the terminate function;
/// pause and resume, and the audited enqueue of missing periods, issue
/// 44), granted to the operator and console once
/// they exist: a console operator pauses a job from its page.
const OPTIONAL_OPERATOR_FUNCTIONS: &[&str] = &[
    "batchonce_operator_audit_terminate_sessions",
    "batchonce_operator_enqueue",
    "batchonce_operator_pause",
    "batchonce_operator_resume",
];

/// Worker functions a later migration adds, granted to the worker once they
/// exist: the fold of the run counts (20261209000001), which every worker's
/// recovery loop calls.
const OPTIONAL_WORKER_FUNCTIONS: &[&str] = &["batchonce_fold_tally"];

/// The audited archive (issue 43), granted to the operator alone once a
/// later migration has added it: the console's operators act on one run at
/// a time, and moving history out of the ledger is a command-line decision.
const ARCHIVE_FUNCTION: &str = "batchonce_operator_archive";

/// What the terminate function reads: the run, its attempts, the open fences.
const TERMINATOR_READS: &[&str] = &["batch_job_run", "batch_job_attempt", "batch_fence_held"];

/// The state-change functions each role may call (migrations
/// 20261203000004 and 20261203000005); every other function of the engine is its owner's.
const WORKER_FUNCTIONS: &[&str] = &[
    "batchonce_claim",
    "batchonce_claim2",
    "batchonce_claim3",
    "batchonce_partition",
    "batchonce_heartbeat",
    "batchonce_fence_open",
    "batchonce_fence_commit",
    "batchonce_finish",
    "batchonce_recover_expired",
    "batchonce_freeze_context",
    "batchonce_fence",
    "batchonce_progress",
    "batchonce_attempt_output",
];
const PRODUCER_FUNCTIONS: &[&str] = &[
    "batchonce_enqueue",
    "batchonce_enqueue2",
    "batchonce_enqueue_declared",
];
const OPERATOR_FUNCTIONS: &[&str] = &[
    "batchonce_operator_check",
    "batchonce_operator_apply",
    "batchonce_operator_audit_terminate",
    "batchonce_operator_hold_row",
];
const PROGRAM_FUNCTIONS: &[&str] = &[
    "batchonce_fence",
    "batchonce_progress",
    "batchonce_partition",
];
/// The console is an operator's tool: the operator's functions, no more.
const CONSOLE_FUNCTIONS: &[&str] = OPERATOR_FUNCTIONS;

/// Role names are `<prefix>_<part>`; the prefix is checked so it can be
/// spliced into SQL as an identifier.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    let ok = !prefix.is_empty()
        && prefix.len() <= 40
        && prefix.starts_with(|c: char| c.is_ascii_lowercase())
        && prefix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid role prefix {:?}: use 1 to 40 of a-z, 0-9 and _, starting with a letter",
            crate::text::truncate(prefix)
        ))
    }
}

/// What the roles are granted besides the fixed rules.
#[derive(Debug, Clone, Default)]
pub struct RolesOptions<'a> {
    /// The tables the registered job kinds write (`Registry::output_tables`).
    pub output_tables: &'a [&'a str],
    /// Keep the direct writes the previous release's processes need (runs,
    /// attempts, the audit table, every job kind's table) while a rolling
    /// upgrade is under way: the expand step. Apply again without it once no
    /// process of the previous release is left.
    pub keep_direct_writes: bool,
}

/// An identifier quoted for SQL: the names are checked, and quoted all the
/// same, so no name can ever be read as SQL.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The parts of the role names: seven group roles for logins, then the two
/// that no login may hold.
const LOGIN_PARTS: [&str; 7] = [
    "migrator", "producer", "worker", "operator", "readonly", "program", "console",
];
const HELD_BY_NOBODY: [&str; 2] = ["guard", "terminator"];

/// The SQL that creates the roles (if missing) and grants their privileges
/// in `schema`; safe to run again.
pub fn sql(prefix: &str, schema: &str, opts: &RolesOptions) -> Result<String, String> {
    let output_tables = opts.output_tables;
    check_prefix(prefix)?;
    if !schema
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_')
        || schema.is_empty()
    {
        return Err(format!("invalid schema name {schema:?}"));
    }
    for t in output_tables {
        if t.is_empty() || !t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("invalid output table name {t:?}"));
        }
    }
    let names = Names::new(prefix, schema);
    let mut out = String::new();
    names.create_roles(&mut out);
    names.schema_privileges(&mut out);
    names.grants(&mut out, opts);
    names.default_privileges(&mut out);
    Ok(out)
}

/// The names the roles' SQL splices in: the prefix and schema as given, and
/// every role and the schema quoted as identifiers.
struct Names<'a> {
    prefix: &'a str,
    schema: &'a str,
    /// The schema, quoted.
    s: String,
    /// The roles, quoted: migrator, producer, worker, operator, readonly,
    /// program, console, guard and terminator.
    m: String,
    p: String,
    w: String,
    o: String,
    r: String,
    g: String,
    c: String,
    guard: String,
    term: String,
}

/// A statement of the grants block: a `--` comment is written as it is,
/// anything else inside `EXECUTE '…'`.
fn emit(out: &mut String, stmt: &str) {
    if stmt.starts_with("--") {
        out.push_str(&format!("    {stmt}\n"));
    } else {
        out.push_str(&format!("    EXECUTE '{}';\n", stmt.replace('\'', "''")));
    }
}

impl<'a> Names<'a> {
    /// The names for `prefix` and `schema`, both already checked.
    fn new(prefix: &'a str, schema: &'a str) -> Self {
        let name = |part: &str| format!("{prefix}_{part}");
        Names {
            prefix,
            schema,
            s: ident(schema),
            m: ident(&name("migrator")),
            p: ident(&name("producer")),
            w: ident(&name("worker")),
            o: ident(&name("operator")),
            r: ident(&name("readonly")),
            g: ident(&name("program")),
            c: ident(&name("console")),
            guard: ident(&name("guard")),
            term: ident(&name("terminator")),
        }
    }

    /// A role's name, unquoted: `<prefix>_<part>`.
    fn name(&self, part: &str) -> String {
        format!("{}_{part}", self.prefix)
    }

    /// A table of the schema, quoted.
    fn table(&self, t: &str) -> String {
        format!("{}.{}", self.s, ident(t))
    }

    /// Functions of the schema, quoted, separated by commas.
    fn functions(&self, list: &[&str]) -> String {
        list.iter()
            .map(|f| format!("{}.{}", self.s, ident(f)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The header, and every role created if it is missing.
    fn create_roles(&self, out: &mut String) {
        let Names {
            prefix,
            schema,
            w,
            guard,
            term,
            ..
        } = self;
        out.push_str(&format!(
            "-- Least-privilege roles for batchonce (prefix {prefix}, schema {schema}).\n\
             -- Group roles: grant them to login roles, for example\n\
             --   CREATE ROLE settle_worker LOGIN PASSWORD '...' IN ROLE {w};\n\
             -- {guard} (owns the audit table) and {term} (ends a session that blocks a run)\n\
             -- are held by no login.\n"
        ));
        for part in LOGIN_PARTS.iter().chain(&HELD_BY_NOBODY) {
            let role = self.name(part);
            out.push_str(&format!(
                "DO $$ BEGIN\n  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN\n    CREATE ROLE {} NOLOGIN;\n  END IF;\nEND $$;\n",
                ident(&role)
            ));
        }
    }

    /// Who uses the schema, and that only the migrator creates in it.
    fn schema_privileges(&self, out: &mut String) {
        let Names {
            schema,
            s,
            m,
            p,
            w,
            o,
            r,
            g,
            c,
            guard,
            term,
            ..
        } = self;
        out.push_str(&format!(
            "ALTER ROLE {guard} NOLOGIN;\nALTER ROLE {term} NOLOGIN;\n\
             \n-- Everyone uses the schema; only the migrator changes it. No other role may\n\
             -- CREATE in it (PostgreSQL 14 and older let PUBLIC create in `public`): a\n\
             -- function or operator planted there that matches a call better than\n\
             -- pg_catalog's would run as the migrator inside its SECURITY DEFINER functions.\n\
             GRANT USAGE ON SCHEMA {s} TO {m}, {p}, {w}, {o}, {r}, {g}, {c}, {guard}, {term};\n\
             REVOKE CREATE ON SCHEMA {s} FROM PUBLIC;\n\
             DO $create$\nDECLARE\n  x record;\nBEGIN\n\
             \x20 FOR x IN SELECT a.grantee::regrole AS grantee\n\
             \x20           FROM pg_namespace n, aclexplode(n.nspacl) a\n\
             \x20           WHERE n.nspname = '{schema}' AND a.privilege_type = 'CREATE'\n\
             \x20             AND a.grantee <> 0 AND a.grantee <> n.nspowner\n\
             \x20             AND a.grantee <> '{migrator}'::regrole\n\
             \x20 LOOP\n\
             \x20   EXECUTE format('REVOKE CREATE ON SCHEMA %I FROM %s', '{schema}', x.grantee);\n\
             \x20 END LOOP;\n\
             END $create$;\n\
             GRANT CREATE ON SCHEMA {s} TO {m};\n",
            migrator = self.name("migrator"),
        ));
    }

    /// On the tables that exist before the engine's: every job kind's
    /// tables are read by the workers, and written by nobody but the owner.
    fn on_tables(&self) -> Vec<String> {
        let Names {
            s,
            p,
            w,
            o,
            r,
            g,
            c,
            ..
        } = self;
        // Grants on existing objects only once they exist: the roles come first
        // (the migrator must exist to create the tables), the grants after
        // `migrate`, and default privileges cover what the migrator adds later.
        vec![
            "-- Job kinds' tables: workers read them all (sources) and write only the kinds' output tables.".to_owned(),
            format!("GRANT SELECT ON ALL TABLES IN SCHEMA {s} TO {w}"),
            format!("REVOKE INSERT, UPDATE ON ALL TABLES IN SCHEMA {s} FROM {w}"),
            format!("GRANT USAGE ON ALL SEQUENCES IN SCHEMA {s} TO {w}"),
            format!("GRANT SELECT ON ALL TABLES IN SCHEMA {s} TO {p}, {o}, {r}, {c}"),
            "-- Nobody but the owner deletes; the roles may have had more before.".to_owned(),
            format!("REVOKE DELETE, TRUNCATE ON ALL TABLES IN SCHEMA {s} FROM {p}, {w}, {o}, {r}, {g}, {c}"),
            format!("REVOKE INSERT, UPDATE ON ALL TABLES IN SCHEMA {s} FROM {p}, {o}, {r}, {g}, {c}"),
            format!("REVOKE USAGE ON ALL SEQUENCES IN SCHEMA {s} FROM {p}, {o}, {r}, {g}, {c}"),
            "-- The engine's tables: no role writes a run, an attempt or an audit row itself; the functions below do.".to_owned(),
        ]
    }

    /// On each engine table, only if it exists (a later migration adds
    /// some): the relation's name, then the statement.
    fn on_engine_tables(&self) -> Vec<(String, String)> {
        let Names {
            schema,
            p,
            w,
            o,
            r,
            g,
            c,
            term,
            ..
        } = self;
        let mut engine: Vec<(String, String)> = Vec::new();
        for t in ENGINE_TABLES {
            engine.push((
                format!("{schema}.{t}"),
                format!(
                    "REVOKE ALL ON {} FROM {p}, {w}, {o}, {r}, {g}, {c}, {term}",
                    self.table(t)
                ),
            ));
            if !ENGINE_ONLY_TABLES.contains(t) {
                engine.push((
                    format!("{schema}.{t}"),
                    format!("GRANT SELECT ON {} TO {p}, {o}, {r}, {c}", self.table(t)),
                ));
            }
        }
        engine
    }

    /// After the engine's tables: the columns readable, the registry rows,
    /// each role's functions, the output tables and, with
    /// `keep_direct_writes`, the previous release's direct writes.
    fn on_tables_after(&self, opts: &RolesOptions) -> Vec<String> {
        let output_tables = opts.output_tables;
        let Names {
            s,
            p,
            w,
            o,
            r,
            g,
            c,
            term,
            ..
        } = self;
        let outputs = output_tables
            .iter()
            .map(|t| self.table(t))
            .collect::<Vec<_>>()
            .join(", ");
        let mut on_tables_after = vec![
            "-- A lease token is the capability to change a run: every column of runs and attempts (live or archived) but the token.".to_owned(),
            format!("REVOKE SELECT ON {}, {} FROM {p}, {o}, {r}, {c}", self.table("batch_job_run"), self.table("batch_job_attempt")),
            format!(
                // Dollar quotes: every statement here runs inside EXECUTE '…'.
                // The archive tables exist only once their migration has run.
                "DO $cols$ DECLARE t regclass; BEGIN FOREACH t IN ARRAY ARRAY[to_regclass($t${s}.batch_job_run$t$), to_regclass($t${s}.batch_job_attempt$t$), \
                 to_regclass($t${s}.batch_job_run_archive$t$), to_regclass($t${s}.batch_job_attempt_archive$t$)] LOOP CONTINUE WHEN t IS NULL; \
                 EXECUTE format($f$REVOKE SELECT ON %s FROM {p}, {o}, {r}, {c}$f$, t); \
                 EXECUTE format($f$GRANT SELECT (%s) ON %s TO {p}, {o}, {r}, {c}$f$, (SELECT string_agg(quote_ident(attname), $j$, $j$) FROM pg_attribute \
                 WHERE attrelid = t AND attnum <> 0 AND NOT attisdropped AND attname <> $n$lease_token$n$), t); END LOOP; END $cols$"
            ),
            "-- A worker reads only which migrations ran (not runs or their tokens).".to_owned(),
            format!("GRANT SELECT ON {} TO {w}", self.table("_sqlx_migrations")),
            "-- A worker's or producer's own registry row and recorded configuration, removed when it stops.".to_owned(),
            format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON {}, {} TO {w}, {p}",
                self.table("batch_worker"),
                self.table("batch_process_config")
            ),
            "-- Each role calls its own state-change functions, and nothing else of the engine's.".to_owned(),
            format!("REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {s} FROM PUBLIC, {p}, {w}, {o}, {r}, {g}, {c}, {term}"),
            format!("GRANT EXECUTE ON FUNCTION {} TO {w}", self.functions(&lasting(WORKER_FUNCTIONS))),
            format!("GRANT EXECUTE ON FUNCTION {} TO {p}", self.functions(&lasting(PRODUCER_FUNCTIONS))),
            format!("GRANT EXECUTE ON FUNCTION {} TO {o}", self.functions(&lasting(OPERATOR_FUNCTIONS))),
            format!("GRANT EXECUTE ON FUNCTION {} TO {g}", self.functions(&lasting(PROGRAM_FUNCTIONS))),
            format!("GRANT EXECUTE ON FUNCTION {} TO {c}", self.functions(&lasting(CONSOLE_FUNCTIONS))),
        ];
        if !output_tables.is_empty() {
            on_tables_after
                .push("-- The registered kinds' output tables (Job::output_tables).".to_owned());
            on_tables_after.push(format!("GRANT INSERT, UPDATE ON {outputs} TO {w}"));
        }
        if opts.keep_direct_writes {
            on_tables_after.extend([
                "-- --keep-direct-writes: what the previous release's processes write directly, until the rolling upgrade is done.".to_owned(),
                format!("GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA {s} TO {w}"),
                format!("REVOKE INSERT, UPDATE ON {} FROM {w}", self.table(AUDIT_TABLE)),
                format!("GRANT INSERT ON {} TO {p}", self.table("batch_job_run")),
                format!("GRANT UPDATE ON {}, {} TO {w}, {o}", self.table("batch_job_run"), self.table("batch_job_attempt")),
                format!("GRANT SELECT ON {}, {} TO {p}, {o}, {r}, {c}", self.table("batch_job_run"), self.table("batch_job_attempt")),
                format!("GRANT INSERT ON {} TO {o}", self.table(AUDIT_TABLE)),
                format!("GRANT USAGE ON ALL SEQUENCES IN SCHEMA {s} TO {p}, {o}"),
            ]);
        }
        on_tables_after
    }

    /// The block that grants on the tables and functions once `migrate` has
    /// created them, and the grants that need no table.
    fn grants(&self, out: &mut String, opts: &RolesOptions) {
        let Names {
            schema,
            s,
            o,
            r,
            c,
            guard,
            term,
            ..
        } = self;
        out.push_str(&format!(
            "\n-- `runs stale` reads other roles' sessions (pg_stat_activity).\n\
             GRANT pg_read_all_stats TO {o}, {r}, {c};\n\
             -- Only {term} may end another session, through the audited\n\
             -- batchonce_operator_terminate it owns (which checks the sessions it ends\n\
             -- in pg_stat_activity).\n\
             GRANT pg_signal_backend, pg_read_all_stats TO {term};\n\
             \n-- On the tables and functions, once `batchonce migrate` has created them.\n\
             DO $grants$\nDECLARE\n  f regprocedure;\n  terminate_exists boolean := false;\n\
             \x20 superuser boolean := (SELECT rolsuper FROM pg_roles WHERE rolname = current_user);\n\
             BEGIN\n  IF to_regproc('{schema}.batchonce_claim3') IS NOT NULL THEN\n\
             \x20   -- An administrator that is no superuser acts as guard and terminator for the\n\
             \x20   -- ownership changes, which PostgreSQL allows only to a new owner that may\n\
             \x20   -- create in the schema; the membership and that privilege end with this\n\
             \x20   -- transaction's script (below), so no other session ever sees them.\n\
             \x20   IF NOT superuser THEN\n\
             \x20     EXECUTE 'GRANT {guard}, {term} TO ' || quote_ident(current_user);\n\
             \x20     EXECUTE 'GRANT CREATE ON SCHEMA {s} TO {guard}, {term}';\n\
             \x20   END IF;\n"
        ));
        for stmt in &self.on_tables() {
            emit(out, stmt);
        }
        for (rel, sql) in &self.on_engine_tables() {
            out.push_str(&format!(
                "    IF to_regclass('{rel}') IS NOT NULL THEN EXECUTE '{}'; END IF;\n",
                sql.replace('\'', "''")
            ));
        }
        for stmt in &self.on_tables_after(opts) {
            emit(out, stmt);
        }
        self.audit_ownership(out);
        self.function_grants(out);
    }

    /// Inside the grants block: the audit trail owned by guard, out of the
    /// migrator's reach.
    fn audit_ownership(&self, out: &mut String) {
        let Names { s, m, guard, .. } = self;
        emit(
            out,
            "-- The audit trail's past is out of the migrator's reach: guard owns the table and its",
        );
        emit(out, "-- triggers' functions, so the migrator can neither alter, disable, truncate nor drop them,");
        emit(
            out,
            "-- nor replace the stamp; their names resolve in pg_catalog only. The migrator's operator",
        );
        emit(out, "-- functions insert (and read back) audit rows; the foreign key's owner must reference runs.");
        emit(
            out,
            &format!("ALTER TABLE {} OWNER TO {guard}", self.table(AUDIT_TABLE)),
        );
        for f in AUDIT_FUNCTIONS {
            emit(
                out,
                &format!("ALTER FUNCTION {s}.{f} SET search_path = pg_catalog, pg_temp"),
            );
        }
        out.push_str(&format!(
            "    -- Every function a trigger of the audit table calls (none runs as its owner).\n\
             \x20   FOR f IN SELECT DISTINCT t.tgfoid::regprocedure FROM pg_trigger t\n\
             \x20            JOIN pg_proc p ON p.oid = t.tgfoid\n\
             \x20            WHERE t.tgrelid = '{audit}'::regclass AND NOT t.tgisinternal AND NOT p.prosecdef\n\
             \x20   LOOP\n\
             \x20     EXECUTE format('ALTER FUNCTION %s OWNER TO %s', f, '{guard}');\n\
             \x20     EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);\n\
             \x20   END LOOP;\n",
            audit = self.table(AUDIT_TABLE),
        ));
        emit(
            out,
            &format!("REVOKE ALL ON {} FROM {m}", self.table(AUDIT_TABLE)),
        );
        emit(
            out,
            &format!("GRANT SELECT, INSERT ON {} TO {m}", self.table(AUDIT_TABLE)),
        );
        emit(
            out,
            &format!(
                "GRANT REFERENCES (job_key) ON {} TO {guard}",
                self.table("batch_job_run")
            ),
        );
        emit(
            out,
            "-- The audited end of a session: terminator owns it and reads what it checks;",
        );
        emit(
            out,
            "-- the operator and console call it, and hold pg_signal_backend themselves only",
        );
        emit(
            out,
            "-- while it does not exist (a schema of an earlier release).",
        );
    }

    /// Inside the grants block: the optional functions (terminate, pause
    /// and resume, the archive) and what the terminator reads; it closes
    /// the block.
    fn function_grants(&self, out: &mut String) {
        let Names {
            schema,
            s,
            p,
            w,
            o,
            g,
            c,
            guard,
            term,
            ..
        } = self;
        out.push_str(&format!(
            "    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p\n\
             \x20            WHERE p.pronamespace = '{s}'::regnamespace AND p.proname = '{TERMINATE_FUNCTION}'\n\
             \x20   LOOP\n\
             \x20     terminate_exists := true;\n\
             \x20     EXECUTE format('ALTER FUNCTION %s OWNER TO %s', f, '{term}');\n\
             \x20     EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);\n\
             \x20     EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s, %s', f, '{o}', '{c}');\n\
             \x20   END LOOP;\n\
             \x20   -- The audit row that names the sessions to end; pause and resume.\n\
             \x20   FOR f IN SELECT p.oid::regprocedure FROM pg_proc p\n\
             \x20            WHERE p.pronamespace = '{s}'::regnamespace AND p.proname = ANY(ARRAY[{optional}])\n\
             \x20   LOOP\n\
             \x20     EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s, %s', f, '{o}', '{c}');\n\
             \x20   END LOOP;\n\
             \x20   FOR f IN SELECT p.oid::regprocedure FROM pg_proc p\n\
             \x20            WHERE p.pronamespace = '{s}'::regnamespace AND p.proname = ANY(ARRAY[{optional_worker}])\n\
             \x20   LOOP\n\
             \x20     EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', f, '{w}');\n\
             \x20   END LOOP;\n\
{contracted}\
             \x20   -- The archive, for the operator alone.\n\
             \x20   FOR f IN SELECT p.oid::regprocedure FROM pg_proc p\n\
             \x20            WHERE p.pronamespace = '{s}'::regnamespace AND p.proname = '{ARCHIVE_FUNCTION}'\n\
             \x20   LOOP\n\
             \x20     EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', f, '{o}');\n\
             \x20   END LOOP;\n\
             \x20   IF terminate_exists THEN\n",
            optional = quoted(OPTIONAL_OPERATOR_FUNCTIONS),
            optional_worker = quoted(OPTIONAL_WORKER_FUNCTIONS),
            contracted = contracted_grants(
                s,
                &[
                    (WORKER_FUNCTIONS, w.as_str()),
                    (PRODUCER_FUNCTIONS, p.as_str()),
                    (OPERATOR_FUNCTIONS, o.as_str()),
                    (PROGRAM_FUNCTIONS, g.as_str()),
                    (CONSOLE_FUNCTIONS, c.as_str()),
                ]
            ),
        ));
        for t in TERMINATOR_READS {
            out.push_str(&format!(
                "      IF to_regclass('{schema}.{t}') IS NOT NULL THEN EXECUTE 'GRANT SELECT ON {} TO {term}'; END IF;\n",
                self.table(t)
            ));
        }
        out.push_str(&format!(
            "      EXECUTE 'GRANT SELECT, INSERT ON {audit} TO {term}';\n\
             \x20     IF to_regprocedure('{schema}.batchonce_now(timestamptz)') IS NOT NULL THEN\n\
             \x20       EXECUTE 'GRANT EXECUTE ON FUNCTION {s}.batchonce_now(timestamptz) TO {term}';\n\
             \x20     END IF;\n\
             \x20     IF EXISTS (SELECT 1 FROM pg_auth_members WHERE roleid = 'pg_signal_backend'::regrole\n\
             \x20                AND member = '{op}'::regrole) THEN\n\
             \x20       EXECUTE 'REVOKE pg_signal_backend FROM {o}';\n\
             \x20     END IF;\n\
             \x20     IF EXISTS (SELECT 1 FROM pg_auth_members WHERE roleid = 'pg_signal_backend'::regrole\n\
             \x20                AND member = '{con}'::regrole) THEN\n\
             \x20       EXECUTE 'REVOKE pg_signal_backend FROM {c}';\n\
             \x20     END IF;\n\
             \x20   END IF;\n\
             \x20 END IF;\n\
             \x20 IF NOT terminate_exists THEN\n\
             \x20   EXECUTE 'GRANT pg_signal_backend TO {o}, {c}';\n\
             \x20 END IF;\n\
             \x20 IF NOT superuser THEN\n\
             \x20   EXECUTE 'REVOKE CREATE ON SCHEMA {s} FROM {guard}, {term}';\n\
             \x20 END IF;\n\
             END $grants$;\n",
            audit = self.table(AUDIT_TABLE),
            op = self.name("operator"),
            con = self.name("console"),
        ));
    }

    /// Default privileges on what the migrator creates later, and no login
    /// holding guard or terminator.
    fn default_privileges(&self, out: &mut String) {
        let Names {
            s,
            m,
            p,
            w,
            o,
            r,
            c,
            guard,
            term,
            ..
        } = self;
        out.push_str(&format!(
            "\n-- Tables the migrator creates later can be read; writing a new output table,\n\
             -- like calling a new function, waits until `batchonce roles` runs again.\n\
             ALTER DEFAULT PRIVILEGES FOR ROLE {m} IN SCHEMA {s} GRANT SELECT ON TABLES TO {w};\n\
             ALTER DEFAULT PRIVILEGES FOR ROLE {m} IN SCHEMA {s} GRANT SELECT ON TABLES TO {p}, {o}, {r}, {c};\n\
             ALTER DEFAULT PRIVILEGES FOR ROLE {m} IN SCHEMA {s} GRANT USAGE ON SEQUENCES TO {w};\n\
             ALTER DEFAULT PRIVILEGES FOR ROLE {m} IN SCHEMA {s} REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;\n\
             ALTER DEFAULT PRIVILEGES FOR ROLE {m} IN SCHEMA {s} REVOKE EXECUTE ON FUNCTIONS FROM {w};\n\
             \n-- No login holds {guard} or {term}, and neither does the migrator.\n\
             DO $nobody$\nDECLARE\n  x record;\nBEGIN\n\
             \x20 FOR x IN SELECT a.roleid::regrole AS role, a.member::regrole AS member\n\
             \x20           FROM pg_auth_members a\n\
             \x20           WHERE a.roleid IN ('{gname}'::regrole, '{tname}'::regrole)\n\
             \x20 LOOP\n\
             \x20   EXECUTE format('REVOKE %s FROM %s', x.role, x.member);\n\
             \x20 END LOOP;\n\
             END $nobody$;\n",
            gname = self.name("guard"),
            tname = self.name("terminator"),
        ));
    }
}

/// Why [`apply`] failed.
#[derive(Debug, thiserror::Error)]
pub enum RolesError {
    #[error("{0}")]
    Invalid(String),
    #[error("applying the roles failed (run it as a superuser, or as an admin that can create roles, grant on the migrator's tables, grant pg_read_all_stats and pg_signal_backend, and revoke CREATE on the schema; or apply the printed SQL yourself): {0}")]
    Database(#[from] sqlx::Error),
}

/// Applies [`sql`] in one transaction.
pub async fn apply(
    pool: &PgPool,
    prefix: &str,
    opts: &RolesOptions<'_>,
) -> Result<String, RolesError> {
    let schema: String = sqlx::query_scalar("SELECT current_schema()")
        .fetch_one(pool)
        .await?;
    let text = sql(prefix, &schema, opts).map_err(RolesError::Invalid)?;
    let mut tx = pool.begin().await?;
    sqlx::raw_sql(&text).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(text)
}

/// A role's functions that every schema of this release keeps: those
/// `migrate --contract` drops are granted by [`contracted_grants`] instead.
fn lasting<'a>(list: &[&'a str]) -> Vec<&'a str> {
    let dropped = crate::ops::contract::dropped_names();
    list.iter()
        .copied()
        .filter(|f| !dropped.contains(f))
        .collect()
}

/// The grants on each role's functions that `migrate --contract` drops, as
/// loops over those that exist, so that `roles` grants them to the previous
/// release's processes before the contract and fails on nothing after it.
/// `schema` and the roles come quoted.
fn contracted_grants(schema: &str, roles: &[(&[&str], &str)]) -> String {
    let dropped = crate::ops::contract::dropped_names();
    let mut out = String::new();
    for (list, role) in roles {
        let names: Vec<&str> = list
            .iter()
            .copied()
            .filter(|f| dropped.contains(f))
            .collect();
        if names.is_empty() {
            continue;
        }
        out.push_str(&format!(
            "    -- Until `migrate --contract` drops them.\n\
             \x20   FOR f IN SELECT p.oid::regprocedure FROM pg_proc p\n\
             \x20            WHERE p.pronamespace = '{schema}'::regnamespace AND p.proname = ANY(ARRAY[{names}])\n\
             \x20   LOOP\n\
             \x20     EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', f, '{role}');\n\
             \x20   END LOOP;\n",
            names = quoted(&names),
        ));
    }
    out
}

/// The names as a list of SQL string literals (constants of this file).
fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|f| format!("'{f}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts<'a>(tables: &'a [&'a str]) -> RolesOptions<'a> {
        RolesOptions {
            output_tables: tables,
            keep_direct_writes: false,
        }
    }

    #[test]
    fn prefixes_are_identifiers() {
        assert!(check_prefix("batchonce").is_ok());
        assert!(check_prefix("bo_test_1").is_ok());
        for bad in ["", "1bo", "Bo", "bo-x", "bo;drop", "bo x", &"a".repeat(41)] {
            assert!(check_prefix(bad).is_err(), "{bad}");
        }
        assert!(sql("bo", "public; drop", &opts(&[])).is_err());
    }

    #[test]
    fn workers_never_get_delete_on_items() {
        let s = sql("bo", "public", &opts(&["settlement_item"])).unwrap();
        assert!(s.contains(
            "EXECUTE 'GRANT INSERT, UPDATE ON \"public\".\"settlement_item\" TO \"bo_worker\"'"
        ));
        assert!(s.contains(
            "EXECUTE 'REVOKE INSERT, UPDATE ON ALL TABLES IN SCHEMA \"public\" FROM \"bo_worker\"'"
        ));
        assert!(sql("bo", "public", &opts(&["x; drop"])).is_err());
        assert!(s.contains("EXECUTE 'REVOKE DELETE, TRUNCATE ON ALL TABLES IN SCHEMA \"public\" FROM \"bo_producer\", \"bo_worker\", \"bo_operator\", \"bo_readonly\", \"bo_program\", \"bo_console\"'"));
        // Nothing in the SQL needs quoting inside EXECUTE '...'.
        assert!(!s.contains("''"));
        assert!(!s.contains("DELETE ON \"public\".\"batch_operator_action\""));
    }

    #[test]
    fn every_identifier_is_quoted() {
        let s = sql("bo", "public", &opts(&["settlement_item"])).unwrap();
        for part in [
            "migrator", "producer", "worker", "operator", "readonly", "program", "console",
        ] {
            assert!(s.contains(&format!("\"bo_{part}\"")), "{part}");
            assert!(!s.contains(&format!(" bo_{part};")), "{part} unquoted");
        }
        assert!(
            s.contains(
                "GRANT EXECUTE ON FUNCTION \"public\".\"batchonce_enqueue2\", \
                 \"public\".\"batchonce_enqueue_declared\" TO \"bo_producer\""
            ),
            "{s}"
        );
        assert!(s.contains("REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA \"public\" FROM PUBLIC"));
        // The console acts only through the operator's audited functions.
        assert!(s.contains(
            "GRANT EXECUTE ON FUNCTION \"public\".\"batchonce_operator_check\", \
             \"public\".\"batchonce_operator_apply\", \
             \"public\".\"batchonce_operator_hold_row\" TO \"bo_console\""
        ));
        // What the contract drops is granted only while it exists.
        assert!(s.contains(
            "p.proname = ANY(ARRAY['batchonce_enqueue'])\n    LOOP\n      \
             EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', f, '\"bo_producer\"');"
        ));
        assert!(!s.contains("\"public\".\"batchonce_claim\","));
        assert!(s.contains("GRANT pg_signal_backend TO \"bo_operator\", \"bo_console\""));
    }

    #[test]
    fn only_the_migrator_creates_and_guard_owns_the_trail() {
        let s = sql("bo", "public", &opts(&[])).unwrap();
        assert!(s.contains("REVOKE CREATE ON SCHEMA \"public\" FROM PUBLIC;"));
        assert!(s.contains("GRANT CREATE ON SCHEMA \"public\" TO \"bo_migrator\";"));
        assert!(s.contains(
            "EXECUTE 'ALTER TABLE \"public\".\"batch_operator_action\" OWNER TO \"bo_guard\"';"
        ));
        assert!(s.contains("GRANT pg_signal_backend, pg_read_all_stats TO \"bo_terminator\";"));
        assert!(s.contains("CREATE ROLE \"bo_guard\" NOLOGIN"));
        assert!(s.contains("ALTER ROLE \"bo_terminator\" NOLOGIN;"));
    }

    #[test]
    fn keeping_direct_writes_is_explicit() {
        let strict = sql("bo", "public", &opts(&[])).unwrap();
        assert!(!strict.contains("GRANT UPDATE ON \"public\".\"batch_job_run\""));
        let kept = sql(
            "bo",
            "public",
            &RolesOptions {
                output_tables: &[],
                keep_direct_writes: true,
            },
        )
        .unwrap();
        assert!(kept.contains("GRANT UPDATE ON \"public\".\"batch_job_run\", \"public\".\"batch_job_attempt\" TO \"bo_worker\", \"bo_operator\""));
        assert!(kept.contains("GRANT INSERT ON \"public\".\"batch_job_run\" TO \"bo_producer\""));
    }
}
