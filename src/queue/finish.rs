//! Ending attempts: finishing leased runs in batches (success, skip, retry,
//! fatal, release), the retry backoff, and recovery of runs whose lease
//! expired.
//!
//! - `finish_many` ends up to `MAX_FINISH_BATCH` (1,000) attempts in one statement and one commit:
//!   succeeded, skipped, retry, fatal or release, each conditional on its own `(job_key,
//!   lease_token)` and closing its own attempt row. It returns each run's new status in input
//!   order, or `None` for a token that no longer owns its run (nothing is written for that one, the
//!   others are unaffected); a key twice is refused before anything is written. Rows are locked in
//!   key order, so two batches never wait on each other in a cycle, and the statement starts from
//!   its input rows and looks runs up by key, so its cost grows with the batch, not the table:
//!   `batchonce_finish` names `job_key = ANY (p_keys)` on every table it reads and runs without
//!   sequential scans or nested loops (migration 20261207000002), because under a run table
//!   analyzed while empty or small a plan read all of it for each finish (3 s a finish in a drain).
//!   `finish` is `finish_many` of one. A release also raises the run's `max_attempts` by one,
//!   capped at 1000. `finish_many_within` is the same statement in a transaction with
//!   `lock_timeout` set (`SET LOCAL`, through `set_config`), for a worker's release after an abort.
//! - `finish_many_detailed` is `finish_many` that also says whether each attempt's lease had
//!   already expired when it finished (accepted, as nobody took the run over, but the worker counts
//!   it as a lost lease).
//! - `backoff_delay` computes the retry delay with jitter.
//! - `fold_tally()` folds the counts the finishes appended (migration 20261209000001); every
//!   worker's recovery loop calls it.
//! - `recover_expired(jobs, legacy_retry, clock)` handles lease-expiry recovery for the worker's
//!   jobs, following each run's stored `on_lease_expiry`; `legacy_retry` (the worker's own `retry`
//!   jobs) serves only runs without a context. It locks with `FOR UPDATE SKIP LOCKED`, so a run
//!   whose holder has a fence open is left until the fence ends. It reads the running list's keys
//!   first and the runs by them, like the finish (migration 20261207000002).

use std::collections::HashSet;
use std::time::Duration;

use rand::Rng;
use sqlx::{PgPool, Row};

use super::{Fence, QueueError, RunStatus};
use crate::clock::Clock;
use crate::key::{JobKey, JobName};
use crate::text::truncate;

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

/// Lease-expiry recovery (`docs/operations.md`, "What happens without an
/// operator: `on_lease_expiry`") for runs of `jobs` whose stored
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

/// Folds the rows the finishes appended to `batch_job_tally` into one per
/// job and outcome (`batchonce_fold_tally`), so the counts every view reads
/// stay a few rows however many runs finished. The sums do not change;
/// returns how many rows were folded (0 when another worker is folding).
pub async fn fold_tally(pool: &PgPool) -> Result<i64, QueueError> {
    let mut stmt = crate::db::statement(pool).await?;
    let folded = crate::db::query_scalar("SELECT batchonce_fold_tally()")
        .fetch_one(stmt.conn())
        .await?;
    stmt.done().await?;
    Ok(folded)
}

/// Records the last lines a command job's program printed on the attempt
/// its lease token names (`None` leaves what is there), and returns the
/// items the program counted on that attempt with `batchonce_progress`
/// (processed, failed); `(0, 0)` when the attempt is not found.
pub async fn record_output(
    pool: &PgPool,
    key: &JobKey,
    token: i64,
    output: Option<&str>,
) -> Result<(i64, i64), QueueError> {
    let mut stmt = crate::db::statement(pool).await?;
    let row: Option<(i64, i64)> =
        crate::db::query_as("SELECT processed, failed FROM batchonce_attempt_output($1, $2, $3)")
            .bind(key.as_str())
            .bind(token)
            .bind(output.map(truncate_output))
            .fetch_optional(stmt.conn())
            .await?;
    stmt.done().await?;
    Ok(row.unwrap_or((0, 0)))
}

/// The most output characters kept per attempt (the schema's CHECK).
pub const MAX_OUTPUT_CHARS: usize = 4000;

fn truncate_output(s: &str) -> String {
    // The newest lines matter most: cut from the front, on a char boundary.
    let n = s.chars().count();
    if n <= MAX_OUTPUT_CHARS {
        return s.to_owned();
    }
    s.chars().skip(n - MAX_OUTPUT_CHARS).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
