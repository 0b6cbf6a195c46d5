//! The worker's service loops besides the completer: heartbeats (with
//! self-fencing), lease-expiry recovery and LISTEN for new runs.
//!
//! - a heartbeat loop on a dedicated pool, every `min(lease_ttl) / 3` but no more often than every
//!   200 ms. Each tick first refreshes the worker's `last_seen` with `worker_registry::touch`,
//!   whether or not it holds a lease, under a timeout of half a tick interval (`lease_ttl / 6`), so
//!   a hung database cannot stall the loop and keep self-fencing from running; a failure or timeout
//!   is logged (`could not refresh last_seen`, `refreshing last_seen timed out`) and the tick goes
//!   on. Then, if it holds leases, the heartbeat query runs under a timeout of a quarter of the
//!   smallest `lease_ttl` of the held runs, and a timeout counts as a failed heartbeat, so
//!   self-fencing also fires when the query hangs (a silent network partition). The sleep
//!   (`lease_ttl / 3`), the refresh (at most `lease_ttl / 6`) and the heartbeat (at most `lease_ttl
//!   / 4`) add up to less than `lease_ttl`, so even a hung database cannot stretch one tick past
//!   the lease and self-fencing is checked in time. Each heartbeat statement adds one to
//!   `batchonce_heartbeats_total` or `batchonce_heartbeat_failures_total`;
//! - a recovery loop running `recover_expired` for job kinds under policy `retry`, every
//!   `min(lease_ttl) / 2` clamped to 1–15 s, counting each recovered run in
//!   `batchonce_leases_recovered_total`, and then folding the run counts the finishes appended
//!   (`queue::fold_tally`);
//! - a LISTEN loop that reconnects with backoff, on a connection of the main pool or, with
//!   `--listen-url` (`WorkerOptions::listen_pool`), on a direct connection of its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::{live_for, lock, Shared, VERSION};
use crate::clock::Clock;
use crate::key::JobName;
use crate::queue::{self, HeldLease, QueueError};
use crate::runtime::job::LeaseRenewal;
use crate::runtime::worker_registry;
use crate::telemetry;

/// The heartbeat's period: a third of the shortest lease held (each run
/// carries its own), or of `idle_ttl` when none is held.
pub(super) fn heartbeat_every(shared: &Shared, idle_ttl: Duration) -> Duration {
    let shortest = lock(&shared.held)
        .values()
        .map(|h| h.lease_ttl)
        .min()
        .unwrap_or(idle_ttl);
    (shortest.min(idle_ttl) / 3).max(Duration::from_millis(200))
}

/// Extends every held lease in one statement on a dedicated pool. A lease
/// that could not be renewed within its ttl on this process's own monotonic
/// clock is treated as lost (self-fencing), even if the database is unreachable.
pub(super) async fn heartbeat_loop(
    shared: Arc<Shared>,
    pool: PgPool,
    idle_ttl: Duration,
    stopped: CancellationToken,
) {
    loop {
        let every = heartbeat_every(&shared, idle_ttl);
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stopped.cancelled() => return,
        }
        // Bounded like the heartbeat: a hung database must not stall the
        // loop, or self-fencing below would never run.
        // Sleep (ttl/3) + this (ttl/6) + the heartbeat (ttl/4) stay under the
        // ttl, so self-fencing fires before the lease runs out.
        match tokio::time::timeout(
            every / 2,
            worker_registry::touch(&pool, &shared.opts.worker_id, VERSION, live_for(every)),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "could not refresh last_seen"),
            Err(_) => warn!("refreshing last_seen timed out"),
        }
        let snapshot: Vec<HeldLease> = lock(&shared.held)
            .iter()
            .map(|(k, h)| HeldLease {
                fence: queue::Fence {
                    key: k.clone(),
                    token: h.token,
                },
                lease_ttl: h.lease_ttl,
            })
            .collect();
        if snapshot.is_empty() {
            continue;
        }
        // A hung query (a silent network partition) counts as a failure, so
        // self-fencing below still fires on time.
        let min_ttl = snapshot
            .iter()
            .map(|h| h.lease_ttl)
            .min()
            .unwrap_or(every * 3);
        let sent = Instant::now();
        let result = match tokio::time::timeout(
            min_ttl / 4,
            queue::heartbeat(&pool, &snapshot, shared.clock),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err(QueueError::Invalid(format!(
                "heartbeat timed out after {}ms",
                (min_ttl / 4).as_millis()
            ))),
        };
        match &result {
            Ok(_) => metrics::counter!(telemetry::HEARTBEATS).increment(1),
            Err(_) => metrics::counter!(telemetry::HEARTBEAT_FAILURES).increment(1),
        }
        let mut held = lock(&shared.held);
        match result {
            Ok(report) => {
                for k in &report.extended {
                    if let Some(h) = held.get(k) {
                        h.renewed.send_replace(LeaseRenewal {
                            sent,
                            ttl: h.lease_ttl,
                        });
                    }
                }
                for k in report.extended.iter().chain(&report.busy) {
                    if let Some(h) = held.get_mut(k) {
                        h.last_ok = Instant::now();
                    }
                }
                for k in &report.lost {
                    if let Some(h) = held.get(k) {
                        warn!(job_key = %k, attempt = h.attempt, outcome = "lease_lost",
                              "heartbeat: lease lost; cancelling the handler");
                        h.lost.cancel();
                        h.cancel.cancel();
                    }
                }
            }
            Err(e) => {
                warn!(error = %e, "heartbeat failed");
                for (k, h) in held.iter() {
                    if h.last_ok.elapsed() >= h.lease_ttl && !h.lost.is_cancelled() {
                        warn!(job_key = %k, attempt = h.attempt, outcome = "lease_lost",
                              "no heartbeat within the lease ttl; stopping the handler (self-fencing)");
                        h.lost.cancel();
                        h.cancel.cancel();
                    }
                }
            }
        }
    }
}

/// Puts runs whose lease expired back to PENDING (policy `retry`).
pub(super) async fn rescue_loop(
    pool: PgPool,
    jobs: Vec<JobName>,
    legacy_retry: Vec<JobName>,
    every: Duration,
    wake: Arc<Notify>,
    stopped: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stopped.cancelled() => return,
        }
        match queue::recover_expired(&pool, &jobs, &legacy_retry, Clock::Db).await {
            Ok(recovered) => {
                for r in &recovered {
                    metrics::counter!(telemetry::LEASES_RECOVERED, "job" => r.key.job_name().to_owned())
                        .increment(1);
                    warn!(job_key = %r.key, previous_owner = r.previous_owner.as_deref().unwrap_or("?"),
                          status = %r.status, outcome = "lease_expired",
                          "lease expired; run recovered with a new token");
                }
                if !recovered.is_empty() {
                    wake.notify_one();
                }
            }
            Err(e) => warn!(error = %e, "lease-expiry recovery failed; retrying"),
        }
        // The counts every view reads stay a few rows however many runs
        // this worker finished.
        if let Err(e) = queue::fold_tally(&pool).await {
            warn!(error = %e, "folding the run counts failed; retrying");
        }
    }
}

/// Wakes the claim loop on every enqueue notification; reconnects with backoff.
pub(super) async fn listen_loop(pool: PgPool, wake: Arc<Notify>, stopped: CancellationToken) {
    let mut backoff = Backoff::new();
    loop {
        let session = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(queue::NOTIFY_CHANNEL).await?;
            loop {
                listener.recv().await?;
                wake.notify_one();
            }
            #[allow(unreachable_code)]
            Ok::<(), sqlx::Error>(())
        };
        tokio::select! {
            r = session => if let Err(e) = r {
                warn!(error = %e, "LISTEN connection lost; polling until it is back");
            },
            _ = stopped.cancelled() => return,
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff.next()) => {}
            _ = stopped.cancelled() => return,
        }
    }
}

/// Exponential backoff for reconnects: 100ms doubling to 10s.
pub(super) struct Backoff(Duration);

impl Backoff {
    pub(super) fn new() -> Self {
        Self(Duration::from_millis(100))
    }
    pub(super) fn next(&mut self) -> Duration {
        let d = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(10));
        d
    }
    pub(super) fn reset(&mut self) {
        self.0 = Duration::from_millis(100);
    }
}
