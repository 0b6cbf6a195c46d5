//! `batchonce produce`: one tick with `--once` (for a timer), or the
//! producer loop with its signals and metrics server until SIGTERM.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use super::process::{default_worker_id, host_name, spawn_metrics, spawn_signal_handler};
use super::{require_url, Cli};
use crate::clock::Clock;
use crate::config::Config;
use crate::db;
use crate::runtime::producer;
use crate::runtime::worker::Shutdown;

/// `produce`: one tick (`--once`) or the loop, on the database clock or on
/// `--now`.
pub(super) async fn produce(
    cli: &Cli,
    config: Config,
    once: bool,
    interval: Option<Duration>,
    now: Option<chrono::DateTime<chrono::Utc>>,
    metrics_addr: std::net::SocketAddr,
) -> anyhow::Result<ExitCode> {
    let clock = now.map(Clock::At).unwrap_or(Clock::Db);
    if once {
        return produce_once(cli, &config, clock, interval).await;
    }
    let url = require_url(cli)?;
    let pool = db::connect_lazy(url, "batchonce-producer", 2)?;
    let signals = Shutdown::default();
    spawn_signal_handler(signals.clone())?;
    let server = spawn_metrics(metrics_addr, &pool, &signals);
    tracing::info!(
        interval_ms = interval.unwrap_or(producer::DEFAULT_INTERVAL).as_millis() as u64,
        "producer started"
    );
    let id = format!("producer-{}", default_worker_id());
    let interval = interval.unwrap_or(producer::DEFAULT_INTERVAL);
    producer::run(pool, config, clock, interval, id, signals.shutdown.clone()).await;
    let _ = server.await;
    tracing::info!("producer stopped");
    Ok(ExitCode::SUCCESS)
}

/// `produce --once`: one tick, the producer registered as live for three
/// of its timer's periods, and what each job enqueued.
async fn produce_once(
    cli: &Cli,
    config: &Config,
    clock: Clock,
    interval: Option<Duration>,
) -> anyhow::Result<ExitCode> {
    let url = require_url(cli)?;
    let pool = db::connect(url, "batchonce-producer", 2).await?;
    // One row per host for producers run by a timer, however
    // many times they run.
    let id = format!("producer-once-{}", host_name());
    let report = producer::tick(&pool, config, clock)
        .await
        .context("producer tick failed")?;
    // Registered once it has ticked, as live as three of its
    // timer's periods (`--interval`), so the console tells
    // when the timer stopped firing.
    producer::register(
        &pool,
        config,
        &id,
        producer::once_live_for(config, interval),
    )
    .await;
    producer::log_tick(&report);
    if cli.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        for t in &report {
            for k in &t.enqueued {
                println!("enqueued {k}");
            }
            for k in &t.skipped {
                println!("skipped {k}");
            }
            println!(
                "{}: {} enqueued, {} skipped, {} duplicate{}",
                t.job,
                t.enqueued.len(),
                t.skipped.len(),
                t.duplicates,
                if t.truncated {
                    " (window truncated: shorten catch_up)"
                } else {
                    ""
                }
            );
        }
        if report.is_empty() {
            println!("no enabled job has a schedule");
        }
    }
    Ok(ExitCode::SUCCESS)
}
