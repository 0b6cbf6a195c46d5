//! Metrics: the one place every metric is named and described (the list is
//! mirrored in docs/metrics.md and checked against the dashboards by a test),
//! the Prometheus recorder, and the HTTP endpoint (`/metrics`, `/healthz`,
//! `/readyz`) that `worker`, `produce` and `exporter` serve. Names carry the
//! `batchonce_` prefix and base units; labels are only `job`, `status` and
//! `outcome` (and `version`, `commit` on `batchonce_build_info`), never a
//! job key, a date or error text. Each process creates its counters at zero
//! for every job it serves and every outcome when it starts ([`serve_jobs`]),
//! so the first event of a process's life is an increase that `increase()`
//! sees, rather than a series that appears already at 1.
//!
//! Metrics, in four parts.
//!
//! - The names. Every metric is a `pub const` here (`RUNS_ENQUEUED` is
//!   `batchonce_runs_enqueued_total`, and so on), listed in `ALL` and described once, with its
//!   unit, in `describe()`. Names carry the `batchonce_` prefix and base units (`_seconds`,
//!   `_total`). The same list, with types, labels and meanings, is docs/metrics.md;
//!   `workers/tests/observability.rs` checks that every name in `ALL` has exactly one row there and
//!   that the alert rules and the dashboard use only names in `ALL` (and the histogram's `_bucket`,
//!   `_sum` and `_count`).
//! - The recorder. `install()` installs the `metrics-exporter-prometheus` recorder once per process
//!   (a `OnceLock`), with buckets of 0.5 s to 2 h for `batchonce_run_duration_seconds`, and
//!   describes every metric. It returns `None` if another recorder was installed first. Until it
//!   runs, the `metrics::counter!`, `gauge!` and `histogram!` calls elsewhere do nothing, which is
//!   why the short commands (`enqueue`, `produce --once`, `demo`, …) export nothing.
//! - The zeros. `serve_jobs(role, jobs)` installs the recorder and creates, at zero, every counter
//!   a worker (each `outcome` of `batchonce_attempts_total`, lost and recovered leases, items,
//!   heartbeats) or a producer (runs enqueued and deduplicated, ticks) increments, for each job it
//!   serves, before the first claim or tick: `increase()` cannot see the first event of a series
//!   that appears already at 1. `install()` also sets `batchonce_build_info{version, commit}` to 1
//!   (`commit` from `build.rs`: `BATCHONCE_GIT_COMMIT` at build time, else `git rev-parse`, else
//!   `unknown`).
//! - The endpoint. `serve(addr, ready, stop)` installs the recorder and serves, with axum,
//!   `/metrics` (the recorder's rendering), `/healthz` (`200 ok`) and `/readyz` (`200 ready` while
//!   the `ready` flag is set, `503 database not reached yet` otherwise) until `stop`. If it cannot
//!   bind `addr`, it logs `cannot serve metrics; continuing without them` and returns: the batch
//!   work matters more than its metrics, so a busy port never stops a worker or a producer.

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
pub const PARTITIONS: &str = "batchonce_partitions";
pub const SCOPES: &str = "batchonce_scopes";
pub const SCOPES_PERIOD: &str = "batchonce_scopes_period_start_timestamp_seconds";
pub const OLDEST_PENDING_AGE: &str = "batchonce_oldest_pending_age_seconds";
pub const STALE_RUNS: &str = "batchonce_stale_runs";
pub const LAST_SUCCESS: &str = "batchonce_last_success_timestamp_seconds";
pub const CURRENT_ATTEMPTS: &str = "batchonce_current_run_attempts";
pub const EXPIRED_LEASES: &str = "batchonce_expired_leases";
pub const EXPORTER_LAST_SCRAPE: &str = "batchonce_exporter_last_success_timestamp_seconds";
pub const CONFIG_FINGERPRINTS: &str = "batchonce_config_fingerprints";
pub const REGISTRY_ROWS_LEFT_OUT: &str = "batchonce_registry_rows_left_out";
pub const NEWEST_FAILURE: &str = "batchonce_newest_failure_timestamp_seconds";
pub const LAST_DONE_PERIOD: &str = "batchonce_last_done_period_start_timestamp_seconds";
pub const DUE_PERIOD: &str = "batchonce_due_period_start_timestamp_seconds";
pub const BUILD_INFO: &str = "batchonce_build_info";
pub const JOB_PAUSED: &str = "batchonce_job_paused";
pub const JOB_PAUSED_SECONDS: &str = "batchonce_job_paused_seconds";

/// Every `outcome` label of [`ATTEMPTS`] and [`RUN_DURATION`].
pub const OUTCOMES: &[&str] = &[
    "succeeded",
    "failed",
    "retried",
    "skipped",
    "lease_lost",
    "fatal",
    "released",
];

/// The commit this binary was built from (build.rs), or `unknown`.
pub const GIT_COMMIT: &str = match option_env!("BATCHONCE_GIT_COMMIT") {
    Some(c) => c,
    None => "unknown",
};

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
    PARTITIONS,
    SCOPES,
    SCOPES_PERIOD,
    OLDEST_PENDING_AGE,
    STALE_RUNS,
    LAST_SUCCESS,
    CURRENT_ATTEMPTS,
    EXPIRED_LEASES,
    EXPORTER_LAST_SCRAPE,
    CONFIG_FINGERPRINTS,
    REGISTRY_ROWS_LEFT_OUT,
    NEWEST_FAILURE,
    LAST_DONE_PERIOD,
    DUE_PERIOD,
    BUILD_INFO,
    JOB_PAUSED,
    JOB_PAUSED_SECONDS,
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
        "Runs per job and status, from the database (job, status); a partitioned run counts once."
    );
    describe_gauge!(
        PARTITIONS,
        Unit::Count,
        "Partitions of partitioned runs per job and status (job, status)."
    );
    describe_gauge!(
        SCOPES,
        Unit::Count,
        "Scoped runs of the job's newest scoped period per status (job, status)."
    );
    describe_gauge!(
        SCOPES_PERIOD,
        Unit::Seconds,
        "Start of the period batchonce_scopes counts, as Unix time (job)."
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
        "Unix time the job's newest SUCCEEDED run finished; absent if none ever did (job)."
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
        REGISTRY_ROWS_LEFT_OUT,
        Unit::Count,
        "Registry rows (batch_worker, batch_process_config) no view believes, left out of every view; the exporter logs each."
    );
    describe_gauge!(
        NEWEST_FAILURE,
        Unit::Seconds,
        "Unix time the newest of the job's runs FAILED now failed; 0 when none is FAILED (job)."
    );
    describe_gauge!(
        LAST_DONE_PERIOD,
        Unit::Seconds,
        "Unix time the newest period of the job done (SUCCEEDED or SKIPPED) starts (job)."
    );
    describe_gauge!(
        DUE_PERIOD,
        Unit::Seconds,
        "Unix time the latest period of the job's schedule that is due starts (job)."
    );
    describe_gauge!(
        JOB_PAUSED,
        Unit::Count,
        "1 while the job is paused (batchonce jobs pause): its runs are not claimed; 0 otherwise (job)."
    );
    describe_gauge!(
        JOB_PAUSED_SECONDS,
        Unit::Seconds,
        "How long the job has been paused, by the database clock; 0 while it is not (job)."
    );
    describe_gauge!(
        BUILD_INFO,
        Unit::Count,
        "Always 1; the labels name this process's release (version, commit)."
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
            metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION"), "commit" => GIT_COMMIT)
                .set(1.0);
            Some(handle)
        })
        .clone()
}

/// The roles whose counters [`serve_jobs`] creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Worker,
    Producer,
}

/// Installs the recorder and creates, at zero, every counter a process of
/// `role` increments for each job in `jobs` (each outcome of an attempt,
/// lost and recovered leases, items; runs enqueued), so that the first
/// lease loss or retry of the process's life moves a series Prometheus has
/// already seen at 0 and alerts built on `increase()` fire on it.
pub fn serve_jobs<'a>(role: Role, jobs: impl IntoIterator<Item = &'a crate::key::JobName>) {
    if install().is_none() {
        return;
    }
    match role {
        Role::Worker => {
            metrics::counter!(HEARTBEATS).increment(0);
            metrics::counter!(HEARTBEAT_FAILURES).increment(0);
        }
        Role::Producer => metrics::counter!(PRODUCER_TICKS).increment(0),
    }
    for job in jobs {
        let job = job.to_string();
        match role {
            Role::Worker => {
                for outcome in OUTCOMES {
                    metrics::counter!(ATTEMPTS, "job" => job.clone(), "outcome" => *outcome)
                        .increment(0);
                }
                for name in [LEASES_LOST, LEASES_RECOVERED, ITEMS_PROCESSED, ITEMS_FAILED] {
                    metrics::counter!(name, "job" => job.clone()).increment(0);
                }
            }
            Role::Producer => {
                for name in [RUNS_ENQUEUED, RUNS_DEDUPLICATED] {
                    metrics::counter!(name, "job" => job.clone()).increment(0);
                }
            }
        }
    }
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
