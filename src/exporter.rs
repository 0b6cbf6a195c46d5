//! `batchonce exporter`: publishes the database-derived gauges (runs per job
//! and status, oldest pending age, stale runs, last success, attempts of the
//! current run, expired leases, configurations among live processes) from
//! one process, so they are exported once rather than by every worker.
//! Database errors are logged and retried.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::clock::Clock;
use crate::config::Config;
use crate::queue::{self, StaleSpec};
use crate::telemetry;

/// Reads the gauges once and publishes them.
pub async fn publish_once(pool: &PgPool, config: &Config) -> Result<(), queue::QueueError> {
    let specs = StaleSpec::from_config(config);
    for (job, g) in queue::gauges(pool, &specs, Clock::Db).await? {
        let job = job.to_string();
        for (status, n) in &g.runs {
            metrics::gauge!(telemetry::RUNS, "job" => job.clone(), "status" => status.clone())
                .set(*n as f64);
        }
        metrics::gauge!(telemetry::OLDEST_PENDING_AGE, "job" => job.clone())
            .set(g.oldest_pending_seconds);
        metrics::gauge!(telemetry::STALE_RUNS, "job" => job.clone()).set(g.stale as f64);
        metrics::gauge!(telemetry::LAST_SUCCESS, "job" => job.clone()).set(g.last_success_unix);
        metrics::gauge!(telemetry::CURRENT_ATTEMPTS, "job" => job.clone())
            .set(g.current_attempts as f64);
        metrics::gauge!(telemetry::EXPIRED_LEASES, "job" => job).set(g.expired_leases as f64);
    }
    for (job, n) in crate::worker_registry::fingerprint_counts(pool).await? {
        metrics::gauge!(telemetry::CONFIG_FINGERPRINTS, "job" => job).set(n as f64);
    }
    metrics::gauge!(telemetry::EXPORTER_LAST_SCRAPE)
        .set(chrono::Utc::now().timestamp_millis() as f64 / 1000.0);
    Ok(())
}

/// Publishes every `interval` until `stop`.
pub async fn run(pool: PgPool, config: Config, interval: Duration, stop: CancellationToken) {
    loop {
        if let Err(e) = publish_once(&pool, &config).await {
            warn!(error = %e, "exporter could not read the database; retrying");
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.cancelled() => return,
        }
    }
}
