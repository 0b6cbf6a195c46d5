//! What the long-running commands (`worker`, `produce`, `exporter`,
//! `console`) share: the signal handler, the metrics server with its
//! readiness check, and the ids they register under.

use std::time::Duration;

use anyhow::Context;

use crate::runtime::worker::Shutdown;

/// This host's name as ids use it: at most 40 of letters, digits, `-`,
/// `_` and `.`.
pub(super) fn host_name() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "host".into());
    host.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(40)
        .collect()
}

/// A worker's default id (`--worker-id`): this host's name and the process id.
pub(super) fn default_worker_id() -> String {
    format!("{}-{}", host_name(), std::process::id())
}

/// Serves metrics until shutdown; `/readyz` turns ready once the database
/// answers. A task runs `SELECT 1` on the command's pool every 10 s while
/// it succeeds and every second while it fails. The worker starts this
/// before [`super::schema::wait_for_schema`], so `/healthz` answers while it waits.
pub(super) fn spawn_metrics(
    addr: std::net::SocketAddr,
    pool: &sqlx::PgPool,
    signals: &Shutdown,
) -> tokio::task::JoinHandle<()> {
    let ready = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (pool, flag, stop) = (pool.clone(), ready.clone(), signals.shutdown.clone());
    tokio::spawn(async move {
        loop {
            // The simple protocol: one exchange, safe through any pooler.
            let ok = sqlx::raw_sql("SELECT 1").execute(&pool).await.is_ok();
            flag.store(ok, std::sync::atomic::Ordering::Relaxed);
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(if ok { 10 } else { 1 })) => {}
                _ = stop.cancelled() => return,
            }
        }
    });
    tokio::spawn(crate::telemetry::serve(
        addr,
        ready,
        signals.shutdown.clone(),
    ))
}

/// SIGTERM/SIGINT start a graceful shutdown; a second one logs `second
/// signal: exiting now; …` and exits at once, with status 128 + the
/// signal's number, without releasing anything: whoever signals twice wants
/// the process gone, and the leases expire and are recovered as after a
/// crash.
pub(super) fn spawn_signal_handler(signals: Shutdown) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    tokio::spawn(async move {
        for n in 0..2 {
            let signo = tokio::select! {
                _ = term.recv() => 15,
                _ = int.recv() => 2,
            };
            if n == 0 {
                tracing::info!("signal received: graceful shutdown (send again to exit at once)");
                signals.shutdown.cancel();
            } else {
                // Whatever the shutdown is waiting for (a handler, a lock,
                // the database), the person who asked twice gets their
                // process back. Nothing is released: the database ends the
                // sessions as their sockets close, and the leases expire
                // and are recovered like a crashed worker's.
                tracing::warn!(
                    exit_status = 128 + signo,
                    "second signal: exiting now; leases still held are not released, they expire and are recovered"
                );
                std::process::exit(128 + signo);
            }
        }
    });
    Ok(())
}
