//! The process registry: the only module that writes `batch_worker` and
//! `batch_process_config`. Each worker and producer registers at start with
//! the effective configuration of every job it serves (and its
//! fingerprint), refreshes `last_seen` and `live_until` while it runs, and
//! deregisters when it stops. It also answers whether live processes
//! disagree about a job's configuration ([`config_drift`]).
//!
//! Who registers: `worker::run` at start (a failure is only a warning: the
//! first heartbeat tick re-registers), touched by the heartbeat loop on
//! every tick and deregistered after the service loops have ended on a clean
//! stop; `produce` as `producer-<host>-<pid>`, live for three intervals,
//! touched each tick and deregistered at stop; `produce --once` as
//! `producer-once-<host>`, one row per host, once it has ticked, live for
//! three of its timer's periods (`producer::once_live_for`). A failure to
//! register is logged and never stops the producer.
//!
//! Invariants:
//!
//! - A process is live by its own promise (`live_until`), never by a fixed
//!   window. A SIGKILLed process never deregisters, so its row keeps its last
//!   `last_seen`, which `queue::stale_runs` reports as evidence; the worker's
//!   sessions carry its id as `application_name` (`db.rs`), which is how
//!   `stale_runs` finds its live sessions in `pg_stat_activity`. For
//!   `migrate --contract`, [`running`] also counts a connected process and a
//!   row with no `live_until` (0.1.0) seen within [`QUIET_BEFORE_LIVE_UNTIL`].
//! - Each row records the login that wrote it (`registered_by`, the column's
//!   default `session_user`), and row-level security lets a login other than
//!   the tables' owner write only its own rows (migration 20261208000006); a
//!   process whose id another login holds fails to register (logged) until
//!   that row is deleted.
//! - Every reader here leaves out the rows that `queue::WORKER_PROBLEM` and
//!   `queue::CONFIG_PROBLEM` fault, the rule every view shares
//!   (`queue::registry_problems` lists them).

use std::time::Duration;

use sqlx::{PgPool, Row};

use crate::config::JobConfig;
use crate::key::JobName;
use crate::queue::{CONFIG_PROBLEM, WORKER_PROBLEM};

/// What a registered process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Worker,
    Producer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Worker => "worker",
            Self::Producer => "producer",
        }
    }
}

/// How long the rows of processes that stopped without deregistering are
/// kept (they are evidence for `runs stale` meanwhile).
const KEEP_DEAD: &str = "30 days";

fn host() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".into())
}

/// Registers (or re-registers, after a restart under the same id) a worker,
/// as [`register_process`] does but without configuration rows.
pub async fn register(pool: &PgPool, worker_id: &str, version: &str) -> Result<(), sqlx::Error> {
    register_process(
        pool,
        worker_id,
        Role::Worker,
        version,
        Duration::from_secs(60),
        &[],
    )
    .await
}

/// Registers a process with the configuration of every job it serves,
/// replacing what an earlier process of the same id recorded. It promises
/// to show a sign of life again within `live_for`.
///
/// The row holds the role (`worker` or `producer`), host (from
/// `gethostname`, at most 255 characters), pid, version (at most 64),
/// `started_at = last_seen = now()` and `live_until = now() + live_for`.
/// Each job's settings ([`job_settings`]) are recorded with their
/// fingerprint: the first 16 hex digits of the md5 of the jsonb text, so
/// equal settings give equal fingerprints everywhere. It also prunes rows
/// of processes whose `live_until` passed 30 days ago (a worker role cannot
/// read runs to ask whether one still names them).
pub async fn register_process(
    pool: &PgPool,
    process_id: &str,
    role: Role,
    version: &str,
    live_for: Duration,
    jobs: &[(JobName, &JobConfig)],
) -> Result<(), sqlx::Error> {
    let names: Vec<&str> = jobs.iter().map(|(n, _)| n.as_str()).collect();
    let settings: Vec<serde_json::Value> = jobs.iter().map(|(_, c)| job_settings(c)).collect();
    let mut tx = pool.begin().await?;
    crate::db::query(
        "INSERT INTO batch_worker (worker_id, host, pid, version, started_at, last_seen, role, live_until) \
         VALUES ($1, left($2, 255), $3, left($4, 64), now(), now(), $5, now() + make_interval(secs => $6)) \
         ON CONFLICT (worker_id) DO UPDATE \
         SET host = EXCLUDED.host, pid = EXCLUDED.pid, version = EXCLUDED.version, \
             started_at = now(), last_seen = now(), role = EXCLUDED.role, \
             live_until = EXCLUDED.live_until",
    )
    .bind(process_id)
    .bind(host())
    .bind(std::process::id() as i32)
    .bind(version)
    .bind(role.as_str())
    .bind(live_for.as_secs_f64())
    .execute(&mut *tx)
    .await?;
    crate::db::query("DELETE FROM batch_process_config WHERE process_id = $1")
        .bind(process_id)
        .execute(&mut *tx)
        .await?;
    if !jobs.is_empty() {
        crate::db::query(
            "INSERT INTO batch_process_config (process_id, job_name, fingerprint, settings) \
             SELECT $1, j, left(md5(s::text), 16), s FROM unnest($2::text[], $3::jsonb[]) AS t(j, s)",
        )
        .bind(process_id)
        .bind(&names)
        .bind(&settings)
        .execute(&mut *tx)
        .await?;
    }
    // Processes that stopped without deregistering (SIGKILL, a lost host)
    // are kept a month as evidence for `runs stale`: longer than any run
    // should stay stale unnoticed. (A worker role cannot read the runs, so
    // the rule cannot ask whether one still names them.)
    crate::db::query(&format!(
        "DELETE FROM batch_worker w WHERE w.live_until < now() - interval '{KEEP_DEAD}'"
    ))
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// Refreshes `last_seen` and `live_until`; re-registers if an operator
/// removed the row (without its configuration, which the next start records).
pub async fn touch(
    pool: &PgPool,
    worker_id: &str,
    version: &str,
    live_for: Duration,
) -> Result<(), sqlx::Error> {
    let mut stmt = crate::db::statement(pool).await?;
    let n = crate::db::query(
        "UPDATE batch_worker SET last_seen = now(), \
         live_until = now() + make_interval(secs => $2) WHERE worker_id = $1",
    )
    .bind(worker_id)
    .bind(live_for.as_secs_f64())
    .execute(stmt.conn())
    .await?
    .rows_affected();
    stmt.done().await?;
    if n == 0 {
        register(pool, worker_id, version).await?;
    }
    Ok(())
}

/// Removes a stopped process (and, by cascade, its configuration rows).
pub async fn deregister(pool: &PgPool, worker_id: &str) -> Result<(), sqlx::Error> {
    let mut stmt = crate::db::statement(pool).await?;
    crate::db::query("DELETE FROM batch_worker WHERE worker_id = $1")
        .bind(worker_id)
        .execute(stmt.conn())
        .await?;
    stmt.done().await
}

/// A job's effective configuration as recorded for comparison: every key
/// that changes what a run is or how it is executed. Values that may hold
/// secrets (a command's environment, URLs) are recorded as a hash only, so
/// a difference shows without the value.
pub fn job_settings(cfg: &JobConfig) -> serde_json::Value {
    let hidden = |v: &str| format!("hash:{:016x}", crate::key::fnv1a64(v.as_bytes()));
    let d = |d: Duration| humantime::format_duration(d).to_string();
    let options: serde_json::Map<String, serde_json::Value> = cfg
        .options
        .values
        .iter()
        .map(|(k, v)| {
            let v = match v.as_str() {
                Some(s) if k.ends_with("url") => serde_json::Value::String(hidden(s)),
                _ => serde_json::to_value(v).unwrap_or(serde_json::Value::Null),
            };
            (k.clone(), v)
        })
        .collect();
    let command = cfg.command.as_ref().map(|c| {
        serde_json::json!({
            "argv": c.argv,
            "timeout": d(c.timeout),
            "kill_grace": d(c.kill_grace),
            "working_dir": c.working_dir.as_ref().map(|p| p.display().to_string()),
            "env": c.env.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(hidden(v)))).collect::<serde_json::Map<_, _>>(),
            "skipped_exit_code": c.skipped_exit_code,
            "fatal_exit_codes": c.fatal_exit_codes,
        })
    });
    let mut settings = serde_json::json!({
        "timezone": cfg.timezone.name(),
        "schedule": cfg.schedule.as_ref().map(|s| s.as_str()),
        "covers": cfg.covers.as_str(),
        "catch_up": d(cfg.catch_up),
        "skip_dates": cfg.skip_dates.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
        "skip_weekdays": cfg.skip_weekdays.iter().map(|w| w.to_string()).collect::<Vec<_>>(),
        "enabled": cfg.enabled,
        "max_attempts": cfg.max_attempts,
        "lease_ttl": d(cfg.lease_ttl),
        "stale_after": d(cfg.stale_after),
        "chunk_size": cfg.chunk_size,
        "chunk_pause": d(cfg.chunk_pause),
        "backoff": d(cfg.backoff),
        "backoff_max": d(cfg.backoff_max),
        "on_lease_expiry": cfg.on_lease_expiry.as_str(),
        "max_item_failures": cfg.max_item_failures,
        "options": options,
        "command": command,
    });
    // Recorded only when a job is partitioned, so that the fingerprints of
    // every other job stay those the previous release records.
    if cfg.partitions > 1 {
        settings["partitions"] = serde_json::json!(cfg.partitions);
    }
    // Likewise only for a scoped job (issue 24); `batchonce_enqueue_declared`
    // refuses a job whose live processes record scopes.
    if let Some(scopes) = &cfg.scopes {
        settings["scopes"] = scopes.to_json();
    }
    settings
}

/// How long a process of a release that records no `live_until` (0.1.0)
/// counts as possibly running after its last sign of life, when no session
/// carries its id: three heartbeats of a worker whose lease is up to 3 min,
/// and a longer lease's worker keeps its LISTEN or polling session.
pub const QUIET_BEFORE_LIVE_UNTIL: &str = "3 minutes";

/// A registered process that may still be running (see [`running`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Running {
    pub worker_id: String,
    pub role: String,
    pub host: String,
    pub pid: i32,
    pub version: String,
    pub last_seen: chrono::DateTime<chrono::Utc>,
    /// A session of this database carries its id as `application_name`.
    pub connected: bool,
    /// Until when it counts as running without a session: its `live_until`,
    /// or `last_seen` plus [`QUIET_BEFORE_LIVE_UNTIL`] without one.
    pub counted_until: Option<chrono::DateTime<chrono::Utc>>,
}

/// The processes that may still be running, by the database's clock: live
/// by the registry's rule (`live_until` not passed, on a row no view
/// faults), connected, or of a release that records no `live_until` and
/// seen within [`QUIET_BEFORE_LIVE_UNTIL`]. A caller that must see no new
/// process meanwhile locks `batch_worker` first in its transaction.
pub async fn running(conn: &mut sqlx::PgConnection) -> Result<Vec<Running>, sqlx::Error> {
    let sql = format!(
        "SELECT * FROM (
           SELECT w.worker_id::text, w.role::text, w.host::text, w.pid, w.version::text, w.last_seen,
                  EXISTS (SELECT 1 FROM pg_stat_activity a
                          WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
                            AND a.application_name = w.worker_id) AS connected,
                  CASE WHEN {WORKER_PROBLEM} IS NOT NULL THEN NULL
                       WHEN w.live_until IS NULL
                         THEN w.last_seen + interval '{QUIET_BEFORE_LIVE_UNTIL}'
                       ELSE w.live_until END AS counted_until
           FROM batch_worker w) p
         WHERE p.connected OR p.counted_until > now()
         ORDER BY p.worker_id"
    );
    let rows = crate::db::query(&sql).fetch_all(&mut *conn).await?;
    rows.iter()
        .map(|r| {
            Ok(Running {
                worker_id: r.try_get("worker_id")?,
                role: r.try_get("role")?,
                host: r.try_get("host")?,
                pid: r.try_get("pid")?,
                version: r.try_get("version")?,
                last_seen: r.try_get("last_seen")?,
                connected: r.try_get("connected")?,
                counted_until: r.try_get("counted_until")?,
            })
        })
        .collect()
}

/// One live process's configuration of a job.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProcessConfig {
    pub process_id: String,
    pub role: String,
    pub host: String,
    pub fingerprint: String,
}

/// A job whose live processes run different configurations.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ConfigDrift {
    pub job_name: String,
    pub processes: Vec<ProcessConfig>,
    /// The keys whose values differ between them.
    pub keys: Vec<String>,
}

/// Jobs whose live processes (those whose `live_until` has not passed)
/// recorded more than one configuration, with who runs which and the keys
/// that differ; `status` and `runs stale` print it.
pub async fn config_drift(pool: &PgPool) -> Result<Vec<ConfigDrift>, sqlx::Error> {
    let mut stmt = crate::db::statement(pool).await?;
    let sql = format!(
        r#"
        WITH live AS (
            SELECT c.process_id, w.role, w.host, c.job_name, c.fingerprint, c.settings
            FROM batch_process_config c
            JOIN batch_worker w ON w.worker_id = c.process_id
            WHERE w.live_until > now() AND {WORKER_PROBLEM} IS NULL AND {CONFIG_PROBLEM} IS NULL
        ), drifting AS (
            SELECT job_name, count(*) AS n FROM live
            GROUP BY job_name HAVING count(DISTINCT fingerprint) > 1
        ), keys AS (
            SELECT e.job_name, array_agg(e.key ORDER BY e.key) AS keys
            FROM (SELECT l.job_name, kv.key, count(DISTINCT kv.value) AS nvalues, count(*) AS n
                  FROM live l CROSS JOIN LATERAL jsonb_each(l.settings) kv
                  WHERE l.job_name IN (SELECT job_name FROM drifting)
                  GROUP BY l.job_name, kv.key) e
            JOIN drifting d ON d.job_name = e.job_name
            -- A key differs when it has two values, or when some process
            -- does not record it at all.
            WHERE e.nvalues > 1 OR e.n < d.n
            GROUP BY e.job_name
        )
        SELECT l.job_name, l.process_id, l.role, l.host, l.fingerprint,
               COALESCE(k.keys, ARRAY[]::text[]) AS keys
        FROM live l
        JOIN drifting d USING (job_name)
        LEFT JOIN keys k USING (job_name)
        ORDER BY l.job_name, l.fingerprint, l.process_id
        "#
    );
    let rows = crate::db::query(&sql).fetch_all(stmt.conn()).await?;
    stmt.done().await?;
    let mut out: Vec<ConfigDrift> = Vec::new();
    for r in rows {
        let job: String = r.try_get("job_name")?;
        let process = ProcessConfig {
            process_id: r.try_get("process_id")?,
            role: r.try_get("role")?,
            host: r.try_get("host")?,
            fingerprint: r.try_get("fingerprint")?,
        };
        match out.last_mut() {
            Some(d) if d.job_name == job => d.processes.push(process),
            _ => out.push(ConfigDrift {
                job_name: job,
                processes: vec![process],
                keys: r.try_get("keys")?,
            }),
        }
    }
    Ok(out)
}

/// For every job any process recorded: how many different configurations
/// its live processes run (0 when none is live), for the exporter's gauge.
pub async fn fingerprint_counts(pool: &PgPool) -> Result<Vec<(String, i64)>, sqlx::Error> {
    let mut stmt = crate::db::statement(pool).await?;
    let sql = format!(
        "SELECT c.job_name, count(DISTINCT c.fingerprint) FILTER (WHERE w.live_until > now()) AS n \
         FROM batch_process_config c JOIN batch_worker w ON w.worker_id = c.process_id \
         WHERE {WORKER_PROBLEM} IS NULL AND {CONFIG_PROBLEM} IS NULL \
         GROUP BY c.job_name ORDER BY c.job_name"
    );
    let rows = crate::db::query(&sql).fetch_all(stmt.conn()).await?;
    stmt.done().await?;
    rows.iter()
        .map(|r| Ok((r.try_get("job_name")?, r.try_get("n")?)))
        .collect()
}

/// One registered process, for the console's workers page.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProcessView {
    pub worker_id: String,
    pub role: String,
    pub host: String,
    pub pid: i32,
    pub version: String,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub last_seen: chrono::DateTime<chrono::Utc>,
    /// Whether it promised a sign of life that is not yet overdue.
    pub live: bool,
    /// The jobs it recorded a configuration for, with the fingerprint.
    pub jobs: Vec<(String, String)>,
}

/// Every registered process (live first, then the most recently seen),
/// with the configuration fingerprints it recorded.
pub async fn processes(pool: &PgPool) -> Result<Vec<ProcessView>, sqlx::Error> {
    let mut stmt = crate::db::statement(pool).await?;
    // A process of a release that recorded no `live_until` is not known to
    // be live.
    let sql = format!(
        "SELECT w.worker_id, w.role, w.host, w.pid, w.version, w.started_at, w.last_seen, \
                COALESCE(w.live_until > now(), false) AS live, \
                COALESCE(array_agg(c.job_name::text ORDER BY c.job_name) FILTER (WHERE c.job_name IS NOT NULL), '{{}}') AS job_names, \
                COALESCE(array_agg(c.fingerprint::text ORDER BY c.job_name) FILTER (WHERE c.job_name IS NOT NULL), '{{}}') AS fingerprints \
         FROM batch_worker w LEFT JOIN batch_process_config c \
           ON c.process_id = w.worker_id AND {CONFIG_PROBLEM} IS NULL \
         WHERE {WORKER_PROBLEM} IS NULL \
         GROUP BY w.worker_id \
         ORDER BY COALESCE(w.live_until > now(), false) DESC, w.last_seen DESC, w.worker_id \
         LIMIT 1000"
    );
    let rows = crate::db::query(&sql).fetch_all(stmt.conn()).await?;
    stmt.done().await?;
    rows.iter()
        .map(|r| {
            let names: Vec<String> = r.try_get("job_names")?;
            let prints: Vec<String> = r.try_get("fingerprints")?;
            Ok(ProcessView {
                worker_id: r.try_get("worker_id")?,
                role: r.try_get("role")?,
                host: r.try_get("host")?,
                pid: r.try_get("pid")?,
                version: r.try_get("version")?,
                started_at: r.try_get("started_at")?,
                last_seen: r.try_get("last_seen")?,
                live: r.try_get("live")?,
                jobs: names.into_iter().zip(prints).collect(),
            })
        })
        .collect()
}

/// The settings a producer most recently recorded for `job` (its schedule,
/// time zone, period rule and business calendar), or those of any process
/// when no producer recorded it; `None` when nobody did.
pub async fn recorded_settings(
    pool: &PgPool,
    job: &JobName,
) -> Result<Option<serde_json::Value>, sqlx::Error> {
    let mut stmt = crate::db::statement(pool).await?;
    let sql = format!(
        "SELECT c.settings FROM batch_process_config c \
         JOIN batch_worker w ON w.worker_id = c.process_id \
         WHERE c.job_name = $1 AND {WORKER_PROBLEM} IS NULL AND {CONFIG_PROBLEM} IS NULL \
         ORDER BY (w.role = 'producer') DESC, c.recorded_at DESC LIMIT 1"
    );
    let settings = crate::db::query_scalar(&sql)
        .bind(job.as_str())
        .fetch_optional(stmt.conn())
        .await?;
    stmt.done().await?;
    Ok(settings)
}
