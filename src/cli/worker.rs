//! `batchonce worker`: the connection budget (main pool, heartbeat pool,
//! LISTEN connection), the signals and metrics server, the wait for a
//! migrated schema, then `worker::run` until SIGTERM/SIGINT.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;

use super::process::{default_worker_id, spawn_metrics, spawn_signal_handler};
use super::schema::wait_for_schema;
use super::{require_url, served_jobs, validate_worker_id, Cli, WorkerArgs};
use crate::config::Config;
use crate::db;
use crate::runtime::job::Registry;
use crate::runtime::worker::{self, Shutdown, WorkerOptions};

/// `worker`: runs the jobs it serves (`--jobs`, default every declared one)
/// until a signal, then returns once the worker has shut down.
pub(super) async fn worker(
    cli: &Cli,
    registry: Registry,
    config: Config,
    args: &WorkerArgs,
) -> anyhow::Result<ExitCode> {
    let WorkerArgs {
        concurrency,
        prefetch,
        worker_id,
        grace,
        poll_interval,
        no_listen,
        listen_url,
        metrics_addr,
        max_connections,
        jobs,
    } = args;
    let url = require_url(cli)?;
    let worker_id = match worker_id {
        Some(id) => validate_worker_id(id)?,
        None => default_worker_id(),
    };
    let registry = served_jobs(registry, jobs, &config)?;
    // Handlers and claims share the main pool; heartbeats get their own.
    let max_ttl = config
        .jobs
        .values()
        .map(|c| c.lease_ttl)
        .max()
        .unwrap_or(Duration::from_secs(30));
    let idle_tx = (max_ttl * 2).max(Duration::from_secs(10));
    let size = max_connections.unwrap_or(concurrency + 3);
    let listen = !no_listen;
    if listen && listen_url.is_none() && cli.pgbouncer {
        bail!("--pgbouncer: PgBouncer in transaction mode cannot hold a LISTEN session; give --listen-url with a direct URL to PostgreSQL, or --no-listen to poll");
    }
    if size < 2 && listen && listen_url.is_none() {
        bail!("--max-connections 1 leaves no connection for claims once LISTEN holds one: give at least 2, add --listen-url, or add --no-listen");
    }
    let pool = db::connect_worker(url, &worker_id, size, idle_tx)?;
    let heartbeat_pool = db::connect_worker(url, &worker_id, 1, idle_tx)?;
    // The LISTEN session never goes through a pooler: its own
    // connection, outside the pool's budget.
    let listen_pool = match listen_url {
        Some(u) if listen => Some(db::connect_direct_lazy(u, &worker_id, 1)?),
        _ => None,
    };
    tracing::info!(
        pool = size,
        heartbeat = 1,
        listen = u8::from(listen_pool.is_some()),
        max_connections = size + 1 + u32::from(listen_pool.is_some()),
        pgbouncer = cli.pgbouncer,
        "connection budget"
    );
    let signals = Shutdown::default();
    spawn_signal_handler(signals.clone())?;
    let server = spawn_metrics(*metrics_addr, &pool, &signals);
    if !wait_for_schema(&pool, &registry, &signals).await? {
        let _ = server.await;
        return Ok(ExitCode::SUCCESS);
    }
    let mut opts = WorkerOptions::new(worker_id);
    opts.concurrency = *concurrency;
    opts.prefetch = *prefetch;
    opts.grace = *grace;
    opts.poll_interval = *poll_interval;
    opts.listen = listen;
    opts.listen_pool = listen_pool;
    worker::run(
        registry,
        config,
        pool,
        heartbeat_pool,
        opts,
        signals.clone(),
    )
    .await;
    // The worker returns only after a shutdown signal; stop serving too.
    signals.shutdown.cancel();
    let _ = server.await;
    Ok(ExitCode::SUCCESS)
}
