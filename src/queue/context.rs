//! The run-context columns of `batch_job_run` (see [`crate::config::context`]): how
//! they are bound when runs are enqueued, read back from any statement that
//! selects them, and frozen on runs that a previous release enqueued without
//! them. Part of the queue, which alone writes the table.

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{PgPool, Postgres, Row};

use super::{Fence, QueueError};
use crate::config::context::RunContext;
use crate::config::LeaseExpiryPolicy;
use crate::key::{JobKey, JobName};
use crate::schedule::Covers;

/// The context columns of a run aliased `r`, with durations as seconds, for
/// every select list and `RETURNING` clause that [`from_row`] reads.
pub(crate) const COLUMNS: &str = "r.timezone, r.period_start, r.period_end, r.covers, \
    extract(epoch FROM r.lease_ttl)::float8 AS lease_ttl_s, \
    extract(epoch FROM r.stale_after)::float8 AS stale_after_s, \
    r.on_lease_expiry, r.chunk_size, \
    extract(epoch FROM r.backoff)::float8 AS backoff_s, \
    extract(epoch FROM r.backoff_max)::float8 AS backoff_max_s, \
    r.max_item_failures, r.attempt_budget";

/// Column-wise arrays of contexts, bound as `$n … $n+11` in the order of
/// [`ASSIGN`]'s placeholders.
#[derive(Debug, Default)]
pub(crate) struct Arrays {
    timezone: Vec<String>,
    period_start: Vec<DateTime<Utc>>,
    period_end: Vec<DateTime<Utc>>,
    covers: Vec<&'static str>,
    lease_ttl: Vec<f64>,
    stale_after: Vec<f64>,
    on_lease_expiry: Vec<&'static str>,
    chunk_size: Vec<i32>,
    backoff: Vec<f64>,
    backoff_max: Vec<f64>,
    max_item_failures: Vec<Option<i64>>,
    attempt_budget: Vec<i32>,
}

impl Arrays {
    pub(crate) fn push(&mut self, c: &RunContext) {
        self.timezone.push(c.timezone.name().to_owned());
        self.period_start.push(c.period_start);
        self.period_end.push(c.period_end);
        self.covers.push(c.covers.as_str());
        self.lease_ttl.push(c.lease_ttl.as_secs_f64());
        self.stale_after.push(c.stale_after.as_secs_f64());
        self.on_lease_expiry.push(c.on_lease_expiry.as_str());
        self.chunk_size
            .push(c.chunk_size.min(i32::MAX as u32) as i32);
        self.backoff.push(c.backoff.as_secs_f64());
        self.backoff_max.push(c.backoff_max.as_secs_f64());
        self.max_item_failures
            .push(c.max_item_failures.map(|n| n.min(i64::MAX as u64) as i64));
        self.attempt_budget
            .push(c.attempt_budget.min(i32::MAX as u32) as i32);
    }

    /// Binds the twelve arrays, in order, after the query's other parameters.
    pub(crate) fn bind<'q>(
        &'q self,
        q: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments> {
        q.bind(&self.timezone)
            .bind(&self.period_start)
            .bind(&self.period_end)
            .bind(&self.covers)
            .bind(&self.lease_ttl)
            .bind(&self.stale_after)
            .bind(&self.on_lease_expiry)
            .bind(&self.chunk_size)
            .bind(&self.backoff)
            .bind(&self.backoff_max)
            .bind(&self.max_item_failures)
            .bind(&self.attempt_budget)
    }
}

/// `unnest` of the twelve arrays starting at parameter `$first`, as
/// `c(tz, ps, pe, cov, ttl, stale, exp, chunk, bo, bomax, mif, budget)`.
pub(crate) fn unnest(first: usize) -> String {
    let types = [
        "text[]",
        "timestamptz[]",
        "timestamptz[]",
        "text[]",
        "float8[]",
        "float8[]",
        "text[]",
        "int[]",
        "float8[]",
        "float8[]",
        "int8[]",
        "int[]",
    ];
    let args: Vec<String> = types
        .iter()
        .enumerate()
        .map(|(i, t)| format!("${}::{t}", first + i))
        .collect();
    args.join(", ")
}

/// The aliases [`unnest`] produces, in order.
pub(crate) const UNNEST_ALIASES: &str =
    "tz, ps, pe, cov, ttl, stale, exp, chunk, bo, bomax, mif, budget";

/// `SET` assignments of the context columns from a row aliased `c` with
/// [`UNNEST_ALIASES`].
pub(crate) const ASSIGN: &str = "timezone = c.tz, period_start = c.ps, period_end = c.pe, \
    covers = c.cov, lease_ttl = make_interval(secs => c.ttl), \
    stale_after = make_interval(secs => c.stale), on_lease_expiry = c.exp, \
    chunk_size = c.chunk, backoff = make_interval(secs => c.bo), \
    backoff_max = make_interval(secs => c.bomax), max_item_failures = c.mif, \
    attempt_budget = c.budget";

/// The context a row carries, or `None` for a run enqueued by a release
/// that stored none.
pub(crate) fn from_row(row: &PgRow) -> Result<Option<RunContext>, QueueError> {
    let Some(tz): Option<String> = row.try_get("timezone")? else {
        return Ok(None);
    };
    let bad = |what: &str, v: &str| {
        QueueError::Invalid(format!("stored run context has an invalid {what}: {v:?}"))
    };
    let secs = |col: &str| -> Result<std::time::Duration, QueueError> {
        let s: Option<f64> = row.try_get(col)?;
        let s = s.ok_or_else(|| bad(col, "NULL"))?;
        std::time::Duration::try_from_secs_f64(s).map_err(|_| bad(col, &s.to_string()))
    };
    let covers: String = row
        .try_get::<Option<String>, _>("covers")?
        .unwrap_or_default();
    let expiry: String = row
        .try_get::<Option<String>, _>("on_lease_expiry")?
        .unwrap_or_default();
    let chunk: Option<i32> = row.try_get("chunk_size")?;
    let budget: Option<i32> = row.try_get("attempt_budget")?;
    let mif: Option<i64> = row.try_get("max_item_failures")?;
    Ok(Some(RunContext {
        timezone: tz.parse().map_err(|_| bad("time zone", &tz))?,
        period_start: row
            .try_get::<Option<DateTime<Utc>>, _>("period_start")?
            .ok_or_else(|| bad("period_start", "NULL"))?,
        period_end: row
            .try_get::<Option<DateTime<Utc>>, _>("period_end")?
            .ok_or_else(|| bad("period_end", "NULL"))?,
        covers: Covers::parse(&covers).ok_or_else(|| bad("covers", &covers))?,
        lease_ttl: secs("lease_ttl_s")?,
        stale_after: secs("stale_after_s")?,
        on_lease_expiry: match expiry.as_str() {
            "retry" => LeaseExpiryPolicy::Retry,
            "hold" => LeaseExpiryPolicy::Hold,
            other => return Err(bad("on_lease_expiry", other)),
        },
        chunk_size: chunk
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| bad("chunk_size", &format!("{chunk:?}")))?,
        backoff: secs("backoff_s")?,
        backoff_max: secs("backoff_max_s")?,
        max_item_failures: mif.and_then(|n| u64::try_from(n).ok()),
        attempt_budget: budget
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| bad("attempt_budget", &format!("{budget:?}")))?,
    }))
}

/// Freezes the context of a run the caller holds, if it has none yet (a
/// run enqueued by the previous release), and returns the run's context
/// either way: whoever froze it first decided it for good.
pub async fn freeze_held(
    pool: &PgPool,
    fence: &Fence,
    context: &RunContext,
) -> Result<RunContext, QueueError> {
    let c = context;
    // A database function: only the lease holder can freeze, and only a
    // run that has no context yet (migration 20261203000004).
    let mut stmt = crate::db::statement(pool).await?;
    let row = crate::db::query(
        "SELECT * FROM batchonce_freeze_context($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, \
         $12, $13, $14)",
    )
    .bind(fence.key.as_str())
    .bind(fence.token)
    .bind(c.timezone.name())
    .bind(c.period_start)
    .bind(c.period_end)
    .bind(c.covers.as_str())
    .bind(c.lease_ttl.as_secs_f64())
    .bind(c.stale_after.as_secs_f64())
    .bind(c.on_lease_expiry.as_str())
    .bind(c.chunk_size.min(i32::MAX as u32) as i32)
    .bind(c.backoff.as_secs_f64())
    .bind(c.backoff_max.as_secs_f64())
    .bind(c.max_item_failures.map(|n| n.min(i64::MAX as u64) as i64))
    .bind(c.attempt_budget.min(i32::MAX as u32) as i32)
    .fetch_optional(stmt.conn())
    .await?;
    stmt.done().await?;
    let Some(row) = row else {
        return Err(QueueError::LeaseLost(fence.key.to_string()));
    };
    from_row(&row)?.ok_or_else(|| QueueError::LeaseLost(fence.key.to_string()))
}

/// A live run (PENDING, RUNNING or FAILED) that has no context yet.
#[derive(Debug, Clone)]
pub struct LegacyRun {
    pub key: JobKey,
    pub job: JobName,
    pub business_date: NaiveDate,
}

/// The live runs without a context, oldest first, at most `limit`.
pub async fn legacy_runs(pool: &PgPool, limit: i64) -> Result<Vec<LegacyRun>, QueueError> {
    let mut stmt = crate::db::statement(pool).await?;
    let rows = crate::db::query(
        "SELECT job_key, job_name, business_date FROM batch_job_run \
         WHERE timezone IS NULL AND status IN ('PENDING', 'RUNNING', 'FAILED') \
         ORDER BY enqueued_at, job_key LIMIT $1",
    )
    .bind(limit)
    .fetch_all(stmt.conn())
    .await?;
    stmt.done().await?;
    rows.iter()
        .map(|r| {
            let key: String = r.try_get("job_key")?;
            let job: String = r.try_get("job_name")?;
            Ok(LegacyRun {
                key: JobKey::parse(&key).map_err(|e| QueueError::Invalid(e.to_string()))?,
                job: JobName::parse(&job).map_err(|e| QueueError::Invalid(e.to_string()))?,
                business_date: r.try_get("business_date")?,
            })
        })
        .collect()
}

/// Freezes the contexts of runs that have none, in one statement; a run
/// that got one meanwhile keeps it. Returns how many were frozen.
pub async fn freeze_legacy(
    pool: &PgPool,
    runs: &[(JobKey, RunContext)],
) -> Result<u64, QueueError> {
    if runs.is_empty() {
        return Ok(0);
    }
    let keys: Vec<&str> = runs.iter().map(|(k, _)| k.as_str()).collect();
    let mut arrays = Arrays::default();
    for (_, c) in runs {
        arrays.push(c);
    }
    let sql = format!(
        "WITH c AS (SELECT * FROM unnest($1::text[], {}) AS c(job_key, {UNNEST_ALIASES})) \
         UPDATE batch_job_run r SET {ASSIGN} FROM c \
         WHERE r.job_key = c.job_key AND r.timezone IS NULL",
        unnest(2)
    );
    let mut stmt = crate::db::statement(pool).await?;
    let n = arrays
        .bind(crate::db::query(&sql).bind(&keys))
        .execute(stmt.conn())
        .await?
        .rows_affected();
    stmt.done().await?;
    Ok(n)
}
