//! The queue: the only module that writes `batch_job_run` and
//! `batch_job_attempt`. Every state change is one conditional statement whose
//! `WHERE` names the state it expects (and, for a worker, its lease token), so
//! two actors racing on one run can never both win. All times come from the
//! [`Clock`], which is the database's `now()` outside tests.
//!
//! The queue: every statement on `batch_job_run` and `batch_job_attempt`, and the writes to
//! `batch_operator_action`. `mod.rs` holds the protocol (enqueue, claim, heartbeat, fence, finish,
//! recovery, operator actions); `context.rs` the run-context columns (binding them at enqueue,
//! reading them back, `freeze_held` for a claimed run without one, `legacy_runs`/`freeze_legacy`
//! for `migrate`); `views.rs` the read views (`status`, `stale_runs`, `gauges`), which share one
//! SQL rule for what is stale (`LIVE`), from each run's stored policies and never from a
//! configuration file (a run without stored policies is judged by the engine's defaults); `status`
//! lists exactly the runs `stale_runs` returns, with their conclusions.
//!
//! - `enqueue` inserts many runs in one statement with `ON CONFLICT DO NOTHING`, each with its
//!   `RunContext` in the context columns, sends NOTIFY in the same transaction, and reports
//!   inserted and duplicate keys in input order. After the commit it adds one per key to
//!   `batchonce_runs_enqueued_total` or `batchonce_runs_deduplicated_total` (label `job`). A
//!   `NewRun` with a `skip_reason` (a period the business calendar skips) is inserted as SKIPPED,
//!   with the reason in `error_message` and `finished_at` set, instead of PENDING.
//!   `NewRun::new(key, date, cfg)` builds a pending run with the context `cfg` gives it.
//! - `claim` claims runs and inserts their attempt rows in one statement. Its pick is the database
//!   function `batchonce_due_runs` (fifth migration), which reads due runs through the partial
//!   index `batch_job_run_claim_idx` in claim order and stops at the limit, locking with `SKIP
//!   LOCKED`; the function's `SET enable_bitmapscan = off, enable_sort = off` keep it on that plan.
//!   As a plain query, under statistics that said few runs were pending (a table never analyzed, or
//!   one analyzed while it was all history) the planner read every pending run with a bitmap scan
//!   and sorted them on each claim: 3 ms per claim of 10 at 20,000 pending, quadratic over a
//!   backlog. The claim then updates the picked runs by an array of keys (`job_key =
//!   ANY(ARRAY(SELECT …))`), not a join, so the cached plan cannot hash the whole table either. It
//!   also sets `heartbeat_processed = processed_count`, so the items of earlier attempts never look
//!   like progress of the new one in `stale_runs`.
//! - `heartbeat` extends all of a process's leases in one statement, reporting each as extended,
//!   busy or lost. It also copies each extended run's `processed_count` into `heartbeat_processed`.
//!   `FencedTx::commit` does not set that column, so `processed_count > heartbeat_processed` means
//!   the run advanced since its last heartbeat statement.
//! - `begin_fenced` opens a `FencedTx`, which holds the run row locked. It first sets
//!   `idle_in_transaction_session_timeout` for that transaction alone (`set_config(…, true)`) to
//!   twice the run's lease, at least `MIN_FENCED_IDLE` (10 s): the session-wide value of
//!   `db::connect_worker` follows the longest lease of every kind the worker runs (60 s beside the
//!   default kinds, which `workers/tests/hosts.rs` ran into with a 2 s lease) and cannot be sent
//!   through PgBouncer. `FencedTx::commit` updates the counters, extends the lease from
//!   `clock_timestamp()` (the commit, not the transaction's start) and commits the items. The fence
//!   query also returns `pg_backend_pid()` and `now()`, the session and transaction it runs in
//!   (`FencedTx::session`, a `blockers::SessionTx`); `FencedTx::track` lists them in a
//!   `blockers::FenceSessions` until the transaction ends, which `JobContext::fenced` does for the
//!   worker. Through PgBouncer the pid is the server's, and one transaction keeps one server
//!   connection.
//! - `finish_many` ends up to `MAX_FINISH_BATCH` (1,000) attempts in one statement and one commit:
//!   succeeded, skipped, retry, fatal or release, each conditional on its own `(job_key,
//!   lease_token)` and closing its own attempt row. It returns each run's new status in input
//!   order, or `None` for a token that no longer owns its run (nothing is written for that one, the
//!   others are unaffected); a key twice is refused before anything is written. Rows are locked in
//!   key order, so two batches never wait on each other in a cycle, and the statement starts from
//!   its input rows and looks runs up by key, so its cost grows with the batch, not the table.
//!   `finish` is `finish_many` of one. A release also raises the run's `max_attempts` by one,
//!   capped at 1000. `finish_many_within` is the same statement in a transaction with
//!   `lock_timeout` set (`SET LOCAL`, through `set_config`), for a worker's release after an abort.
//! - `backoff_delay` computes the retry delay with jitter.
//! - `recover_expired(jobs, legacy_retry, clock)` handles lease-expiry recovery for the worker's
//!   jobs, following each run's stored `on_lease_expiry`; `legacy_retry` (the worker's own `retry`
//!   jobs) serves only runs without a context. It locks with `FOR UPDATE SKIP LOCKED`, so a run
//!   whose holder has a fence open is left until the fence ends.
//! - `finish_many_detailed` is `finish_many` that also says whether each attempt's lease had
//!   already expired when it finished (accepted, as nobody took the run over, but the worker counts
//!   it as a lost lease).
//! - `list_runs`, `show_run` and `status` serve inspection. `actions` lists a run's rows of
//!   `batch_operator_action`, oldest first, for `runs show`.
//! - `stale_runs(clock)` lists the RUNNING runs that started more than their stored `stale_after`
//!   ago, or whose lease expired under their stored policy `hold` (a run without stored policies:
//!   the engine's defaults, never a file). `status` lists exactly these, with their conclusions.
//!   Each `StaleRun` carries the evidence: attempt, owner, seconds running, whether the lease
//!   expired, heartbeat age, `processed_count` and whether it advanced since the last heartbeat,
//!   the owner's `batch_worker.last_seen` and its age, and whether `pg_stat_activity` has a session
//!   in the current database (`datname = current_database()`) whose `application_name` is the
//!   owner. Its conclusion is `blocked` when a session of the owner waits on a lock
//!   (`blockers::lock_wait`, whose `LockWait` the `StaleRun` carries as `lock_wait` with the
//!   blocking sessions), before any other; `alive-slow` when that session is connected and the
//!   heartbeat is younger than `lease_ttl`, `dead` when there is no session and neither the
//!   heartbeat nor `last_seen` is younger than `lease_ttl`, and `unknown` otherwise.
//! - `Action` (`Fail`, `Rerun`, `Skip`) and `OperatorRequest` describe an operator action.
//!   `Action::allowed(force)` gives the states it may start from: fail RUNNING, or with force
//!   RUNNING or PENDING; rerun FAILED, or with force FAILED, SUCCEEDED or SKIPPED; skip PENDING or
//!   FAILED, whatever the force. A RUNNING run can be failed without force only if its lease has
//!   expired or it started more than the request's `stale_after` ago.
//! - `apply_action` runs one transaction. `check_action` locks the run with `SELECT … FOR UPDATE`
//!   and checks the state, returning `Refused` (`<action> refused for KEY: it is STATUS …`) on a
//!   mismatch. Then one conditional `UPDATE … WHERE job_key = $1 AND status = ANY(allowed)` writes
//!   the new state. `fail` draws a new token when the run was RUNNING, which fences the holder, and
//!   closes the open attempt as `operator_failed`. `rerun` sets PENDING, `next_run_at = now` and
//!   `max_attempts = LEAST(attempts + the job's max_attempts, 1000)`, so the budget is renewed and
//!   attempt numbers stay unique. Every action clears `lease_expires_at` and writes `error_message`
//!   (`failed by operator O: R`, `re-run by operator O: R`, `skipped by operator O: R`). Last, the
//!   audit row goes into `batch_operator_action` (operator, action, key, reason, before and after
//!   status; `session_user_name` takes its default, `session_user`). Because of the row lock, of
//!   two operators acting at once the second waits and is checked against the first one's result,
//!   so the same action never applies twice. `preview_action` (`--dry-run`) runs `check_action` and
//!   rolls back. `apply_action_in` and `preview_action_in` do the same in a transaction the caller
//!   opened, which is how `blockers::act` sets a lock timeout; `check_action(…, lock: false)` reads
//!   the row without locking it.
//! - `blockers` (`src/queue/blockers.rs`) is about sessions that hold locks others wait for.
//!   `FenceSessions` and `terminate_own` serve the worker (see `worker.rs`). `blockers_of(pid)`
//!   lists the sessions that `pg_blocking_pids` names for a session, each with the sessions that
//!   block it in turn, as `pg_stat_activity` shows them (`Session`: pid, `application_name`, user,
//!   backend type, state, transaction start and age, statement start and age, wait event, blocking
//!   pids, the first 200 characters of the query). `lock_wait(key, owner)` finds the owner's
//!   session that waits on a lock, preferring one known to work on the run: its `backend_xid` is
//!   the row's `xmax`, or the owner holds no other run. The row's `xmax` names its one locker only
//!   until a heartbeat locks the row too, after which it is a multixact, which SQL cannot tell from
//!   a transaction id. `act` runs an operator action in a transaction whose first statement sets
//!   `lock_timeout` and reads `pg_backend_pid()`. While the action runs, it asks `blockers_of`
//!   about that pid every 100 ms on a second connection. A lock timeout (SQLSTATE 55P03) becomes
//!   `ActError::Blocked` with the last sessions seen. With `terminate_blocker`, `act` first checks
//!   the action without the lock, because a refused action is not worth a terminated session. It
//!   then tries the action once more. As soon as that try waits for one of the same client sessions
//!   (pid and `xact_start`), `terminate_audited` commits a `terminate-blocker` audit row whose
//!   `detail` describes them. In a second transaction it then takes the row `FOR NO KEY UPDATE`
//!   (compatible with the fence's `FOR KEY SHARE`), terminates them (`pg_terminate_backend` in a
//!   `MATERIALIZED` CTE, so the filter is applied before the call), and rolls back once they are
//!   gone and their worker's next statement waits behind it or the action, or after 1 s, clearing
//!   the `pg_stat_activity` snapshot (`pg_stat_clear_snapshot()`) before each look. Without that
//!   hold, a statement that arrived between the session's death and the woken action's re-lock
//!   needed no wait and took the row first: the worker's finish of its failed handler, a retry that
//!   left the run PENDING.
//! - `gauges(pool, also, clock)` reads, in one statement, everything the exporter publishes for
//!   every job the database knows (the distinct `job_name`s of `batch_job_run` by a loose index
//!   scan, those of `batch_process_config`) and each of `also`: runs per status (every `RunStatus`,
//!   zeros included), the age of the oldest due PENDING run (0 when none), stale runs by the same
//!   rule as `stale_runs`, the last SUCCEEDED `finished_at` as Unix time (`None` if never), the
//!   newest `finished_at` of the runs FAILED now (0 when none), the newest `period_start` done
//!   (SUCCEEDED or SKIPPED) that has begun, the most `attempts` among PENDING and RUNNING runs, and
//!   RUNNING runs with an expired lease. A job without runs gets zeros, so the alert rules always
//!   see a series.
//! - `delete_preflight_run` deletes one scratch run of `preflight` and its attempt rows in one
//!   transaction. It refuses any key whose job is not `PREFLIGHT_JOB` (`batchonce-preflight`), and
//!   its `DELETE` also names that job.
//! - `truncate` cuts messages to 1,000 characters on a char boundary. `src/cli/` also cuts every
//!   error line with it.
//! - `QueueError::is_transient` classifies connection trouble, shutdown, serialization failures and
//!   deadlocks as worth retrying.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};
use rand::Rng;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Postgres, Row, Transaction};

use crate::clock::Clock;
use crate::context::RunContext;
use crate::key::{JobKey, JobName};
use crate::telemetry;

pub mod blockers;
pub mod context;
mod views;

pub use views::{
    gauges, stale_runs, status, JobGauges, QueueStatus, StaleBrief, StaleRun, StatusCount,
};

/// The channel `enqueue` notifies so idle workers wake at once.
pub const NOTIFY_CHANNEL: &str = "batchonce_run";
/// Longest error message stored (the schema's CHECK).
pub const MAX_ERROR_CHARS: usize = 1000;
/// Largest payload stored, in bytes of its JSON text (the schema's CHECK).
pub const MAX_PAYLOAD_BYTES: usize = 65_536;

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The caller's lease token no longer owns the run: another worker or an
    /// operator took it over. Nothing was written.
    #[error("lease lost on {0}: the run was taken over; nothing was written")]
    LeaseLost(String),
    #[error("{0}")]
    Invalid(String),
    /// A transient database failure reported on behalf of a batched
    /// statement (the worker's completer), where the original error cannot be
    /// handed to every caller.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

impl QueueError {
    /// Whether retrying the same call later may succeed (connection trouble,
    /// a restarting server, serialization failures).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Database(e) => is_transient(e),
            Self::Unavailable(_) => true,
            _ => false,
        }
    }
}

/// Connection-level trouble and server restarts, as opposed to bad SQL or data.
pub fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => {
            let code = db.code();
            let code = code.as_deref().unwrap_or("");
            // 08: connection exception, 57P: operator intervention (shutdown),
            // 40001/40P01: serialization failure and deadlock, 53: resources.
            code.starts_with("08")
                || code.starts_with("57P")
                || code.starts_with("53")
                || code == "40001"
                || code == "40P01"
        }
        _ => false,
    }
}

/// The states of a run (DESIGN.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RunStatus {
    Pending,
    Running,
    Succeeded,
    Failed,
    Skipped,
}

impl RunStatus {
    pub const ALL: [RunStatus; 5] = [
        Self::Pending,
        Self::Running,
        Self::Succeeded,
        Self::Failed,
        Self::Skipped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Running => "RUNNING",
            Self::Succeeded => "SUCCEEDED",
            Self::Failed => "FAILED",
            Self::Skipped => "SKIPPED",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s))
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Skipped)
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A run to enqueue.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub key: JobKey,
    pub job: JobName,
    pub business_date: NaiveDate,
    pub max_attempts: u32,
    pub payload: serde_json::Value,
    /// Set for periods the business calendar skips: the run is recorded as
    /// SKIPPED with this reason instead of being queued.
    pub skip_reason: Option<String>,
    /// What defines the run, stored with it (see [`crate::context`]).
    pub context: RunContext,
}

impl NewRun {
    /// A pending run of `key` with the context `cfg` gives it (no payload,
    /// not skipped).
    pub fn new(
        key: JobKey,
        business_date: NaiveDate,
        cfg: &crate::config::JobConfig,
    ) -> Result<Self, crate::context::PeriodError> {
        let period = key.as_str().split_once(':').map_or("", |(_, p)| p);
        let context = RunContext::for_key(cfg, business_date, period)?;
        let job = JobName::parse(key.job_name())
            .map_err(|_| crate::context::PeriodError(key.to_string()))?;
        Ok(Self {
            key,
            job,
            business_date,
            max_attempts: cfg.max_attempts,
            payload: serde_json::json!({}),
            skip_reason: None,
            context,
        })
    }
}

/// What one enqueue statement did, key by key, in input order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EnqueueReport {
    pub enqueued: Vec<JobKey>,
    pub duplicates: Vec<JobKey>,
}

/// Inserts many runs in one statement; existing keys are reported as
/// duplicates and left untouched. Notifies idle workers in the same
/// transaction, so the wake-up is sent only if the rows commit.
pub async fn enqueue(
    pool: &PgPool,
    runs: &[NewRun],
    clock: Clock,
) -> Result<EnqueueReport, QueueError> {
    let mut seen = HashSet::new();
    let mut keys = Vec::new();
    let mut names = Vec::new();
    let mut dates = Vec::new();
    let mut maxes = Vec::new();
    let mut payloads = Vec::new();
    let mut reasons: Vec<Option<String>> = Vec::new();
    let mut contexts = context::Arrays::default();
    let mut order = Vec::new();
    for r in runs {
        if r.key.job_name() != r.job.as_str() {
            return Err(QueueError::Invalid(format!(
                "job key {} does not belong to job {}",
                r.key, r.job
            )));
        }
        let size = r.payload.to_string().len();
        if size > MAX_PAYLOAD_BYTES {
            return Err(QueueError::Invalid(format!(
                "payload of {} is {size} bytes; the limit is {MAX_PAYLOAD_BYTES}",
                r.key
            )));
        }
        order.push(r.key.clone());
        // The same key twice in one call is one run: the second is a duplicate.
        if seen.insert(r.key.clone()) {
            keys.push(r.key.as_str().to_owned());
            names.push(r.job.as_str().to_owned());
            dates.push(r.business_date);
            maxes.push(r.max_attempts as i32);
            payloads.push(r.payload.clone());
            reasons.push(r.skip_reason.as_deref().map(truncate));
            contexts.push(&r.context);
        }
    }
    if keys.is_empty() {
        return Ok(EnqueueReport::default());
    }
    // The database function inserts PENDING runs, or SKIPPED ones with a
    // calendar reason, and nothing else (migration 20261203000004); it
    // notifies idle workers in the same statement.
    let mut stmt = crate::db::statement(pool).await?;
    let q = crate::db::query(
        "SELECT k FROM batchonce_enqueue($1, $2, $3, $4, $5, $6, $7, \
         $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19) AS k",
    )
    .bind(&keys)
    .bind(&names)
    .bind(&dates)
    .bind(&maxes)
    .bind(&payloads)
    .bind(clock.bind())
    .bind(&reasons);
    let inserted: Vec<String> = contexts
        .bind(q)
        .fetch_all(stmt.conn())
        .await?
        .iter()
        .map(|r| r.try_get("k"))
        .collect::<Result<_, _>>()?;
    stmt.done().await?;
    let inserted: HashSet<String> = inserted.into_iter().collect();
    let mut report = EnqueueReport::default();
    let mut reported = HashSet::new();
    for k in order {
        let job = k.job_name().to_owned();
        if inserted.contains(k.as_str()) && reported.insert(k.clone()) {
            metrics::counter!(telemetry::RUNS_ENQUEUED, "job" => job).increment(1);
            report.enqueued.push(k);
        } else {
            metrics::counter!(telemetry::RUNS_DEDUPLICATED, "job" => job).increment(1);
            report.duplicates.push(k);
        }
    }
    Ok(report)
}

/// What a worker may claim: job names, with the lease length its own
/// configuration gives, which applies only to runs that carry no context of
/// their own (enqueued by the previous release).
#[derive(Debug, Clone)]
pub struct ClaimSpec {
    pub job: JobName,
    pub lease_ttl: Duration,
}

/// A run held by a worker, with the token that fences its writes.
#[derive(Debug, Clone)]
pub struct Lease {
    pub key: JobKey,
    pub job: JobName,
    pub business_date: NaiveDate,
    pub attempt: i32,
    pub max_attempts: i32,
    pub token: i64,
    pub expires_at: DateTime<Utc>,
    pub processed_count: i64,
    pub payload: serde_json::Value,
    /// What defines the run; `None` for a run the previous release enqueued,
    /// which the worker freezes before its handler starts.
    pub context: Option<RunContext>,
}

/// The pair every fenced statement checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub key: JobKey,
    pub token: i64,
}

impl Lease {
    pub fn fence(&self) -> Fence {
        Fence {
            key: self.key.clone(),
            token: self.token,
        }
    }
}

/// Claims up to `limit` due PENDING runs in one statement: `SKIP LOCKED` keeps
/// concurrent claimers off each other's rows, every claim draws a new token
/// from the sequence, and the attempt row is written by the same statement.
pub async fn claim(
    pool: &PgPool,
    worker_id: &str,
    specs: &[ClaimSpec],
    limit: u32,
    clock: Clock,
) -> Result<Vec<Lease>, QueueError> {
    if limit == 0 || specs.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<&str> = specs.iter().map(|s| s.job.as_str()).collect();
    let ttls: Vec<f64> = specs.iter().map(|s| s.lease_ttl.as_secs_f64()).collect();
    let mut stmt = crate::db::statement(pool).await?;
    // The claim runs in a database function (migration 20261203000004),
    // which alone may turn a PENDING run into a RUNNING one with a new token.
    let rows = crate::db::query("SELECT * FROM batchonce_claim($1, $2, $3, $4, $5)")
        .bind(&names)
        .bind(&ttls)
        .bind(limit as i64)
        .bind(worker_id)
        .bind(clock.bind())
        .fetch_all(stmt.conn())
        .await?;
    stmt.done().await?;
    rows.iter().map(lease_from_row).collect()
}

fn lease_from_row(row: &PgRow) -> Result<Lease, QueueError> {
    let key: String = row.try_get("job_key")?;
    let job: String = row.try_get("job_name")?;
    Ok(Lease {
        key: JobKey::parse(&key).map_err(|e| QueueError::Invalid(e.to_string()))?,
        job: JobName::parse(&job).map_err(|e| QueueError::Invalid(e.to_string()))?,
        business_date: row.try_get("business_date")?,
        attempt: row.try_get("attempts")?,
        max_attempts: row.try_get("max_attempts")?,
        token: row.try_get("lease_token")?,
        expires_at: row.try_get("lease_expires_at")?,
        processed_count: row.try_get("processed_count")?,
        payload: row.try_get("payload")?,
        context: context::from_row(row)?,
    })
}

/// A lease to extend, with its length.
#[derive(Debug, Clone)]
pub struct HeldLease {
    pub fence: Fence,
    pub lease_ttl: Duration,
}

/// The outcome of one heartbeat for all leases a process holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HeartbeatReport {
    /// Extended now.
    pub extended: Vec<JobKey>,
    /// Still ours, but another statement holds the row's update lock (a
    /// fenced commit writing its counters, or a takeover waiting for its
    /// turn); the heartbeat does not wait behind it and tries again next time.
    pub busy: Vec<JobKey>,
    /// No longer ours: cancel their handlers.
    pub lost: Vec<JobKey>,
}

/// Extends every held lease in one statement. A fenced transaction's
/// FOR KEY SHARE lock does not stop it, so a chunk, or a command job's
/// script, that keeps its fence for most of the lease keeps its lease; a row
/// whose update lock another statement holds is skipped rather than waited
/// for, so one run never stalls the heartbeats of the others.
pub async fn heartbeat(
    pool: &PgPool,
    held: &[HeldLease],
    clock: Clock,
) -> Result<HeartbeatReport, QueueError> {
    if held.is_empty() {
        return Ok(HeartbeatReport::default());
    }
    let keys: Vec<&str> = held.iter().map(|h| h.fence.key.as_str()).collect();
    let tokens: Vec<i64> = held.iter().map(|h| h.fence.token).collect();
    let ttls: Vec<f64> = held.iter().map(|h| h.lease_ttl.as_secs_f64()).collect();
    let mut stmt = crate::db::statement(pool).await?;
    let rows = crate::db::query("SELECT * FROM batchonce_heartbeat($1, $2, $3, $4)")
        .bind(&keys)
        .bind(&tokens)
        .bind(&ttls)
        .bind(clock.bind())
        .fetch_all(stmt.conn())
        .await?;
    stmt.done().await?;
    let mut report = HeartbeatReport::default();
    for row in rows {
        let key: String = row.try_get("job_key")?;
        let key = JobKey::parse(&key).map_err(|e| QueueError::Invalid(e.to_string()))?;
        let extended: bool = row.try_get("extended")?;
        let mine: bool = row.try_get("mine")?;
        match (extended, mine) {
            (true, _) => report.extended.push(key),
            (false, true) => report.busy.push(key),
            (false, false) => report.lost.push(key),
        }
    }
    Ok(report)
}

/// A transaction that may write a run's items: it began by checking and
/// locking `(job_key, lease_token, RUNNING, lease not expired)`, and keeps the
/// row locked until commit, so no takeover can happen in between and a worker
/// whose lease was taken can never commit.
pub struct FencedTx {
    tx: Transaction<'static, Postgres>,
    fence: Fence,
    /// The server session and transaction the fence runs in.
    session: blockers::SessionTx,
    /// Set while a worker tracks this transaction ([`FencedTx::track`]).
    tracked: Option<blockers::Tracked>,
    lease_ttl: Duration,
    clock: Clock,
    processed: i64,
    failed: i64,
}

impl std::fmt::Debug for FencedTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedTx")
            .field("fence", &self.fence)
            .field("processed", &self.processed)
            .field("failed", &self.failed)
            .finish()
    }
}

/// The shortest idle time a fenced transaction is given between two of its
/// statements before the server ends it: twice the run's lease, but never
/// less than this, so a handler that works between statements is not cut off.
pub const MIN_FENCED_IDLE: Duration = Duration::from_secs(10);

/// Opens a fenced transaction, or fails with [`QueueError::LeaseLost`].
pub async fn begin_fenced(
    pool: &PgPool,
    fence: &Fence,
    lease_ttl: Duration,
    clock: Clock,
) -> Result<FencedTx, QueueError> {
    let mut tx = pool.begin().await?;
    // The run row stays locked until this transaction ends, and lease
    // recovery skips locked rows, so a holder that stops mid-chunk (SIGSTOP,
    // a cut network) must not keep it open for long. The session-wide
    // timeout of `db::connect_worker` follows the largest lease of all the
    // kinds a worker runs (60 s beside the default kinds even for a 2 s
    // lease) and cannot be sent through PgBouncer at all; this one follows
    // this run's own lease and lasts for this transaction only.
    let idle = (lease_ttl * 2).max(MIN_FENCED_IDLE);
    crate::db::query("SELECT set_config('idle_in_transaction_session_timeout', $1, true)")
        .bind(format!("{}ms", idle.as_millis()))
        .execute(&mut *tx)
        .await?;
    // FOR KEY SHARE: every takeover changes the lease token, a unique key,
    // so its UPDATE takes FOR UPDATE and waits for this lock, while the
    // holder's heartbeat changes no key and passes it (migration
    // 20261203000001). The commit's own update of the row (NO KEY UPDATE)
    // does not conflict with a KEY SHARE lock, its own or another fenced
    // transaction's, so upgrading it cannot deadlock.
    // The server's pid and this transaction's start name the session, so
    // a worker that abandons the handler can end it if it is still running
    // (and locking) on the server; through PgBouncer too, since the pid is
    // the server's, and one transaction stays on one server connection.
    let ok: Option<(i32, DateTime<Utc>)> =
        crate::db::query_as("SELECT pid, xact_start FROM batchonce_fence_open($1, $2, $3)")
            .bind(fence.key.as_str())
            .bind(fence.token)
            .bind(clock.bind())
            .fetch_optional(&mut *tx)
            .await?;
    let Some((pid, xact_start)) = ok else {
        return Err(QueueError::LeaseLost(fence.key.to_string()));
    };
    Ok(FencedTx {
        tx,
        fence: fence.clone(),
        session: blockers::SessionTx { pid, xact_start },
        tracked: None,
        lease_ttl,
        clock,
        processed: 0,
        failed: 0,
    })
}

impl FencedTx {
    /// The connection to write items with; every statement on it is inside
    /// the fence.
    pub fn conn(&mut self) -> &mut PgConnection {
        &mut self.tx
    }

    /// Counts items this transaction processed and failed; they reach the
    /// run's counters only if it commits.
    pub fn add_progress(&mut self, processed: i64, failed: i64) {
        self.processed += processed;
        self.failed += failed;
    }

    /// The counts added so far.
    pub fn progress(&self) -> (i64, i64) {
        (self.processed, self.failed)
    }

    /// The server session this transaction runs in.
    pub fn session(&self) -> blockers::SessionTx {
        self.session
    }

    /// Lists this transaction's session in `set` until the transaction ends
    /// (commit, rollback or drop).
    pub fn track(&mut self, set: &blockers::FenceSessions) {
        self.tracked = Some(set.add(self.session));
    }

    /// Advances the run's counters and extends its lease (progress is proof
    /// of life), then commits everything written in the fence.
    pub async fn commit(mut self) -> Result<(i64, i64), QueueError> {
        // The run's and the attempt's counters, and the lease extended, in
        // the database function only a lease holder can call with effect.
        let n: i32 =
            crate::db::query_scalar("SELECT batchonce_fence_commit($1, $2, $3, $4, $5, $6)")
                .bind(self.fence.key.as_str())
                .bind(self.fence.token)
                .bind(self.processed)
                .bind(self.failed)
                .bind(self.lease_ttl.as_secs_f64())
                .bind(self.clock.bind())
                .fetch_one(&mut *self.tx)
                .await?;
        if n != 1 {
            // Unreachable while the row lock is held; checked all the same.
            return Err(QueueError::LeaseLost(self.fence.key.to_string()));
        }
        self.tx.commit().await?;
        Ok((self.processed, self.failed))
    }

    /// Abandons everything written in the fence.
    pub async fn rollback(self) -> Result<(), QueueError> {
        self.tx.rollback().await?;
        Ok(())
    }
}

/// How an attempt ended, as the worker reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    Succeeded,
    Skipped {
        reason: String,
    },
    /// A retryable failure: PENDING again after `delay`, or FAILED when the
    /// attempts are used up.
    Retry {
        error: String,
        delay: Duration,
    },
    /// A fatal failure: FAILED now.
    Fatal {
        error: String,
    },
    /// Graceful shutdown: back to PENDING now with a new token.
    Release,
}

/// Counts of one attempt (the history row accumulates them at each fenced
/// commit; these are for the caller's logs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttemptCounts {
    pub processed: i64,
    pub failed: i64,
}

/// Ends an attempt with one conditional statement on `(job_key, lease_token)`
/// that also closes the attempt row. Returns the run's new status, or
/// [`QueueError::LeaseLost`] when the token no longer owns it.
pub async fn finish(
    pool: &PgPool,
    fence: &Fence,
    finish: &Finish,
    clock: Clock,
) -> Result<RunStatus, QueueError> {
    let mut results = finish_many(pool, &[(fence.clone(), finish.clone())], clock).await?;
    match results.pop().flatten() {
        Some(s) => Ok(s),
        None => Err(QueueError::LeaseLost(fence.key.to_string())),
    }
}

/// The most attempts one [`finish_many`] statement ends; callers split
/// larger sets.
pub const MAX_FINISH_BATCH: usize = 1000;

/// Ends many attempts in one statement (and one commit): each is conditional
/// on its own `(job_key, lease_token)` exactly like [`finish`], and closes its
/// attempt row in the same statement. Returns, in input order, each run's new
/// status, or `None` where the token no longer owns the run (nothing was
/// written for that one; the others are unaffected).
pub async fn finish_many(
    pool: &PgPool,
    items: &[(Fence, Finish)],
    clock: Clock,
) -> Result<Vec<Option<RunStatus>>, QueueError> {
    Ok(finish_many_detailed(pool, items, clock)
        .await?
        .into_iter()
        .map(|f| f.map(|f| f.status))
        .collect())
}

/// One attempt ended by [`finish_many_detailed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    pub status: RunStatus,
    /// The lease had expired before the finish, although nobody had taken
    /// the run over yet: the attempt outlived its lease, which the worker
    /// counts as a lost lease.
    pub lease_expired: bool,
}

/// [`finish_many`], saying also of each attempt whether its lease had
/// expired by the time it finished.
pub async fn finish_many_detailed(
    pool: &PgPool,
    items: &[(Fence, Finish)],
    clock: Clock,
) -> Result<Vec<Option<Finished>>, QueueError> {
    finish_many_within(pool, items, clock, None).await
}

/// [`finish_many_detailed`], giving up with SQLSTATE 55P03 when a row
/// stays locked longer than `lock_timeout` (a worker that must exit, whose
/// release may wait for a session it does not control).
pub async fn finish_many_within(
    pool: &PgPool,
    items: &[(Fence, Finish)],
    clock: Clock,
    lock_timeout: Option<Duration>,
) -> Result<Vec<Option<Finished>>, QueueError> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    if items.len() > MAX_FINISH_BATCH {
        return Err(QueueError::Invalid(format!(
            "{} finishes in one statement; the limit is {MAX_FINISH_BATCH}",
            items.len()
        )));
    }
    let mut keys = Vec::with_capacity(items.len());
    let mut tokens = Vec::with_capacity(items.len());
    let mut kinds = Vec::with_capacity(items.len());
    let mut messages: Vec<Option<String>> = Vec::with_capacity(items.len());
    let mut delays = Vec::with_capacity(items.len());
    let mut seen = HashSet::new();
    for (fence, finish) in items {
        // One row may be updated once per statement; a key twice is a caller
        // bug, and which of the two would win is undefined.
        if !seen.insert(fence.key.as_str()) {
            return Err(QueueError::Invalid(format!(
                "{} is finished twice in one statement",
                fence.key
            )));
        }
        let (kind, message, delay) = match finish {
            Finish::Succeeded => ("succeeded", None, 0.0),
            Finish::Skipped { reason } => ("skipped", Some(truncate(reason)), 0.0),
            Finish::Retry { error, delay } => ("retry", Some(truncate(error)), delay.as_secs_f64()),
            Finish::Fatal { error } => ("fatal", Some(truncate(error)), 0.0),
            Finish::Release => ("release", None, 0.0),
        };
        keys.push(fence.key.as_str());
        tokens.push(fence.token);
        kinds.push(kind);
        messages.push(message);
        delays.push(delay);
    }
    // The statement starts from the input rows and looks each run and
    // attempt up by key, so its cost grows with the batch, not the table.
    // (Narrowing the tables with `job_key = ANY($1)` instead made the cached
    // plan compare every row of the batch with every other: quadratic.)
    let mut stmt = match lock_timeout {
        None => crate::db::statement(pool).await?,
        Some(t) => {
            // A setting for this transaction only, so through PgBouncer too.
            let mut tx = pool.begin().await?;
            crate::db::query("SELECT set_config('lock_timeout', $1, true)")
                .bind(format!("{}ms", t.as_millis().max(1)))
                .execute(&mut *tx)
                .await?;
            crate::db::StatementConn::Tx(tx)
        }
    };
    let rows = crate::db::query("SELECT * FROM batchonce_finish($1, $2, $3, $4, $5, $6)")
        .bind(&keys)
        .bind(&tokens)
        .bind(&kinds)
        .bind(&messages)
        .bind(&delays)
        .bind(clock.bind())
        .fetch_all(stmt.conn())
        .await?;
    stmt.done().await?;
    let mut done = std::collections::HashMap::with_capacity(rows.len());
    for row in rows {
        let key: String = row.try_get("job_key")?;
        let status: String = row.try_get("status")?;
        let status = RunStatus::parse(&status)
            .ok_or_else(|| QueueError::Invalid(format!("unknown status {status}")))?;
        let lease_expired: Option<bool> = row.try_get("expired")?;
        done.insert(
            key,
            Finished {
                status,
                lease_expired: lease_expired.unwrap_or(false),
            },
        );
    }
    Ok(keys.iter().map(|k| done.get(*k).copied()).collect())
}

/// The retry delay after failed attempt `attempt` (1-based): `base * 2^(n-1)`,
/// capped at `max`, then drawn uniformly from its upper half so that runs
/// failing together do not retry together.
pub fn backoff_delay(attempt: i32, base: Duration, max: Duration) -> Duration {
    let exp = attempt.clamp(1, 31) as u32 - 1;
    let full = base.saturating_mul(2u32.saturating_pow(exp)).min(max);
    let half = full / 2;
    let jitter = rand::thread_rng().gen_range(0.0..=1.0);
    half + half.mul_f64(jitter)
}

/// A run whose lease expired and was recovered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    pub key: JobKey,
    pub previous_owner: Option<String>,
    pub status: RunStatus,
}

/// Lease-expiry recovery (DESIGN.md §4.7) for runs of `jobs` whose stored
/// policy is `retry`: a RUNNING run whose lease expired goes back to PENDING
/// with a new token, or to FAILED when that was its last attempt. The token
/// bump fences the old holder. A run the previous release enqueued stores no
/// policy; for those, `legacy_retry` names the jobs whose policy is `retry`
/// in the recovering worker's configuration.
pub async fn recover_expired(
    pool: &PgPool,
    jobs: &[JobName],
    legacy_retry: &[JobName],
    clock: Clock,
) -> Result<Vec<Recovered>, QueueError> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<&str> = jobs.iter().map(JobName::as_str).collect();
    let legacy: Vec<&str> = legacy_retry.iter().map(JobName::as_str).collect();
    let mut stmt = crate::db::statement(pool).await?;
    let rows = crate::db::query("SELECT * FROM batchonce_recover_expired($1, $3, $2)")
        .bind(&names)
        .bind(clock.bind())
        .bind(&legacy)
        .fetch_all(stmt.conn())
        .await?;
    stmt.done().await?;
    rows.iter()
        .map(|row| {
            let key: String = row.try_get("job_key")?;
            let status: String = row.try_get("status")?;
            Ok(Recovered {
                key: JobKey::parse(&key).map_err(|e| QueueError::Invalid(e.to_string()))?,
                previous_owner: row.try_get("old_owner")?,
                status: RunStatus::parse(&status)
                    .ok_or_else(|| QueueError::Invalid(format!("unknown status {status}")))?,
            })
        })
        .collect()
}

/// One run as the inspection commands show it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunView {
    pub job_key: String,
    pub job_name: String,
    pub business_date: NaiveDate,
    pub status: String,
    pub attempts: i32,
    pub max_attempts: i32,
    pub next_run_at: DateTime<Utc>,
    pub lease_owner: Option<String>,
    pub lease_token: Option<i64>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub heartbeat_at: Option<DateTime<Utc>>,
    pub enqueued_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub processed_count: i64,
    pub failed_count: i64,
    pub error_message: Option<String>,
    /// The database clock when the row was read: `lease_expires_at` and
    /// `next_run_at` are compared with it, never with this machine's clock.
    pub read_at: DateTime<Utc>,
    /// What defines the run (time zone, period, policies); `None` for a run
    /// the previous release enqueued and nobody has claimed since.
    #[serde(serialize_with = "serialize_context")]
    pub context: Option<RunContext>,
}

fn serialize_context<S: serde::Serializer>(
    c: &Option<RunContext>,
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::Serialize as _;
    c.as_ref().map(RunContext::to_json).serialize(s)
}

/// One attempt from the history.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AttemptView {
    pub attempt: i32,
    pub lease_token: i64,
    pub worker_id: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub outcome: Option<String>,
    pub error_message: Option<String>,
    pub processed_count: i64,
    pub failed_count: i64,
}

const RUN_COLUMNS: &str = "r.job_key, r.job_name, r.business_date, r.status, r.attempts, \
    r.max_attempts, r.next_run_at, r.lease_owner, r.lease_token, r.lease_expires_at, \
    r.heartbeat_at, r.enqueued_at, r.started_at, r.finished_at, r.processed_count, \
    r.failed_count, r.error_message, now() AS read_at";

fn run_from_row(row: &PgRow) -> Result<RunView, QueueError> {
    Ok(RunView {
        job_key: row.try_get("job_key")?,
        job_name: row.try_get("job_name")?,
        business_date: row.try_get("business_date")?,
        status: row.try_get("status")?,
        attempts: row.try_get("attempts")?,
        max_attempts: row.try_get("max_attempts")?,
        next_run_at: row.try_get("next_run_at")?,
        lease_owner: row.try_get("lease_owner")?,
        lease_token: row.try_get("lease_token")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        heartbeat_at: row.try_get("heartbeat_at")?,
        enqueued_at: row.try_get("enqueued_at")?,
        started_at: row.try_get("started_at")?,
        finished_at: row.try_get("finished_at")?,
        processed_count: row.try_get("processed_count")?,
        failed_count: row.try_get("failed_count")?,
        error_message: row.try_get("error_message")?,
        read_at: row.try_get("read_at")?,
        context: context::from_row(row)?,
    })
}

/// Runs, newest business date first, optionally filtered.
pub async fn list_runs(
    pool: &PgPool,
    status: Option<RunStatus>,
    job: Option<&JobName>,
    limit: u32,
) -> Result<Vec<RunView>, QueueError> {
    let sql = format!(
        "SELECT {RUN_COLUMNS}, {} FROM batch_job_run r \
         WHERE ($1::text IS NULL OR r.status = $1) AND ($2::text IS NULL OR r.job_name = $2) \
         ORDER BY r.business_date DESC, r.job_key LIMIT $3",
        context::COLUMNS
    );
    let mut stmt = crate::db::statement(pool).await?;
    let rows = crate::db::query(&sql)
        .bind(status.map(RunStatus::as_str))
        .bind(job.map(JobName::as_str))
        .bind(limit as i64)
        .fetch_all(stmt.conn())
        .await?;
    stmt.done().await?;
    rows.iter().map(run_from_row).collect()
}

/// One run and its attempt history, or `None` if the key is unknown.
pub async fn show_run(
    pool: &PgPool,
    key: &JobKey,
) -> Result<Option<(RunView, Vec<AttemptView>)>, QueueError> {
    let sql = format!(
        "SELECT {RUN_COLUMNS}, {} FROM batch_job_run r WHERE r.job_key = $1",
        context::COLUMNS
    );
    let mut stmt = crate::db::statement(pool).await?;
    let Some(row) = crate::db::query(&sql)
        .bind(key.as_str())
        .fetch_optional(stmt.conn())
        .await?
    else {
        return Ok(None);
    };
    let run = run_from_row(&row)?;
    let attempts = crate::db::query(
        "SELECT attempt, lease_token, worker_id, started_at, finished_at, outcome, \
         error_message, processed_count, failed_count \
         FROM batch_job_attempt WHERE job_key = $1 ORDER BY attempt",
    )
    .bind(key.as_str())
    .fetch_all(stmt.conn())
    .await?
    .iter()
    .map(|r| {
        Ok(AttemptView {
            attempt: r.try_get("attempt")?,
            lease_token: r.try_get("lease_token")?,
            worker_id: r.try_get("worker_id")?,
            started_at: r.try_get("started_at")?,
            finished_at: r.try_get("finished_at")?,
            outcome: r.try_get("outcome")?,
            error_message: r.try_get("error_message")?,
            processed_count: r.try_get("processed_count")?,
            failed_count: r.try_get("failed_count")?,
        })
    })
    .collect::<Result<Vec<_>, sqlx::Error>>()?;
    stmt.done().await?;
    Ok(Some((run, attempts)))
}

/// An operator action (DESIGN.md §4.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// RUNNING (stale or lease-expired; any with force) or PENDING with
    /// force → FAILED, fencing the holder.
    Fail,
    /// FAILED (SUCCEEDED or SKIPPED with force) → PENDING, budget renewed.
    Rerun,
    /// PENDING or FAILED → SKIPPED.
    Skip,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fail => "fail",
            Self::Rerun => "rerun",
            Self::Skip => "skip",
        }
    }

    fn allowed(self, force: bool) -> &'static [&'static str] {
        match (self, force) {
            (Self::Fail, false) => &["RUNNING"],
            (Self::Fail, true) => &["RUNNING", "PENDING"],
            (Self::Rerun, false) => &["FAILED"],
            (Self::Rerun, true) => &["FAILED", "SUCCEEDED", "SKIPPED"],
            (Self::Skip, _) => &["PENDING", "FAILED"],
        }
    }

    fn target(self) -> RunStatus {
        match self {
            Self::Fail => RunStatus::Failed,
            Self::Rerun => RunStatus::Pending,
            Self::Skip => RunStatus::Skipped,
        }
    }
}

/// An operator's request.
#[derive(Debug, Clone)]
pub struct OperatorRequest {
    pub action: Action,
    pub key: JobKey,
    pub operator: String,
    pub reason: String,
    pub force: bool,
    /// For `fail`: the job's `stale_after` (a RUNNING run must be older, or
    /// its lease expired, unless forced). The run's own stored value wins;
    /// this serves only runs the previous release enqueued without one.
    pub stale_after: Duration,
    /// For `rerun`: attempts granted anew. The run's own stored budget wins;
    /// this serves only runs without one.
    pub max_attempts: u32,
}

/// What an action did (or, on a dry run, would do).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ActionOutcome {
    pub job_key: String,
    pub action: String,
    pub before: String,
    pub after: String,
    pub applied: bool,
}

/// Why an action was refused: the run's current state, for the operator.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{action} refused for {key}: it is {status}{detail}")]
pub struct Refused {
    pub action: &'static str,
    pub key: String,
    pub status: String,
    pub detail: String,
}

/// Checks an action against the run's current state without writing.
pub async fn preview_action(
    pool: &PgPool,
    req: &OperatorRequest,
    clock: Clock,
) -> Result<Result<ActionOutcome, Refused>, QueueError> {
    preview_action_in(pool.begin().await?, req, clock).await
}

/// [`preview_action`] in a transaction the caller opened (and may have set
/// a `lock_timeout` in).
pub(crate) async fn preview_action_in(
    mut tx: Transaction<'static, Postgres>,
    req: &OperatorRequest,
    clock: Clock,
) -> Result<Result<ActionOutcome, Refused>, QueueError> {
    let r = check_action(&mut tx, req, clock, true).await?;
    tx.rollback().await?;
    Ok(r.map(|before| ActionOutcome {
        job_key: req.key.to_string(),
        action: req.action.as_str().into(),
        before,
        after: req.action.target().as_str().into(),
        applied: false,
    }))
}

/// Checks an action against the run, locking its row `FOR UPDATE` when
/// `lock` (to act on it), or reading it without waiting for anyone (to see
/// whether the action would be refused anyway).
async fn check_action(
    tx: &mut PgConnection,
    req: &OperatorRequest,
    clock: Clock,
    lock: bool,
) -> Result<Result<String, Refused>, QueueError> {
    // A database function: the operator role cannot lock the row itself.
    let row: Option<(String, bool)> =
        crate::db::query_as("SELECT status, stale FROM batchonce_operator_check($1, $2, $3, $4)")
            .bind(req.key.as_str())
            .bind(req.stale_after.as_secs_f64())
            .bind(clock.bind())
            .bind(lock)
            .fetch_optional(&mut *tx)
            .await?;
    let Some((status, stale)) = row else {
        return Err(QueueError::Invalid(format!("no run with key {}", req.key)));
    };
    let refuse = |detail: String| Refused {
        action: req.action.as_str(),
        key: req.key.to_string(),
        status: status.clone(),
        detail,
    };
    let allowed = req.action.allowed(req.force);
    if !allowed.contains(&status.as_str()) {
        let hint = match (req.action, status.as_str()) {
            (Action::Rerun, "SUCCEEDED" | "SKIPPED") => {
                "; re-running it is a correction: add --force"
            }
            (Action::Fail, "PENDING") => "; add --force to fail a run that has not started",
            _ => "",
        };
        return Ok(Err(refuse(format!(
            " (allowed from {}){hint}",
            allowed.join(" or ")
        ))));
    }
    if req.action == Action::Fail && status == "RUNNING" && !stale && !req.force {
        return Ok(Err(refuse(
            " with a live lease and not past stale_after; check `runs stale`, or add --force"
                .into(),
        )));
    }
    Ok(Ok(status))
}

/// Applies an operator action: one conditional UPDATE of the run plus its
/// audit row, in one transaction. Of two operators acting at once, exactly
/// one succeeds; the other is refused with the state the first left.
pub async fn apply_action(
    pool: &PgPool,
    req: &OperatorRequest,
    clock: Clock,
) -> Result<Result<ActionOutcome, Refused>, QueueError> {
    apply_action_in(pool, pool.begin().await?, req, clock).await
}

/// [`apply_action`] in a transaction the caller opened (and may have set a
/// `lock_timeout` in).
pub(crate) async fn apply_action_in(
    pool: &PgPool,
    mut tx: Transaction<'static, Postgres>,
    req: &OperatorRequest,
    clock: Clock,
) -> Result<Result<ActionOutcome, Refused>, QueueError> {
    let before = match check_action(&mut tx, req, clock, true).await? {
        Ok(b) => b,
        Err(refused) => return Ok(Err(refused)),
    };
    let allowed: Vec<&str> = req.action.allowed(req.force).to_vec();
    let message = truncate(&format!(
        "{} by operator {}: {}",
        match req.action {
            Action::Fail => "failed",
            Action::Rerun => "re-run",
            Action::Skip => "skipped",
        },
        req.operator,
        req.reason
    ));
    // check_action locked the row, so this cannot miss; the function's
    // WHERE repeats the expected state all the same. The new state, the
    // closed attempt and the audit row are one call of a database function
    // (migration 20261203000004): the operator role can change a run no
    // other way, and the audit row's time and session are the database's.
    let updated: Option<String> = crate::db::query_scalar(
        "SELECT batchonce_operator_apply($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(req.key.as_str())
    .bind(req.action.as_str())
    .bind(&allowed)
    .bind(req.action.target().as_str())
    .bind(&message)
    .bind(clock.bind())
    .bind(req.max_attempts as i32)
    .bind(req.operator.as_str())
    .bind(req.reason.as_str())
    .bind(before.as_str())
    .fetch_one(&mut *tx)
    .await?;
    if updated.is_none() {
        tx.rollback().await?;
        let mut stmt = crate::db::statement(pool).await?;
        let status: String =
            crate::db::query_scalar("SELECT status FROM batch_job_run WHERE job_key = $1")
                .bind(req.key.as_str())
                .fetch_one(stmt.conn())
                .await?;
        stmt.done().await?;
        return Ok(Err(Refused {
            action: req.action.as_str(),
            key: req.key.to_string(),
            status,
            detail: " (another action changed it first)".into(),
        }));
    }
    tx.commit().await?;
    Ok(Ok(ActionOutcome {
        job_key: req.key.to_string(),
        action: req.action.as_str().into(),
        before,
        after: req.action.target().as_str().into(),
        applied: true,
    }))
}

/// One audited operator action, for `runs show`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ActionView {
    pub at: DateTime<Utc>,
    pub operator: String,
    pub session_user: String,
    pub action: String,
    pub reason: String,
    pub before_status: String,
    pub after_status: String,
    /// What a `terminate-blocker` row ended; `None` for the other actions.
    pub detail: Option<String>,
}

/// The operator history of a run, oldest first.
pub async fn actions(pool: &PgPool, key: &JobKey) -> Result<Vec<ActionView>, QueueError> {
    let mut stmt = crate::db::statement(pool).await?;
    let rows = crate::db::query(
        "SELECT at, operator, session_user_name, action, reason, before_status, after_status, \
         detail FROM batch_operator_action WHERE job_key = $1 ORDER BY id",
    )
    .bind(key.as_str())
    .fetch_all(stmt.conn())
    .await?;
    stmt.done().await?;
    rows.iter()
        .map(|r| {
            Ok(ActionView {
                at: r.try_get("at")?,
                operator: r.try_get("operator")?,
                session_user: r.try_get("session_user_name")?,
                action: r.try_get("action")?,
                reason: r.try_get("reason")?,
                before_status: r.try_get("before_status")?,
                after_status: r.try_get("after_status")?,
                detail: r.try_get("detail")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(QueueError::from)
}

/// The job name of `preflight`'s scratch runs; only these can be deleted.
pub const PREFLIGHT_JOB: &str = "batchonce-preflight";

/// Removes one scratch run of `preflight` and its attempts. Refuses any other
/// job: runs of real jobs are history and are never deleted.
pub async fn delete_preflight_run(pool: &PgPool, key: &JobKey) -> Result<u64, QueueError> {
    if key.job_name() != PREFLIGHT_JOB {
        return Err(QueueError::Invalid(format!(
            "{key} is not a preflight run; runs are never deleted"
        )));
    }
    let mut tx = pool.begin().await?;
    crate::db::query("DELETE FROM batch_job_attempt WHERE job_key = $1")
        .bind(key.as_str())
        .execute(&mut *tx)
        .await?;
    let n = crate::db::query("DELETE FROM batch_job_run WHERE job_key = $1 AND job_name = $2")
        .bind(key.as_str())
        .bind(PREFLIGHT_JOB)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    tx.commit().await?;
    Ok(n)
}

/// Truncates to the stored limit on a character boundary.
pub fn truncate(s: &str) -> String {
    match s.char_indices().nth(MAX_ERROR_CHARS) {
        Some((i, _)) => s[..i].to_owned(),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncates_on_char_boundary() {
        let s = "가".repeat(1500);
        let t = truncate(&s);
        assert_eq!(t.chars().count(), MAX_ERROR_CHARS);
        assert_eq!(truncate("short"), "short");
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let base = Duration::from_secs(10);
        let max = Duration::from_secs(60);
        for _ in 0..100 {
            let d1 = backoff_delay(1, base, max);
            assert!(d1 >= Duration::from_secs(5) && d1 <= Duration::from_secs(10));
            let d3 = backoff_delay(3, base, max);
            assert!(d3 >= Duration::from_secs(20) && d3 <= Duration::from_secs(40));
            let d9 = backoff_delay(9, base, max);
            assert!(d9 >= Duration::from_secs(30) && d9 <= Duration::from_secs(60));
        }
    }

    #[test]
    fn statuses_round_trip() {
        for s in RunStatus::ALL {
            assert_eq!(RunStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(RunStatus::parse("failed"), Some(RunStatus::Failed));
        assert_eq!(RunStatus::parse("DONE"), None);
    }
}
