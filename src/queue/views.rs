//! Read views of the queue for operators: `status`, `runs stale` and the
//! exporter's gauges. They share one rule for what is stale, computed from
//! what each run stores (its `stale_after`, lease length and lease-expiry
//! policy), so every view gives the same answer whatever configuration file
//! the reader has. The file only fills in for runs the previous release
//! enqueued without a context, and engine defaults for jobs it does not
//! name.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};

use super::{QueueError, RunStatus};
use crate::clock::Clock;
use crate::config::{JobConfig, LeaseExpiryPolicy};
use crate::key::JobName;

/// A job's policies as the reader's configuration gives them: used only for
/// runs that store none (enqueued by the previous release).
#[derive(Debug, Clone)]
pub struct StaleSpec {
    pub job: JobName,
    pub stale_after: Duration,
    pub lease_ttl: Duration,
    /// Under policy `hold`, an expired lease is reported even if the run is
    /// younger than `stale_after`.
    pub hold: bool,
}

impl StaleSpec {
    /// The fallback specs of every job in a configuration.
    pub fn from_config(config: &crate::config::Config) -> Vec<Self> {
        config
            .jobs
            .iter()
            .map(|(n, c)| Self {
                job: n.clone(),
                stale_after: c.stale_after,
                lease_ttl: c.lease_ttl,
                hold: c.on_lease_expiry == LeaseExpiryPolicy::Hold,
            })
            .collect()
    }
}

/// The RUNNING runs with their effective policies, as `live` (r, eff_stale,
/// eff_ttl, eff_hold, is_stale) and the instant `t.now`. Parameters: $1 job
/// names, $2 stale seconds, $3 lease seconds, $4 hold flags (the fallback
/// specs), $5 the clock, $6 and $7 the engine's default stale and lease
/// seconds. A run is stale when it started more than its `stale_after` ago,
/// or when its lease expired under policy `hold`.
const LIVE: &str = r#"
    fallback AS (
        SELECT * FROM unnest($1::text[], $2::float8[], $3::float8[], $4::bool[])
            AS f(job_name, stale_secs, ttl_secs, hold)
    ), t AS (SELECT COALESCE($5, now()) AS now),
    live AS (
        SELECT r.*,
               COALESCE(r.stale_after, make_interval(secs => COALESCE(f.stale_secs, $6))) AS eff_stale,
               COALESCE(r.lease_ttl, make_interval(secs => COALESCE(f.ttl_secs, $7))) AS eff_ttl,
               COALESCE(r.on_lease_expiry = 'hold', f.hold, false) AS eff_hold
        FROM batch_job_run r
        LEFT JOIN fallback f ON f.job_name = r.job_name
        -- A lease expiry is set exactly while RUNNING; saying so lets the
        -- scan use batch_job_run_lease_idx.
        WHERE r.status = 'RUNNING' AND r.lease_expires_at IS NOT NULL
    ), judged AS (
        SELECT live.*, t.now,
               (live.started_at < t.now - live.eff_stale
                OR (live.eff_hold AND live.lease_expires_at <= t.now)) AS is_stale
        FROM live CROSS JOIN t
    )
"#;

/// Binds the seven parameters [`LIVE`] takes.
fn bind_live<'q>(
    q: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    specs: &'q Specs,
    clock: Clock,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let d = JobConfig::default();
    q.bind(&specs.names)
        .bind(&specs.stale)
        .bind(&specs.ttl)
        .bind(&specs.hold)
        .bind(clock.bind())
        .bind(d.stale_after.as_secs_f64())
        .bind(d.lease_ttl.as_secs_f64())
}

struct Specs {
    names: Vec<String>,
    stale: Vec<f64>,
    ttl: Vec<f64>,
    hold: Vec<bool>,
}

impl Specs {
    fn new(specs: &[StaleSpec]) -> Self {
        Self {
            names: specs.iter().map(|s| s.job.to_string()).collect(),
            stale: specs.iter().map(|s| s.stale_after.as_secs_f64()).collect(),
            ttl: specs.iter().map(|s| s.lease_ttl.as_secs_f64()).collect(),
            hold: specs.iter().map(|s| s.hold).collect(),
        }
    }
}

/// Counts per job and status, for `status`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StatusCount {
    pub job_name: String,
    pub status: String,
    pub runs: i64,
}

/// The queue at a glance.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QueueStatus {
    pub counts: Vec<StatusCount>,
    /// Age in seconds of the oldest due PENDING run, by the database clock.
    pub oldest_pending_seconds: Option<f64>,
    /// RUNNING runs whose lease has expired.
    pub expired_leases: i64,
    /// Stale runs, by the rule `runs stale` and the exporter use.
    pub stale: Vec<String>,
}

/// Counts per job and status, the oldest due PENDING run, expired leases
/// and stale runs. `fallback` serves only runs that store no policies.
pub async fn status(
    pool: &PgPool,
    fallback: &[StaleSpec],
    clock: Clock,
) -> Result<QueueStatus, QueueError> {
    let mut stmt = crate::db::statement(pool).await?;
    let counts = crate::db::query(
        "SELECT job_name, status, count(*) AS runs FROM batch_job_run \
         GROUP BY job_name, status ORDER BY job_name, status",
    )
    .fetch_all(stmt.conn())
    .await?
    .iter()
    .map(|r| {
        Ok(StatusCount {
            job_name: r.try_get("job_name")?,
            status: r.try_get("status")?,
            runs: r.try_get("runs")?,
        })
    })
    .collect::<Result<Vec<_>, sqlx::Error>>()?;
    stmt.done().await?;
    let mut stmt = crate::db::statement(pool).await?;
    let oldest: Option<f64> = crate::db::query_scalar(
        "SELECT extract(epoch FROM COALESCE($1, now()) - min(next_run_at))::float8 \
         FROM batch_job_run WHERE status = 'PENDING' AND next_run_at <= COALESCE($1, now())",
    )
    .bind(clock.bind())
    .fetch_one(stmt.conn())
    .await?;
    stmt.done().await?;
    let specs = Specs::new(fallback);
    let sql = format!(
        "WITH {LIVE} SELECT job_key, lease_expires_at <= now AS expired, is_stale \
         FROM judged ORDER BY started_at, job_key"
    );
    let mut stmt = crate::db::statement(pool).await?;
    let rows = bind_live(crate::db::query(&sql), &specs, clock)
        .fetch_all(stmt.conn())
        .await?;
    stmt.done().await?;
    let mut expired = 0;
    let mut stale = Vec::new();
    for r in rows {
        if r.try_get::<bool, _>("expired")? {
            expired += 1;
        }
        if r.try_get::<bool, _>("is_stale")? {
            stale.push(r.try_get("job_key")?);
        }
    }
    Ok(QueueStatus {
        counts,
        oldest_pending_seconds: oldest,
        expired_leases: expired,
        stale,
    })
}

/// A RUNNING run past its `stale_after`, or with an expired lease under
/// policy `hold`, with the evidence an operator needs (DESIGN.md §4.8).
#[derive(Debug, Clone, serde::Serialize)]
pub struct StaleRun {
    pub job_key: String,
    pub job_name: String,
    pub attempt: i32,
    pub worker_id: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub running_seconds: f64,
    pub lease_expired: bool,
    pub heartbeat_age_seconds: Option<f64>,
    pub processed_count: i64,
    /// Whether processed_count moved since the last heartbeat.
    pub advanced_since_heartbeat: bool,
    pub worker_last_seen: Option<DateTime<Utc>>,
    pub worker_last_seen_age_seconds: Option<f64>,
    /// A session with the worker's application_name is connected now.
    pub session_alive: bool,
    /// A session of the worker that waits on a lock, and who holds it.
    pub lock_wait: Option<super::blockers::LockWait>,
    /// `blocked`, `alive-slow`, `dead` or `unknown`.
    pub conclusion: String,
}

/// Lists stale runs with evidence and a conclusion per run:
/// `blocked` (a session of its worker waits on a lock: the evidence names
/// who holds it), `alive-slow` (its session is connected and its heartbeat
/// is recent),
/// `dead` (no session, no heartbeat within the lease ttl, worker not seen
/// within it either), `unknown` (the evidence disagrees: look closer).
/// `fallback` serves only runs that store no policies.
pub async fn stale_runs(
    pool: &PgPool,
    fallback: &[StaleSpec],
    clock: Clock,
) -> Result<Vec<StaleRun>, QueueError> {
    let specs = Specs::new(fallback);
    let sql = format!(
        r#"
        WITH {LIVE}
        SELECT j.job_key, j.job_name, j.attempts, j.lease_owner, j.started_at,
               extract(epoch FROM j.now - j.started_at)::float8 AS running_seconds,
               j.lease_expires_at <= j.now AS lease_expired,
               extract(epoch FROM j.now - j.heartbeat_at)::float8 AS heartbeat_age,
               j.processed_count, j.processed_count > j.heartbeat_processed AS advanced,
               w.last_seen, extract(epoch FROM j.now - w.last_seen)::float8 AS last_seen_age,
               EXISTS (SELECT 1 FROM pg_stat_activity a
                       WHERE a.application_name = j.lease_owner
                         AND a.datname = current_database()) AS session_alive,
               extract(epoch FROM j.eff_ttl)::float8 AS ttl_secs
        FROM judged j
        LEFT JOIN batch_worker w ON w.worker_id = j.lease_owner
        WHERE j.is_stale
        ORDER BY j.started_at, j.job_key
        "#
    );
    let mut stmt = crate::db::statement(pool).await?;
    let rows = bind_live(crate::db::query(&sql), &specs, clock)
        .fetch_all(stmt.conn())
        .await?;
    stmt.done().await?;
    let mut runs: Vec<StaleRun> = rows
        .iter()
        .map(|r| {
            let ttl: f64 = r.try_get("ttl_secs")?;
            let hb: Option<f64> = r.try_get("heartbeat_age")?;
            let seen: Option<f64> = r.try_get("last_seen_age")?;
            let alive: bool = r.try_get("session_alive")?;
            let recent = |age: Option<f64>| age.is_some_and(|a| a < ttl);
            let conclusion = if alive && recent(hb) {
                "alive-slow"
            } else if !alive && !recent(hb) && !recent(seen) {
                "dead"
            } else {
                "unknown"
            };
            Ok(StaleRun {
                job_key: r.try_get("job_key")?,
                job_name: r.try_get("job_name")?,
                attempt: r.try_get("attempts")?,
                worker_id: r.try_get("lease_owner")?,
                started_at: r.try_get("started_at")?,
                running_seconds: r
                    .try_get::<Option<f64>, _>("running_seconds")?
                    .unwrap_or(0.0),
                lease_expired: r
                    .try_get::<Option<bool>, _>("lease_expired")?
                    .unwrap_or(false),
                heartbeat_age_seconds: hb,
                processed_count: r.try_get("processed_count")?,
                advanced_since_heartbeat: r.try_get("advanced")?,
                worker_last_seen: r.try_get("last_seen")?,
                worker_last_seen_age_seconds: seen,
                session_alive: alive,
                lock_wait: None,
                conclusion: conclusion.to_owned(),
            })
        })
        .collect::<Result<_, sqlx::Error>>()?;
    // A live worker whose session waits on a lock is neither slow nor
    // unknown: it is blocked, and the evidence says by whom.
    for run in runs.iter_mut().filter(|r| r.session_alive) {
        let Some(owner) = run.worker_id.as_deref() else {
            continue;
        };
        run.lock_wait = super::blockers::lock_wait(pool, &run.job_key, owner).await?;
        if run.lock_wait.is_some() {
            run.conclusion = "blocked".to_owned();
        }
    }
    Ok(runs)
}

/// Database-derived gauges for one job (the exporter's view).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobGauges {
    pub runs: Vec<(String, i64)>,
    pub oldest_pending_seconds: f64,
    pub stale: i64,
    pub last_success_unix: f64,
    pub current_attempts: i64,
    pub expired_leases: i64,
}

/// Reads every gauge the exporter publishes, for each given job, in one
/// statement (jobs with no runs get zeros, so alerts see a series). Stale
/// runs follow the rule of [`stale_runs`].
pub async fn gauges(
    pool: &PgPool,
    specs: &[StaleSpec],
    clock: Clock,
) -> Result<Vec<(JobName, JobGauges)>, QueueError> {
    let binds = Specs::new(specs);
    let sql = format!(
        r#"
        WITH {LIVE}
        SELECT f.job_name,
          (SELECT coalesce(jsonb_object_agg(status, n), '{{}}'::jsonb) FROM
             (SELECT status, count(*) AS n FROM batch_job_run r
              WHERE r.job_name = f.job_name GROUP BY status) s) AS runs,
          (SELECT coalesce(extract(epoch FROM t.now - min(next_run_at)), 0)::float8
             FROM batch_job_run r WHERE r.job_name = f.job_name
              AND status = 'PENDING' AND next_run_at <= t.now) AS oldest,
          (SELECT count(*) FROM judged j WHERE j.job_name = f.job_name AND j.is_stale) AS stale,
          (SELECT coalesce(extract(epoch FROM max(finished_at)), 0)::float8
             FROM batch_job_run r WHERE r.job_name = f.job_name
              AND status = 'SUCCEEDED') AS last_success,
          (SELECT coalesce(max(attempts), 0)::bigint FROM batch_job_run r
             WHERE r.job_name = f.job_name AND status IN ('PENDING', 'RUNNING')) AS attempts,
          (SELECT count(*) FROM judged j WHERE j.job_name = f.job_name
              AND j.lease_expires_at <= j.now) AS expired
        FROM fallback f CROSS JOIN t
        "#
    );
    let mut stmt = crate::db::statement(pool).await?;
    let rows = bind_live(crate::db::query(&sql), &binds, clock)
        .fetch_all(stmt.conn())
        .await?;
    stmt.done().await?;
    rows.iter()
        .map(|r| {
            let name: String = r.try_get("job_name")?;
            let runs: serde_json::Value = r.try_get("runs")?;
            let runs = RunStatus::ALL
                .iter()
                .map(|st| {
                    let n = runs.get(st.as_str()).and_then(|v| v.as_i64()).unwrap_or(0);
                    (st.as_str().to_owned(), n)
                })
                .collect();
            Ok((
                JobName::parse(&name).map_err(|e| QueueError::Invalid(e.to_string()))?,
                JobGauges {
                    runs,
                    oldest_pending_seconds: r.try_get("oldest")?,
                    stale: r.try_get("stale")?,
                    last_success_unix: r.try_get("last_success")?,
                    current_attempts: r.try_get("attempts")?,
                    expired_leases: r.try_get("expired")?,
                },
            ))
        })
        .collect()
}
