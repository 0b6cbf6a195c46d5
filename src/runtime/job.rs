//! The job API: what a job kind implements ([`Job`]) and what it receives
//! ([`JobContext`]): the run's identity, the context it was enqueued with
//! (time zone, period, policies), the rest of its configuration, fenced
//! transactions for every write, progress counters and a cancellation signal.
//!
//! - `Job` is the trait a job kind implements: `name`, `default_config`, `migrations`, `demo` and
//!   `run`.
//! - `JobContext` is what the handler gets: key, business date, attempt, token, worker id, `run`
//!   (the run's `RunContext`, stored when it was enqueued), config (the worker's, with every value
//!   the run defines replaced by the run's), payload, a read pool, fenced transactions, progress
//!   counters, cancellation, and `concurrently` (bounded calls in flight, in order, none started
//!   once cancelled). `JobContext::commit` commits a fenced transaction and, once it has
//!   committed, adds its counts to `batchonce_items_processed_total` and
//!   `batchonce_items_failed_total` (label `job`). `with_lease_lost(token)` gives the context the
//!   worker's lease-lost token, which the worker cancels before the cancellation token when the
//!   lease is gone, and `is_lease_lost()` reads it, so a handler can tell a lost lease (stop now:
//!   nothing it writes can commit) from a shutdown (stop cleanly at a chunk boundary).
//!   `with_lease_renewals(rx)` gives it a `watch` of `LeaseRenewal { sent, ttl }`, the lease's
//!   confirmed extensions (the claim, then every heartbeat that reported the run `extended`; `busy`
//!   extends nothing), where `sent` is the monotonic instant taken before the statement, so `sent +
//!   ttl` is the earliest the lease can expire; `lease_renewals()` reads it. A context built
//!   without a worker assumes the lease began when the context was made and is never extended.
//! - `Outcome` is `Succeeded` or `Skipped(reason)`.
//! - `JobError` is `Retryable`, `Fatal`, `LeaseLost` or `Cancelled`. `sqlx::Error` converts to
//!   `Retryable`.
//! - `JobDemo` is how `demo` works with any job kind. `seed(pool, config, dates)` and `verify(pool,
//!   config, key, date)` are required; `verify` gets the run's key before its date, so a kind with
//!   several periods a date can check each. `prepare(config, home)` adjusts the demo's
//!   configuration of the kind (by default nothing; `notification-send` points its outbox sender
//!   into the demo folder), and `periods(config, now)` gives the periods the demo runs (by default
//!   the three business dates before today in the job's zone; `inventory-sync` gives its last three
//!   quarter-hours).
//! - `Registry` maps job names to kinds. `Registry::migrations` collects every registered kind's
//!   `Migrator`. `Registry::only` keeps the declared kinds. `Registry::resolve` finds a job by
//!   name, and its error (`unknown job "…" (declared: …; …)`) quotes at most 80 characters of the
//!   name, through `key::shown`.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use sqlx::migrate::Migrator;
use sqlx::PgPool;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::config::context::RunContext;
use crate::config::JobConfig;
use crate::key::{JobKey, JobName};
use crate::queue::{self, Fence, FencedTx, QueueError};
use crate::schedule::Period;

/// How a handler ended well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    /// Nothing to do for this period; the reason is recorded on the run.
    Skipped(String),
}

/// How a handler ended badly.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// Worth another attempt after a backoff (a timeout, a lost connection).
    #[error("{0}")]
    Retryable(String),
    /// Worth another attempt, but not before `delay` (a provider's
    /// `Retry-After`, an apalis `RetryAfterError`): the run is due again
    /// `delay` after the attempt ends, instead of after the job's backoff.
    /// The attempt counts like any other, so `max_attempts` still holds.
    #[error("{error}")]
    RetryAfter {
        error: String,
        delay: std::time::Duration,
    },
    /// Another attempt would fail the same way (bad source data, a bug):
    /// the run is FAILED at once.
    #[error("{0}")]
    Fatal(String),
    /// The lease was taken over; the handler's writes cannot commit.
    #[error("lease lost")]
    LeaseLost,
    /// The worker is shutting down or the lease was lost; stop after the
    /// current chunk.
    #[error("cancelled")]
    Cancelled,
}

impl From<QueueError> for JobError {
    fn from(e: QueueError) -> Self {
        match e {
            QueueError::LeaseLost(_) => Self::LeaseLost,
            QueueError::Invalid(m) => Self::Fatal(m),
            QueueError::Unavailable(m) => Self::Retryable(format!("database unavailable: {m}")),
            QueueError::Database(e) => e.into(),
        }
    }
}

impl From<sqlx::Error> for JobError {
    /// Database errors retry: a constraint violation in an item table is a
    /// bug that retries will not fix, but they are bounded by `max_attempts`,
    /// and a connection error must never fail a run on the first try.
    fn from(e: sqlx::Error) -> Self {
        Self::Retryable(format!("database error: {e}"))
    }
}

/// Demo support: seeds source data and checks the results, so `demo` can show
/// any job kind running exactly once.
#[async_trait]
pub trait JobDemo: Send + Sync {
    /// Adjusts the demo's configuration of this kind (e.g. a sender that
    /// writes into the demo's folder `home`).
    fn prepare(&self, _config: &mut JobConfig, _home: &std::path::Path) {}

    /// The periods the demo runs: by default the three business dates
    /// before today in the job's time zone.
    fn periods(&self, config: &JobConfig, now: DateTime<Utc>) -> Vec<Period> {
        let today = now.with_timezone(&config.timezone).date_naive();
        (1..=3u64)
            .rev()
            .filter_map(|d| today.checked_sub_days(chrono::Days::new(d)))
            .map(Period::day)
            .collect()
    }

    /// Writes demo source data for these business dates; returns a one-line
    /// description ("3,600 orders").
    async fn seed(
        &self,
        pool: &PgPool,
        config: &JobConfig,
        dates: &[NaiveDate],
    ) -> Result<String, sqlx::Error>;

    /// Compares a finished run's output with its source.
    async fn verify(
        &self,
        pool: &PgPool,
        config: &JobConfig,
        key: &JobKey,
        date: NaiveDate,
    ) -> Result<Verification, sqlx::Error>;
}

/// The result of [`JobDemo::verify`].
#[derive(Debug, Clone)]
pub struct Verification {
    pub items: i64,
    /// Item keys written more than once (must be 0).
    pub duplicates: i64,
    /// Output compared with the source, e.g. "total 12,345 = source 12,345".
    pub detail: String,
    pub ok: bool,
}

/// A kind of batch work. One value serves every run of its job name.
#[async_trait]
pub trait Job: Send + Sync + 'static {
    /// The job name, used in keys and the `[jobs.<name>]` config table.
    fn name(&self) -> JobName;

    /// The defaults the config file overrides (e.g. the business time zone).
    fn default_config(&self) -> JobConfig {
        JobConfig::default()
    }

    /// The job kind's own tables, applied by `batchonce migrate`.
    fn migrations(&self) -> Option<&'static Migrator> {
        None
    }

    /// The tables the kind writes its items to. `batchonce roles` lets the
    /// worker role insert and update these and only read every other table
    /// of the schema (the sources: an application's orders are never a
    /// worker's to change).
    fn output_tables(&self) -> &'static [&'static str] {
        &[]
    }

    /// Demo data and checks, if the job kind takes part in `demo`.
    fn demo(&self) -> Option<&dyn JobDemo> {
        None
    }

    /// Executes one attempt. Writes go through [`JobContext::fenced`]; between
    /// chunks the handler checks [`JobContext::is_cancelled`].
    async fn run(&self, ctx: &JobContext) -> Result<Outcome, JobError>;
}

/// Per-attempt counters, shared with the worker for the attempt history.
#[derive(Debug, Default)]
pub struct Progress {
    processed: AtomicI64,
    failed: AtomicI64,
}

impl Progress {
    pub fn processed(&self) -> i64 {
        self.processed.load(Ordering::Relaxed)
    }
    pub fn failed(&self) -> i64 {
        self.failed.load(Ordering::Relaxed)
    }
}

/// A lease confirmed extended in the database, by the claim or by a
/// heartbeat that reported it `extended` (not `busy`, which extends
/// nothing). The lease then runs at least until `sent + ttl`, because the
/// database set its expiry from a clock read after the statement was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRenewal {
    /// When the statement was sent, on this process's monotonic clock.
    pub sent: Instant,
    /// The lease ttl the statement applied.
    pub ttl: Duration,
}

impl LeaseRenewal {
    /// The earliest instant the lease can expire after this renewal.
    pub fn expires_no_earlier_than(&self) -> Instant {
        self.sent + self.ttl
    }
}

/// What a handler gets for one attempt.
#[derive(Debug, Clone)]
pub struct JobContext {
    pub key: JobKey,
    pub job: JobName,
    pub business_date: NaiveDate,
    pub attempt: i32,
    pub lease_token: i64,
    pub worker_id: String,
    /// What defines the run, stored when it was enqueued: read the time
    /// zone, the period's instants and the policies from here, never from
    /// a configuration file (they may differ between processes).
    pub run: RunContext,
    /// The job's configuration, with every value the run defines replaced
    /// by the run's (so `config.timezone == run.timezone`); the rest (kind
    /// options, `chunk_pause`, a command's program) is this worker's.
    pub config: JobConfig,
    pub payload: serde_json::Value,
    /// The whole run, one partition of it, or its final step. A kind that
    /// sets `partitionable` in its default configuration works on the items
    /// of its partition alone (`batchonce_partition(item_key, count) = no`)
    /// and does what must happen once, after all of them, in `Final`.
    pub step: queue::Step,
    /// The scope the run is for (`<job>:<period>@<scope>`), `None` for an
    /// unscoped run. A kind that sets `scopable` works on that scope's
    /// items alone; the scope is part of the key, so it is fixed with the run.
    pub scope: Option<crate::key::Scope>,
    pool: PgPool,
    cancel: CancellationToken,
    /// Set (before `cancel`) when the lease is gone rather than a shutdown.
    lost: CancellationToken,
    progress: Arc<Progress>,
    clock: Clock,
    /// The latest confirmed extension of the lease.
    renewals: watch::Receiver<LeaseRenewal>,
    /// The server sessions of this attempt's open fenced transactions.
    fences: queue::blockers::FenceSessions,
}

impl JobContext {
    /// `config` is the worker's configuration of the job; the run's context
    /// overrides what it defines.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        lease: &queue::Lease,
        run: RunContext,
        worker_id: &str,
        config: &JobConfig,
        pool: PgPool,
        cancel: CancellationToken,
        progress: Arc<Progress>,
        clock: Clock,
    ) -> Self {
        let ttl = run.lease_ttl;
        Self {
            key: lease.key.clone(),
            job: lease.job.clone(),
            business_date: lease.business_date,
            attempt: lease.attempt,
            lease_token: lease.token,
            worker_id: worker_id.to_owned(),
            config: run.apply_to(config),
            run,
            payload: lease.payload.clone(),
            step: lease.step,
            scope: lease
                .key
                .scope()
                .and_then(|s| crate::key::Scope::parse(s).ok()),
            pool,
            cancel,
            lost: CancellationToken::new(),
            progress,
            clock,
            // Without a worker publishing renewals, assume the lease began
            // now and is never extended.
            renewals: watch::channel(LeaseRenewal {
                sent: Instant::now(),
                ttl,
            })
            .1,
            fences: Default::default(),
        }
    }

    /// The token the worker cancels when the lease is lost, so a handler can
    /// tell a lost lease (stop now) from a shutdown (stop cleanly).
    pub fn with_lease_lost(mut self, lost: CancellationToken) -> Self {
        self.lost = lost;
        self
    }

    /// The renewals the worker publishes: the claim first, then every
    /// heartbeat that extended the lease.
    pub fn with_lease_renewals(mut self, renewals: watch::Receiver<LeaseRenewal>) -> Self {
        self.renewals = renewals;
        self
    }

    /// Where [`Self::fenced`] lists the sessions of its open transactions,
    /// for the worker to end them if it abandons the handler mid-statement.
    pub fn with_fence_sessions(mut self, fences: queue::blockers::FenceSessions) -> Self {
        self.fences = fences;
        self
    }

    /// The lease's confirmed extensions, for a handler that must stop
    /// something outside the database before the lease can expire (a
    /// command job's supervisor).
    pub fn lease_renewals(&self) -> watch::Receiver<LeaseRenewal> {
        self.renewals.clone()
    }

    /// The lease is gone: nothing this attempt writes can commit.
    pub fn is_lease_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// A pool for reads (source data). Never write items through it.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Opens a fenced transaction: commit it with [`Self::commit`] so the
    /// counters of this attempt follow.
    pub async fn fenced(&self) -> Result<FencedTx, JobError> {
        let fence = Fence {
            key: self.key.clone(),
            token: self.lease_token,
        };
        let mut tx =
            queue::begin_fenced(&self.pool, &fence, self.run.lease_ttl, self.clock).await?;
        tx.track(&self.fences);
        Ok(tx)
    }

    /// Commits a fenced transaction and adds its counts to this attempt.
    pub async fn commit(&self, tx: FencedTx) -> Result<(), JobError> {
        let (p, f) = tx.commit().await?;
        self.progress.processed.fetch_add(p, Ordering::Relaxed);
        self.progress.failed.fetch_add(f, Ordering::Relaxed);
        let job = self.job.to_string();
        metrics::counter!(crate::telemetry::ITEMS_PROCESSED, "job" => job.clone())
            .increment(p.max(0) as u64);
        metrics::counter!(crate::telemetry::ITEMS_FAILED, "job" => job).increment(f.max(0) as u64);
        Ok(())
    }

    /// Shutdown was requested or the lease was lost: stop at a chunk boundary.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Resolves when [`Self::is_cancelled`] becomes true (for sleeps).
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    /// Sleeps, waking early on cancellation; returns `Err(Cancelled)` then.
    pub async fn pause(&self, d: std::time::Duration) -> Result<(), JobError> {
        if d.is_zero() {
            return if self.is_cancelled() {
                Err(JobError::Cancelled)
            } else {
                Ok(())
            };
        }
        tokio::select! {
            _ = tokio::time::sleep(d) => Ok(()),
            _ = self.cancel.cancelled() => Err(JobError::Cancelled),
        }
    }

    /// Counts of this attempt so far.
    pub fn progress(&self) -> (i64, i64) {
        (self.progress.processed(), self.progress.failed())
    }

    /// Runs `f` on `items` in order with at most `limit` in flight (at
    /// least one), for I/O a chunk waits on: provider calls, HTTP requests.
    /// Once the attempt is cancelled no new call starts; those in flight
    /// finish. Returns the results of the calls that started, in item
    /// order, so a caller marks them in one fenced transaction and leaves
    /// the rest for the next attempt under the same item keys.
    pub async fn concurrently<'a, T, R, F, Fut>(
        &self,
        items: &'a [T],
        limit: usize,
        mut f: F,
    ) -> Vec<R>
    where
        F: FnMut(&'a T) -> Fut,
        Fut: std::future::Future<Output = R>,
    {
        use futures_util::stream::{FuturesOrdered, StreamExt as _};
        let mut in_flight = FuturesOrdered::new();
        let mut next = items.iter();
        let mut out = Vec::with_capacity(items.len());
        loop {
            while in_flight.len() < limit.max(1) && !self.is_cancelled() {
                match next.next() {
                    Some(item) => in_flight.push_back(f(item)),
                    None => break,
                }
            }
            match in_flight.next().await {
                Some(r) => out.push(r),
                None => return out,
            }
        }
    }
}

/// The job kinds a binary runs. The engine knows none of its own.
#[derive(Default, Clone)]
pub struct Registry {
    jobs: std::collections::BTreeMap<JobName, Arc<dyn Job>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.jobs.keys()).finish()
    }
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a job kind; a second kind with the same name replaces the first.
    pub fn register(mut self, job: impl Job) -> Self {
        self.jobs.insert(job.name(), Arc::new(job));
        self
    }

    pub fn get(&self, name: &JobName) -> Option<&Arc<dyn Job>> {
        self.jobs.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &JobName> {
        self.jobs.keys()
    }

    pub fn jobs(&self) -> impl Iterator<Item = &Arc<dyn Job>> {
        self.jobs.values()
    }

    /// The kinds among `names` (those a configuration declares): a process
    /// runs, schedules and migrates only these.
    pub fn only<'a>(&self, names: impl IntoIterator<Item = &'a JobName>) -> Self {
        let mut jobs = std::collections::BTreeMap::new();
        for n in names {
            if let Some(j) = self.jobs.get(n) {
                jobs.insert(n.clone(), j.clone());
            }
        }
        Self { jobs }
    }

    /// Every kind's defaults, the base the config file is applied to.
    pub fn default_configs(&self) -> std::collections::BTreeMap<JobName, JobConfig> {
        self.jobs
            .iter()
            .map(|(n, j)| (n.clone(), j.default_config()))
            .collect()
    }

    /// Every registered kind's output tables, sorted, without repeats.
    pub fn output_tables(&self) -> Vec<&'static str> {
        let mut t: Vec<&'static str> = self
            .jobs
            .values()
            .flat_map(|j| j.output_tables().iter().copied())
            .collect();
        t.sort_unstable();
        t.dedup();
        t
    }

    /// The job kinds' migrations, for [`crate::db::migrate`].
    pub fn migrations(&self) -> Vec<&'static Migrator> {
        self.jobs.values().filter_map(|j| j.migrations()).collect()
    }

    /// Resolves a job name typed by a user, with a clear error.
    pub fn resolve(&self, name: &str) -> Result<JobName, String> {
        let known: Vec<&str> = self.jobs.keys().map(JobName::as_str).collect();
        JobName::parse(name)
            .ok()
            .filter(|n| self.jobs.contains_key(n))
            .ok_or_else(|| {
                format!(
                    "unknown job {:?} (declared: {}; a job exists only when the configuration has a [jobs.<name>] table for it)",
                    crate::key::shown(name),
                    if known.is_empty() { "none".to_owned() } else { known.join(", ") }
                )
            })
    }
}
