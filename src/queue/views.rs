//! Read views of the queue for operators: `status`, `runs stale`
//! ([`stale_runs`]) and the exporter's gauges ([`gauges`]).
//!
//! Invariants:
//!
//! - They share one rule for what is stale ([`LIVE`]), computed only from
//!   what the database holds: each run's stored `stale_after`, lease length
//!   and lease-expiry policy. No view reads the reader's configuration file,
//!   so every view gives the same answer whatever file the operator has, or
//!   none. A run the previous release enqueued without a context (until
//!   `batchonce migrate` or a claiming worker freezes one) is judged by the
//!   engine's defaults ([`JobConfig::default`]: stale after 20 minutes, a
//!   30-second lease, policy `retry`), never by a file.
//! - Every view here costs what is open and what it shows, never the
//!   ledger's history (`tests/ledger_views.rs`): counts come from the lists
//!   of PENDING, RUNNING and FAILED runs and from `batch_job_tally`
//!   ([`COUNTS`], migration 20261209000001), every run is read by its key,
//!   and a job's newest done or scoped period by reading its runs newest
//!   first.
//! - The registry's rows are written by every worker and producer login, so
//!   one may be absurd. [`WORKER_PROBLEM`] and [`CONFIG_PROBLEM`] are the one
//!   rule every view applies: a row they fault is left out of `status`,
//!   `runs stale`, the exporter and the console alike, and
//!   [`registry_problems`] lists it (process id and why) for each view to
//!   report.

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};

use super::{QueueError, RunStatus};
use crate::clock::Clock;
use crate::config::JobConfig;
use crate::key::JobName;

/// The RUNNING runs with their effective policies, as `live` (r, eff_stale,
/// eff_ttl, eff_hold) and `judged` (adds `is_stale` and the instant `now`).
/// Parameters: $1 the clock, $2 and $3 the engine's default stale and lease
/// seconds (for runs that store no policies). A run is stale when it
/// started more than its `stale_after` ago, or when its lease expired under
/// policy `hold`.
const LIVE: &str = r#"
    t AS (SELECT COALESCE($1, now()) AS now),
    live AS (
        -- Named columns, never r.*: the roles that read these views may
        -- not read a run's lease token (`batchonce roles`).
        SELECT r.job_key, r.job_name, r.attempts, r.lease_owner, r.started_at,
               r.lease_expires_at, r.heartbeat_at, r.processed_count,
               r.heartbeat_processed,
               COALESCE(r.stale_after, make_interval(secs => $2)) AS eff_stale,
               COALESCE(r.lease_ttl, make_interval(secs => $3)) AS eff_ttl,
               COALESCE(r.on_lease_expiry = 'hold', false) AS eff_hold
        -- The RUNNING runs are listed in batch_job_running; their rows are
        -- the truth, so a listed run that is no longer RUNNING is left out.
        -- An array of keys, not a join: whatever the statistics say, the
        -- runs are read by key, never the ledger (tests/ledger_views.rs).
        FROM batch_job_run r
        WHERE r.job_key = ANY (ARRAY(SELECT l.job_key FROM batch_job_running l))
          AND r.status = 'RUNNING'
    ), judged AS (
        SELECT live.*, t.now,
               (live.started_at < t.now - live.eff_stale
                OR (live.eff_hold AND live.lease_expires_at <= t.now)) AS is_stale
        FROM live CROSS JOIN t
    )
"#;

/// Binds the three parameters [`LIVE`] takes.
fn bind_live<'q>(
    q: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    clock: Clock,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let d = JobConfig::default();
    q.bind(clock.bind())
        .bind(d.stale_after.as_secs_f64())
        .bind(d.lease_ttl.as_secs_f64())
}

/// Runs per job, status and kind (`part`: a partition of a partitioned
/// run), as `counts` (job_name, status, part, n): PENDING and RUNNING runs
/// through their lists (each checked against its run row), FAILED ones
/// from theirs, SUCCEEDED and SKIPPED from `batch_job_tally` (migration
/// 20261209000001).
/// It reads what is open and one row per job and outcome, never the
/// ledger, and is the one count `status`, the exporter and the console
/// show. A status without runs has no row.
const COUNTS: &str = r#"
    counts AS (
        SELECT r.job_name::text AS job_name, r.status::text AS status,
               r.partition_of IS NOT NULL AS part, count(*) AS n
        FROM batch_job_run r
        WHERE r.job_key = ANY (ARRAY(SELECT o.job_key FROM batch_job_due o))
          AND r.status = 'PENDING' GROUP BY 1, 2, 3
        UNION ALL
        SELECT r.job_name::text, r.status::text, r.partition_of IS NOT NULL, count(*)
        FROM batch_job_run r
        WHERE r.job_key = ANY (ARRAY(SELECT o.job_key FROM batch_job_running o))
          AND r.status = 'RUNNING' GROUP BY 1, 2, 3
        UNION ALL
        -- The failed list holds what is counted, kept in the transaction
        -- that fails or revives a run: a thousand failures read no run.
        SELECT o.job_name::text, 'FAILED', o.part, count(*)
        FROM batch_job_failed o GROUP BY 1, 2, 3
        UNION ALL
        SELECT t.job_name::text, t.status::text, t.part, sum(t.runs)::bigint
        FROM batch_job_tally t GROUP BY 1, 2, 3 HAVING sum(t.runs) <> 0
    )
"#;

/// The open scoped runs (PENDING, RUNNING, FAILED) as `open_scoped`
/// (job_name, period_start): the periods not yet done, read from the
/// lists.
const OPEN_SCOPED: &str = r#"
    open_scoped AS (
        SELECT DISTINCT r.job_name::text AS job_name, r.period_start
        FROM batch_job_run r
        WHERE r.job_key = ANY (ARRAY(
                SELECT d.job_key FROM batch_job_due d WHERE d.scoped
                UNION SELECT l.job_key FROM batch_job_running l))
          AND r.scope IS NOT NULL AND r.status IN ('PENDING', 'RUNNING')
        UNION
        SELECT x.job_name::text, x.period_start FROM batch_job_failed x WHERE x.scoped
    )
"#;

/// Why the `batch_worker` row `w` cannot be believed, or NULL when it can:
/// a pid that is no process's, a time no process wrote (infinite, before
/// 2000 or ahead of the database's clock by more than an hour), or a
/// promised sign of life more than 31 days after the last (no process
/// promises one that far; `live_until` NULL is a process of a release
/// before the registry recorded one, shown as not live). The one rule
/// every view applies.
pub const WORKER_PROBLEM: &str = "(CASE \
    WHEN w.pid <= 0 THEN 'pid is not a process id' \
    WHEN NOT isfinite(w.started_at) OR NOT isfinite(w.last_seen) \
      OR w.started_at < '2000-01-01' OR w.last_seen < '2000-01-01' \
      OR w.started_at > now() + interval '1 hour' OR w.last_seen > now() + interval '1 hour' \
      THEN 'started_at or last_seen is not a time a process wrote' \
    WHEN w.live_until IS NOT NULL AND (NOT isfinite(w.live_until) OR w.live_until < '2000-01-01' \
      OR w.live_until > w.last_seen + interval '31 days') \
      THEN 'live_until is absurd' END)";

/// Why the `batch_process_config` row `c` (of the process row `w`) cannot
/// be believed, or NULL: its process row is faulted, its job is no job name,
/// its settings are no JSON object, its fingerprint is not that of its
/// settings, or its time is no time a process wrote.
pub const CONFIG_PROBLEM: &str = "(CASE \
    WHEN c.job_name !~ '^[a-z0-9]+(-[a-z0-9]+)*$' THEN 'job_name is not a job name' \
    WHEN jsonb_typeof(c.settings) <> 'object' THEN 'settings are not a JSON object' \
    WHEN c.fingerprint IS DISTINCT FROM left(md5(c.settings::text), 16) \
      THEN 'fingerprint is not that of its settings' \
    WHEN NOT isfinite(c.recorded_at) OR c.recorded_at < '2000-01-01' \
      OR c.recorded_at > now() + interval '1 hour' THEN 'recorded_at is not a time a process wrote' \
    END)";

/// A registry row that every view leaves out, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RegistryProblem {
    /// `batch_worker` or `batch_process_config`.
    pub table: String,
    pub process_id: String,
    /// The configuration's job name, for a `batch_process_config` row.
    pub job_name: Option<String>,
    pub problem: String,
}

impl RegistryProblem {
    /// One line naming the row and why it is left out (unescaped: each
    /// view escapes it for where it shows it).
    pub fn describe(&self) -> String {
        match &self.job_name {
            Some(job) => format!(
                "{} row of process {}, job {}: {}",
                self.table, self.process_id, job, self.problem
            ),
            None => format!(
                "{} row of process {}: {}",
                self.table, self.process_id, self.problem
            ),
        }
    }
}

/// At most this many faulted rows are listed; the count says how many.
const MAX_PROBLEMS: i64 = 50;

/// The registry rows every view leaves out ([`WORKER_PROBLEM`],
/// [`CONFIG_PROBLEM`]), at most 50, with the total count. A configuration
/// row of a faulted process is left out with it and not listed again.
pub async fn registry_problems(pool: &PgPool) -> Result<(Vec<RegistryProblem>, i64), QueueError> {
    let sql = format!(
        "WITH p AS ( \
           SELECT 'batch_worker' AS tbl, w.worker_id::text AS process_id, NULL::text AS job_name, \
                  {WORKER_PROBLEM} AS problem FROM batch_worker w \
           UNION ALL \
           SELECT 'batch_process_config', c.process_id::text, c.job_name::text, {CONFIG_PROBLEM} \
           FROM batch_process_config c JOIN batch_worker w ON w.worker_id = c.process_id \
           WHERE {WORKER_PROBLEM} IS NULL) \
         SELECT tbl, process_id, job_name, problem, count(*) OVER () AS total FROM p \
         WHERE problem IS NOT NULL ORDER BY process_id, tbl DESC, job_name LIMIT $1"
    );
    let mut stmt = crate::db::statement(pool).await?;
    let rows = crate::db::query(&sql)
        .bind(MAX_PROBLEMS)
        .fetch_all(stmt.conn())
        .await?;
    stmt.done().await?;
    let total = match rows.first() {
        Some(r) => r.try_get("total")?,
        None => 0,
    };
    let list = rows
        .iter()
        .map(|r| {
            Ok(RegistryProblem {
                table: r.try_get("tbl")?,
                process_id: r.try_get("process_id")?,
                job_name: r.try_get("job_name")?,
                problem: r.try_get("problem")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()?;
    Ok((list, total))
}

/// Counts per job and status, for `status`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StatusCount {
    pub job_name: String,
    pub status: RunStatus,
    pub runs: i64,
}

/// The queue at a glance.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QueueStatus {
    /// Runs per job and status; a partitioned run counts once, by its parent.
    pub counts: Vec<StatusCount>,
    /// Partitions of partitioned runs per job and status.
    pub partitions: Vec<StatusCount>,
    /// Age in seconds of the oldest due PENDING run, by the database clock.
    pub oldest_pending_seconds: Option<f64>,
    /// RUNNING runs whose lease has expired.
    pub expired_leases: i64,
    /// Stale runs with their conclusions: exactly what [`stale_runs`] says.
    pub stale: Vec<StaleBrief>,
    /// Scoped jobs' periods: each job's newest, and older ones with scopes
    /// not done, with their scopes per state ([`super::scope_periods`]).
    pub scopes: Vec<super::ScopePeriod>,
}

/// A stale run as `status` lists it: its key and the conclusion
/// [`stale_runs`] reached.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StaleBrief {
    pub job_key: String,
    pub job_name: String,
    pub conclusion: Conclusion,
}

/// What the evidence says about a stale run's worker ([`stale_runs`]). The
/// text (`blocked`, `alive-slow`, `dead`, `unknown`) is what `runs stale`,
/// `status`, their JSON and the console print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Conclusion {
    /// A session of the worker waits on a lock; the evidence names who holds it.
    Blocked,
    /// The worker's session is connected and its heartbeat is recent.
    AliveSlow,
    /// No session, and neither a heartbeat nor the worker seen within the lease ttl.
    Dead,
    /// The evidence disagrees: look closer.
    Unknown,
}

impl Conclusion {
    pub const ALL: [Conclusion; 4] = [Self::Blocked, Self::AliveSlow, Self::Dead, Self::Unknown];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Blocked => "blocked",
            Self::AliveSlow => "alive-slow",
            Self::Dead => "dead",
            Self::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for Conclusion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, so that widths align a conclusion as they align a string.
        f.pad(self.as_str())
    }
}

impl std::str::FromStr for Conclusion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| format!("unknown conclusion {s:?}"))
    }
}

/// Counts per job and status, the oldest due PENDING run, expired leases
/// and stale runs. The stale runs are [`stale_runs`]'s own answer, so
/// `status` and `runs stale` cannot disagree.
pub async fn status(pool: &PgPool, clock: Clock) -> Result<QueueStatus, QueueError> {
    let sql =
        format!("WITH {COUNTS} SELECT job_name, status, part, n AS runs FROM counts ORDER BY 1, 2");
    let mut stmt = crate::db::statement(pool).await?;
    let rows = crate::db::query(&sql).fetch_all(stmt.conn()).await?;
    stmt.done().await?;
    let (mut counts, mut partitions) = (Vec::new(), Vec::new());
    for r in &rows {
        let c = StatusCount {
            job_name: r.try_get("job_name")?,
            status: r.try_get("status")?,
            runs: r.try_get("runs")?,
        };
        if r.try_get::<bool, _>("part")? {
            partitions.push(c);
        } else {
            counts.push(c);
        }
    }
    let mut stmt = crate::db::statement(pool).await?;
    let oldest: Option<f64> = crate::db::query_scalar(
        "SELECT extract(epoch FROM COALESCE($1, now()) - min(next_run_at))::float8 \
         FROM (SELECT d.next_run_at FROM batch_job_due d \
               WHERE d.next_run_at <= COALESCE($1, now()) \
                 AND (SELECT r.status FROM batch_job_run r WHERE r.job_key = d.job_key) = 'PENDING' \
               ORDER BY d.next_run_at, d.job_key LIMIT 1) oldest",
    )
    .bind(clock.bind())
    .fetch_one(stmt.conn())
    .await?;
    stmt.done().await?;
    let sql = format!("WITH {LIVE} SELECT count(*) AS n FROM judged WHERE lease_expires_at <= now");
    let mut stmt = crate::db::statement(pool).await?;
    let expired: i64 = bind_live(crate::db::query(&sql), clock)
        .fetch_one(stmt.conn())
        .await?
        .try_get("n")?;
    stmt.done().await?;
    let stale = stale_runs(pool, clock)
        .await?
        .into_iter()
        .map(|r| StaleBrief {
            job_key: r.job_key,
            job_name: r.job_name,
            conclusion: r.conclusion,
        })
        .collect();
    let scopes = super::scope_periods(pool, None, 1).await?;
    Ok(QueueStatus {
        counts,
        partitions,
        oldest_pending_seconds: oldest,
        expired_leases: expired,
        stale,
        scopes,
    })
}

/// A RUNNING run past its `stale_after`, or with an expired lease under
/// policy `hold`, with the evidence an operator needs (how to read it:
/// `docs/operations.md`): attempt, owner, seconds running, whether the
/// lease expired, heartbeat age, `processed_count` and whether it advanced
/// since the last heartbeat, the owner's `batch_worker.last_seen` and its
/// age, whether `pg_stat_activity` has a session in the current database
/// (`datname = current_database()`) whose `application_name` is the owner,
/// and, for `blocked`, the owner's waiting session and the sessions
/// blocking it (`lock_wait`, from `blockers::lock_wait`).
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
    pub conclusion: Conclusion,
}

/// Lists stale runs with evidence and a conclusion per run:
/// `blocked` (a session of its worker waits on a lock: the evidence names
/// who holds it), `alive-slow` (its session is connected and its heartbeat
/// is recent),
/// `dead` (no session, no heartbeat within the lease ttl, worker not seen
/// within it either), `unknown` (the evidence disagrees: look closer).
/// `blocked` comes before any other conclusion; `alive-slow` needs a
/// heartbeat younger than `lease_ttl`, and `dead` neither a heartbeat nor a
/// `last_seen` younger than `lease_ttl`. A run without stored policies is
/// judged by the engine's defaults, never a file. `status` lists exactly
/// these runs.
pub async fn stale_runs(pool: &PgPool, clock: Clock) -> Result<Vec<StaleRun>, QueueError> {
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
        LEFT JOIN batch_worker w ON w.worker_id = j.lease_owner AND {WORKER_PROBLEM} IS NULL
        WHERE j.is_stale
        ORDER BY j.started_at, j.job_key
        "#
    );
    let mut stmt = crate::db::statement(pool).await?;
    let rows = bind_live(crate::db::query(&sql), clock)
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
                Conclusion::AliveSlow
            } else if !alive && !recent(hb) && !recent(seen) {
                Conclusion::Dead
            } else {
                Conclusion::Unknown
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
                conclusion,
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
            run.conclusion = Conclusion::Blocked;
        }
    }
    Ok(runs)
}

/// Database-derived gauges for one job (the exporter's view).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobGauges {
    /// Runs per status; a partitioned run counts once, by its parent.
    pub runs: Vec<(RunStatus, i64)>,
    /// Partitions per status (all zero for a job without partitions).
    pub partitions: Vec<(RunStatus, i64)>,
    pub oldest_pending_seconds: f64,
    pub stale: i64,
    /// When a run of the job last succeeded (counted when it did, so a run
    /// re-run or archived since still counts); `None` if none ever did.
    pub last_success_unix: Option<f64>,
    /// When the newest of the runs FAILED now failed; 0 when none is.
    pub newest_failure_unix: f64,
    /// The start of the newest period done (SUCCEEDED or SKIPPED) that has
    /// begun by now; `None` if none is (or none stores its period).
    pub last_done_period_start_unix: Option<f64>,
    pub current_attempts: i64,
    pub expired_leases: i64,
    /// The scoped runs of the job's newest scoped period per status (all
    /// zero for a job without scoped runs): bounded by jobs and states,
    /// never one series per scope.
    pub scopes: Vec<(RunStatus, i64)>,
    /// The start of that period, `None` for a job without scoped runs (or
    /// one whose runs store no period).
    pub scope_period_start_unix: Option<f64>,
    /// How long the job has been paused (`batchonce jobs pause`), `None`
    /// while it is not. A paused job's PENDING runs count above, but their
    /// due entries are held, so none of them is the oldest due one.
    pub paused_seconds: Option<f64>,
}

/// Reads every gauge the exporter publishes, in one statement, for every
/// job the database knows: each job with runs, each job a live or recent
/// process registered, and each of `also` (with zeros when it has no runs
/// yet, so alerts see a series). Stale runs follow the rule of
/// [`stale_runs`].
///
/// Per job: runs per status (every `RunStatus`, zeros included), the age of
/// the oldest due PENDING run (0 when none), stale runs, when the job last
/// succeeded as Unix time (`None` if never), the newest `finished_at` of
/// the runs FAILED now (0 when none), the newest `period_start` done
/// (SUCCEEDED or SKIPPED) that has begun (a scoped period only once every
/// scope of it is done), the most `attempts` among PENDING and RUNNING
/// runs, RUNNING runs with an expired lease, the scoped runs of the job's
/// newest scoped period per status with that period's start, and how long
/// the job has been paused (`batch_job_pause`; a paused job is reported
/// even without runs). The jobs with runs are the distinct `job_name`s of
/// `batch_job_run`, found by a loose index scan. A paused job's PENDING
/// runs are counted, but their due entries are held at 9999-12-31, so none
/// of them is the oldest due PENDING run (here and in `status`): the pause
/// gauges say why they wait.
pub async fn gauges(
    pool: &PgPool,
    also: &[JobName],
    clock: Clock,
) -> Result<Vec<(JobName, JobGauges)>, QueueError> {
    let also: Vec<&str> = also.iter().map(JobName::as_str).collect();
    let sql = gauges_sql();
    let mut stmt = crate::db::statement(pool).await?;
    let rows = bind_live(crate::db::query(&sql), clock)
        .bind(&also)
        .fetch_all(stmt.conn())
        .await?;
    stmt.done().await?;
    rows.iter().map(job_gauges).collect()
}

/// The statement of [`gauges`]: one row per job, `$4` the jobs to include
/// even without runs.
fn gauges_sql() -> String {
    format!(
        r#"
        WITH RECURSIVE {LIVE}, {COUNTS}, {OPEN_SCOPED},
        -- The distinct job names of batch_job_run, one index probe each
        -- (a loose scan of batch_job_run_job_name_idx).
        run_jobs AS (
            SELECT min(job_name)::text AS job_name FROM batch_job_run
            UNION ALL
            SELECT (SELECT min(r.job_name)::text FROM batch_job_run r
                    WHERE r.job_name > run_jobs.job_name)
            FROM run_jobs WHERE run_jobs.job_name IS NOT NULL
        ), jobs AS (
            SELECT job_name FROM run_jobs WHERE job_name IS NOT NULL
            UNION SELECT c.job_name::text FROM batch_process_config c
                  JOIN batch_worker w ON w.worker_id = c.process_id
                  WHERE {WORKER_PROBLEM} IS NULL AND {CONFIG_PROBLEM} IS NULL
            UNION SELECT unnest($4::text[])
            UNION SELECT p.job_name::text FROM batch_job_pause p
        ),
        -- Each scoped job's periods newest first, one probe each through
        -- the scoped runs' index, for as long as the period is open (a
        -- scope of it PENDING, RUNNING or FAILED, by the lists) or has not
        -- begun: the last row of each job is its newest period done, or
        -- none.
        scoped_walk AS (
            SELECT f.job_name, (SELECT max(r.period_start) FROM batch_job_run r
                                WHERE r.job_name = f.job_name AND r.scope IS NOT NULL
                                  AND r.period_start <= t.now) AS ps
            FROM jobs f CROSS JOIN t
            UNION ALL
            SELECT w.job_name, (SELECT max(r.period_start) FROM batch_job_run r
                                WHERE r.job_name = w.job_name AND r.scope IS NOT NULL
                                  AND r.period_start < w.ps)
            FROM scoped_walk w
            -- Uncorrelated, so the open periods are hashed once.
            WHERE w.ps IS NOT NULL AND (w.job_name, w.ps) IN (
                      SELECT o.job_name, o.period_start FROM open_scoped o)
        ), scoped_done AS (
            SELECT w.job_name, w.ps FROM scoped_walk w
            WHERE w.ps IS NOT NULL AND (w.job_name, w.ps) NOT IN (
                      SELECT o.job_name, o.period_start FROM open_scoped o
                      WHERE o.period_start IS NOT NULL)
        )
        SELECT f.job_name,
          (SELECT coalesce(jsonb_object_agg(c.status, c.n), '{{}}'::jsonb) FROM counts c
             WHERE c.job_name = f.job_name AND NOT c.part) AS runs,
          (SELECT coalesce(jsonb_object_agg(c.status, c.n), '{{}}'::jsonb) FROM counts c
             WHERE c.job_name = f.job_name AND c.part) AS partitions,
          (SELECT coalesce(extract(epoch FROM t.now - min(d.next_run_at)), 0)::float8
             FROM batch_job_due d WHERE d.job_name = f.job_name AND d.next_run_at <= t.now
              -- A subquery per entry, not a join: the run by its key.
              AND (SELECT r.status FROM batch_job_run r WHERE r.job_key = d.job_key)
                  = 'PENDING') AS oldest,
          (SELECT count(*) FROM judged j WHERE j.job_name = f.job_name AND j.is_stale) AS stale,
          -- When the job last succeeded: the newest finish the tally counted.
          (SELECT extract(epoch FROM max(y.newest_finished_at))::float8
             FROM batch_job_tally y WHERE y.job_name = f.job_name
              AND y.status = 'SUCCEEDED' AND NOT y.part) AS last_success,
          (SELECT coalesce(extract(epoch FROM max(x.failed_at)), 0)::float8
             FROM batch_job_failed x
             WHERE x.job_name = f.job_name AND NOT x.part) AS newest_failure,
          -- The newest period done: of a scoped job, the end of the walk
          -- above; of an unscoped one (its newest run is), the newest done
          -- on the newest business date with one (its periods start later
          -- as its dates do). A job newly scoped has none until a scoped
          -- period is done.
          extract(epoch FROM CASE WHEN ld.d IS NULL
            THEN (SELECT d.ps FROM scoped_done d WHERE d.job_name = f.job_name)
            ELSE (SELECT max(r.period_start) FROM batch_job_run r
                  WHERE r.job_name = f.job_name AND r.business_date = ld.d
                    AND r.scope IS NULL AND r.period_start <= t.now
                    AND r.status IN ('SUCCEEDED', 'SKIPPED') AND r.partition_of IS NULL)
            END)::float8 AS last_done,
          (SELECT coalesce(max(r.attempts), 0)::bigint
             FROM batch_job_run r
             WHERE r.job_key = ANY (ARRAY(
                     SELECT d.job_key FROM batch_job_due d WHERE d.job_name = f.job_name
                     UNION ALL SELECT l.job_key FROM batch_job_running l
                     WHERE l.job_name = f.job_name))
               AND r.status IN ('PENDING', 'RUNNING')) AS attempts,
          (SELECT count(*) FROM judged j WHERE j.job_name = f.job_name
              AND j.lease_expires_at <= j.now) AS expired,
          (SELECT coalesce(jsonb_object_agg(status, n), '{{}}'::jsonb) FROM
             (SELECT status, count(*) AS n FROM batch_job_run r
              WHERE r.job_name = f.job_name AND r.scope IS NOT NULL
                AND r.partition_of IS NULL AND r.period_start = sp.ps
              GROUP BY status) s) AS scopes,
          extract(epoch FROM sp.ps)::float8 AS scope_period,
          (SELECT extract(epoch FROM t.now - p.paused_at)::float8
             FROM batch_job_pause p WHERE p.job_name = f.job_name) AS paused
        FROM jobs f CROSS JOIN t
        -- An unscoped job's newest business date with a period done: its
        -- runs newest first through (job_name, business_date), stopping at
        -- the first done one; read only when its newest run is unscoped,
        -- so a scoped job's runs are never passed.
        LEFT JOIN LATERAL (
            SELECT n.scope IS NULL AS unscoped FROM batch_job_run n
            WHERE n.job_name = f.job_name ORDER BY n.business_date DESC LIMIT 1) nw ON true
        -- `nw.unscoped` names no column of r: the planner tests it once,
        -- before the scan, never per row.
        LEFT JOIN LATERAL (
            SELECT r.business_date AS d FROM batch_job_run r
            WHERE nw.unscoped AND r.job_name = f.job_name AND r.scope IS NULL
              AND r.status IN ('SUCCEEDED', 'SKIPPED') AND r.period_start <= t.now
              AND r.partition_of IS NULL
            ORDER BY r.business_date DESC LIMIT 1) ld ON true
        -- The newest scoped period, by the scoped runs' index.
        LEFT JOIN LATERAL (
            SELECT max(r.period_start) AS ps FROM batch_job_run r
            WHERE r.job_name = f.job_name AND r.scope IS NOT NULL) sp ON true
        ORDER BY f.job_name
        "#
    )
}

/// One job's gauges from a row of [`gauges_sql`].
fn job_gauges(r: &sqlx::postgres::PgRow) -> Result<(JobName, JobGauges), QueueError> {
    let name: String = r.try_get("job_name")?;
    let per_status = |col: &str| -> Result<Vec<(RunStatus, i64)>, QueueError> {
        let v: serde_json::Value = r.try_get(col)?;
        Ok(RunStatus::ALL
            .iter()
            .map(|st| {
                let n = v.get(st.as_str()).and_then(|v| v.as_i64()).unwrap_or(0);
                (*st, n)
            })
            .collect())
    };
    let runs = per_status("runs")?;
    let partitions = per_status("partitions")?;
    let scopes = per_status("scopes")?;
    Ok((
        JobName::parse(&name).map_err(|e| QueueError::Invalid(e.to_string()))?,
        JobGauges {
            runs,
            partitions,
            oldest_pending_seconds: r.try_get("oldest")?,
            stale: r.try_get("stale")?,
            last_success_unix: r.try_get("last_success")?,
            newest_failure_unix: r.try_get("newest_failure")?,
            last_done_period_start_unix: r.try_get("last_done")?,
            current_attempts: r.try_get("attempts")?,
            expired_leases: r.try_get("expired")?,
            scopes,
            scope_period_start_unix: r.try_get("scope_period")?,
            paused_seconds: r.try_get("paused")?,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conclusions_round_trip_through_text_and_json() {
        let texts: Vec<&str> = Conclusion::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(texts, ["blocked", "alive-slow", "dead", "unknown"]);
        for c in Conclusion::ALL {
            assert_eq!(c.to_string().parse::<Conclusion>(), Ok(c));
            let json = serde_json::to_value(c).unwrap();
            assert_eq!(json, serde_json::json!(c.as_str()));
            assert_eq!(serde_json::from_value::<Conclusion>(json).unwrap(), c);
        }
        assert!("Dead".parse::<Conclusion>().is_err());
        assert!(serde_json::from_value::<Conclusion>(serde_json::json!("gone")).is_err());
    }
}
