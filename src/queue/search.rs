//! Read views for the console: run lists filtered by job, state, business
//! date range and key and paged by keyset (so any number of runs can be paged
//! through at the same cost), the newest run of each job, and the audit log.
//! Reads only; nothing here writes.
//!
//! - `search_runs(filter, after, limit)` orders by business date (newest
//!   first), then key, and continues after a `RunCursor` (the last row of
//!   the previous page), never by offset.
//! - `latest_runs(jobs)` reads each job's newest run through the
//!   `(job_name, business_date)` index, one lookup per job.
//! - `recent_runs(jobs, n, clock)` reads each job's newest `n` runs the same
//!   way, with their durations, for the console's charts.
//! - `audit_log(filter, before_id, limit)` lists `batch_operator_action`
//!   newest first, with the console's `remote_addr`.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::{PgPool, Row};

use super::runs::{run_from_row, RUN_COLUMNS};
use super::{context, QueueError, RunStatus, RunView};
use crate::clock::Clock;
use crate::key::{JobName, Scope};

/// Which runs a list shows; every field narrows it.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub job: Option<JobName>,
    pub status: Option<RunStatus>,
    /// Business dates from (inclusive).
    pub from: Option<NaiveDate>,
    /// Business dates to (inclusive).
    pub to: Option<NaiveDate>,
    /// Part of the key, matched as text (no pattern characters).
    pub key: Option<String>,
    /// Only the runs of this scope.
    pub scope: Option<Scope>,
}

/// Where a page of runs ends: the next page starts after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCursor {
    pub business_date: NaiveDate,
    pub job_key: String,
}

/// Runs matching `filter`, newest business date first, then by key,
/// starting after `after`; at most `limit`.
pub async fn search_runs(
    pool: &PgPool,
    filter: &RunFilter,
    after: Option<&RunCursor>,
    limit: u32,
) -> Result<Vec<RunView>, QueueError> {
    // Every filter but the job's; $2 names the job.
    let filters = "($1::text IS NULL OR r.status = $1) \
           AND ($3::date IS NULL OR r.business_date >= $3) \
           AND ($4::date IS NULL OR r.business_date <= $4) \
           AND ($5::text IS NULL OR strpos(r.job_key, $5) > 0) \
           AND ($6::date IS NULL OR r.business_date < $6 \
                OR (r.business_date = $6 AND r.job_key > $7)) \
           AND ($9::text IS NULL OR r.scope = $9) AND r.partition_of IS NULL";
    let sql = match filter.status.and_then(open_list) {
        // FAILED runs through their list in the page's order (its indexes
        // are so ordered), each checked against its run row: a page reads
        // about a page, however many runs failed.
        Some("batch_job_failed") => format!(
            "SELECT x.* FROM batch_job_failed o CROSS JOIN LATERAL ( \
               SELECT {RUN_COLUMNS}, {ctx} FROM batch_job_run r \
               WHERE r.job_key = o.job_key AND {filters} OFFSET 0) x \
             WHERE {job} \
               AND ($3::date IS NULL OR o.business_date >= $3) \
               AND ($4::date IS NULL OR o.business_date <= $4) \
               AND ($6::date IS NULL OR o.business_date < $6 \
                    OR (o.business_date = $6 AND o.job_key > $7)) \
             ORDER BY o.business_date DESC, o.job_key LIMIT $8",
            ctx = context::COLUMNS,
            // Two texts, so that each is planned on its own index.
            job = if filter.job.is_some() {
                "o.job_name = $2"
            } else {
                "$2::text IS NULL"
            },
        ),
        // Other open runs are found through their list, however long the
        // ledger.
        Some(list) => format!(
            "SELECT {RUN_COLUMNS}, {ctx} FROM batch_job_run r \
             WHERE r.job_key = ANY (ARRAY(SELECT o.job_key FROM {list} o \
                                          WHERE $2::text IS NULL OR o.job_name = $2)) \
               AND {filters} \
             ORDER BY r.business_date DESC, r.job_key LIMIT $8",
            ctx = context::COLUMNS
        ),
        // History, newest first: each job's runs through its
        // (job_name, business_date) index, at most a page each, so a page
        // reads about what it shows (and, filtered by a key or a rare
        // state, what it passes on the way).
        None => format!(
            "WITH RECURSIVE run_jobs AS ( \
               SELECT min(job_name)::text AS job_name FROM batch_job_run WHERE $2::text IS NULL \
               UNION ALL \
               SELECT (SELECT min(r.job_name)::text FROM batch_job_run r \
                       WHERE r.job_name > run_jobs.job_name) \
               FROM run_jobs WHERE run_jobs.job_name IS NOT NULL \
             ), jobs AS ( \
               SELECT $2::text AS job_name WHERE $2::text IS NOT NULL \
               UNION ALL SELECT job_name FROM run_jobs WHERE job_name IS NOT NULL \
             ) \
             SELECT x.* FROM jobs j CROSS JOIN LATERAL ( \
               SELECT {RUN_COLUMNS}, {ctx} FROM batch_job_run r \
               WHERE r.job_name = j.job_name AND {filters} \
               ORDER BY r.business_date DESC, r.job_key LIMIT $8) x \
             ORDER BY x.business_date DESC, x.job_key LIMIT $8",
            ctx = context::COLUMNS
        ),
    };
    let mut stmt = crate::db::statement(pool).await?;
    let rows = crate::db::query(&sql)
        .bind(filter.status.map(RunStatus::as_str))
        .bind(filter.job.as_ref().map(JobName::as_str))
        .bind(filter.from)
        .bind(filter.to)
        .bind(filter.key.as_deref().filter(|k| !k.is_empty()))
        .bind(after.map(|c| c.business_date))
        .bind(after.map(|c| c.job_key.as_str()))
        .bind(limit as i64)
        .bind(filter.scope.as_ref().map(Scope::as_str))
        .fetch_all(stmt.conn())
        .await?;
    stmt.done().await?;
    rows.iter().map(run_from_row).collect()
}

/// The list that holds every run of an open state (migrations
/// 20261207000001 and 20261209000001), or `None` for a finished one.
fn open_list(status: RunStatus) -> Option<&'static str> {
    match status {
        RunStatus::Pending => Some("batch_job_due"),
        RunStatus::Running => Some("batch_job_running"),
        RunStatus::Failed => Some("batch_job_failed"),
        RunStatus::Succeeded | RunStatus::Skipped => None,
    }
}

/// The newest run (latest business date, then the greatest key) of each of
/// `jobs` that has one.
pub async fn latest_runs(pool: &PgPool, jobs: &[String]) -> Result<Vec<RunView>, QueueError> {
    let sql = format!(
        "SELECT x.* FROM unnest($1::text[]) AS j(name) CROSS JOIN LATERAL ( \
           SELECT {RUN_COLUMNS}, {} FROM batch_job_run r WHERE r.job_name = j.name \
             AND r.partition_of IS NULL \
           ORDER BY r.business_date DESC, r.job_key DESC LIMIT 1) x \
         ORDER BY x.job_name",
        context::COLUMNS
    );
    let mut stmt = crate::db::statement(pool).await?;
    let rows = crate::db::query(&sql)
        .bind(jobs)
        .fetch_all(stmt.conn())
        .await?;
    stmt.done().await?;
    rows.iter().map(run_from_row).collect()
}

/// Which audit rows to show; every field narrows it.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub job: Option<JobName>,
    /// Part of the key, matched as text.
    pub key: Option<String>,
    pub operator: Option<String>,
    pub action: Option<String>,
}

/// One row of the audit log.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AuditRow {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub operator: String,
    pub session_user: String,
    pub action: String,
    pub job_key: String,
    pub reason: String,
    /// Text, not a [`RunStatus`]: besides a run's states, an audit row
    /// records a job's (`ACTIVE`, `PAUSED`), a period's (`MISSING`) and an
    /// archive's (`FINISHED`, `ARCHIVED`).
    pub before_status: String,
    pub after_status: String,
    pub detail: Option<String>,
    /// Where a console user acted from; `None` for the command line.
    pub remote_addr: Option<String>,
}

/// Audit rows matching `filter`, newest first, with ids below `before_id`.
pub async fn audit_log(
    pool: &PgPool,
    filter: &AuditFilter,
    before_id: Option<i64>,
    limit: u32,
) -> Result<Vec<AuditRow>, QueueError> {
    let mut stmt = crate::db::statement(pool).await?;
    let rows = crate::db::query(
        "SELECT a.id, a.at, a.operator, a.session_user_name, a.action, a.job_key, a.reason, \
                a.before_status, a.after_status, a.detail, a.remote_addr \
         FROM batch_operator_action a \
         WHERE ($1::text IS NULL OR split_part(a.job_key, ':', 1) = $1) \
           AND ($2::text IS NULL OR strpos(a.job_key, $2) > 0) \
           AND ($3::text IS NULL OR a.operator = $3) \
           AND ($4::text IS NULL OR a.action = $4) \
           AND ($5::bigint IS NULL OR a.id < $5) \
         ORDER BY a.id DESC LIMIT $6",
    )
    .bind(filter.job.as_ref().map(JobName::as_str))
    .bind(filter.key.as_deref().filter(|k| !k.is_empty()))
    .bind(filter.operator.as_deref().filter(|o| !o.is_empty()))
    .bind(filter.action.as_deref().filter(|a| !a.is_empty()))
    .bind(before_id)
    .bind(limit as i64)
    .fetch_all(stmt.conn())
    .await?;
    stmt.done().await?;
    rows.iter()
        .map(|r| {
            Ok(AuditRow {
                id: r.try_get("id")?,
                at: r.try_get("at")?,
                operator: r.try_get("operator")?,
                session_user: r.try_get("session_user_name")?,
                action: r.try_get("action")?,
                job_key: r.try_get("job_key")?,
                reason: r.try_get("reason")?,
                before_status: r.try_get("before_status")?,
                after_status: r.try_get("after_status")?,
                detail: r.try_get("detail")?,
                remote_addr: r.try_get("remote_addr")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(QueueError::from)
}

/// The database's clock now: what the console compares periods with.
pub async fn database_now(pool: &PgPool) -> Result<DateTime<Utc>, QueueError> {
    let mut stmt = crate::db::statement(pool).await?;
    let now = crate::db::query_scalar("SELECT now()")
        .fetch_one(stmt.conn())
        .await?;
    stmt.done().await?;
    Ok(now)
}

/// Runs per job in the console's charts.
pub const RECENT_RUNS: i64 = 30;

/// One of a job's newest runs, for a chart.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RecentRun {
    pub job_key: String,
    pub job_name: String,
    pub business_date: NaiveDate,
    pub status: RunStatus,
    pub processed_count: i64,
    pub failed_count: i64,
    /// From the current attempt's start to its finish (to now while
    /// RUNNING); `None` for a run that never started.
    pub duration_seconds: Option<f64>,
    /// The first 200 characters of its error.
    pub error: Option<String>,
}

/// Each job's newest `per_job` runs (not partitions), newest business date
/// first: each through the `(job_name, business_date)` index, read
/// backwards.
pub async fn recent_runs(
    pool: &PgPool,
    jobs: &[String],
    per_job: i64,
    clock: Clock,
) -> Result<BTreeMap<String, Vec<RecentRun>>, QueueError> {
    if jobs.is_empty() {
        return Ok(BTreeMap::new());
    }
    let mut stmt = crate::db::statement(pool).await?;
    let rows = crate::db::query(
        "SELECT x.* FROM unnest($1::text[]) AS j(name) CROSS JOIN LATERAL ( \
           SELECT r.job_key::text, r.job_name::text, r.business_date, r.status::text, \
                  r.processed_count, r.failed_count, left(r.error_message, 200) AS error, \
                  extract(epoch FROM COALESCE(r.finished_at, \
                    CASE WHEN r.status = 'RUNNING' THEN COALESCE($3, now()) END) \
                    - r.started_at)::float8 AS secs \
           FROM batch_job_run r WHERE r.job_name = j.name AND r.partition_of IS NULL \
           ORDER BY r.business_date DESC, r.job_key DESC LIMIT $2) x",
    )
    .bind(jobs)
    .bind(per_job)
    .bind(clock.bind())
    .fetch_all(stmt.conn())
    .await?;
    stmt.done().await?;
    let mut out: BTreeMap<String, Vec<RecentRun>> = BTreeMap::new();
    for r in rows {
        let run = RecentRun {
            job_key: r.try_get("job_key")?,
            job_name: r.try_get("job_name")?,
            business_date: r.try_get("business_date")?,
            status: r.try_get("status")?,
            processed_count: r.try_get("processed_count")?,
            failed_count: r.try_get("failed_count")?,
            duration_seconds: r.try_get::<Option<f64>, _>("secs")?.map(|s| s.max(0.0)),
            error: r.try_get("error")?,
        };
        out.entry(run.job_name.clone()).or_default().push(run);
    }
    Ok(out)
}
