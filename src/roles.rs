//! `batchonce roles`: least-privilege database roles for each part of the
//! system, as SQL to review or to apply. Five group roles (NOLOGIN); an
//! administrator grants them to login roles:
//!
//! - `<prefix>_migrator`: DDL on the schema; runs `migrate` and `preflight`,
//!   and owns what it creates, so the default privileges below follow.
//! - `<prefix>_producer`: inserts runs (`produce`, `enqueue`), and its
//!   registry row with its configuration.
//! - `<prefix>_worker`: leases, heartbeats, attempts, its registry row and
//!   configuration, and
//!   the job kinds' item tables: select, insert, update, never delete.
//! - `<prefix>_operator`: the audited `runs fail|rerun|skip`: updates runs
//!   and attempts, appends to the audit table, and may terminate another
//!   role's session (`pg_signal_backend`, for `--terminate-blocker`).
//! - `<prefix>_readonly`: reads everything (`status`, `runs list`, the
//!   exporter, dashboards).
//!
//! Nobody but the table owner may update, delete or truncate the audit
//! table; its trigger refuses even the owner.

use sqlx::PgPool;

/// The engine's tables, which get per-role grants; every other table of the
/// schema belongs to a job kind (sources and items).
const ENGINE_TABLES: &[&str] = &[
    "batch_job_run",
    "batch_job_attempt",
    "batch_worker",
    "batch_process_config",
    "batch_operator_action",
    "_sqlx_migrations",
];

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
            crate::queue::truncate(prefix)
        ))
    }
}

/// The SQL that creates the roles (if missing) and grants their privileges
/// in `schema`; safe to run again.
pub fn sql(prefix: &str, schema: &str) -> Result<String, String> {
    check_prefix(prefix)?;
    if !schema
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_')
        || schema.is_empty()
    {
        return Err(format!("invalid schema name {schema:?}"));
    }
    let m = format!("{prefix}_migrator");
    let p = format!("{prefix}_producer");
    let w = format!("{prefix}_worker");
    let o = format!("{prefix}_operator");
    let r = format!("{prefix}_readonly");
    let s = schema;
    let mut out = String::new();
    out.push_str(&format!(
        "-- Least-privilege roles for batchonce (prefix {prefix}, schema {s}).\n\
         -- Group roles: grant them to login roles, for example\n\
         --   CREATE ROLE settle_worker LOGIN PASSWORD '...' IN ROLE {w};\n"
    ));
    for role in [&m, &p, &w, &o, &r] {
        out.push_str(&format!(
            "DO $$ BEGIN\n  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN\n    CREATE ROLE {role} NOLOGIN;\n  END IF;\nEND $$;\n"
        ));
    }
    out.push_str(&format!(
        "\n-- Everyone uses the schema; only the migrator changes it.\n\
         GRANT USAGE ON SCHEMA {s} TO {m}, {p}, {w}, {o}, {r};\n\
         GRANT CREATE ON SCHEMA {s} TO {m};\n"
    ));
    let engine = ENGINE_TABLES
        .iter()
        .map(|t| format!("{s}.{t}"))
        .collect::<Vec<_>>()
        .join(", ");
    // Grants on existing objects only once they exist: the roles come first
    // (the migrator must exist to create the tables), the grants after
    // `migrate`, and default privileges cover what the migrator adds later.
    let on_tables = [
        "-- Job kinds' tables (sources and items): workers read and write them.".to_owned(),
        format!("GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA {s} TO {w}"),
        format!("GRANT USAGE ON ALL SEQUENCES IN SCHEMA {s} TO {w}, {p}, {o}"),
        format!("GRANT SELECT ON ALL TABLES IN SCHEMA {s} TO {p}, {o}, {r}"),
        "-- Nobody but the owner deletes; the roles may have had more before.".to_owned(),
        format!("REVOKE DELETE, TRUNCATE ON ALL TABLES IN SCHEMA {s} FROM {p}, {w}, {o}, {r}"),
        format!("REVOKE INSERT, UPDATE ON ALL TABLES IN SCHEMA {s} FROM {p}, {o}, {r}"),
        "-- Then exactly what each role needs of the engine's tables.".to_owned(),
        format!("REVOKE INSERT, UPDATE ON {engine} FROM {w}"),
        format!("GRANT INSERT ON {s}.batch_job_run TO {p}"),
        format!("GRANT UPDATE ON {s}.batch_job_run, {s}.batch_job_attempt TO {w}, {o}"),
        format!("GRANT INSERT ON {s}.batch_job_attempt TO {w}"),
        "-- A worker's or producer's own registry row and recorded configuration, removed when it stops.".to_owned(),
        format!("GRANT INSERT, UPDATE, DELETE ON {s}.batch_worker, {s}.batch_process_config TO {w}, {p}"),
        format!("GRANT INSERT ON {s}.batch_operator_action TO {o}"),
        "-- The fence for command jobs runs with the caller's privileges.".to_owned(),
        format!("REVOKE EXECUTE ON FUNCTION {s}.batchonce_fence(text, bigint) FROM PUBLIC"),
        format!("GRANT EXECUTE ON FUNCTION {s}.batchonce_fence(text, bigint) TO {w}"),
    ];
    out.push_str(&format!(
        "\n-- `runs stale` reads other roles' sessions (pg_stat_activity).\n\
         GRANT pg_read_all_stats TO {o}, {r};\n\
         -- `runs fail|rerun|skip --terminate-blocker` ends a worker's session\n\
         -- that holds a run (pg_terminate_backend); not a superuser's.\n\
         GRANT pg_signal_backend TO {o};\n\
         \n-- On the tables, once `batchonce migrate` has created them.\n\
         DO $grants$ BEGIN\n  IF to_regprocedure('{s}.batchonce_fence(text, bigint)') IS NOT NULL THEN\n"
    ));
    for stmt in &on_tables {
        if stmt.starts_with("--") {
            out.push_str(&format!("    {stmt}\n"));
        } else {
            out.push_str(&format!("    EXECUTE '{stmt}';\n"));
        }
    }
    out.push_str("  END IF;\nEND $grants$;\n");
    out.push_str(&format!(
        "\n-- Tables the migrator creates later get the same grants.\n\
         ALTER DEFAULT PRIVILEGES FOR ROLE {m} IN SCHEMA {s} GRANT SELECT, INSERT, UPDATE ON TABLES TO {w};\n\
         ALTER DEFAULT PRIVILEGES FOR ROLE {m} IN SCHEMA {s} GRANT SELECT ON TABLES TO {p}, {o}, {r};\n\
         ALTER DEFAULT PRIVILEGES FOR ROLE {m} IN SCHEMA {s} GRANT USAGE ON SEQUENCES TO {w}, {p}, {o};\n\
         ALTER DEFAULT PRIVILEGES FOR ROLE {m} IN SCHEMA {s} REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;\n\
         ALTER DEFAULT PRIVILEGES FOR ROLE {m} IN SCHEMA {s} GRANT EXECUTE ON FUNCTIONS TO {w};\n"
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
pub async fn apply(pool: &PgPool, prefix: &str) -> Result<String, RolesError> {
    let schema: String = sqlx::query_scalar("SELECT current_schema()")
        .fetch_one(pool)
        .await?;
    let text = sql(prefix, &schema).map_err(RolesError::Invalid)?;
    let mut tx = pool.begin().await?;
    sqlx::raw_sql(&text).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_identifiers() {
        assert!(check_prefix("batchonce").is_ok());
        assert!(check_prefix("bo_test_1").is_ok());
        for bad in ["", "1bo", "Bo", "bo-x", "bo;drop", "bo x", &"a".repeat(41)] {
            assert!(check_prefix(bad).is_err(), "{bad}");
        }
        assert!(sql("bo", "public; drop").is_err());
    }

    #[test]
    fn workers_never_get_delete_on_items() {
        let s = sql("bo", "public").unwrap();
        assert!(s.contains(
            "EXECUTE 'GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO bo_worker'"
        ));
        assert!(s.contains("EXECUTE 'REVOKE DELETE, TRUNCATE ON ALL TABLES IN SCHEMA public FROM bo_producer, bo_worker, bo_operator, bo_readonly'"));
        // Nothing in the SQL needs quoting inside EXECUTE '...'.
        assert!(!s.contains("''"));
        assert!(!s.contains("DELETE ON public.batch_operator_action"));
    }
}
