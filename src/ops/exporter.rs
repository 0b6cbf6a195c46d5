//! `batchonce exporter`: publishes the database-derived gauges (runs per job
//! and status, oldest pending age, stale runs, last success, newest failure,
//! newest period done, attempts of the current run, expired leases, paused
//! jobs, configurations among live processes) from one process, so they are
//! exported once rather than by every worker. It reports every job the
//! database knows (each job with runs, each job a process registered), not
//! only those of its own file, and judges each run by the policies the run
//! stores: an exporter started anywhere, with any file or none, publishes
//! the same numbers as `status` and `runs stale`. Database errors are
//! logged and retried.
//!
//! `batchonce exporter`. `publish_once` reads `queue::gauges` on the database clock for every job
//! the database knows (each job with runs, each job a process registered, plus zeros for the jobs
//! of the exporter's own file without runs), judging runs by their stored policies, never by the
//! file, and sets `batchonce_runs` (labels `job`, `status`; a partitioned run counts once),
//! `batchonce_partitions` (the same labels, for jobs with partitioned runs), `batchonce_scopes`
//! (the same labels: the scoped runs of the job's newest scoped period, for jobs with scoped runs;
//! five series per job whatever the number of scopes) with
//! `batchonce_scopes_period_start_timestamp_seconds` (label `job`: which period that is),
//! `batchonce_oldest_pending_age_seconds`, `batchonce_stale_runs`,
//! `batchonce_last_success_timestamp_seconds` (only for a job that has succeeded: never 0),
//! `batchonce_newest_failure_timestamp_seconds` (the label `BatchonceRunFailed` carries, so a
//! second FAILED key notifies again), `batchonce_last_done_period_start_timestamp_seconds` (what
//! `BatchonceRunMissed` compares with the producers'
//! `batchonce_due_period_start_timestamp_seconds`), `batchonce_current_run_attempts`,
//! `batchonce_expired_leases`, `batchonce_job_paused` (1 while the job is paused, else 0) and
//! `batchonce_job_paused_seconds` (how long; 0 while not paused) (label `job`; a paused job is
//! reported even without runs), `batchonce_config_fingerprints` (label `job`, from
//! `worker_registry::fingerprint_counts`), `batchonce_registry_rows_left_out` (the registry rows
//! `queue::registry_problems` faults, each also logged with its process id escaped: no view
//! believes them, and none is taken down by one), and then
//! `batchonce_exporter_last_success_timestamp_seconds`, which therefore advances only after a
//! successful read. `run` publishes every `--interval` (default 15 s) until its cancellation token
//! fires. A database error is logged (`exporter could not read the database; retrying`) and tried
//! again at the next interval; it never ends the process.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::clock::Clock;
use crate::config::Config;
use crate::key::JobName;
use crate::queue;
use crate::telemetry;

/// Reads the gauges once and publishes them. `also` names jobs to publish
/// zeros for while they have no runs yet (the exporter's own file).
pub async fn publish_once(pool: &PgPool, also: &[JobName]) -> Result<(), queue::QueueError> {
    for (job, g) in queue::gauges(pool, also, Clock::Db).await? {
        let job = job.to_string();
        for (status, n) in &g.runs {
            metrics::gauge!(telemetry::RUNS, "job" => job.clone(), "status" => status.as_str())
                .set(*n as f64);
        }
        // Partitions only for a job that has them: the same five statuses,
        // so the series stay bounded by jobs, not by runs or partitions.
        if g.partitions.iter().any(|(_, n)| *n > 0) {
            for (status, n) in &g.partitions {
                metrics::gauge!(telemetry::PARTITIONS, "job" => job.clone(), "status" => status.as_str())
                    .set(*n as f64);
            }
        }
        // Scopes likewise: the newest scoped period's runs per status, five
        // series per scoped job however many scopes it has; which scopes
        // are in a state is for `status` and the console to say.
        if g.scopes.iter().any(|(_, n)| *n > 0) {
            for (status, n) in &g.scopes {
                metrics::gauge!(telemetry::SCOPES, "job" => job.clone(), "status" => status.as_str())
                    .set(*n as f64);
            }
            if let Some(t) = g.scope_period_start_unix {
                metrics::gauge!(telemetry::SCOPES_PERIOD, "job" => job.clone()).set(t);
            }
        }
        metrics::gauge!(telemetry::OLDEST_PENDING_AGE, "job" => job.clone())
            .set(g.oldest_pending_seconds);
        metrics::gauge!(telemetry::STALE_RUNS, "job" => job.clone()).set(g.stale as f64);
        // A job that never succeeded has no last success: publishing 0
        // would read as "56 years ago" on a dashboard.
        if let Some(t) = g.last_success_unix {
            metrics::gauge!(telemetry::LAST_SUCCESS, "job" => job.clone()).set(t);
        }
        metrics::gauge!(telemetry::NEWEST_FAILURE, "job" => job.clone()).set(g.newest_failure_unix);
        if let Some(t) = g.last_done_period_start_unix {
            metrics::gauge!(telemetry::LAST_DONE_PERIOD, "job" => job.clone()).set(t);
        }
        metrics::gauge!(telemetry::CURRENT_ATTEMPTS, "job" => job.clone())
            .set(g.current_attempts as f64);
        metrics::gauge!(telemetry::EXPIRED_LEASES, "job" => job.clone())
            .set(g.expired_leases as f64);
        // Every job reported gets both, 0 while it is not paused, so the
        // alert on a long pause and a dashboard see a series for each.
        metrics::gauge!(telemetry::JOB_PAUSED, "job" => job.clone())
            .set(if g.paused_seconds.is_some() { 1.0 } else { 0.0 });
        metrics::gauge!(telemetry::JOB_PAUSED_SECONDS, "job" => job)
            .set(g.paused_seconds.unwrap_or(0.0));
    }
    for (job, n) in crate::runtime::worker_registry::fingerprint_counts(pool).await? {
        metrics::gauge!(telemetry::CONFIG_FINGERPRINTS, "job" => job).set(n as f64);
    }
    let (left_out, n) = queue::registry_problems(pool).await?;
    for p in &left_out {
        warn!(
            table = %p.table,
            process_id = %crate::text::escape_for_terminal(&p.process_id),
            job = %crate::text::escape_for_terminal(p.job_name.as_deref().unwrap_or("")),
            problem = %p.problem,
            "registry row left out of every view"
        );
    }
    metrics::gauge!(telemetry::REGISTRY_ROWS_LEFT_OUT).set(n as f64);
    metrics::gauge!(telemetry::EXPORTER_LAST_SCRAPE)
        .set(chrono::Utc::now().timestamp_millis() as f64 / 1000.0);
    Ok(())
}

/// Publishes every `interval` until `stop`.
pub async fn run(pool: PgPool, config: Config, interval: Duration, stop: CancellationToken) {
    telemetry::install();
    let also: Vec<JobName> = config.jobs.keys().cloned().collect();
    loop {
        if let Err(e) = publish_once(&pool, &also).await {
            warn!(error = %e, "exporter could not read the database; retrying");
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.cancelled() => return,
        }
    }
}
