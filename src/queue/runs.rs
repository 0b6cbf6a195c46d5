//! Read views of single runs for inspection: `runs list`, `runs show` and
//! a run's audited operator history. Reads only; nothing here writes, and
//! nothing here reads a lease token: a token is the capability to change a
//! run, and the roles that inspect runs may not read it (`batchonce roles`);
//! an attempt is named by its number.
//!
//! - `list_runs`, `show_run` and `status` serve inspection. `actions` lists a run's rows of
//!   `batch_operator_action`, oldest first, for `runs show`.

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};

use super::{context, QueueError, RunStatus};
use crate::config::context::RunContext;
use crate::key::{JobKey, JobName, Scope};

/// One run as the inspection commands show it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunView {
    pub job_key: String,
    pub job_name: String,
    pub business_date: NaiveDate,
    pub status: RunStatus,
    pub attempts: i32,
    pub max_attempts: i32,
    pub next_run_at: DateTime<Utc>,
    pub lease_owner: Option<String>,
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
    /// Whole run, a partition of a parent, or a partitioned parent (whose
    /// own claim is the final step).
    pub step: super::Step,
    /// A partition's parent run.
    pub partition_of: Option<String>,
    /// The scope the key names (`…@seller-4711`), for a scoped run.
    pub scope: Option<String>,
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
    pub worker_id: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub outcome: Option<String>,
    pub error_message: Option<String>,
    pub processed_count: i64,
    pub failed_count: i64,
    /// The last lines a command job's program printed in this attempt
    /// (`stdout: …` / `stderr: …`, one per line); `None` for other kinds and
    /// for attempts of a release that did not record them.
    pub output: Option<String>,
}

pub(super) const RUN_COLUMNS: &str =
    "r.job_key, r.job_name, r.business_date, r.status, r.attempts, \
    r.max_attempts, r.next_run_at, r.lease_owner, r.lease_expires_at, \
    r.heartbeat_at, r.enqueued_at, r.started_at, r.finished_at, r.processed_count, \
    r.failed_count, r.error_message, now() AS read_at, r.partition_no::int AS partition_no, \
    r.partition_count::int AS partition_count, r.partition_of, r.scope::text AS scope";

pub(super) fn run_from_row(row: &PgRow) -> Result<RunView, QueueError> {
    Ok(RunView {
        job_key: row.try_get("job_key")?,
        job_name: row.try_get("job_name")?,
        business_date: row.try_get("business_date")?,
        status: row.try_get("status")?,
        attempts: row.try_get("attempts")?,
        max_attempts: row.try_get("max_attempts")?,
        next_run_at: row.try_get("next_run_at")?,
        lease_owner: row.try_get("lease_owner")?,
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
        step: super::Step::from_row(row)?,
        partition_of: row.try_get("partition_of")?,
        scope: row.try_get("scope")?,
    })
}

/// The columns [`attempt_from_row`] reads, of `batch_job_attempt` or its
/// archive (never the token).
pub(super) const ATTEMPT_COLUMNS: &str = "attempt, worker_id, started_at, finished_at, outcome, \
    error_message, processed_count, failed_count, output_tail";

pub(super) fn attempt_from_row(r: &PgRow) -> Result<AttemptView, sqlx::Error> {
    Ok(AttemptView {
        attempt: r.try_get("attempt")?,
        worker_id: r.try_get("worker_id")?,
        started_at: r.try_get("started_at")?,
        finished_at: r.try_get("finished_at")?,
        outcome: r.try_get("outcome")?,
        error_message: r.try_get("error_message")?,
        processed_count: r.try_get("processed_count")?,
        failed_count: r.try_get("failed_count")?,
        output: r.try_get("output_tail")?,
    })
}

/// Runs, newest business date first, optionally filtered; a partitioned
/// run is listed once, by its parent (`runs show` lists its partitions).
pub async fn list_runs(
    pool: &PgPool,
    status: Option<RunStatus>,
    job: Option<&JobName>,
    scope: Option<&Scope>,
    limit: u32,
) -> Result<Vec<RunView>, QueueError> {
    // One query for every list, the console's included.
    let filter = super::RunFilter {
        job: job.cloned(),
        status,
        scope: scope.cloned(),
        ..Default::default()
    };
    super::search_runs(pool, &filter, None, limit).await
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
    let attempts = crate::db::query(&format!(
        "SELECT {ATTEMPT_COLUMNS} FROM batch_job_attempt WHERE job_key = $1 ORDER BY attempt"
    ))
    .bind(key.as_str())
    .fetch_all(stmt.conn())
    .await?
    .iter()
    .map(attempt_from_row)
    .collect::<Result<Vec<_>, sqlx::Error>>()?;
    stmt.done().await?;
    Ok(Some((run, attempts)))
}

/// One audited operator action, for `runs show`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ActionView {
    pub at: DateTime<Utc>,
    pub operator: String,
    pub session_user: String,
    pub action: String,
    pub reason: String,
    /// Text, not a [`RunStatus`]: an `enqueue` row's `before_status` is
    /// `MISSING`, and a job's rows (`pause`, `archive`) name its states.
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
