//! The worker runtime: claims runs, executes their handlers with bounded
//! concurrency, heartbeats every held lease on its own connection and
//! schedule, recovers expired leases, wakes on NOTIFY (polling as fallback),
//! and shuts down gracefully. [`run`] owns one process's claim loop and
//! `execute` one attempt; claimed runs wait in a bounded local queue
//! (`prefetch.rs`); four service loops run beside them: a completer
//! (`finish.rs`), and a heartbeat loop, a recovery loop and a LISTEN loop
//! (`loops.rs`).
//!
//! Invariants:
//!
//! - Transient database errors are logged and retried with backoff; they
//!   never end the process.
//! - A process never holds more than 5 × `--concurrency` + 2 × `--prefetch`
//!   leases, even when finishes stall: every claim asks only for room that
//!   the claims already out have not asked for (`requested`).
//! - A lost lease finishes nothing. A handler that returns
//!   `JobError::Cancelled` with neither a shutdown nor a lost lease is
//!   retried with the usual backoff, so it cannot release and re-claim its
//!   run forever.
//! - Shutdown is two cancellation tokens ([`Shutdown`]). `shutdown` stops
//!   claims and asks handlers to stop at a chunk boundary; the queued runs,
//!   and those of a claim still out, are released. `abort` (after `--grace`)
//!   drops the handlers and rolls back their open chunk, and `run` then
//!   returns within [`ABORT_BOUND`], whatever handlers wait for, so the
//!   process exits within `--grace` + 5 s of the first signal.
//! - Dropping a handler does not stop a statement it had sent, so the worker
//!   ends the abandoned handler's sessions that are still in its fenced
//!   transactions (never a reused pid or a session that has moved on), which
//!   frees the run's row for whoever takes the run over.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot, watch, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::clock::Clock;
use crate::config::context::RunContext;
use crate::config::{Config, JobConfig, LeaseExpiryPolicy};
use crate::key::{JobKey, JobName};
use crate::queue::{self, AttemptCounts, ClaimSpec, Finish, Lease, QueueError};
use crate::runtime::job::{JobContext, JobError, LeaseRenewal, Outcome, Progress, Registry};
use crate::runtime::worker_registry;
use crate::telemetry;

mod finish;
mod loops;
mod prefetch;

use finish::{completer_loop, finish_with_retries, release};
use loops::{heartbeat_loop, listen_loop, rescue_loop, Backoff};
use prefetch::{queue_claimed, release_queued, LocalQueue};

/// What a claim task returns: when its statement was sent, and the leases.
type ClaimResult = (Instant, Result<Vec<Lease>, QueueError>);

/// The longest delay a handler's `JobError::RetryAfter` may ask for; a
/// longer one is cut to this, so a run is never put off for years by a
/// mistaken header.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(7 * 86_400);

/// The default of `WorkerOptions::prefetch` (`--prefetch`).
pub const DEFAULT_PREFETCH: u32 = 512;

/// Recorded in `batch_worker.version`.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// How a worker process behaves.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    pub worker_id: String,
    /// Runs executed at once.
    pub concurrency: u32,
    /// Claim attempts without a NOTIFY, so nothing waits on a lost wake-up.
    pub poll_interval: Duration,
    /// After SIGTERM, how long running handlers may take to reach a chunk
    /// boundary before they are abandoned and their leases released.
    pub grace: Duration,
    /// Whether to LISTEN for enqueue notifications.
    pub listen: bool,
    /// Where to LISTEN when not on a connection of the main pool: a direct
    /// connection when the main pool goes through PgBouncer.
    pub listen_pool: Option<PgPool>,
    /// The most runs claimed ahead of a free slot (`prefetch.rs`); 0 claims
    /// only for free slots.
    pub prefetch: u32,
}

impl WorkerOptions {
    pub fn new(worker_id: impl Into<String>) -> Self {
        Self {
            worker_id: worker_id.into(),
            concurrency: 4,
            poll_interval: Duration::from_secs(2),
            grace: Duration::from_secs(20),
            listen: true,
            listen_pool: None,
            prefetch: DEFAULT_PREFETCH,
        }
    }
}

/// The signals that stop a worker: `shutdown` stops claiming and asks handlers
/// to stop at a chunk boundary; `abort` abandons them at once (the end of the
/// grace period, or the embedder's choice). After `abort`, [`run`] returns
/// within [`ABORT_BOUND`]: abandoned handlers' statements still running on
/// the server are ended, their runs released if that can be done in time,
/// and otherwise left to expire. (The command line exits at once on a
/// second signal instead.)
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    pub shutdown: CancellationToken,
    pub abort: CancellationToken,
}

struct Held {
    token: i64,
    /// The attempt's number, which the logs name (never the token: a token
    /// is the capability to change the run, for this process alone).
    attempt: i32,
    lease_ttl: Duration,
    /// Set when the lease is gone (taken over, or not renewed within its ttl).
    lost: CancellationToken,
    /// What the handler sees: shutdown or lease lost.
    cancel: CancellationToken,
    last_ok: Instant,
    /// Confirmed extensions of the lease, for the handler.
    renewed: watch::Sender<LeaseRenewal>,
}

/// How long [`run`] takes at most once `abort` fires (the process exits
/// within `--grace` plus this after SIGTERM): abandoned handlers' sessions
/// are ended and their runs released within [`ABANDON_BOUND`], and the
/// background loops and the registry row get the rest.
pub const ABORT_BOUND: Duration = Duration::from_secs(5);
/// The part of [`ABORT_BOUND`] the run tasks get to end their abandoned
/// sessions and release their runs; what is not released by then is left
/// to expire and be recovered. [`run`] waits this long for the run tasks
/// and then aborts them; it gives the service loops until 4 s and the
/// registry row until 5 s.
const ABANDON_BOUND: Duration = Duration::from_secs(3);
/// How long a release after an abort waits for the run's row (a session
/// the worker does not control, such as a command job's program, may hold
/// it), per try: a lock the worker cannot end costs at most three tries.
const ABANDONED_RELEASE_LOCK_TIMEOUT: Duration = Duration::from_secs(1);

struct Shared {
    registry: Registry,
    config: Config,
    pool: PgPool,
    /// The heartbeats' pool, which handlers never use: the worker ends an
    /// abandoned handler's sessions through it, whatever the main pool is
    /// busy with.
    heartbeat_pool: PgPool,
    opts: WorkerOptions,
    held: Mutex<HashMap<JobKey, Held>>,
    signals: Shutdown,
    clock: Clock,
    /// Finishes go through the completer, which writes every finish that is
    /// waiting in one statement.
    finishes: mpsc::UnboundedSender<FinishRequest>,
    /// Runs whose handler has returned and whose finish is waiting or being
    /// written. A run gives its execution slot back when its handler returns,
    /// so the next claim overlaps the finish; this second bound, of
    /// [`FINISHING_PER_SLOT`] per slot plus `--prefetch`, keeps the leases a
    /// process holds bounded if finishes stall. Sized by the concurrency
    /// alone it capped a drain at about what one finish batch of that size
    /// per round trip allows, whatever the claims brought in (BENCHMARKS.md).
    finishing: Arc<Semaphore>,
    /// Signalled when a handler returns and gives its execution slot back,
    /// so the claim loop claims again while that run's finish is written.
    slot_freed: Notify,
}

/// Claim statements one process keeps in flight. With one, the claim was
/// the serial part of a drain at concurrency 32; a second overlaps it (its
/// pick skips the first one's locked rows) and drained 5 % faster; a third,
/// tried beside two finish streams, nothing more (BENCHMARKS.md, sixth round).
/// One finish statement is in flight at a time: a second finish stream made
/// more, smaller batches and drained no faster.
const CLAIMS_IN_FLIGHT: usize = 2;

/// Finishes that may wait per execution slot. Room for several lets the
/// completer's batches grow while the claim loop keeps the slots busy; with
/// one per slot the handlers waited for finishing slots and both batches
/// stayed small (drain at concurrency 8: 4,100 runs/s with 1, 5,700 with 2,
/// 6,000 with 4; BENCHMARKS.md).
const FINISHING_PER_SLOT: usize = 4;

/// One finish waiting for the completer, with where to send its result.
struct FinishRequest {
    fence: queue::Fence,
    finish: Finish,
    reply: oneshot::Sender<Result<queue::Finished, QueueError>>,
}

/// Runs a worker until `signals.shutdown` fires and every handler has ended.
///
/// `pool` serves claims and handlers; `heartbeat_pool` is reserved for
/// heartbeats so that a pool busy with handlers cannot delay them.
///
/// Claimed runs go to the bounded local queue (`prefetch.rs`) and start as
/// soon as an execution slot (a `Semaphore` sized `--concurrency`) is free.
/// A claim asks for the free slots plus the queue's earned target (the runs
/// this process started in the last 50 ms, at most `--prefetch`), runs as a
/// task of its own so runs keep starting while it is out, and at most
/// [`CLAIMS_IN_FLIGHT`] are out at a time. The loop wakes on NOTIFY, on
/// `--poll-interval`, when a task ends, when a handler gives its slot back
/// (`slot_freed`) or when a queued run reaches its deadline (then released
/// for any worker). A run gives its execution slot back as soon as its
/// handler has returned, after taking a slot of a second semaphore,
/// [`FINISHING_PER_SLOT`] × `--concurrency` plus `--prefetch`, for its
/// finish, so the next claim overlaps the finish and the completer's
/// batches can grow.
pub async fn run(
    registry: Registry,
    config: Config,
    pool: PgPool,
    heartbeat_pool: PgPool,
    opts: WorkerOptions,
    signals: Shutdown,
) {
    let specs: Vec<ClaimSpec> = registry
        .names()
        .map(|n| ClaimSpec {
            job: n.clone(),
            lease_ttl: job_config(&config, n).lease_ttl,
        })
        .collect();
    // Recovery follows each run's stored policy; the configuration's serves
    // only runs the previous release enqueued without one.
    let jobs: Vec<JobName> = registry.names().cloned().collect();
    // Every counter of every job at zero before the first claim, so the
    // first lease loss or retry of this process's life fires its alert.
    telemetry::serve_jobs(telemetry::Role::Worker, &jobs);
    let legacy_retry: Vec<JobName> = registry
        .names()
        .filter(|n| job_config(&config, n).on_lease_expiry == LeaseExpiryPolicy::Retry)
        .cloned()
        .collect();
    let min_ttl = specs
        .iter()
        .map(|s| s.lease_ttl)
        .min()
        .unwrap_or(Duration::from_secs(30));
    let (finishes, finish_rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        registry,
        config,
        pool: pool.clone(),
        heartbeat_pool: heartbeat_pool.clone(),
        opts: opts.clone(),
        held: Mutex::new(HashMap::new()),
        signals: signals.clone(),
        clock: Clock::Db,
        finishes,
        finishing: Arc::new(Semaphore::new(
            FINISHING_PER_SLOT * opts.concurrency.max(1) as usize + opts.prefetch as usize,
        )),
        slot_freed: Notify::new(),
    });
    let served: Vec<(JobName, JobConfig)> = shared
        .registry
        .names()
        .map(|n| (n.clone(), job_config(&shared.config, n)))
        .collect();
    let served: Vec<(JobName, &JobConfig)> = served.iter().map(|(n, c)| (n.clone(), c)).collect();
    if let Err(e) = worker_registry::register_process(
        &pool,
        &opts.worker_id,
        worker_registry::Role::Worker,
        VERSION,
        live_for(min_ttl / 3),
        &served,
    )
    .await
    {
        // The heartbeat loop re-registers once the database answers.
        warn!(error = %e, "could not register the worker yet");
    }
    let stopped = CancellationToken::new();
    let wake = Arc::new(Notify::new());
    let services = spawn_services(
        &shared,
        finish_rx,
        heartbeat_pool,
        (jobs, legacy_retry),
        min_ttl,
        &wake,
        &stopped,
    );
    info!(
        worker_id = %opts.worker_id,
        concurrency = opts.concurrency,
        jobs = %specs.iter().map(|s| s.job.as_str()).collect::<Vec<_>>().join(","),
        "worker started"
    );
    let mut claim_loop = ClaimLoop::new(shared.clone(), specs.into(), wake);
    claim_loop.run().await;
    claim_loop.give_back().await;
    shut_down(&shared, claim_loop.tasks, services, stopped).await;
}

/// Spawns the service loops: the completer, the heartbeat loop, the
/// recovery loop (for `jobs`, with the legacy retry policy for the second
/// list) and, unless told not to, the LISTEN loop.
fn spawn_services(
    shared: &Arc<Shared>,
    finish_rx: mpsc::UnboundedReceiver<FinishRequest>,
    heartbeat_pool: PgPool,
    (jobs, legacy_retry): (Vec<JobName>, Vec<JobName>),
    min_ttl: Duration,
    wake: &Arc<Notify>,
    stopped: &CancellationToken,
) -> JoinSet<()> {
    let (pool, opts) = (&shared.pool, &shared.opts);
    let mut services = JoinSet::new();
    // The completer outlives every run task: it stops only when `stopped`
    // fires, after the last task has ended.
    services.spawn(completer_loop(
        pool.clone(),
        finish_rx,
        Clock::Db,
        stopped.clone(),
    ));
    services.spawn(heartbeat_loop(
        shared.clone(),
        heartbeat_pool,
        min_ttl,
        stopped.clone(),
    ));
    services.spawn(rescue_loop(
        pool.clone(),
        jobs,
        legacy_retry,
        (min_ttl / 2).clamp(Duration::from_secs(1), Duration::from_secs(15)),
        wake.clone(),
        stopped.clone(),
    ));
    if opts.listen {
        let listen_pool = opts.listen_pool.clone().unwrap_or_else(|| pool.clone());
        services.spawn(listen_loop(listen_pool, wake.clone(), stopped.clone()));
    }
    services
}

/// The claim loop's state: the runs claimed and waiting for a slot, the
/// claims out, and the run tasks.
struct ClaimLoop {
    shared: Arc<Shared>,
    specs: Arc<[ClaimSpec]>,
    wake: Arc<Notify>,
    /// The execution slots (`--concurrency`).
    permits: Arc<Semaphore>,
    tasks: JoinSet<()>,
    backoff: Backoff,
    local: LocalQueue,
    /// A claim runs as a task of its own, so runs already claimed keep
    /// starting from the local queue while it is out, and a second may go
    /// out while the first is on the server.
    claims: JoinSet<ClaimResult>,
    /// What each claim out has asked for, by task, so that a claim that ends
    /// in any way (a panic included) gives back only its own.
    wants: HashMap<tokio::task::Id, usize>,
    claim_not_before: Instant,
    /// Set when a claim found fewer due runs than it asked for: the next one
    /// waits for a reason to look again (a notification, the poll interval,
    /// a slot given back), or an idle worker would claim in a tight loop.
    drained: bool,
}

impl ClaimLoop {
    /// A loop with every slot free and nothing claimed.
    fn new(shared: Arc<Shared>, specs: Arc<[ClaimSpec]>, wake: Arc<Notify>) -> Self {
        let opts = &shared.opts;
        ClaimLoop {
            permits: Arc::new(Semaphore::new(opts.concurrency.max(1) as usize)),
            tasks: JoinSet::new(),
            backoff: Backoff::new(),
            local: LocalQueue::new(opts.prefetch as usize, opts.concurrency.max(1) as usize),
            claims: JoinSet::new(),
            wants: HashMap::new(),
            claim_not_before: Instant::now(),
            drained: false,
            shared,
            specs,
            wake,
        }
    }

    /// Claims and starts runs until `shutdown` fires.
    async fn run(&mut self) {
        while !self.shared.signals.shutdown.is_cancelled() {
            // Let run tasks that are ready give their slots back first, so one
            // claim takes them all rather than one each.
            tokio::task::yield_now().await;
            while let Some(done) = self.tasks.try_join_next() {
                log_task_end(done);
            }
            let now = Instant::now();
            self.start_queued(now);
            self.send_claim(now);
            self.wait().await;
        }
    }

    /// Releases the queued runs past their deadline, and starts queued runs
    /// while execution slots are free.
    fn start_queued(&mut self, now: Instant) {
        let (shared, local, tasks) = (&self.shared, &mut self.local, &mut self.tasks);
        let overdue = local.take_overdue(now);
        if !overdue.is_empty() {
            tasks.spawn(release_queued(shared.clone(), overdue));
        }
        while local.len() > 0 {
            let Ok(permit) = self.permits.clone().try_acquire_owned() else {
                break;
            };
            if let Some(q) = local.pop(now) {
                tasks.spawn(execute(shared.clone(), q.lease, permit, q.claim_sent));
            }
        }
    }

    /// Sends a claim if there is room for one, and runs to ask for.
    fn send_claim(&mut self, now: Instant) {
        let (local, wants) = (&mut self.local, &mut self.wants);
        if self.claims.len() < CLAIMS_IN_FLIGHT && !self.drained && now >= self.claim_not_before {
            // Room for the free slots and for the queue's target; a claim
            // only for the queue waits until it is half empty, so claims
            // stay large.
            let free = self.permits.available_permits();
            let target = local.target(now);
            let requested: usize = wants.values().sum();
            let want = (free + target).saturating_sub(local.len() + requested);
            if want > 0 && (free > requested || (local.len() + requested) * 2 <= target) {
                let pool = self.shared.pool.clone();
                let worker_id = self.shared.opts.worker_id.clone();
                let specs = self.specs.clone();
                let task = self.claims.spawn(async move {
                    // Before the statement: the leases it grants last at
                    // least their ttl from here.
                    let sent = Instant::now();
                    let r = queue::claim(&pool, &worker_id, &specs, want as u32, Clock::Db).await;
                    (sent, r)
                });
                wants.insert(task.id(), want);
            }
        }
    }

    /// Waits for a reason to look again: a signal, a notification, a slot
    /// given back, the poll interval, a queued run's deadline, the end of a
    /// claim's backoff, a claim's result or a run task's end.
    async fn wait(&mut self) {
        let Self {
            shared,
            specs,
            wake,
            tasks,
            backoff,
            local,
            claims,
            wants,
            claim_not_before,
            drained,
            ..
        } = self;
        let (opts, signals) = (&shared.opts, &shared.signals);
        let next_deadline = local
            .next_deadline()
            .unwrap_or_else(|| Instant::now() + opts.poll_interval);
        let waiting = claims.is_empty() && *claim_not_before > Instant::now();
        tokio::select! {
            _ = signals.shutdown.cancelled() => {}
            _ = wake.notified() => *drained = false,
            _ = shared.slot_freed.notified() => *drained = false,
            _ = tokio::time::sleep(opts.poll_interval) => *drained = false,
            _ = tokio::time::sleep_until(next_deadline.into()), if local.len() > 0 => {}
            _ = tokio::time::sleep_until((*claim_not_before).into()), if waiting => {}
            Some(done) = claims.join_next_with_id(), if !claims.is_empty() => {
                let id = match &done {
                    Ok((id, _)) => *id,
                    Err(e) => e.id(),
                };
                let want = wants.remove(&id).unwrap_or(0);
                match done {
                    Ok((_, (sent, Ok(leases)))) => {
                        backoff.reset();
                        *drained = leases.len() < want;
                        queue_claimed(local, specs, leases, sent);
                    }
                    Ok((_, (_, Err(e)))) => {
                        let delay = backoff.next();
                        warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "claim failed; retrying");
                        *claim_not_before = Instant::now() + delay;
                    }
                    Err(e) => error!(error = %e, "claim task ended abnormally"),
                }
            }
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                *drained = false;
                log_task_end(done);
            }
        }
    }

    /// After the loop: waits for the claims still out and releases what
    /// they return, with everything queued.
    async fn give_back(&mut self) {
        let (local, specs) = (&mut self.local, &self.specs);
        // A claim still out may commit leases: wait for it (it is one statement)
        // and give back, with everything queued, what it returns.
        while let Some(done) = self.claims.join_next().await {
            if let Ok((sent, Ok(leases))) = done {
                queue_claimed(local, specs, leases, sent);
            }
        }
        let queued = local.take_all();
        if !queued.is_empty() {
            self.tasks
                .spawn(release_queued(self.shared.clone(), queued));
        }
    }
}

/// Lets the running handlers reach a chunk boundary within `--grace`, then
/// aborts them, and bounds the rest: the run tasks, the service loops and
/// the registry row, within [`ABORT_BOUND`] of the abort.
async fn shut_down(
    shared: &Shared,
    mut tasks: JoinSet<()>,
    mut services: JoinSet<()>,
    stopped: CancellationToken,
) {
    let (pool, opts, signals) = (&shared.pool, &shared.opts, &shared.signals);
    info!(
        worker_id = %opts.worker_id,
        running = tasks.len(),
        grace_ms = opts.grace.as_millis() as u64,
        "shutting down: no more claims; letting running handlers reach a chunk boundary"
    );
    let deadline = tokio::time::sleep(opts.grace);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            done = tasks.join_next() => match done {
                Some(done) => log_task_end(done),
                None => break,
            },
            _ = &mut deadline => {
                warn!(running = tasks.len(), "grace period over; abandoning the current chunks");
                signals.abort.cancel();
                break;
            }
            _ = signals.abort.cancelled() => break,
        }
    }
    // Either every task has ended or `abort` fired: from here on, bounded.
    let started = tokio::time::Instant::now();
    let abandoned = started + ABANDON_BOUND;
    if tokio::time::timeout_at(abandoned, async {
        while let Some(done) = tasks.join_next().await {
            log_task_end(done);
        }
    })
    .await
    .is_err()
    {
        warn!(
            running = tasks.len(),
            bound_ms = ABANDON_BOUND.as_millis() as u64,
            "runs not released in time; their leases expire and are recovered"
        );
        tasks.shutdown().await;
    }
    stopped.cancel();
    let services_by = started + (ABORT_BOUND - Duration::from_secs(1));
    if tokio::time::timeout_at(services_by, async {
        while services.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        services.shutdown().await;
    }
    match tokio::time::timeout_at(
        started + ABORT_BOUND,
        worker_registry::deregister(pool, &opts.worker_id),
    )
    .await
    {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(error = %e, "could not deregister the worker"),
        Err(_) => warn!("deregistering the worker timed out"),
    }
    info!(worker_id = %opts.worker_id, "worker stopped");
}

/// How long after a sign of life this worker counts as live: a few
/// heartbeats, so one slow heartbeat does not make it look gone.
fn live_for(heartbeat_every: Duration) -> Duration {
    heartbeat_every * 3 + Duration::from_secs(10)
}

fn job_config(config: &Config, name: &JobName) -> JobConfig {
    config.job(name).cloned().unwrap_or_default()
}

/// The run's context: stored with the run, or, for a run the previous
/// release enqueued without one, frozen now from this worker's
/// configuration (whoever freezes it first decides it for good). On error,
/// the finish to write instead of running the handler (`None`: release).
async fn run_context(
    shared: &Shared,
    lease: &Lease,
    cfg: &JobConfig,
) -> Result<RunContext, Option<Finish>> {
    if let Some(c) = &lease.context {
        return Ok(c.clone());
    }
    let period = lease.key.period();
    let fresh = match RunContext::for_key(cfg, lease.business_date, period) {
        Ok(c) => c,
        Err(e) => {
            return Err(Some(Finish::Fatal {
                error: format!("the run has no stored context and {e}"),
            }))
        }
    };
    let mut backoff = Backoff::new();
    for _ in 0..5 {
        match queue::context::freeze_held(&shared.pool, &lease.fence(), &fresh).await {
            Ok(c) => {
                info!(job_key = %lease.key, timezone = c.timezone.name(),
                      period_start = %c.period_start, period_end = %c.period_end,
                      "froze the context of a run enqueued by the previous release");
                return Ok(c);
            }
            Err(QueueError::LeaseLost(_)) => return Err(None),
            Err(e) => {
                warn!(job_key = %lease.key, error = %e, "could not freeze the run's context; retrying");
                tokio::time::sleep(backoff.next()).await;
            }
        }
    }
    Err(None)
}

fn log_task_end(done: Result<(), tokio::task::JoinError>) {
    if let Err(e) = done {
        error!(error = %e, "run task ended abnormally");
    }
}

/// One attempt, from claimed lease to finish. `slot` is its execution slot,
/// given back as soon as the handler has returned.
///
/// It registers the lease in the in-memory `held` map that feeds
/// heartbeats, and gives the handler's `JobContext` the lease-lost token
/// (`with_lease_lost`), which the heartbeat loop and self-fencing cancel
/// before the cancellation token, and the lease's renewals
/// (`with_lease_renewals`): seeded with the instant taken before the claim
/// statement, then published by the heartbeat loop, with the instant taken
/// before its statement, for every run it reports `extended`. It spawns the
/// handler and waits for it, for the lease to be lost, or for an abort, and
/// maps the result to a `Finish`: a lost lease finishes nothing; a cancel
/// caused by shutdown, or an abort, becomes `Release`.
///
/// It counts the attempt: `batchonce_attempts_total` and the
/// `batchonce_run_duration_seconds` histogram (from the claim to the end,
/// labels `job` and `outcome`), with `lease_lost` for a lost lease (which
/// also adds to `batchonce_leases_lost_total`), and otherwise the outcome
/// of the `finish` statement once it has committed. A `finish` refused
/// because the lease was lost counts an attempt with outcome `lease_lost`
/// and a lost lease too. The `run finished` log event carries `started_at`
/// and `finished_at`.
///
/// On an abort or a lost lease, it reads the run's open fenced sessions
/// (`FenceSessions::snapshot`, before the drop removes them), drops the
/// handler, and ends those sessions that are still in the same transaction
/// (pid and `xact_start` together) with [`end_own_sessions`].
async fn execute(
    shared: Arc<Shared>,
    lease: Lease,
    slot: tokio::sync::OwnedSemaphorePermit,
    claim_sent: Instant,
) {
    let file_cfg = job_config(&shared.config, &lease.job);
    let Some(job) = shared.registry.get(&lease.job).cloned() else {
        // Unreachable: claims name only registered jobs. Release it anyway.
        release(&shared, &lease, AttemptCounts::default()).await;
        return;
    };
    let run = match run_context(&shared, &lease, &file_cfg).await {
        Ok(run) => run,
        Err(finish) => {
            match finish {
                Some(f) => {
                    let lost = CancellationToken::new();
                    finish_with_retries(&shared, &lease, &f, AttemptCounts::default(), &lost, 0)
                        .await;
                }
                None => release(&shared, &lease, AttemptCounts::default()).await,
            }
            return;
        }
    };
    // What the handler and this task act on: the run's policies, the
    // worker's file only for what the run does not define.
    let cfg = run.apply_to(&file_cfg);
    let lost = CancellationToken::new();
    let cancel = shared.signals.shutdown.child_token();
    let fences = queue::blockers::FenceSessions::default();
    let (renewed, renewals) = watch::channel(LeaseRenewal {
        sent: claim_sent,
        ttl: cfg.lease_ttl,
    });
    {
        let mut held = lock(&shared.held);
        held.insert(
            lease.key.clone(),
            Held {
                token: lease.token,
                attempt: lease.attempt,
                lease_ttl: cfg.lease_ttl,
                lost: lost.clone(),
                cancel: cancel.clone(),
                last_ok: Instant::now(),
                renewed,
            },
        );
    }
    let progress = Arc::new(Progress::default());
    let ctx = JobContext::new(
        &lease,
        run,
        &shared.opts.worker_id,
        &file_cfg,
        shared.pool.clone(),
        cancel.clone(),
        progress.clone(),
        shared.clock,
    )
    .with_lease_lost(lost.clone())
    .with_lease_renewals(renewals)
    .with_fence_sessions(fences.clone());
    let started = Instant::now();
    info!(
        job_key = %lease.key, business_date = %lease.business_date, attempt = lease.attempt,
        worker_id = %shared.opts.worker_id,
        "run started"
    );
    let end = run_handler(&shared, &lease, job, ctx, &lost, &fences).await;
    let counts = AttemptCounts {
        processed: progress.processed(),
        failed: progress.failed(),
    };
    let finish = finish_for(end, &lease, &cfg, &lost, &cancel);
    complete(&shared, &lease, slot, finish, counts, &lost, started).await;
}

/// How a handler's attempt ended: it returned, its lease was lost, or the
/// worker aborted it.
enum End {
    Handler(Result<Outcome, JobError>),
    Lost,
    Aborted,
}

/// Spawns the handler and waits for it, for the lease to be lost or for an
/// abort; a handler that did not return is dropped and its own blocked
/// sessions ended.
async fn run_handler(
    shared: &Shared,
    lease: &Lease,
    job: Arc<dyn crate::runtime::job::Job>,
    ctx: JobContext,
    lost: &CancellationToken,
    fences: &queue::blockers::FenceSessions,
) -> End {
    let mut handle = tokio::spawn(async move { job.run(&ctx).await });
    let end = tokio::select! {
        r = &mut handle => End::Handler(match r {
            Ok(r) => r,
            Err(e) => Err(JobError::Retryable(format!("handler panicked: {e}"))),
        }),
        _ = lost.cancelled() => End::Lost,
        _ = shared.signals.abort.cancelled() => End::Aborted,
    };
    if !matches!(end, End::Handler(_)) {
        // Dropping the handler drops its open fenced transaction, but a
        // statement of it may still run on the server, waiting on a lock
        // held elsewhere, and keep the run's row locked for as long: the
        // release below (or any takeover) would wait with it. So the
        // sessions still open are read first (dropping removes them) and
        // ended after.
        let open = fences.snapshot();
        handle.abort();
        let _ = handle.await;
        end_own_sessions(shared, lease, &open).await;
    }
    end
}

/// The finish an attempt's end calls for; `None` when the lease is lost
/// and nothing more may be written.
fn finish_for(
    end: End,
    lease: &Lease,
    cfg: &JobConfig,
    lost: &CancellationToken,
    cancel: &CancellationToken,
) -> Option<Finish> {
    match end {
        End::Handler(Ok(Outcome::Succeeded)) => Some(Finish::Succeeded),
        End::Handler(Ok(Outcome::Skipped(reason))) => Some(Finish::Skipped { reason }),
        End::Handler(Err(JobError::Retryable(error))) => Some(Finish::Retry {
            error,
            delay: queue::backoff_delay(lease.attempt, cfg.backoff, cfg.backoff_max),
        }),
        End::Handler(Err(JobError::RetryAfter { error, delay })) => Some(Finish::Retry {
            error,
            delay: delay.min(MAX_RETRY_AFTER),
        }),
        End::Handler(Err(JobError::Fatal(error))) => Some(Finish::Fatal { error }),
        End::Handler(Err(JobError::LeaseLost)) | End::Lost => None,
        End::Handler(Err(JobError::Cancelled)) if lost.is_cancelled() => None,
        End::Handler(Err(JobError::Cancelled)) if !cancel.is_cancelled() => {
            // Returning Cancelled unasked would release and re-claim forever.
            Some(Finish::Retry {
                error: "handler returned Cancelled without a shutdown or lost lease".into(),
                delay: queue::backoff_delay(lease.attempt, cfg.backoff, cfg.backoff_max),
            })
        }
        End::Handler(Err(JobError::Cancelled)) | End::Aborted => Some(Finish::Release),
    }
}

/// Gives the execution slot back (after taking a finishing slot), writes
/// the finish, counts the attempt and forgets the lease.
async fn complete(
    shared: &Shared,
    lease: &Lease,
    slot: tokio::sync::OwnedSemaphorePermit,
    finish: Option<Finish>,
    counts: AttemptCounts,
    lost: &CancellationToken,
    started: Instant,
) {
    // Take a finishing slot before giving the execution slot back, so the
    // leases held stay bounded.
    let finishing = shared.finishing.clone().acquire_owned().await;
    drop(slot);
    shared.slot_freed.notify_one();
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let job = lease.job.to_string();
    let record = |outcome: &'static str| {
        metrics::counter!(telemetry::ATTEMPTS, "job" => job.clone(), "outcome" => outcome)
            .increment(1);
        metrics::histogram!(telemetry::RUN_DURATION, "job" => job.clone(), "outcome" => outcome)
            .record(started.elapsed().as_secs_f64());
    };
    if finish.is_none() {
        record("lease_lost");
        metrics::counter!(telemetry::LEASES_LOST, "job" => job.clone()).increment(1);
    }
    match finish {
        None => warn!(
            job_key = %lease.key, business_date = %lease.business_date, attempt = lease.attempt,
            worker_id = %shared.opts.worker_id,
            processed = counts.processed, failed = counts.failed, elapsed_ms,
            outcome = "lease_lost", "run stopped: lease lost, nothing more is written"
        ),
        Some(Finish::Release) => release(shared, lease, counts).await,
        Some(f) => {
            if let Some(status) =
                finish_with_retries(shared, lease, &f, counts, lost, elapsed_ms).await
            {
                record(outcome_name(&f, status));
            }
        }
    }
    lock(&shared.held).remove(&lease.key);
    drop(finishing);
}

fn outcome_name(finish: &Finish, status: queue::RunStatus) -> &'static str {
    match finish {
        Finish::Succeeded => "succeeded",
        Finish::Skipped { .. } => "skipped",
        Finish::Retry { .. } if status == queue::RunStatus::Pending => "retried",
        Finish::Retry { .. } => "failed",
        Finish::Fatal { .. } => "fatal",
        Finish::Release => "released",
    }
}

/// Counts and logs a lease this process held and lost, whatever the cause,
/// so `batchonce_leases_lost_total` sees every one.
fn lease_lost(lease: &Lease, cause: &str) {
    warn!(job_key = %lease.key, attempt = lease.attempt,
          outcome = "lease_lost", cause, "lease lost");
    metrics::counter!(telemetry::LEASES_LOST, "job" => lease.job.to_string()).increment(1);
}

/// Ends the server sessions of an abandoned handler's fenced transactions
/// that are still in those transactions, through the heartbeat pool, with
/// `blockers::terminate_own`, within 1 s, logging `abandoned handler: ended
/// its own blocked database session(s)`. A statement waiting for another
/// session's lock would otherwise keep its fenced transaction, and so the
/// run's row, locked, while every takeover (the release first) waits for
/// that row.
async fn end_own_sessions(shared: &Shared, lease: &Lease, open: &[queue::blockers::SessionTx]) {
    if open.is_empty() {
        return;
    }
    match tokio::time::timeout(
        Duration::from_secs(1),
        queue::blockers::terminate_own(&shared.heartbeat_pool, open),
    )
    .await
    {
        Ok(Ok(ended)) if ended.is_empty() => {}
        Ok(Ok(ended)) => warn!(
            job_key = %lease.key, attempt = lease.attempt,
            pids = %ended.iter().map(|e| e.pid.to_string()).collect::<Vec<_>>().join(","),
            waiting_on = %ended.iter().filter_map(|e| e.waiting_on.as_deref()).collect::<Vec<_>>().join("; "),
            "abandoned handler: ended its own blocked database session(s), which held the run's row"
        ),
        Ok(Err(e)) => warn!(job_key = %lease.key, error = %e,
            "abandoned handler: could not end its database sessions; the release may wait for them"),
        Err(_) => warn!(job_key = %lease.key,
            "abandoned handler: ending its database sessions timed out; the release may wait for them"),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere; the map stays usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}
