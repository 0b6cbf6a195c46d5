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
//! - `declared_job(pool, job)` reads one job's declaration back, and
//!   `config_from_declared(settings)` turns it into the `JobConfig` that
//!   builds its runs' contexts, for the console's enqueue of missing
//!   periods, which has no configuration file of its own.

use std::collections::BTreeMap;

use sqlx::PgPool;

use super::QueueError;
use crate::config::{JobConfig, LeaseExpiryPolicy};
use crate::key::JobName;
use crate::schedule::{Covers, CronSchedule};

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

/// One job's declaration (`batch_job_declared.settings`), if `migrate`
/// declared it.
pub async fn declared_job(
    pool: &PgPool,
    job: &JobName,
) -> Result<Option<serde_json::Value>, QueueError> {
    let mut stmt = crate::db::statement(pool).await?;
    let settings =
        crate::db::query_scalar("SELECT settings FROM batch_job_declared WHERE job_name = $1")
            .bind(job.as_str())
            .fetch_optional(stmt.conn())
            .await?;
    stmt.done().await?;
    Ok(settings)
}

/// A declared job read back from what [`declared_settings`] stored.
#[derive(Debug, Clone)]
pub struct DeclaredJob {
    /// The configuration its runs' contexts are built from: the time zone,
    /// schedule, covers, calendar, partitions and policies as declared,
    /// everything else the engine's defaults.
    pub config: JobConfig,
    /// The declaration says the job is scoped; it does not say which scopes
    /// (a list or a query), so `config.scopes` is `None` all the same.
    pub scoped: bool,
}

/// Reads a declaration back into the configuration that built it, as far
/// as the declaration goes (see [`DeclaredJob`]). `Err` names the first
/// value this release cannot read.
pub fn config_from_declared(settings: &serde_json::Value) -> Result<DeclaredJob, String> {
    let text = |k: &str| settings.get(k).and_then(|v| v.as_str());
    let need = |k: &str| text(k).ok_or_else(|| format!("the declaration has no {k}"));
    let duration = |k: &str| -> Result<std::time::Duration, String> {
        humantime::parse_duration(need(k)?).map_err(|e| format!("the declared {k}: {e}"))
    };
    let number = |k: &str| -> Result<u64, String> {
        settings
            .get(k)
            .and_then(|v| v.as_u64())
            .ok_or_else(|| format!("the declared {k} is not a number"))
    };
    let small = |k: &str| -> Result<u32, String> {
        u32::try_from(number(k)?).map_err(|_| format!("the declared {k} is too large"))
    };
    let list = |k: &str| -> Vec<&str> {
        settings
            .get(k)
            .and_then(|v| v.as_array())
            .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default()
    };
    let timezone = need("timezone")?.parse().map_err(|_| {
        format!(
            "the declared time zone {} is unknown",
            need("timezone").unwrap_or("")
        )
    })?;
    let covers = Covers::parse(need("covers")?)
        .ok_or_else(|| "the declared covers is unknown".to_owned())?;
    let schedule = text("schedule").map(CronSchedule::parse).transpose()?;
    let on_lease_expiry = match need("on_lease_expiry")? {
        "retry" => LeaseExpiryPolicy::Retry,
        "hold" => LeaseExpiryPolicy::Hold,
        other => return Err(format!("the declared on_lease_expiry {other} is unknown")),
    };
    let skip_dates = list("skip_dates")
        .into_iter()
        .map(|d| crate::key::parse_date(d).map_err(|e| format!("the declared skip_dates: {e}")))
        .collect::<Result<_, _>>()?;
    let skip_weekdays = list("skip_weekdays")
        .into_iter()
        .map(|d| {
            d.parse::<chrono::Weekday>()
                .map_err(|_| format!("the declared skip_weekdays: {d} is no weekday"))
        })
        .collect::<Result<_, _>>()?;
    let partitions = u16::try_from(number("partitions")?)
        .ok()
        .filter(|n| (1..=crate::key::MAX_PARTITIONS).contains(n))
        .ok_or_else(|| "the declared partitions are not 1 to 256".to_owned())?;
    let config = JobConfig {
        timezone,
        covers,
        schedule,
        skip_dates,
        skip_weekdays,
        partitions,
        max_attempts: small("max_attempts")?,
        lease_ttl: duration("lease_ttl")?,
        stale_after: duration("stale_after")?,
        on_lease_expiry,
        chunk_size: small("chunk_size")?,
        backoff: duration("backoff")?,
        backoff_max: duration("backoff_max")?,
        max_item_failures: settings.get("max_item_failures").and_then(|v| v.as_u64()),
        ..JobConfig::default()
    };
    Ok(DeclaredJob {
        config,
        scoped: settings.get("scoped").and_then(|v| v.as_bool()) == Some(true),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_declaration_reads_back_into_the_configuration_it_came_from() {
        let cfg = JobConfig {
            timezone: chrono_tz::Asia::Seoul,
            covers: Covers::Firing,
            schedule: Some(CronSchedule::parse("*/15 * * * *").unwrap()),
            skip_dates: vec![crate::key::parse_date("2026-09-16").unwrap()],
            skip_weekdays: vec![chrono::Weekday::Sun],
            partitions: 4,
            max_attempts: 7,
            lease_ttl: std::time::Duration::from_millis(2500),
            stale_after: std::time::Duration::from_secs(90),
            on_lease_expiry: LeaseExpiryPolicy::Hold,
            chunk_size: 25,
            backoff: std::time::Duration::from_secs(1),
            backoff_max: std::time::Duration::from_secs(5),
            max_item_failures: Some(3),
            ..JobConfig::default()
        };
        let back = config_from_declared(&declared_settings(&cfg)).unwrap();
        assert!(!back.scoped);
        assert_eq!(back.config, cfg);
        // What it cannot read, it names.
        let mut bad = declared_settings(&cfg);
        bad["timezone"] = serde_json::json!("Mars/Base");
        assert!(config_from_declared(&bad)
            .unwrap_err()
            .contains("time zone"));
        bad = declared_settings(&cfg);
        bad["lease_ttl"] = serde_json::json!("soon");
        assert!(config_from_declared(&bad)
            .unwrap_err()
            .contains("lease_ttl"));
    }
}
