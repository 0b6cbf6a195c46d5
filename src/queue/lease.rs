//! Leases: claiming runs ([`claim`]), heartbeating them ([`heartbeat`]), and
//! the fenced transaction through which a lease holder writes
//! ([`begin_fenced`], [`FencedTx`]).
//!
//! Invariants:
//!
//! - A write outside a live lease is impossible by construction:
//!   `begin_fenced` locks the run row and checks the token first, and
//!   `FencedTx::commit` extends the lease from `clock_timestamp()` (the
//!   commit, not the transaction's start) as it commits the items.
//! - Concurrent claimers never take the same run: the pick locks with `SKIP
//!   LOCKED`, and the claim takes a picked run only if its row still says
//!   PENDING.
//! - A claim reads about what it takes, never the whole due list or run
//!   table, under custom and generic plans alike (`tests/plans.rs`).
//! - `processed_count > heartbeat_processed` means the run advanced since
//!   its last heartbeat statement: a claim sets `heartbeat_processed =
//!   processed_count`, so earlier attempts' items never look like progress,
//!   the heartbeat copies it, and `FencedTx::commit` does not set it.

use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Postgres, Row, Transaction};

use super::{blockers, context, QueueError};
use crate::clock::Clock;
use crate::config::context::RunContext;
use crate::key::{JobKey, JobName};

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
    /// The whole run, one partition of it, or its final step.
    pub step: super::Step,
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
///
/// The statement is the database function `batchonce_claim3`. Its pick
/// takes the due runs from their list `batch_job_due` (migration
/// 20261207000001) through its index `batch_job_due_claim_idx` in claim
/// order, stops at the limit, locks with `SKIP LOCKED` and deletes the
/// entries it takes, within the claim's own statement: a pick in a function
/// of its own read with a newer snapshot than the claim's update, which
/// then missed a run enqueued in between while its entry was gone. The
/// claim keeps `batch_job_running` in step itself. The function runs with
/// `enable_seqscan`, `enable_bitmapscan` and `enable_sort` off (migration
/// 20261207000002): under statistics taken while the list was empty, the
/// usual state of a quiet system, the planner read and sorted every due
/// entry on each claim, quadratic over an outage's backlog. The claim then
/// updates the picked runs by an array of keys (`job_key =
/// ANY(ARRAY(SELECT …))`), not a join, so the cached plan cannot hash the
/// whole table either. It also sets `heartbeat_processed =
/// processed_count`, so the items of earlier attempts never look like
/// progress of the new one in `stale_runs`.
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
    // which alone may turn a PENDING run into a RUNNING one with a new token;
    // its second version (20261204000002) also claims partitions and final
    // steps, which the first leaves to this release.
    let rows = crate::db::query("SELECT * FROM batchonce_claim3($1, $2, $3, $4, $5, true)")
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
        step: super::Step::from_row(row)?,
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
/// for, so one run never stalls the heartbeats of the others. It reports
/// each lease as extended, busy or lost, and copies each extended run's
/// `processed_count` into `heartbeat_processed`.
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
///
/// It first sets `idle_in_transaction_session_timeout` for that transaction
/// alone (`set_config(…, true)`) to twice the run's lease, at least
/// [`MIN_FENCED_IDLE`]: the session-wide value of `db::connect_worker`
/// follows the longest lease of every kind the worker runs (60 s beside the
/// default kinds, which `workers/tests/hosts.rs` ran into with a 2 s lease)
/// and cannot be sent through PgBouncer. The fence query also returns
/// `pg_backend_pid()` and `now()`, the session and transaction it runs in
/// (`FencedTx::session`, a `blockers::SessionTx`); `FencedTx::track` lists
/// them in a `blockers::FenceSessions` until the transaction ends, which
/// `JobContext::fenced` does for the worker. Through PgBouncer the pid is
/// the server's, and one transaction keeps one server connection.
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
    // FOR KEY SHARE: every takeover changes the lease token of a RUNNING
    // run, and a trigger makes such an UPDATE take FOR UPDATE, which waits
    // for this lock (migration 20261207000001; until then the token was a
    // unique key, which did the same), while the holder's heartbeat changes
    // no token and passes it. The commit's own update of the row (NO KEY UPDATE)
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
