//! Retention: `runs archive` moves finished runs and their attempts out of
//! the live ledger into `batch_job_run_archive` and
//! `batch_job_attempt_archive`, and reads an archived run back for
//! `runs show`. This file owns every statement on the two archive tables;
//! the move itself is the audited database function
//! `batchonce_operator_archive` (migration 20261209000002), which only the
//! operator role may call.
//!
//! - `archive_batch` archives one batch (at most `ArchiveRequest::batch`
//!   runs, a partitioned run counted once) in one transaction and returns,
//!   per job, the runs and attempts moved and the audit row's id;
//!   `archive` repeats it until a batch moves nothing, so a large archive
//!   never holds one long transaction, and an interrupted one leaves every
//!   run either live or archived. `preview` (`--dry-run`) counts what would
//!   move and writes nothing.
//! - What is archived: SUCCEEDED or SKIPPED runs whose business date is
//!   before the given date, which must be in the past by the database
//!   clock; a partitioned run only when it and all its partitions are
//!   finished. PENDING, RUNNING and FAILED runs never move.
//! - `show_archived` returns an archived run, its attempts and when and by
//!   which audit row it was archived. The views of the live ledger never
//!   read the archive.
//!
//! An archived key still refuses a second enqueue: `batchonce_enqueue2`
//! reports it as a duplicate, and a direct insert fails with
//! [`ARCHIVED_SQLSTATE`]. Nothing here touches a job kind's item tables.

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::{PgPool, Row};

use super::runs::{run_from_row, AttemptView, RunView};
use super::{context, QueueError};
use crate::clock::Clock;
use crate::key::{JobKey, JobName};

/// The SQLSTATE of a direct `INSERT` of an archived key into `batch_job_run`.
pub const ARCHIVED_SQLSTATE: &str = "BO011";

/// The largest batch the database function accepts.
pub const MAX_ARCHIVE_BATCH: u32 = 100_000;

/// What to archive, and who asks and why (both go into the audit rows).
#[derive(Debug, Clone)]
pub struct ArchiveRequest {
    /// Runs whose business date is strictly before this date.
    pub before: NaiveDate,
    /// Only this job's runs; `None`: every job's.
    pub job: Option<JobName>,
    /// Runs (a partitioned run counted once) per transaction.
    pub batch: u32,
    pub operator: String,
    pub reason: String,
}

/// What one job's share of a batch moved (or, in a preview, would move).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ArchivedJob {
    pub job: String,
    /// Runs moved, partitions included.
    pub runs: i64,
    pub attempts: i64,
    /// The `batch_operator_action` row of this job's share of the batch;
    /// `None` in a preview.
    pub audit_id: Option<i64>,
}

/// Why the database refused an archive: a date that is not in the past, an
/// unknown job, or a batch size out of range (SQLSTATE 22023), or archive
/// tables that lack a live column (55000). The message is the database's.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ArchiveRefused(pub String);

/// What an archive call ended with.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error(transparent)]
    Refused(#[from] ArchiveRefused),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

impl From<sqlx::Error> for ArchiveError {
    fn from(e: sqlx::Error) -> Self {
        let refused = e.as_database_error().and_then(|d| {
            matches!(d.code().as_deref(), Some("22023" | "55000")).then(|| d.message().to_owned())
        });
        match refused {
            Some(m) => Self::Refused(ArchiveRefused(m)),
            None => Self::Queue(QueueError::Database(e)),
        }
    }
}

async fn call(
    pool: &PgPool,
    req: &ArchiveRequest,
    dry_run: bool,
    clock: Clock,
) -> Result<Vec<ArchivedJob>, ArchiveError> {
    let mut tx = pool.begin().await?;
    let rows = crate::db::query(
        "SELECT job, runs_moved, attempts_moved, audit_id \
         FROM batchonce_operator_archive($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(req.before)
    .bind(req.job.as_ref().map(JobName::as_str))
    .bind(i64::from(req.batch))
    .bind(req.operator.as_str())
    .bind(req.reason.as_str())
    .bind(dry_run)
    .bind(clock.bind())
    .fetch_all(&mut *tx)
    .await?;
    let jobs = rows
        .iter()
        .map(|r| {
            Ok(ArchivedJob {
                job: r.try_get("job")?,
                runs: r.try_get("runs_moved")?,
                attempts: r.try_get("attempts_moved")?,
                audit_id: r.try_get("audit_id")?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    if dry_run {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    Ok(jobs)
}

/// Archives one batch in one transaction: the runs, their attempts and one
/// audit row per job commit together or not at all. Empty when nothing is
/// left to archive.
pub async fn archive_batch(
    pool: &PgPool,
    req: &ArchiveRequest,
    clock: Clock,
) -> Result<Vec<ArchivedJob>, ArchiveError> {
    call(pool, req, false, clock).await
}

/// Archives batch after batch until one moves nothing, calling `progress`
/// after each committed batch; returns every batch's rows, in order.
pub async fn archive(
    pool: &PgPool,
    req: &ArchiveRequest,
    clock: Clock,
    mut progress: impl FnMut(&[ArchivedJob]),
) -> Result<Vec<ArchivedJob>, ArchiveError> {
    let mut all = Vec::new();
    loop {
        let batch = archive_batch(pool, req, clock).await?;
        if batch.is_empty() {
            return Ok(all);
        }
        progress(&batch);
        all.extend(batch);
    }
}

/// What [`archive`] would move now, per job, over all its batches; writes
/// nothing (the same checks run, in a transaction that is rolled back).
pub async fn preview(
    pool: &PgPool,
    req: &ArchiveRequest,
    clock: Clock,
) -> Result<Vec<ArchivedJob>, ArchiveError> {
    call(pool, req, true, clock).await
}

/// When and by which audit row a run was archived.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Archived {
    pub archived_at: DateTime<Utc>,
    /// The `batch_operator_action` row (action `archive`).
    pub audit_id: i64,
}

/// An archived run with its attempts and its archiving, or `None` if the
/// archive holds no such key.
pub async fn show_archived(
    pool: &PgPool,
    key: &JobKey,
) -> Result<Option<(RunView, Vec<AttemptView>, Archived)>, QueueError> {
    let sql = format!(
        "SELECT {}, {}, r.archived_at, r.archived_by FROM batch_job_run_archive r \
         WHERE r.job_key = $1",
        super::runs::RUN_COLUMNS,
        context::COLUMNS
    );
    let mut stmt = crate::db::statement(pool).await?;
    let Some(row) = crate::db::query(&sql)
        .bind(key.as_str())
        .fetch_optional(stmt.conn())
        .await?
    else {
        stmt.done().await?;
        return Ok(None);
    };
    let run = run_from_row(&row)?;
    let archived = Archived {
        archived_at: row.try_get("archived_at")?,
        audit_id: row.try_get("archived_by")?,
    };
    let attempts = crate::db::query(&format!(
        "SELECT {} FROM batch_job_attempt_archive WHERE job_key = $1 ORDER BY attempt",
        super::runs::ATTEMPT_COLUMNS
    ))
    .bind(key.as_str())
    .fetch_all(stmt.conn())
    .await?
    .iter()
    .map(super::runs::attempt_from_row)
    .collect::<Result<Vec<_>, sqlx::Error>>()?;
    stmt.done().await?;
    Ok(Some((run, attempts, archived)))
}
