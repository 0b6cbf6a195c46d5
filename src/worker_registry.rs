//! The worker registry: the only module that writes `batch_worker`. Each
//! worker process registers at start, refreshes `last_seen` with its
//! heartbeats, and deregisters when it stops; a SIGKILLed worker's row stays
//! with its last `last_seen`, which is the evidence `runs stale` shows.

use sqlx::PgPool;

/// Registers (or re-registers, after a restart under the same id) a worker.
pub async fn register(pool: &PgPool, worker_id: &str, version: &str) -> Result<(), sqlx::Error> {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".into());
    let mut stmt = crate::db::statement(pool).await?;
    crate::db::query(
        "INSERT INTO batch_worker (worker_id, host, pid, version, started_at, last_seen) \
         VALUES ($1, left($2, 255), $3, left($4, 64), now(), now()) \
         ON CONFLICT (worker_id) DO UPDATE \
         SET host = EXCLUDED.host, pid = EXCLUDED.pid, version = EXCLUDED.version, \
             started_at = now(), last_seen = now()",
    )
    .bind(worker_id)
    .bind(host)
    .bind(std::process::id() as i32)
    .bind(version)
    .execute(stmt.conn())
    .await?;
    stmt.done().await
}

/// Refreshes `last_seen`; re-registers if an operator removed the row.
pub async fn touch(pool: &PgPool, worker_id: &str, version: &str) -> Result<(), sqlx::Error> {
    let mut stmt = crate::db::statement(pool).await?;
    let n = crate::db::query("UPDATE batch_worker SET last_seen = now() WHERE worker_id = $1")
        .bind(worker_id)
        .execute(stmt.conn())
        .await?
        .rows_affected();
    stmt.done().await?;
    if n == 0 {
        register(pool, worker_id, version).await?;
    }
    Ok(())
}

/// Removes a stopped worker.
pub async fn deregister(pool: &PgPool, worker_id: &str) -> Result<(), sqlx::Error> {
    let mut stmt = crate::db::statement(pool).await?;
    crate::db::query("DELETE FROM batch_worker WHERE worker_id = $1")
        .bind(worker_id)
        .execute(stmt.conn())
        .await?;
    stmt.done().await
}
