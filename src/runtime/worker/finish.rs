//! Finishing attempts: the completer that batches finishes into one
//! `queue::finish_many` statement, the retries of a finish that met a
//! transient error, and the release of a run on shutdown or abort.
//!
//! The completer (`completer_loop`) that writes finishes: `execute` hands it a `FinishRequest` and
//! waits for the reply; the completer takes the first request, every other one already waiting
//! (yielding up to four times while more arrive) and ends them all with one `queue::finish_many`.
//! Nothing waits on a timer, so an idle worker finishes a run as soon as its handler returns and
//! a busy one commits once per batch. A failed statement is reported to every caller in the batch
//! (`QueueError::Unavailable` when it was transient), and each retries as before. It stops only
//! after the last run task has ended.

use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::loops::Backoff;
use super::{lease_lost, outcome_name, FinishRequest, Shared, ABANDONED_RELEASE_LOCK_TIMEOUT};
use crate::clock::Clock;
use crate::queue::{self, AttemptCounts, Finish, Lease, QueueError};
use crate::telemetry;

pub(super) async fn finish_with_retries(
    shared: &Shared,
    lease: &Lease,
    finish: &Finish,
    counts: AttemptCounts,
    lost: &CancellationToken,
    elapsed_ms: u64,
) -> Option<queue::RunStatus> {
    // Formatted only if the event is logged: a drain finishes thousands of
    // runs a second.
    let started_at = chrono::Utc::now() - chrono::Duration::milliseconds(elapsed_ms as i64);
    let mut backoff = Backoff::new();
    loop {
        match submit_finish(shared, lease, finish).await {
            Ok(queue::Finished {
                status,
                lease_expired,
            }) => {
                if lease_expired {
                    lease_lost(lease, "the lease expired before the attempt finished");
                }
                let error = match finish {
                    Finish::Retry { error, .. } | Finish::Fatal { error } => Some(error.as_str()),
                    Finish::Skipped { reason } => Some(reason.as_str()),
                    _ => None,
                };
                info!(
                    job_key = %lease.key, business_date = %lease.business_date,
                    attempt = lease.attempt, worker_id = %shared.opts.worker_id,
                    processed = counts.processed,
                    failed = counts.failed, elapsed_ms, started_at = %started_at.to_rfc3339(),
                    finished_at = %chrono::Utc::now().to_rfc3339(), status = %status,
                    outcome = outcome_name(finish, status), error, "run finished"
                );
                return Some(status);
            }
            Err(QueueError::LeaseLost(_)) => {
                lease_lost(lease, "finish refused; the run belongs to someone else now");
                metrics::counter!(telemetry::ATTEMPTS, "job" => lease.job.to_string(), "outcome" => "lease_lost")
                    .increment(1);
                return None;
            }
            Err(e) if e.is_transient() && !lost.is_cancelled() => {
                let delay = backoff.next();
                warn!(job_key = %lease.key, error = %e, retry_in_ms = delay.as_millis() as u64,
                      "finish failed; retrying while the lease lasts");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = lost.cancelled() => {}
                }
            }
            Err(e) => {
                error!(job_key = %lease.key, error = %e,
                       "finish failed; the lease will expire and the run be recovered");
                return None;
            }
        }
    }
}

/// Releases the run for any worker, up to three tries. The attempt counts
/// as `released` only once its release statement has succeeded; a release
/// refused for a lost lease, or failed three times, counts none. After an
/// abort it bypasses the completer and calls `queue::finish_many_within`
/// ([`release_now`]).
pub(super) async fn release(shared: &Shared, lease: &Lease, counts: AttemptCounts) {
    // After an abort the process is about to exit: the release must not
    // wait for a lock it cannot end (a command job's program's session), so
    // it goes straight to the database with a lock timeout, not through the
    // completer.
    let aborted = shared.signals.abort.is_cancelled();
    for attempt in 0..3 {
        let result = if aborted {
            release_now(shared, lease).await
        } else {
            submit_finish(shared, lease, &Finish::Release).await
        };
        match result {
            Ok(f) => {
                if f.lease_expired {
                    lease_lost(lease, "the lease expired before the attempt was released");
                }
                metrics::counter!(telemetry::ATTEMPTS, "job" => lease.job.to_string(), "outcome" => "released")
                    .increment(1);
                info!(job_key = %lease.key, attempt = lease.attempt, processed = counts.processed,
                      outcome = "released", "lease released for another worker");
                return;
            }
            Err(QueueError::LeaseLost(_)) => {
                lease_lost(
                    lease,
                    "release refused; the run belongs to someone else now",
                );
                return;
            }
            Err(e) => {
                warn!(job_key = %lease.key, error = %e, try_no = attempt + 1, "release failed");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    warn!(job_key = %lease.key, "could not release the lease; it will expire and be recovered");
}

/// A release in its own statement, waiting at most
/// [`ABANDONED_RELEASE_LOCK_TIMEOUT`] for the run's row.
pub(super) async fn release_now(
    shared: &Shared,
    lease: &Lease,
) -> Result<queue::Finished, QueueError> {
    let items = [(lease.fence(), Finish::Release)];
    match queue::finish_many_within(
        &shared.pool,
        &items,
        shared.clock,
        Some(ABANDONED_RELEASE_LOCK_TIMEOUT),
    )
    .await?
    .as_slice()
    {
        [Some(f)] => Ok(*f),
        _ => Err(QueueError::LeaseLost(lease.key.to_string())),
    }
}

/// Hands a finish to the completer and waits for its result.
pub(super) async fn submit_finish(
    shared: &Shared,
    lease: &Lease,
    finish: &Finish,
) -> Result<queue::Finished, QueueError> {
    let (reply, result) = oneshot::channel();
    let request = FinishRequest {
        fence: lease.fence(),
        finish: finish.clone(),
        reply,
    };
    if shared.finishes.send(request).is_err() {
        // Unreachable while run tasks exist; the direct statement is the same
        // write, so fall back to it rather than lose the finish.
        return finish_direct(shared, lease, finish).await;
    }
    match result.await {
        Ok(r) => r,
        Err(_) => finish_direct(shared, lease, finish).await,
    }
}

pub(super) async fn finish_direct(
    shared: &Shared,
    lease: &Lease,
    finish: &Finish,
) -> Result<queue::Finished, QueueError> {
    let items = [(lease.fence(), finish.clone())];
    match queue::finish_many_detailed(&shared.pool, &items, shared.clock).await? {
        v if v.len() == 1 => v[0].ok_or_else(|| QueueError::LeaseLost(lease.key.to_string())),
        _ => Err(QueueError::LeaseLost(lease.key.to_string())),
    }
}

/// Writes finishes in batches: it waits for one, takes every other finish
/// already waiting (up to [`queue::MAX_FINISH_BATCH`]) and ends them all in
/// one statement and one commit. Nothing waits on purpose: while one batch is
/// being written the next one gathers, so a busy worker commits once per
/// batch and an idle one finishes a run as soon as its handler returns. A
/// failed statement is reported to every caller, which retries as before.
pub(super) async fn completer_loop(
    pool: PgPool,
    mut rx: mpsc::UnboundedReceiver<FinishRequest>,
    clock: Clock,
    stopped: CancellationToken,
) {
    let mut batch = Vec::new();
    loop {
        let first = tokio::select! {
            r = rx.recv() => r,
            _ = stopped.cancelled() => None,
        };
        let Some(first) = first else { return };
        batch.push(first);
        // Let the run tasks that are ready hand in their finishes too: one
        // reply wakes many tasks at once, and without this the next batch
        // would start with whichever of them happened to run first.
        for _ in 0..4 {
            let before = batch.len();
            while batch.len() < queue::MAX_FINISH_BATCH {
                match rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            if batch.len() == before || batch.len() >= queue::MAX_FINISH_BATCH {
                break;
            }
            tokio::task::yield_now().await;
        }
        let items: Vec<(queue::Fence, Finish)> = batch
            .iter()
            .map(|r| (r.fence.clone(), r.finish.clone()))
            .collect();
        match queue::finish_many_detailed(&pool, &items, clock).await {
            Ok(statuses) => {
                for (request, status) in batch.drain(..).zip(statuses) {
                    let result =
                        status.ok_or_else(|| QueueError::LeaseLost(request.fence.key.to_string()));
                    // A caller that stopped waiting has nothing left to do.
                    let _ = request.reply.send(result);
                }
            }
            Err(e) => {
                let transient = e.is_transient();
                let message = e.to_string();
                for request in batch.drain(..) {
                    let error = if transient {
                        QueueError::Unavailable(message.clone())
                    } else {
                        QueueError::Invalid(message.clone())
                    };
                    let _ = request.reply.send(Err(error));
                }
            }
        }
    }
}
