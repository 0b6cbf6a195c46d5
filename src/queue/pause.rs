//! Paused jobs (issue 44, migration 20261210000001): this file owns every
//! statement on `batch_job_pause`. A paused job's runs are not claimed: its
//! entries in the due list `batch_job_due` are held at 9999-12-31, so no
//! claim of this release or of the previous ones takes them, while the
//! producer still enqueues (nothing is missed) and a run already RUNNING
//! finishes. The run rows keep their real `next_run_at`; resume puts each
//! entry back to it, so the runs are claimed in their order again.
//!
//! - `pause` and `resume` call the audited functions `batchonce_operator_pause` and
//!   `batchonce_operator_resume` (the operator and console roles may call them, no other) in
//!   one transaction each, on the given clock, with one `batch_operator_action` row (`JOB:*`,
//!   `ACTIVE` → `PAUSED` and back) that records the console's remote address when `remote_addr`
//!   is given. Each waits at most [`LOCK_WAIT`] for the due list (a pause holds claims back
//!   while it takes it), then gives up with [`PauseError::Busy`] and changes nothing.
//! - Pausing a paused job or resuming one that is not paused is refused with
//!   [`PAUSE_SQLSTATE`] ([`PauseError::Conflict`]); a bad name, an unknown job or a missing
//!   reason with 22023 ([`PauseError::Invalid`]); either way nothing is written.
//! - `paused_jobs` lists the paused jobs: who paused each, when, why and for how long on the
//!   database clock. `status`, the console and the exporter read it (the exporter through
//!   `views::gauges`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};

use super::QueueError;
use crate::clock::Clock;
use crate::key::JobName;

/// The SQLSTATE of a pause of a paused job, or a resume of one that is not.
pub const PAUSE_SQLSTATE: &str = "BO012";

/// How long a pause or a resume waits for the due list, which every claim,
/// finish and enqueue writes for a moment; while it waits, new claims wait
/// behind it, so it gives up soon rather than stall the workers.
pub const LOCK_WAIT: Duration = Duration::from_secs(5);

/// A paused job.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Paused {
    pub job: String,
    pub paused_at: DateTime<Utc>,
    pub paused_by: String,
    pub reason: String,
    /// How long it has been paused, by the database clock.
    pub paused_seconds: f64,
}

/// Who pauses or resumes which job, and why (all recorded in the audit
/// row; `operator` and `reason` already checked by `text::operator` and
/// `text::reason`).
#[derive(Debug, Clone)]
pub struct PauseRequest {
    pub job: JobName,
    pub operator: String,
    pub reason: String,
}

/// What a pause did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PauseOutcome {
    pub job: String,
    pub paused_at: DateTime<Utc>,
    /// The job's PENDING runs held back.
    pub runs_held: i64,
    /// The `batch_operator_action` row.
    pub audit_id: i64,
}

/// What a resume did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ResumeOutcome {
    pub job: String,
    /// When the pause it ended began.
    pub paused_at: DateTime<Utc>,
    pub paused_seconds: f64,
    /// The job's due entries put back to their runs' `next_run_at`.
    pub runs_released: i64,
    /// The `batch_operator_action` row.
    pub audit_id: i64,
}

/// Why a pause or resume changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    /// The job is already paused (pause) or not paused (resume); the
    /// database's message says since when and by whom.
    #[error("{0}")]
    Conflict(String),
    /// A name that is no job's, a job the database does not know, or no
    /// reason: the database's message names which.
    #[error("{0}")]
    Invalid(String),
    /// The due list stayed locked for [`LOCK_WAIT`].
    #[error("{verb} of {job} gave up after {secs} s waiting for the due list, which another transaction holds (a long enqueue?); nothing changed: try again")]
    Busy {
        verb: &'static str,
        job: String,
        secs: u64,
    },
    #[error(transparent)]
    Queue(#[from] QueueError),
}

impl PauseError {
    fn from_sql(e: sqlx::Error, verb: &'static str, job: &JobName) -> Self {
        let (code, message) = match e.as_database_error() {
            Some(d) => (d.code().map(|c| c.into_owned()), d.message().to_owned()),
            None => (None, String::new()),
        };
        match code.as_deref() {
            Some(PAUSE_SQLSTATE) => Self::Conflict(message),
            Some("22023") => Self::Invalid(message),
            Some("55P03") => Self::Busy {
                verb,
                job: job.to_string(),
                secs: LOCK_WAIT.as_secs(),
            },
            _ => Self::Queue(QueueError::Database(e)),
        }
    }
}

/// Every paused job, by name, with how long it has been paused at
/// `clock`.
pub async fn paused_jobs(pool: &PgPool, clock: Clock) -> Result<Vec<Paused>, QueueError> {
    let mut stmt = crate::db::statement(pool).await?;
    let rows = crate::db::query(
        "SELECT p.job_name::text AS job, p.paused_at, p.paused_by::text AS paused_by, \
                p.reason::text AS reason, \
                extract(epoch FROM COALESCE($1, now()) - p.paused_at)::float8 AS paused_seconds \
         FROM batch_job_pause p ORDER BY p.job_name",
    )
    .bind(clock.bind())
    .fetch_all(stmt.conn())
    .await?;
    stmt.done().await?;
    rows.iter()
        .map(|r| {
            Ok(Paused {
                job: r.try_get("job")?,
                paused_at: r.try_get("paused_at")?,
                paused_by: r.try_get("paused_by")?,
                reason: r.try_get("reason")?,
                paused_seconds: r.try_get("paused_seconds")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(QueueError::from)
}

/// The transaction a pause or a resume runs in: the console's address for
/// the audit row's stamp trigger, and the bound on the wait for the due
/// list, both local to it.
async fn begin(
    pool: &PgPool,
    remote_addr: Option<&str>,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    crate::db::query(
        "SELECT set_config('batchonce.remote_addr', COALESCE($1, ''), true), \
                set_config('lock_timeout', $2, true)",
    )
    .bind(remote_addr.map(crate::text::truncate))
    .bind(format!("{}ms", LOCK_WAIT.as_millis()))
    .execute(&mut *tx)
    .await?;
    Ok(tx)
}

/// Calls the operator function `select` (`SELECT … FROM f($1..$4)`) with
/// the request's job, reason, operator and clock, in a transaction that
/// records `remote_addr`, and returns its one row.
async fn call(
    pool: &PgPool,
    select: &'static str,
    req: &PauseRequest,
    clock: Clock,
    remote_addr: Option<&str>,
) -> Result<sqlx::postgres::PgRow, sqlx::Error> {
    let mut tx = begin(pool, remote_addr).await?;
    let row = crate::db::query(select)
        .bind(req.job.as_str())
        .bind(req.reason.as_str())
        .bind(req.operator.as_str())
        .bind(clock.bind())
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(row)
}

/// Pauses `req.job`: its PENDING runs (and every run enqueued or re-queued
/// while it stays paused) are no longer claimed; RUNNING runs finish.
/// Audited, with `remote_addr` for the console.
pub async fn pause(
    pool: &PgPool,
    req: &PauseRequest,
    clock: Clock,
    remote_addr: Option<&str>,
) -> Result<PauseOutcome, PauseError> {
    let sql = "SELECT paused_at, runs_held, audit_id \
               FROM batchonce_operator_pause($1, $2, $3, $4)";
    let out = async {
        let row = call(pool, sql, req, clock, remote_addr).await?;
        Ok::<_, sqlx::Error>(PauseOutcome {
            job: req.job.to_string(),
            paused_at: row.try_get("paused_at")?,
            runs_held: row.try_get("runs_held")?,
            audit_id: row.try_get("audit_id")?,
        })
    };
    out.await
        .map_err(|e| PauseError::from_sql(e, "pause", &req.job))
}

/// Resumes `req.job`: its held runs are claimable again, in their order,
/// and idle workers are woken. Audited, with `remote_addr` for the console.
pub async fn resume(
    pool: &PgPool,
    req: &PauseRequest,
    clock: Clock,
    remote_addr: Option<&str>,
) -> Result<ResumeOutcome, PauseError> {
    let sql = "SELECT paused_at, paused_seconds, runs_released, audit_id \
               FROM batchonce_operator_resume($1, $2, $3, $4)";
    let out = async {
        let row = call(pool, sql, req, clock, remote_addr).await?;
        Ok::<_, sqlx::Error>(ResumeOutcome {
            job: req.job.to_string(),
            paused_at: row.try_get("paused_at")?,
            paused_seconds: row.try_get("paused_seconds")?,
            runs_released: row.try_get("runs_released")?,
            audit_id: row.try_get("audit_id")?,
        })
    };
    out.await
        .map_err(|e| PauseError::from_sql(e, "resume", &req.job))
}
