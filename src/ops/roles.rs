//! `batchonce roles`: least-privilege database roles for each part of the
//! system, as SQL to review or to apply. Seven group roles (NOLOGIN); an
//! administrator grants them to login roles:
//!
//! - `<prefix>_migrator`: DDL on the schema; runs `migrate` and `preflight`,
//!   and owns what it creates, so the default privileges below follow.
//! - `<prefix>_producer`: enqueues runs through `batchonce_enqueue`, which
//!   inserts only PENDING (or calendar-SKIPPED) runs; writes its registry
//!   row and configuration.
//! - `<prefix>_worker`: claims, heartbeats, fences and finishes runs through
//!   the worker functions, each of which (but claim and recovery) takes the
//!   run's current lease token; writes its registry row and configuration,
//!   and the job kinds' tables (select, insert, update, never delete). It
//!   has no privilege on the run, attempt or audit tables themselves.
//! - `<prefix>_operator`: the audited `runs fail|rerun|skip` through the
//!   operator functions, which write the audit row with the state change;
//!   reads everything, and may terminate another role's session
//!   (`pg_signal_backend`, for `--terminate-blocker`).
//! - `<prefix>_readonly`: reads everything (`status`, `runs list`, the
//!   exporter, dashboards).
//! - `<prefix>_program`: a command job's program: the fence and progress
//!   functions, nothing else; grant it the program's own tables.
//! - `<prefix>_console`: `batchonce console`: what the operator role may
//!   do, under a login of its own (its audit rows' `session_user_name`).
//!
//! Nobody but the table owner may update, delete or truncate the audit
//! table; its trigger refuses even the owner, and another stamps every row
//! with the database's time and session.
//!
//! `batchonce roles`: least-privilege database roles, as SQL to review or to apply; what each role
//! may do is docs/security.md (docs/security.md#database-roles). `sql(prefix, schema, RolesOptions
//! { output_tables, keep_direct_writes })` builds it; `check_prefix` accepts 1–40 characters of
//! `a-z`, `0-9` and `_` starting with a letter, the schema must be ASCII letters, digits and `_`,
//! and every identifier is quoted all the same (`ident`).
//!
//! - It creates seven `NOLOGIN` group roles, `<prefix>_migrator`, `_producer`, `_worker`,
//!   `_operator`, `_readonly`, `_program` and `_console`, each only if missing; grants `USAGE` on
//!   the schema to all, `CREATE` to the migrator, `pg_read_all_stats` to the operator, read-only
//!   and console roles, `pg_signal_backend` to the operator and console roles.
//! - Once the schema holds `batchonce_claim3` (this release's migrations ran), it grants on what
//!   exists: every role but the program reads the tables, except that the worker reads no engine
//!   table but `_sqlx_migrations` (so it never learns a run's token); nobody deletes or truncates;
//!   nobody writes runs, attempts or the audit table; the worker inserts and updates only the
//!   registered kinds' output tables (`Registry::output_tables`), never their sources; the worker
//!   and producer write their own `batch_worker` and `batch_process_config` rows; each role
//!   executes its own state-change functions (`WORKER_FUNCTIONS`, `PRODUCER_FUNCTIONS`,
//!   `OPERATOR_FUNCTIONS`, `PROGRAM_FUNCTIONS`, `CONSOLE_FUNCTIONS`) and no function of the schema is executable by
//!   `PUBLIC`.
//! - `keep_direct_writes` (`--keep-direct-writes`) adds back the direct writes the previous
//!   release's processes make, for the expand step of a rolling upgrade.
//! - Default privileges keyed on the migrator let the roles read tables it creates later; writing a
//!   new output table, or calling a new function, waits for the next `roles --apply`.
//!
//! `apply(pool, prefix, opts)` runs the SQL in one transaction in the session's `current_schema()`;
//! every statement can be repeated.

use sqlx::PgPool;

/// The engine's tables, which get per-role grants; every other table of the
/// schema belongs to a job kind (sources and items).
const ENGINE_TABLES: &[&str] = &[
    "batch_job_run",
    "batch_job_attempt",
    "batch_job_due",
    "batch_job_running",
    "batch_worker",
    "batch_process_config",
    "batch_operator_action",
    "_sqlx_migrations",
];

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
    let name = |part: &str| format!("{prefix}_{part}");
    let (m, p, w, o, r, g, c) = (
        ident(&name("migrator")),
        ident(&name("producer")),
        ident(&name("worker")),
        ident(&name("operator")),
        ident(&name("readonly")),
        ident(&name("program")),
        ident(&name("console")),
    );
    let s = ident(schema);
    let mut out = String::new();
    out.push_str(&format!(
        "-- Least-privilege roles for batchonce (prefix {prefix}, schema {schema}).\n\
         -- Group roles: grant them to login roles, for example\n\
         --   CREATE ROLE settle_worker LOGIN PASSWORD '...' IN ROLE {w};\n"
    ));
    for part in [
        "migrator", "producer", "worker", "operator", "readonly", "program", "console",
    ] {
        let role = name(part);
        out.push_str(&format!(
            "DO $$ BEGIN\n  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN\n    CREATE ROLE {} NOLOGIN;\n  END IF;\nEND $$;\n",
            ident(&role)
        ));
    }
    out.push_str(&format!(
        "\n-- Everyone uses the schema; only the migrator changes it.\n\
         GRANT USAGE ON SCHEMA {s} TO {m}, {p}, {w}, {o}, {r}, {g}, {c};\n\
         GRANT CREATE ON SCHEMA {s} TO {m};\n"
    ));
    let engine = ENGINE_TABLES
        .iter()
        .map(|t| format!("{s}.{}", ident(t)))
        .collect::<Vec<_>>()
        .join(", ");
    let table = |t: &str| format!("{s}.{}", ident(t));
    let functions = |list: &[&str]| {
        list.iter()
            .map(|f| format!("{s}.{}", ident(f)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    // Grants on existing objects only once they exist: the roles come first
    // (the migrator must exist to create the tables), the grants after
    // `migrate`, and default privileges cover what the migrator adds later.
    for t in output_tables {
        if t.is_empty() || !t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("invalid output table name {t:?}"));
        }
    }
    let outputs = output_tables
        .iter()
        .map(|t| table(t))
        .collect::<Vec<_>>()
        .join(", ");
    let mut on_tables = vec![
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
        format!("REVOKE ALL ON {engine} FROM {p}, {w}, {o}, {r}, {g}, {c}"),
        format!("GRANT SELECT ON {engine} TO {p}, {o}, {r}, {c}"),
        "-- A lease token is the capability to change a run: every column of runs and attempts but the token.".to_owned(),
        format!("REVOKE SELECT ON {}, {} FROM {p}, {o}, {r}, {c}", table("batch_job_run"), table("batch_job_attempt")),
        format!(
            "DO $cols$ DECLARE t regclass; BEGIN FOREACH t IN ARRAY ARRAY['{s}.batch_job_run', '{s}.batch_job_attempt']::regclass[] LOOP \
             EXECUTE format('GRANT SELECT (%s) ON %s TO {p}, {o}, {r}, {c}', (SELECT string_agg(quote_ident(attname), ', ') FROM pg_attribute \
             WHERE attrelid = t AND attnum <> 0 AND NOT attisdropped AND attname <> 'lease_token'), t); END LOOP; END $cols$"
        ),
        "-- A worker reads only which migrations ran (not runs or their tokens).".to_owned(),
        format!("GRANT SELECT ON {} TO {w}", table("_sqlx_migrations")),
        "-- A worker's or producer's own registry row and recorded configuration, removed when it stops.".to_owned(),
        format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON {}, {} TO {w}, {p}",
            table("batch_worker"),
            table("batch_process_config")
        ),
        "-- Each role calls its own state-change functions, and nothing else of the engine's.".to_owned(),
        format!("REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {s} FROM PUBLIC, {p}, {w}, {o}, {r}, {g}, {c}"),
        format!("GRANT EXECUTE ON FUNCTION {} TO {w}", functions(WORKER_FUNCTIONS)),
        format!("GRANT EXECUTE ON FUNCTION {} TO {p}", functions(PRODUCER_FUNCTIONS)),
        format!("GRANT EXECUTE ON FUNCTION {} TO {o}", functions(OPERATOR_FUNCTIONS)),
        format!("GRANT EXECUTE ON FUNCTION {} TO {g}", functions(PROGRAM_FUNCTIONS)),
        format!("GRANT EXECUTE ON FUNCTION {} TO {c}", functions(CONSOLE_FUNCTIONS)),
    ];
    if !output_tables.is_empty() {
        on_tables.push("-- The registered kinds' output tables (Job::output_tables).".to_owned());
        on_tables.push(format!("GRANT INSERT, UPDATE ON {outputs} TO {w}"));
    }
    if opts.keep_direct_writes {
        on_tables.extend([
            "-- --keep-direct-writes: what the previous release's processes write directly, until the rolling upgrade is done.".to_owned(),
            format!("GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA {s} TO {w}"),
            format!("REVOKE INSERT, UPDATE ON {} FROM {w}", table("batch_operator_action")),
            format!("GRANT INSERT ON {} TO {p}", table("batch_job_run")),
            format!("GRANT UPDATE ON {}, {} TO {w}, {o}", table("batch_job_run"), table("batch_job_attempt")),
            format!("GRANT SELECT ON {}, {} TO {p}, {o}, {r}, {c}", table("batch_job_run"), table("batch_job_attempt")),
            format!("GRANT INSERT ON {} TO {o}", table("batch_operator_action")),
            format!("GRANT USAGE ON ALL SEQUENCES IN SCHEMA {s} TO {p}, {o}"),
        ]);
    }
    out.push_str(&format!(
        "\n-- `runs stale` reads other roles' sessions (pg_stat_activity), and\n\
         -- `runs fail --terminate-blocker` ends the session that holds a run.\n\
         GRANT pg_read_all_stats TO {o}, {r}, {c};\n\
         GRANT pg_signal_backend TO {o}, {c};\n\
         \n-- On the tables and functions, once `batchonce migrate` has created them.\n\
         DO $grants$ BEGIN\n  IF to_regproc('{schema}.batchonce_claim3') IS NOT NULL THEN\n"
    ));
    for stmt in &on_tables {
        if stmt.starts_with("--") {
            out.push_str(&format!("    {stmt}\n"));
        } else {
            out.push_str(&format!("    EXECUTE '{}';\n", stmt.replace('\'', "''")));
        }
    }
    out.push_str("  END IF;\nEND $grants$;\n");
    out.push_str(&format!(
        "\n-- Tables the migrator creates later can be read; writing a new output table,\n\
         -- like calling a new function, waits until `batchonce roles` runs again.\n\
         ALTER DEFAULT PRIVILEGES FOR ROLE {m} IN SCHEMA {s} GRANT SELECT ON TABLES TO {w};\n\
         ALTER DEFAULT PRIVILEGES FOR ROLE {m} IN SCHEMA {s} GRANT SELECT ON TABLES TO {p}, {o}, {r}, {c};\n\
         ALTER DEFAULT PRIVILEGES FOR ROLE {m} IN SCHEMA {s} GRANT USAGE ON SEQUENCES TO {w};\n\
         ALTER DEFAULT PRIVILEGES FOR ROLE {m} IN SCHEMA {s} REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;\n\
         ALTER DEFAULT PRIVILEGES FOR ROLE {m} IN SCHEMA {s} REVOKE EXECUTE ON FUNCTIONS FROM {w};\n"
    ));
    Ok(out)
}

/// Why [`apply`] failed.
#[derive(Debug, thiserror::Error)]
pub enum RolesError {
    #[error("{0}")]
    Invalid(String),
    #[error("applying the roles failed (run it as a superuser, or as an admin that can create roles, grant on the migrator's tables and grant pg_read_all_stats and pg_signal_backend; or apply the printed SQL yourself): {0}")]
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
                "GRANT EXECUTE ON FUNCTION \"public\".\"batchonce_enqueue\", \
                 \"public\".\"batchonce_enqueue2\", \
                 \"public\".\"batchonce_enqueue_declared\" TO \"bo_producer\""
            ),
            "{s}"
        );
        assert!(s.contains("REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA \"public\" FROM PUBLIC"));
        // The console acts only through the operator's audited functions.
        assert!(s.contains(
            "GRANT EXECUTE ON FUNCTION \"public\".\"batchonce_operator_check\", \
             \"public\".\"batchonce_operator_apply\", \
             \"public\".\"batchonce_operator_audit_terminate\", \
             \"public\".\"batchonce_operator_hold_row\" TO \"bo_console\""
        ));
        assert!(s.contains("GRANT pg_signal_backend TO \"bo_operator\", \"bo_console\""));
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
