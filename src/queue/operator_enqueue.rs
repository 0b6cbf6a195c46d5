//! An operator's enqueue of a job's missing periods (the console's
//! calendar): whole, unscoped runs, each with the context its job's
//! declaration gives it, inserted by `batchonce_operator_enqueue`
//! (migration 20261210000020), which enqueues through `batchonce_enqueue2`,
//! so an operator's or the console's login is checked against the
//! declaration as a producer's is, and writes one `enqueue` audit row per
//! run inserted, in the same transaction.
//!
//! - `existing_runs(keys)` says which of some keys already have a run, live
//!   (its state) or archived (`ARCHIVED`): such a period is not missing.
//! - `job_known(job)` says whether anything in the database names a job (a
//!   declaration, a run, an archived run, a process's recorded
//!   configuration), so the console can answer 404 for any other name.
//! - `operator_enqueue(runs, operator, reason, remote)` enqueues at most
//!   [`MAX_OPERATOR_ENQUEUE`] runs in one transaction and reports, in input
//!   order, the runs inserted (with their state) and the keys that existed
//!   already (duplicates, which change nothing and are not audited).

use sqlx::{PgPool, Row};

use super::{context, NewRun, QueueError, RunStatus};
use crate::key::{JobKey, JobName};
use crate::text::truncate;

/// Most runs one operator enqueue may insert (the function's own bound).
pub const MAX_OPERATOR_ENQUEUE: usize = 400;

/// What [`operator_enqueue`] did, key by key, in input order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorEnqueued {
    /// Runs inserted, each with its state (PENDING, or SKIPPED for a period
    /// the declared calendar skips) and one audit row.
    pub enqueued: Vec<(JobKey, RunStatus)>,
    /// Keys that had a run already (live or archived): nothing changed.
    pub duplicates: Vec<JobKey>,
}

/// Which of `keys` have a run: `(key, state)`, `ARCHIVED` for one the
/// archive holds.
pub async fn existing_runs(
    pool: &PgPool,
    keys: &[JobKey],
) -> Result<Vec<(String, String)>, QueueError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let keys: Vec<&str> = keys.iter().map(JobKey::as_str).collect();
    let mut stmt = crate::db::statement(pool).await?;
    let rows = crate::db::query_as(
        "SELECT r.job_key::text, r.status::text FROM batch_job_run r WHERE r.job_key = ANY ($1) \
         UNION ALL \
         SELECT a.job_key::text, 'ARCHIVED' FROM batch_job_run_archive a WHERE a.job_key = ANY ($1)",
    )
    .bind(&keys)
    .fetch_all(stmt.conn())
    .await?;
    stmt.done().await?;
    Ok(rows)
}

/// Whether the database knows `job` at all: declared, with a run (live or
/// archived), or in a process's recorded configuration.
pub async fn job_known(pool: &PgPool, job: &JobName) -> Result<bool, QueueError> {
    let mut stmt = crate::db::statement(pool).await?;
    let known = crate::db::query_scalar(
        "SELECT EXISTS (SELECT FROM batch_job_declared WHERE job_name = $1) \
             OR EXISTS (SELECT FROM batch_job_run WHERE job_name = $1) \
             OR EXISTS (SELECT FROM batch_job_run_archive WHERE job_name = $1) \
             OR EXISTS (SELECT FROM batch_process_config WHERE job_name = $1)",
    )
    .bind(job.as_str())
    .fetch_one(stmt.conn())
    .await?;
    stmt.done().await?;
    Ok(known)
}

/// Enqueues `runs` (whole, unscoped runs with no payload) as `operator`
/// for `reason`, auditing each run inserted; `remote` is the console
/// user's address for the audit rows. One transaction.
pub async fn operator_enqueue(
    pool: &PgPool,
    runs: &[NewRun],
    operator: &str,
    reason: &str,
    remote: Option<&str>,
) -> Result<OperatorEnqueued, QueueError> {
    if runs.is_empty() {
        return Ok(OperatorEnqueued::default());
    }
    if runs.len() > MAX_OPERATOR_ENQUEUE {
        return Err(QueueError::Invalid(format!(
            "{} runs at once; an operator enqueues at most {MAX_OPERATOR_ENQUEUE}",
            runs.len()
        )));
    }
    let mut keys = Vec::with_capacity(runs.len());
    let mut names = Vec::with_capacity(runs.len());
    let mut dates = Vec::with_capacity(runs.len());
    let mut maxes = Vec::with_capacity(runs.len());
    let mut reasons: Vec<Option<String>> = Vec::with_capacity(runs.len());
    let mut parts: Vec<i32> = Vec::with_capacity(runs.len());
    let mut contexts = context::Arrays::default();
    let mut seen = std::collections::HashSet::new();
    for r in runs {
        if r.key.job_name() != r.job.as_str() {
            return Err(QueueError::Invalid(format!(
                "job key {} does not belong to job {}",
                r.key, r.job
            )));
        }
        if r.scope_query.is_some() || r.key.scope().is_some() || r.key.parent().is_some() {
            return Err(QueueError::Invalid(format!(
                "{}: an operator enqueues whole, unscoped runs only",
                r.key
            )));
        }
        if !seen.insert(r.key.as_str()) {
            return Err(QueueError::Invalid(format!("{} is given twice", r.key)));
        }
        keys.push(r.key.as_str().to_owned());
        names.push(r.job.as_str().to_owned());
        dates.push(r.business_date);
        maxes.push(r.max_attempts.min(i32::MAX as u32) as i32);
        reasons.push(r.skip_reason.as_deref().map(truncate));
        parts.push(i32::from(r.partitions.clamp(1, crate::key::MAX_PARTITIONS)));
        contexts.push(&r.context);
    }
    let mut tx = pool.begin().await?;
    if let Some(addr) = remote {
        // The audit rows' `remote_addr` (the stamp trigger reads it), local
        // to this transaction.
        crate::db::query("SELECT set_config('batchonce.remote_addr', $1, true)")
            .bind(truncate(addr))
            .execute(&mut *tx)
            .await?;
    }
    let q = crate::db::query(
        "SELECT job_key, status FROM batchonce_operator_enqueue($1, $2, $3, $4, $5, \
         $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)",
    )
    .bind(&keys)
    .bind(&names)
    .bind(&dates)
    .bind(&maxes)
    .bind(&reasons);
    let rows = contexts
        .bind(q)
        .bind(&parts)
        .bind(operator)
        .bind(reason)
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    let mut inserted = std::collections::HashMap::new();
    for row in rows {
        let key: String = row.try_get("job_key")?;
        let status: RunStatus = row.try_get("status")?;
        inserted.insert(key, status);
    }
    let mut out = OperatorEnqueued::default();
    for r in runs {
        match inserted.get(r.key.as_str()) {
            Some(status) => out.enqueued.push((r.key.clone(), *status)),
            None => out.duplicates.push(r.key.clone()),
        }
    }
    Ok(out)
}
