//! `batch_job_declared`: the jobs `batchonce migrate` was last given a
//! configuration file for, and what the database checks of an enqueue by a
//! login that does not own the schema (migration 20261208000003): the time
//! zone, `covers`, `partitions`, whether the job is scoped, and the business
//! calendar (`skip_dates`, `skip_weekdays`). The policies, `catch_up` and
//! `enabled` are stored too, for readers (the MISSING periods of
//! `health.rs`); the database bounds the policies without comparing.
//!
//! - `declared_settings(cfg)` is one job's row (`settings` jsonb).
//! - `declare(pool, jobs)` replaces the whole set in one transaction: a job
//!   no longer in the file is no longer declared, an unchanged one keeps its
//!   `declared_at`. Only `migrate` calls it.
//! - `not_as_declared(pool, jobs)` says which of a producer's jobs the
//!   database would refuse, and why, so that one costs only its own tick.
//! - `declared_jobs(pool)` reads the names back (tests).

use std::collections::BTreeMap;

use sqlx::PgPool;

use super::QueueError;
use crate::config::JobConfig;
use crate::key::JobName;

/// What `batch_job_declared.settings` holds for one job. Weekdays are
/// written as PostgreSQL's `to_char(date, 'Dy')` spells them (`Mon`), the
/// way chrono prints them.
pub fn declared_settings(cfg: &JobConfig) -> serde_json::Value {
    let d = |d: std::time::Duration| humantime::format_duration(d).to_string();
    serde_json::json!({
        "timezone": cfg.timezone.name(),
        "covers": cfg.covers.as_str(),
        "partitions": cfg.partitions.max(1),
        "scoped": cfg.scopes.is_some(),
        "schedule": cfg.schedule.as_ref().map(|s| s.as_str()),
        "skip_dates": cfg.skip_dates.iter().map(|x| x.to_string()).collect::<Vec<_>>(),
        "skip_weekdays": cfg.skip_weekdays.iter().map(|w| w.to_string()).collect::<Vec<_>>(),
        // For readers (the MISSING periods of `queue::job_health`): the
        // database compares neither.
        "catch_up": d(cfg.catch_up),
        "enabled": cfg.enabled,
        "max_attempts": cfg.max_attempts,
        "lease_ttl": d(cfg.lease_ttl),
        "stale_after": d(cfg.stale_after),
        "on_lease_expiry": cfg.on_lease_expiry.as_str(),
        "chunk_size": cfg.chunk_size,
        "backoff": d(cfg.backoff),
        "backoff_max": d(cfg.backoff_max),
        "max_item_failures": cfg.max_item_failures,
    })
}

/// What [`declare`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Declared {
    /// Every job now declared.
    pub jobs: Vec<String>,
    /// Jobs that were declared and are no longer.
    pub removed: Vec<String>,
}

/// Makes `jobs` the declared set, in one transaction.
pub async fn declare(
    pool: &PgPool,
    jobs: &BTreeMap<JobName, JobConfig>,
) -> Result<Declared, QueueError> {
    let names: Vec<&str> = jobs.keys().map(JobName::as_str).collect();
    let settings: Vec<serde_json::Value> = jobs.values().map(declared_settings).collect();
    let mut tx = pool.begin().await?;
    let removed: Vec<String> = crate::db::query_scalar(
        "DELETE FROM batch_job_declared WHERE job_name <> ALL ($1::text[]) \
         RETURNING job_name::text",
    )
    .bind(&names)
    .fetch_all(&mut *tx)
    .await?;
    crate::db::query(
        "INSERT INTO batch_job_declared (job_name, settings) \
         SELECT * FROM unnest($1::text[], $2::jsonb[]) \
         ON CONFLICT (job_name) DO UPDATE \
         SET settings = EXCLUDED.settings, declared_at = now() \
         WHERE batch_job_declared.settings IS DISTINCT FROM EXCLUDED.settings",
    )
    .bind(&names)
    .bind(&settings)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    let mut removed = removed;
    removed.sort();
    Ok(Declared {
        jobs: names.iter().map(|n| (*n).to_owned()).collect(),
        removed,
    })
}

/// The keys of a declaration that the database compares a non-owner's
/// enqueue with (migration 20261208000003).
const CHECKED: [&str; 6] = [
    "timezone",
    "covers",
    "partitions",
    "scoped",
    "skip_dates",
    "skip_weekdays",
];

/// Of `jobs`, those a login that does not own the schema may not enqueue
/// as configured here, each with why: not declared, or declared with
/// other values of the keys the database compares.
pub async fn not_as_declared(
    pool: &PgPool,
    jobs: &[(&JobName, &JobConfig)],
) -> Result<Vec<(JobName, String)>, QueueError> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<&str> = jobs.iter().map(|(n, _)| n.as_str()).collect();
    let mut stmt = crate::db::statement(pool).await?;
    let rows: Vec<(String, serde_json::Value)> = crate::db::query_as(
        "SELECT job_name::text, settings FROM batch_job_declared WHERE job_name = ANY ($1)",
    )
    .bind(&names)
    .fetch_all(stmt.conn())
    .await?;
    stmt.done().await?;
    let mut out = Vec::new();
    for (name, cfg) in jobs {
        let Some((_, stored)) = rows.iter().find(|(n, _)| n == name.as_str()) else {
            out.push((
                (*name).clone(),
                format!("job {name} is not declared: run `batchonce migrate` with this configuration file"),
            ));
            continue;
        };
        let mine = declared_settings(cfg);
        let differ: Vec<&str> = CHECKED
            .iter()
            .copied()
            .filter(|k| stored.get(k) != mine.get(k))
            .collect();
        if !differ.is_empty() {
            out.push((
                (*name).clone(),
                format!(
                    "job {name} is declared with another {}: run `batchonce migrate` with this configuration file",
                    differ.join(", ")
                ),
            ));
        }
    }
    Ok(out)
}

/// The names of the declared jobs, sorted.
pub async fn declared_jobs(pool: &PgPool) -> Result<Vec<String>, QueueError> {
    let mut stmt = crate::db::statement(pool).await?;
    let names =
        crate::db::query_scalar("SELECT job_name::text FROM batch_job_declared ORDER BY job_name")
            .fetch_all(stmt.conn())
            .await?;
    stmt.done().await?;
    Ok(names)
}
