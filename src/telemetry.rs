//! Metrics: the one place every metric is named and described (the list is
//! mirrored in docs/metrics.md and checked against the dashboards by a test),
//! the Prometheus recorder, and the HTTP endpoint (`/metrics`, `/healthz`,
//! `/readyz`) that `worker`, `produce` and `exporter` serve. Names carry the
//! `batchonce_` prefix and base units; labels are only `job`, `status` and
//! `outcome`, never a job key, a date or error text.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub const RUNS_ENQUEUED: &str = "batchonce_runs_enqueued_total";
pub const RUNS_DEDUPLICATED: &str = "batchonce_runs_deduplicated_total";
pub const ATTEMPTS: &str = "batchonce_attempts_total";
pub const RUN_DURATION: &str = "batchonce_run_duration_seconds";
pub const ITEMS_PROCESSED: &str = "batchonce_items_processed_total";
pub const ITEMS_FAILED: &str = "batchonce_items_failed_total";
pub const HEARTBEATS: &str = "batchonce_heartbeats_total";
pub const HEARTBEAT_FAILURES: &str = "batchonce_heartbeat_failures_total";
pub const LEASES_LOST: &str = "batchonce_leases_lost_total";
pub const LEASES_RECOVERED: &str = "batchonce_leases_recovered_total";
pub const PRODUCER_TICKS: &str = "batchonce_producer_ticks_total";
pub const PRODUCER_LAST_TICK: &str = "batchonce_producer_last_tick_timestamp_seconds";
pub const RUNS: &str = "batchonce_runs";
pub const OLDEST_PENDING_AGE: &str = "batchonce_oldest_pending_age_seconds";
pub const STALE_RUNS: &str = "batchonce_stale_runs";
pub const LAST_SUCCESS: &str = "batchonce_last_success_timestamp_seconds";
pub const CURRENT_ATTEMPTS: &str = "batchonce_current_run_attempts";
pub const EXPIRED_LEASES: &str = "batchonce_expired_leases";
pub const EXPORTER_LAST_SCRAPE: &str = "batchonce_exporter_last_success_timestamp_seconds";
pub const CONFIG_FINGERPRINTS: &str = "batchonce_config_fingerprints";

/// Every metric this code exports, for the dashboard test.
pub const ALL: &[&str] = &[
    RUNS_ENQUEUED,
    RUNS_DEDUPLICATED,
    ATTEMPTS,
    RUN_DURATION,
    ITEMS_PROCESSED,
    ITEMS_FAILED,
    HEARTBEATS,
    HEARTBEAT_FAILURES,
    LEASES_LOST,
    LEASES_RECOVERED,
    PRODUCER_TICKS,
    PRODUCER_LAST_TICK,
    RUNS,
    OLDEST_PENDING_AGE,
    STALE_RUNS,
    LAST_SUCCESS,
    CURRENT_ATTEMPTS,
    EXPIRED_LEASES,
    EXPORTER_LAST_SCRAPE,
    CONFIG_FINGERPRINTS,
];

fn describe() {
    describe_counter!(
        RUNS_ENQUEUED,
        Unit::Count,
        "Runs inserted by enqueue or the producer (job)."
    );
    describe_counter!(
        RUNS_DEDUPLICATED,
        Unit::Count,
        "Enqueues of keys that already existed: no-ops (job)."
    );
    describe_counter!(ATTEMPTS, Unit::Count, "Attempts ended, by outcome: succeeded, failed, retried, skipped, lease_lost, fatal, released (job, outcome).");
    describe_histogram!(
        RUN_DURATION,
        Unit::Seconds,
        "Wall time of one attempt, claim to finish (job, outcome)."
    );
    describe_counter!(
        ITEMS_PROCESSED,
        Unit::Count,
        "Items committed by fenced transactions (job)."
    );
    describe_counter!(
        ITEMS_FAILED,
        Unit::Count,
        "Items counted as failed by fenced transactions (job)."
    );
    describe_counter!(
        HEARTBEATS,
        Unit::Count,
        "Heartbeat statements that succeeded."
    );
    describe_counter!(
        HEARTBEAT_FAILURES,
        Unit::Count,
        "Heartbeat statements that failed or timed out."
    );
    describe_counter!(
        LEASES_LOST,
        Unit::Count,
        "Leases this process lost: taken over, or not renewed within the ttl (job)."
    );
    describe_counter!(
        LEASES_RECOVERED,
        Unit::Count,
        "Expired leases this process recovered under policy retry (job)."
    );
    describe_counter!(
        PRODUCER_TICKS,
        Unit::Count,
        "Producer ticks that completed."
    );
    describe_gauge!(
        PRODUCER_LAST_TICK,
        Unit::Seconds,
        "Unix time of the last completed producer tick."
    );
    describe_gauge!(
        RUNS,
        Unit::Count,
        "Runs per job and status, from the database (job, status)."
    );
    describe_gauge!(
        OLDEST_PENDING_AGE,
        Unit::Seconds,
        "Age of the oldest due PENDING run (job); 0 when none."
    );
    describe_gauge!(
        STALE_RUNS,
        Unit::Count,
        "RUNNING runs past stale_after, or lease-expired under hold (job)."
    );
    describe_gauge!(
        LAST_SUCCESS,
        Unit::Seconds,
        "Unix time of the job's last SUCCEEDED run; 0 if never (job)."
    );
    describe_gauge!(
        CURRENT_ATTEMPTS,
        Unit::Count,
        "Most attempts among the job's PENDING and RUNNING runs (job)."
    );
    describe_gauge!(
        EXPIRED_LEASES,
        Unit::Count,
        "RUNNING runs whose lease has expired (job)."
    );
    describe_gauge!(
        CONFIG_FINGERPRINTS,
        Unit::Count,
        "Different configurations of the job among live workers and producers; above 1 they disagree (job)."
    );
    describe_gauge!(
        EXPORTER_LAST_SCRAPE,
        Unit::Seconds,
        "Unix time the exporter last read the database."
    );
}

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the Prometheus recorder once per process and describes every
/// metric. Returns `None` if another recorder was installed first.
pub fn install() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(RUN_DURATION.to_owned()),
                    &[
                        0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0,
                    ],
                )
                .ok()?;
            let handle = builder.install_recorder().ok()?;
            describe();
            Some(handle)
        })
        .clone()
}

/// Serves `/metrics`, `/healthz` (the process is up) and `/readyz` (it has
/// reached the database) until `stop`. A port already in use is logged and
/// skipped: the batch work matters more than its metrics.
pub async fn serve(addr: SocketAddr, ready: Arc<AtomicBool>, stop: CancellationToken) {
    let Some(handle) = install() else {
        warn!("metrics recorder unavailable; not serving metrics");
        return;
    };
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            warn!(%addr, error = %e, "cannot serve metrics; continuing without them");
            return;
        }
    };
    // With port 0 the system picks one: log the address actually bound.
    let bound = listener.local_addr().unwrap_or(addr);
    info!(addr = %bound, "serving /metrics, /healthz and /readyz");
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || std::future::ready(handle.render())),
        )
        .route(
            "/healthz",
            axum::routing::get(|| std::future::ready("ok\n")),
        )
        .route(
            "/readyz",
            axum::routing::get(move || {
                let ok = ready.load(Ordering::Relaxed);
                std::future::ready(if ok {
                    (axum::http::StatusCode::OK, "ready\n")
                } else {
                    (
                        axum::http::StatusCode::SERVICE_UNAVAILABLE,
                        "database not reached yet\n",
                    )
                })
            }),
        );
    let _ = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await;
}
