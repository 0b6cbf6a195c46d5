//! What commands do about a database whose schema is not migrated: the
//! worker waits for the database and then refuses a pending migration;
//! the short commands turn a database error into `run batchonce migrate`
//! when a migration is pending.

use std::time::Duration;

use anyhow::{anyhow, bail};

use crate::db;
use crate::queue;
use crate::runtime::job::Registry;
use crate::runtime::worker::Shutdown;

/// The error of a command that needs the schema, on a database where
/// migrations are pending (`pending` is not empty).
fn not_migrated(pending: &[i64]) -> String {
    format!(
        "the database is not migrated ({} migrations pending, first {}): run `batchonce migrate`",
        pending.len(),
        pending.first().copied().unwrap_or_default()
    )
}

/// `err`, or, when the database has pending migrations (which is why a
/// table or column would be missing), the message that says to run
/// `migrate`. Asked only after a failure, so that commands keep working
/// on a database a newer release has migrated further.
pub(super) async fn unless_unmigrated(
    pool: &sqlx::PgPool,
    registry: &Registry,
    err: anyhow::Error,
) -> anyhow::Error {
    // Bad input is reported as it is, whatever the schema.
    if !err.chain().any(|c| c.is::<sqlx::Error>()) {
        return err;
    }
    match db::pending_migrations(pool, &registry.migrations()).await {
        Ok(pending) if !pending.is_empty() => anyhow!(not_migrated(&pending)),
        _ => err,
    }
}

/// Waits for the database to be reachable (a worker may start before it),
/// then refuses to run against a schema that is not migrated: claims would
/// fail forever. Returns false if a signal arrived while waiting (the
/// worker then exits 0). Transient errors are retried with a backoff from
/// 200 ms doubling to 10 s; a pending migration fails with one line,
/// `` the database is not migrated (N migrations pending, first V): run
/// `batchonce migrate` ``.
pub(super) async fn wait_for_schema(
    pool: &sqlx::PgPool,
    registry: &Registry,
    signals: &Shutdown,
) -> anyhow::Result<bool> {
    let mut delay = Duration::from_millis(200);
    loop {
        match db::pending_migrations(pool, &registry.migrations()).await {
            Ok(pending) if pending.is_empty() => return Ok(true),
            Ok(pending) => bail!(not_migrated(&pending)),
            Err(db::DbError::Sql(e)) if queue::is_transient(&e) => {
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64,
                    "database not reachable yet; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = signals.shutdown.cancelled() => return Ok(false),
                }
                delay = (delay * 2).min(Duration::from_secs(10));
            }
            Err(e) => return Err(e.into()),
        }
    }
}
