//! The worker's local queue: runs claimed ahead of a free execution slot,
//! and the rule that keeps a worker from hoarding them.
//!
//! A claim returns leases; a run whose slot is not free yet waits here, in
//! claim order, and is started as soon as a slot is given back, without a
//! round trip. Claiming ahead makes claims larger (fewer statements and
//! commits per run) and lets the next claim overlap the runs being started
//! and finished.
//!
//! How much is claimed ahead, and for how long, is bounded three ways:
//!
//! - **Earned, not configured.** The queue may hold at most as many runs as
//!   this process started during the last [`WINDOW`] (and never more than
//!   `--prefetch`), and nothing while those starts do not outnumber its
//!   execution slots. A worker whose handlers outlast the window starts at
//!   most one run per slot in it, so its target stays at zero and it claims
//!   only for free slots, exactly as without a queue; a worker draining
//!   no-op runs earns a full queue. A run therefore waits about one window
//!   for its slot.
//! - **A deadline.** A queued run that has not started within
//!   [`max_wait`] of its claim (1 s, or a quarter of its lease if that is
//!   shorter) is released (`Finish::Release`: PENDING again at once, with a
//!   new token, its attempt row closed as `released`) for any worker,
//!   and the target drops to zero until runs start quickly again.
//! - **Nothing is heartbeated.** A queued run is not in the heartbeat set, so
//!   a process that stops while runs are queued loses them at its lease's
//!   end like any other; the deadline is a quarter of the lease at most, so a
//!   live process never starts a run whose lease it has not renewed.
//!
//! Leases held by one process: at most `concurrency` (running) +
//! `4 × concurrency` (finishing) + `--prefetch` (queued).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::loops::Backoff;
use super::Shared;
use crate::queue::{self, ClaimSpec, Finish, Lease};
use crate::telemetry;

/// How far back starts count toward the queue's target: a queued run waits
/// about this long for its slot at the rate the process has shown.
pub(super) const WINDOW: Duration = Duration::from_millis(50);

/// The longest a queued run waits for a slot, unless a quarter of its lease
/// is shorter.
pub(super) const MAX_WAIT: Duration = Duration::from_secs(1);

/// The deadline of a run claimed with a lease of `ttl`.
pub(super) fn max_wait(ttl: Duration) -> Duration {
    MAX_WAIT.min(ttl / 4)
}

/// A claimed run waiting for an execution slot.
pub(super) struct Queued {
    pub lease: Lease,
    /// When the claim statement was sent (the lease lasts from here).
    pub claim_sent: Instant,
    /// Past this instant the run is released instead of started.
    pub deadline: Instant,
}

/// The runs claimed ahead, and the starts that earn room for them.
pub(super) struct LocalQueue {
    capacity: usize,
    /// Starts within a window that earn no room: the execution slots.
    slots: usize,
    runs: VecDeque<Queued>,
    starts: VecDeque<Instant>,
    /// No queued run's deadline is earlier than this. It is a lower bound,
    /// not always the minimum (the run that held it may have started since),
    /// so the claim loop looks through the queue only once it has passed:
    /// looking on every wake-up moved every queued run for every run started.
    earliest: Option<Instant>,
}

impl LocalQueue {
    /// A queue of at most `capacity` runs for a worker with `slots`
    /// execution slots; a capacity of 0 turns claiming ahead off.
    pub(super) fn new(capacity: usize, slots: usize) -> Self {
        Self {
            capacity,
            slots,
            runs: VecDeque::new(),
            starts: VecDeque::new(),
            earliest: None,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.runs.len()
    }

    pub(super) fn push(&mut self, q: Queued) {
        self.earliest = Some(self.earliest.map_or(q.deadline, |e| e.min(q.deadline)));
        self.runs.push_back(q);
    }

    /// The oldest queued run, to be started now; its start counts toward
    /// the target.
    pub(super) fn pop(&mut self, now: Instant) -> Option<Queued> {
        let q = self.runs.pop_front()?;
        if self.runs.is_empty() {
            self.earliest = None;
        }
        self.record_start(now);
        Some(q)
    }

    /// Counts a start (also of a run that never waited in the queue).
    pub(super) fn record_start(&mut self, now: Instant) {
        self.forget_before(now);
        // Only the count within the window matters, and never more than the
        // capacity of it.
        if self.starts.len() < self.capacity + self.slots {
            self.starts.push_back(now);
        }
    }

    fn forget_before(&mut self, now: Instant) {
        while let Some(&t) = self.starts.front() {
            if now.duration_since(t) > WINDOW {
                self.starts.pop_front();
            } else {
                break;
            }
        }
    }

    /// How many runs the queue may hold now: the starts of the last window,
    /// at most the capacity, and none unless they outnumber the slots (a
    /// worker whose handlers outlast the window starts at most one run per
    /// slot in it, and claims nothing ahead).
    pub(super) fn target(&mut self, now: Instant) -> usize {
        self.forget_before(now);
        let n = self.starts.len();
        if n <= self.slots {
            0
        } else {
            n.min(self.capacity)
        }
    }

    /// Takes the queued runs whose deadline has passed, and forgets the
    /// starts that earned their room, so the queue does not refill before
    /// runs start quickly again.
    pub(super) fn take_overdue(&mut self, now: Instant) -> Vec<Queued> {
        if self.earliest.is_none_or(|e| e > now) {
            return Vec::new();
        }
        let mut overdue = Vec::new();
        let mut kept = VecDeque::with_capacity(self.runs.len());
        for q in self.runs.drain(..) {
            if q.deadline <= now {
                overdue.push(q);
            } else {
                kept.push_back(q);
            }
        }
        self.runs = kept;
        self.earliest = self.runs.iter().map(|q| q.deadline).min();
        if !overdue.is_empty() {
            self.starts.clear();
        }
        overdue
    }

    /// Every queued run (at shutdown, to be released).
    pub(super) fn take_all(&mut self) -> Vec<Queued> {
        self.earliest = None;
        self.runs.drain(..).collect()
    }

    /// When to look for overdue runs next: no queued run's deadline is
    /// earlier (see `earliest`).
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.earliest
    }
}

/// Puts claimed leases in the local queue, each with its deadline.
pub(super) fn queue_claimed(
    local: &mut LocalQueue,
    specs: &[ClaimSpec],
    leases: Vec<Lease>,
    sent: Instant,
) {
    for lease in leases {
        // The run's own lease length; the worker's file only for a run
        // enqueued without a context.
        let ttl = lease
            .context
            .as_ref()
            .map(|c| c.lease_ttl)
            .or_else(|| {
                specs
                    .iter()
                    .find(|s| s.job == lease.job)
                    .map(|s| s.lease_ttl)
            })
            .unwrap_or(Duration::from_secs(30));
        local.push(Queued {
            lease,
            claim_sent: sent,
            deadline: sent + max_wait(ttl),
        });
    }
}

/// Gives queued runs back (PENDING at once, new token) in one statement,
/// retried like a release; what cannot be given back expires.
pub(super) async fn release_queued(shared: Arc<Shared>, queued: Vec<Queued>) {
    let items: Vec<(queue::Fence, Finish)> = queued
        .iter()
        .map(|q| (q.lease.fence(), Finish::Release))
        .collect();
    for chunk in items.chunks(queue::MAX_FINISH_BATCH) {
        let mut backoff = Backoff::new();
        for try_no in 1..=3 {
            match queue::finish_many(&shared.pool, chunk, shared.clock).await {
                Ok(done) => {
                    for ((fence, _), status) in chunk.iter().zip(done) {
                        if status.is_some() {
                            metrics::counter!(telemetry::ATTEMPTS, "job" => fence.key.job_name().to_owned(), "outcome" => "released")
                                .increment(1);
                        }
                    }
                    info!(
                        runs = chunk.len(),
                        outcome = "released",
                        "claimed ahead but not started in time; released for any worker"
                    );
                    break;
                }
                Err(e) => {
                    warn!(error = %e, try_no, "releasing runs claimed ahead failed");
                    tokio::time::sleep(backoff.next()).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_is_the_starts_of_the_last_window_capped() {
        let mut q = LocalQueue::new(3, 1);
        let t0 = Instant::now();
        assert_eq!(q.target(t0), 0, "a cold worker claims nothing ahead");
        q.record_start(t0);
        assert_eq!(q.target(t0), 0, "one start per slot earns nothing");
        q.record_start(t0);
        assert_eq!(q.target(t0), 2);
        for _ in 0..10 {
            q.record_start(t0);
        }
        assert_eq!(q.target(t0), 3, "never above the capacity");
        assert_eq!(q.target(t0 + WINDOW * 2), 0, "starts age out");
        let mut off = LocalQueue::new(0, 1);
        off.record_start(t0);
        assert_eq!(off.target(t0), 0, "--prefetch 0 turns it off");
    }

    fn queued(n: u32, deadline: Instant) -> Queued {
        let key =
            crate::key::JobKey::parse(&format!("bench-noop:2026-01-{n:02}")).expect("a valid key");
        Queued {
            lease: Lease {
                job: crate::key::JobName::parse(key.job_name()).expect("a valid name"),
                key,
                business_date: chrono::NaiveDate::from_ymd_opt(2026, 1, n).expect("a valid date"),
                attempt: 1,
                max_attempts: 3,
                token: i64::from(n),
                expires_at: chrono::Utc::now(),
                processed_count: 0,
                payload: serde_json::Value::Null,
                context: None,
                step: queue::Step::Whole,
            },
            claim_sent: deadline,
            deadline,
        }
    }

    #[test]
    fn overdue_runs_are_found_in_any_order_and_only_once_due() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut q = LocalQueue::new(8, 1);
        // Deadlines out of claim order, as runs of jobs with different
        // leases have them.
        q.push(queued(1, t0 + 2 * s));
        q.push(queued(2, t0 + s));
        q.push(queued(3, t0 + 4 * s));
        q.push(queued(4, t0 + 3 * s));
        assert_eq!(q.next_deadline(), Some(t0 + s));
        assert!(q.take_overdue(t0).is_empty());
        // The runs that held the two earliest deadlines start: the bound is
        // stale and low, and looking at it finds nothing and moves it on
        // without forgetting the starts that earned the queue its room.
        assert_eq!(q.pop(t0 + s).map(|r| r.lease.token), Some(1));
        assert_eq!(q.pop(t0 + s).map(|r| r.lease.token), Some(2));
        let target = q.target(t0 + s);
        assert_eq!(target, 2, "two starts within the window, one slot");
        assert_eq!(q.next_deadline(), Some(t0 + s));
        assert!(q.take_overdue(t0 + s).is_empty());
        assert_eq!(q.next_deadline(), Some(t0 + 3 * s));
        assert_eq!(q.len(), 2);
        assert_eq!(
            q.target(t0 + s),
            target,
            "nothing was overdue, so the starts still count"
        );
        let mut overdue = |at| -> (Vec<i64>, Option<Instant>) {
            let late = q.take_overdue(at).iter().map(|r| r.lease.token).collect();
            (late, q.next_deadline())
        };
        assert_eq!(overdue(t0 + 3 * s), (vec![4], Some(t0 + 4 * s)));
        assert_eq!(overdue(t0 + 9 * s), (vec![3], None));
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn the_deadline_is_a_quarter_of_a_short_lease() {
        assert_eq!(max_wait(Duration::from_secs(60)), MAX_WAIT);
        assert_eq!(max_wait(Duration::from_secs(2)), Duration::from_millis(500));
    }
}
