//! Each job's health, the one answer the console's overview and `status`
//! (text and `--json`) both print: MISSING periods, overdue, FAILED, stale,
//! PENDING and RUNNING runs, who serves the job, and the banners.
//!
//! - MISSING: a period the stored schedule ([`Expected`]) made due that has
//!   no run, live or archived, of any scope. Only periods due since
//!   `Window::missing_since` count (the job's first period, its earliest
//!   run, or the lookback of 41 days (one for sub-daily jobs), whichever is
//!   later; a job without runs: since it was declared or its catch-up
//!   horizon, whichever is later), up to now on
//!   the database clock, and not those the business calendar skips. At
//!   most [`MAX_CHECKED_PERIODS`], the newest, are checked per job; beyond
//!   that the count says "at least". Each is probed by key (the primary
//!   key, then the scoped runs' `(job_name, period_start)` index, then the
//!   archive), never by reading the job's history.
//! - Overdue: a PENDING run (or partition) whose due-list entry came due
//!   more than [`OVERDUE_AFTER`] ago. A worker serving the job claims a due
//!   run within its poll interval (2 s by default, at once on a
//!   notification), so five minutes means no worker takes it. A retry
//!   waiting for its backoff is not due yet, and an entry parked at
//!   [`WAITING_YEAR`]-12-31 (a partitioned parent waiting for its
//!   partitions, a paused job) never is.
//! - FAILED, stale, PENDING, RUNNING and the oldest due age are the
//!   exporter's gauges (`views::gauges`), so every view counts alike.
//! - Liveness is the registry's `live_until`, the time by which a process
//!   promised its next sign of life (a worker: its last heartbeat plus three
//!   heartbeats and 10 s; a producer: its last tick plus three intervals).
//!   A job's workers are the live workers whose configuration rows name it.
//!   A live worker that recorded no configuration rows (a release before
//!   them, or one that re-registered after its row was deleted) is counted
//!   as serving every job, so it never raises a false alarm.
//! - Banners: [`Banner::NoWorker`] when a job has runs waiting (PENDING,
//!   due or retrying, not parked) and no live worker serves it;
//!   [`Banner::NoProducer`] when some job has a schedule and no producer is
//!   live, i.e. none ticked within three of its intervals.
//!
//! Every statement reads the open work, the registry and one index probe per
//! job or period (`tests/ledger_views.rs`).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::PgPool;

use super::expected::{DuePeriod, Expected, FirstPeriod, SettingsSource, Window};
use super::{QueueError, RunStatus, CONFIG_PROBLEM, WAITING_YEAR, WORKER_PROBLEM};
use crate::clock::Clock;
use crate::key::JobName;
use crate::schedule::MAX_PERIODS_PER_TICK;

/// How long a PENDING run may stay due before it counts as overdue.
pub const OVERDUE_AFTER: Duration = Duration::from_secs(300);
/// The most periods checked for MISSING per job (the newest ones).
pub const MAX_CHECKED_PERIODS: usize = 1_000;
/// How many MISSING periods each job lists (the oldest ones).
pub const MISSING_LISTED: usize = 5;

/// Every job's health and the banners, at one instant of the database clock.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Health {
    pub read_at: DateTime<Utc>,
    pub jobs: Vec<JobHealth>,
    pub producers: Producers,
    /// Live workers that recorded no job: counted as serving every job.
    pub workers_without_jobs: i64,
    pub banners: Vec<Banner>,
}

/// One job's numbers.
#[derive(Debug, Clone, serde::Serialize)]
pub struct JobHealth {
    pub job_name: String,
    pub missing: Missing,
    pub overdue: i64,
    pub failed: i64,
    pub stale: i64,
    pub pending: i64,
    pub running: i64,
    pub succeeded: i64,
    pub skipped: i64,
    /// Age of the oldest due PENDING run, 0 when none.
    pub oldest_due_seconds: f64,
    /// PENDING runs and partitions a worker is to take, now or after their
    /// backoff (not those parked at `WAITING_YEAR`).
    pub waiting: i64,
    /// Of those, the ones due now.
    pub due: i64,
    /// Live workers whose configuration names the job.
    pub workers: i64,
    /// Live producers whose configuration names the job.
    pub producers: i64,
    /// The stored schedule MISSING periods are computed from.
    pub schedule: Option<ScheduleInfo>,
    /// How long the job has been paused (`jobs pause`), when it is.
    pub paused_seconds: Option<f64>,
}

/// The schedule a job's MISSING periods come from, and where it is stored.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScheduleInfo {
    pub schedule: String,
    pub timezone: String,
    pub covers: String,
    pub catch_up: String,
    pub source: SettingsSource,
}

/// A job's MISSING periods.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Missing {
    /// Whether they could be computed; `why_not` says why not.
    pub known: bool,
    pub why_not: Option<String>,
    pub count: usize,
    /// More periods were due than were checked: `count` is a lower bound.
    pub at_least: bool,
    /// The oldest [`MISSING_LISTED`], with why each is missing.
    pub periods: Vec<MissingPeriod>,
    /// Where the window starts: the first instant a period counts from.
    pub window_start: Option<DateTime<Utc>>,
}

impl Missing {
    /// The count as the views print it: `3`, `at least 1000`, or `—`.
    pub fn shown(&self) -> String {
        match (self.known, self.at_least) {
            (false, _) => "—".to_owned(),
            (true, true) => format!("at least {}", self.count),
            (true, false) => self.count.to_string(),
        }
    }
}

/// One MISSING period and why it is missing.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MissingPeriod {
    pub key: String,
    pub period: String,
    pub due_at: DateTime<Utc>,
    /// When it was due in the job's business time zone.
    pub due_local: String,
    pub why: String,
}

/// The producers' liveness.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Producers {
    /// Producers live now (ticked within three of their intervals).
    pub live: i64,
    /// When any producer was last seen, live or not.
    pub last_seen: Option<DateTime<Utc>>,
    pub last_seen_age_seconds: Option<f64>,
}

/// A condition the overview shows above everything, and `status` prints.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Banner {
    /// Runs wait and no live worker serves the job.
    NoWorker {
        job_name: String,
        waiting: i64,
        due: i64,
        oldest_due_seconds: f64,
    },
    /// Some job has a schedule and no producer is live.
    NoProducer {
        scheduled_jobs: Vec<String>,
        last_seen: Option<DateTime<Utc>>,
        last_seen_age_seconds: Option<f64>,
    },
}

impl Banner {
    /// One line saying what is wrong and what to do (unescaped: each view
    /// escapes it for where it shows it).
    /// The command that fixes it, for the command line (the console speaks
    /// in its own words and shows no flags).
    pub fn command_hint(&self) -> String {
        match self {
            Self::NoWorker { job_name, .. } => format!("batchonce worker --jobs {job_name}"),
            Self::NoProducer { .. } => {
                "batchonce produce, or a timer running batchonce produce --once".to_owned()
            }
        }
    }

    /// What is wrong and what to do, in words (no command line).
    pub fn message(&self) -> String {
        match self {
            Self::NoWorker {
                job_name,
                waiting,
                due,
                oldest_due_seconds,
            } => format!(
                "No live worker serves {job_name}: {waiting} PENDING run{} wait{}, {due} due now{}. \
                 Start a worker whose configuration declares it.",
                plural(*waiting),
                if *waiting == 1 { "s" } else { "" },
                if *due > 0 {
                    format!(", the oldest for {}", short_age(*oldest_due_seconds))
                } else {
                    String::new()
                },
            ),
            Self::NoProducer {
                scheduled_jobs,
                last_seen_age_seconds,
                ..
            } => format!(
                "No producer has ticked within three of its intervals ({}): the scheduled periods of {} are not being enqueued. \
                 Start the producer, or check the timer that runs it.",
                match last_seen_age_seconds {
                    Some(s) => format!("one was last seen {} ago", short_age(*s)),
                    None => "none has ever registered".to_owned(),
                },
                scheduled_jobs.join(", "),
            ),
        }
    }
}

fn plural(n: i64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Seconds as `42s`, `7m 3s`, `2h 5m` (whole seconds).
fn short_age(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    let s = if s >= 3600 { s - s % 60 } else { s };
    humantime::format_duration(Duration::from_secs(s)).to_string()
}

/// What the database stores about the jobs' schedules.
#[derive(Default)]
struct Stored {
    /// `batch_job_declared`: settings and when they were declared.
    declared: BTreeMap<String, (serde_json::Value, DateTime<Utc>)>,
    /// The settings a producer (or else any process) recorded last.
    recorded: BTreeMap<String, serde_json::Value>,
}

impl Stored {
    /// The job's expected periods: the declared settings, with `catch_up`
    /// and `enabled` from the recorded ones where a declaration of an
    /// earlier release has none; else the recorded settings.
    fn expected(&self, job: &str) -> Result<Expected, String> {
        let recorded = self.recorded.get(job);
        match (self.declared.get(job), recorded) {
            (Some((declared, _)), recorded) => {
                let mut s = declared.clone();
                for key in ["catch_up", "enabled"] {
                    if s.get(key).is_none() {
                        if let Some(v) = recorded.and_then(|r| r.get(key)) {
                            s[key] = v.clone();
                        }
                    }
                }
                Expected::from_settings(&s, SettingsSource::Declared)
            }
            (None, Some(r)) => Expected::from_settings(r, SettingsSource::Recorded),
            (None, None) => Err(
                "no schedule is stored for this job: `batchonce migrate` declares it from the configuration file, or a producer records it"
                    .into(),
            ),
        }
    }
}

async fn stored(pool: &PgPool, job: Option<&str>) -> Result<Stored, QueueError> {
    let mut stmt = crate::db::statement(pool).await?;
    let declared: Vec<(String, serde_json::Value, DateTime<Utc>)> = crate::db::query_as(
        "SELECT job_name::text, settings, declared_at FROM batch_job_declared \
         WHERE $1::text IS NULL OR job_name = $1",
    )
    .bind(job)
    .fetch_all(stmt.conn())
    .await?;
    let sql = format!(
        "SELECT DISTINCT ON (c.job_name) c.job_name::text, c.settings \
         FROM batch_process_config c JOIN batch_worker w ON w.worker_id = c.process_id \
         WHERE ($1::text IS NULL OR c.job_name = $1) \
           AND {WORKER_PROBLEM} IS NULL AND {CONFIG_PROBLEM} IS NULL \
         ORDER BY c.job_name, (w.role = 'producer') DESC, c.recorded_at DESC"
    );
    let recorded: Vec<(String, serde_json::Value)> = crate::db::query_as(&sql)
        .bind(job)
        .fetch_all(stmt.conn())
        .await?;
    stmt.done().await?;
    Ok(Stored {
        declared: declared
            .into_iter()
            .map(|(n, s, at)| (n, (s, at)))
            .collect(),
        recorded: recorded.into_iter().collect(),
    })
}

/// The database clock's reading for `clock`.
async fn now_of(pool: &PgPool, clock: Clock) -> Result<DateTime<Utc>, QueueError> {
    let mut stmt = crate::db::statement(pool).await?;
    let now = crate::db::query_scalar("SELECT COALESCE($1, now())")
        .bind(clock.bind())
        .fetch_one(stmt.conn())
        .await?;
    stmt.done().await?;
    Ok(now)
}

/// The first period of each job (`firing`: whether its periods are
/// sub-daily, when the earliest period start on the first date is read
/// too): one index probe each in the ledger and the archive.
async fn first_periods(
    pool: &PgPool,
    jobs: &[(String, bool)],
) -> Result<BTreeMap<String, FirstPeriod>, QueueError> {
    if jobs.is_empty() {
        return Ok(BTreeMap::new());
    }
    let names: Vec<&str> = jobs.iter().map(|(n, _)| n.as_str()).collect();
    let firing: Vec<bool> = jobs.iter().map(|(_, f)| *f).collect();
    let mut stmt = crate::db::statement(pool).await?;
    let rows: Vec<(String, Option<NaiveDate>, Option<DateTime<Utc>>)> = crate::db::query_as(
        "SELECT j.name, f.d, \
           CASE WHEN j.firing AND f.d IS NOT NULL THEN LEAST( \
             (SELECT min(r.period_start) FROM batch_job_run r \
              WHERE r.job_name = j.name AND r.business_date = f.d), \
             (SELECT min(a.period_start) FROM batch_job_run_archive a \
              WHERE a.job_name = j.name AND a.business_date = f.d)) END \
         FROM unnest($1::text[], $2::bool[]) AS j(name, firing) \
         CROSS JOIN LATERAL (SELECT LEAST( \
             (SELECT min(r.business_date) FROM batch_job_run r WHERE r.job_name = j.name), \
             (SELECT min(a.business_date) FROM batch_job_run_archive a WHERE a.job_name = j.name) \
           ) AS d) f",
    )
    .bind(&names)
    .bind(&firing)
    .fetch_all(stmt.conn())
    .await?;
    stmt.done().await?;
    Ok(rows
        .into_iter()
        .filter_map(|(n, d, start)| d.map(|date| (n, FirstPeriod { date, start })))
        .collect())
}

/// Of the given periods of each job, the keys that have no run: not by
/// their key in the ledger, not as a scoped run of that period start, and
/// not in the archive. Each probe is a scalar subquery, which the planner
/// never turns into a join over the ledger; they run in order and stop at
/// the first that finds a run.
async fn without_runs(
    pool: &PgPool,
    periods: &[(&str, &DuePeriod)],
) -> Result<HashSet<String>, QueueError> {
    if periods.is_empty() {
        return Ok(HashSet::new());
    }
    let keys: Vec<String> = periods
        .iter()
        .map(|(j, p)| format!("{j}:{}", p.key_part))
        .collect();
    let jobs: Vec<&str> = periods.iter().map(|(j, _)| *j).collect();
    let starts: Vec<DateTime<Utc>> = periods.iter().map(|(_, p)| p.start).collect();
    let dates: Vec<NaiveDate> = periods.iter().map(|(_, p)| p.period.date).collect();
    let mut stmt = crate::db::statement(pool).await?;
    let missing: Vec<String> = crate::db::query_scalar(
        "SELECT c.key FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::date[]) \
           AS c(key, job, ps, d) \
         WHERE CASE \
           WHEN (SELECT true FROM batch_job_run r WHERE r.job_key = c.key) THEN false \
           WHEN (SELECT true FROM batch_job_run r WHERE r.job_name = c.job \
                   AND r.scope IS NOT NULL AND r.period_start = c.ps LIMIT 1) THEN false \
           WHEN (SELECT true FROM batch_job_run_archive a WHERE a.job_key = c.key) THEN false \
           WHEN (SELECT true FROM batch_job_run_archive a WHERE a.job_name = c.job \
                   AND a.business_date = c.d AND starts_with(a.job_key, c.key || '@') LIMIT 1) \
             THEN false \
           ELSE true END",
    )
    .bind(&keys)
    .bind(&jobs)
    .bind(&starts)
    .bind(&dates)
    .fetch_all(stmt.conn())
    .await?;
    stmt.done().await?;
    Ok(missing.into_iter().collect())
}

/// Of `periods` of `job`, the period parts (`2026-09-15`) with no run at
/// all, live or archived, of any scope: the calendar's MISSING cells.
pub async fn periods_without_runs(
    pool: &PgPool,
    job: &JobName,
    periods: &[&DuePeriod],
) -> Result<HashSet<String>, QueueError> {
    let pairs: Vec<(&str, &DuePeriod)> = periods.iter().map(|p| (job.as_str(), *p)).collect();
    let prefix = format!("{job}:");
    Ok(without_runs(pool, &pairs)
        .await?
        .into_iter()
        .filter_map(|k| k.strip_prefix(&prefix).map(str::to_owned))
        .collect())
}

/// Live producers, overall and per job, and live workers per job.
#[derive(Debug, Default)]
struct Registry {
    producers: Producers,
    workers_without_jobs: i64,
    /// Per job: live workers and live producers whose configuration names it.
    per_job: BTreeMap<String, (i64, i64)>,
}

/// Live producers, when one was last seen and how long ago, and live
/// workers without configuration rows.
type Totals = (i64, Option<DateTime<Utc>>, Option<f64>, i64);

async fn registry(pool: &PgPool, clock: Clock) -> Result<Registry, QueueError> {
    let mut stmt = crate::db::statement(pool).await?;
    let per_job_sql = format!(
        "SELECT c.job_name::text, count(*) FILTER (WHERE w.role = 'worker'), \
                count(*) FILTER (WHERE w.role = 'producer') \
         FROM batch_process_config c JOIN batch_worker w ON w.worker_id = c.process_id \
         WHERE w.live_until > COALESCE($1, now()) \
           AND {WORKER_PROBLEM} IS NULL AND {CONFIG_PROBLEM} IS NULL \
         GROUP BY 1"
    );
    let per_job: Vec<(String, i64, i64)> = crate::db::query_as(&per_job_sql)
        .bind(clock.bind())
        .fetch_all(stmt.conn())
        .await?;
    let totals_sql = format!(
        "SELECT count(*) FILTER (WHERE w.role = 'producer' AND w.live_until > t.now), \
                max(w.last_seen) FILTER (WHERE w.role = 'producer'), \
                extract(epoch FROM t.now - max(w.last_seen) FILTER (WHERE w.role = 'producer'))::float8, \
                count(*) FILTER (WHERE w.role = 'worker' AND w.live_until > t.now \
                  AND NOT EXISTS (SELECT 1 FROM batch_process_config c \
                                  WHERE c.process_id = w.worker_id)) \
         FROM batch_worker w CROSS JOIN (SELECT COALESCE($1, now()) AS now) t \
         WHERE {WORKER_PROBLEM} IS NULL GROUP BY t.now"
    );
    let totals: Option<Totals> = crate::db::query_as(&totals_sql)
        .bind(clock.bind())
        .fetch_optional(stmt.conn())
        .await?;
    stmt.done().await?;
    let (live, last_seen, age, bare) = totals.unwrap_or((0, None, None, 0));
    Ok(Registry {
        producers: Producers {
            live,
            last_seen,
            last_seen_age_seconds: age,
        },
        workers_without_jobs: bare,
        per_job: per_job.into_iter().map(|(j, w, p)| (j, (w, p))).collect(),
    })
}

/// Per job: PENDING runs (and partitions) waiting, due now, overdue; read
/// from the due list, each checked against its run row by key.
async fn due_list(
    pool: &PgPool,
    clock: Clock,
) -> Result<BTreeMap<String, (i64, i64, i64)>, QueueError> {
    let mut stmt = crate::db::statement(pool).await?;
    let rows: Vec<(String, i64, i64, i64)> = crate::db::query_as(
        "SELECT d.job_name::text, \
                count(*) FILTER (WHERE d.next_run_at < make_date($3, 1, 1)), \
                count(*) FILTER (WHERE d.next_run_at <= t.now), \
                count(*) FILTER (WHERE d.next_run_at <= t.now - make_interval(secs => $2)) \
         FROM batch_job_due d CROSS JOIN (SELECT COALESCE($1, now()) AS now) t \
         WHERE (SELECT r.status FROM batch_job_run r WHERE r.job_key = d.job_key) = 'PENDING' \
         GROUP BY 1",
    )
    .bind(clock.bind())
    .bind(OVERDUE_AFTER.as_secs_f64())
    .bind(WAITING_YEAR)
    .fetch_all(stmt.conn())
    .await?;
    stmt.done().await?;
    Ok(rows
        .into_iter()
        .map(|(j, w, d, o)| (j, (w, d, o)))
        .collect())
}

/// Why a period that has no run is missing: due when, and whether a
/// producer could still enqueue it.
pub fn why_missing(
    e: &Expected,
    p: &DuePeriod,
    now: DateTime<Utc>,
    job_producers: i64,
    producers: &Producers,
) -> String {
    // The UTC instant too, unless the business zone is UTC itself.
    let utc = if e.timezone == chrono_tz::UTC {
        String::new()
    } else {
        format!(" ({})", p.due_at.format("%Y-%m-%d %H:%M UTC"))
    };
    let due = format!("due at {}{utc} and no run exists", e.local(p.due_at));
    if p.due_at <= e.horizon(now) {
        format!(
            "{due}; it is older than the catch-up horizon (catch_up {}), so no producer enqueues it any more: enqueue it by hand",
            short_age(e.catch_up.num_seconds() as f64)
        )
    } else if producers.live == 0 {
        format!("{due}; no producer is live to enqueue it")
    } else if job_producers == 0 {
        format!("{due}; no live producer's configuration has this job")
    } else {
        format!("{due}; a live producer has this job: its next tick enqueues it, or its log says why it cannot")
    }
}

/// The periods of a job that are MISSING now, newest [`MAX_CHECKED_PERIODS`]
/// at most, and whether more were due than that.
fn due_in_window(e: &Expected, w: &Window) -> (Vec<DuePeriod>, bool, DateTime<Utc>) {
    let mut after = w.missing_since(e);
    let start = after;
    // A window that holds more firings than a tick may walk (only stored
    // settings no configuration check would pass) is narrowed to its
    // newest part, saying "at least".
    let mut narrowed = false;
    let (due, _) = loop {
        let (due, cut) = e.due_periods(after, w.now, MAX_PERIODS_PER_TICK);
        if !cut || after >= w.now {
            break (due, cut);
        }
        after = w.now - (w.now - after) / 4;
        narrowed = true;
    };
    let mut kept: Vec<DuePeriod> = due
        .into_iter()
        .filter(|p| p.skip.is_none() && !w.before_first(p))
        .collect();
    let cut = narrowed || kept.len() > MAX_CHECKED_PERIODS;
    if kept.len() > MAX_CHECKED_PERIODS {
        kept.drain(..kept.len() - MAX_CHECKED_PERIODS);
    }
    (kept, cut, start)
}

/// A job's stored schedule and the window its MISSING periods are in: what
/// the console's calendar needs.
pub struct JobSchedule {
    pub expected: Result<Expected, String>,
    pub window: Window,
    pub producers: Producers,
    /// Live producers whose configuration names the job.
    pub job_producers: i64,
}

/// The stored schedule and window of one job.
pub async fn job_schedule(
    pool: &PgPool,
    job: &JobName,
    clock: Clock,
) -> Result<JobSchedule, QueueError> {
    let now = now_of(pool, clock).await?;
    let stored = stored(pool, Some(job.as_str())).await?;
    let expected = stored.expected(job.as_str());
    let firing = expected
        .as_ref()
        .is_ok_and(|e| e.covers == crate::schedule::Covers::Firing);
    let first = first_periods(pool, &[(job.to_string(), firing)])
        .await?
        .remove(job.as_str());
    let reg = registry(pool, clock).await?;
    Ok(JobSchedule {
        expected,
        window: Window {
            now,
            first,
            known_since: stored.declared.get(job.as_str()).map(|(_, at)| *at),
        },
        job_producers: reg.per_job.get(job.as_str()).map_or(0, |(_, p)| *p),
        producers: reg.producers,
    })
}

/// Every job's health: each job with runs, each job a process recorded and
/// each declared job.
pub async fn job_health(pool: &PgPool, clock: Clock) -> Result<Health, QueueError> {
    let now = now_of(pool, clock).await?;
    let stored = stored(pool, None).await?;
    let declared: Vec<JobName> = stored
        .declared
        .keys()
        .filter_map(|n| JobName::parse(n).ok())
        .collect();
    let gauges = super::gauges(pool, &declared, clock).await?;
    let reg = registry(pool, clock).await?;
    let due = due_list(pool, clock).await?;
    let expected: BTreeMap<String, Result<Expected, String>> = gauges
        .iter()
        .map(|(j, _)| (j.to_string(), stored.expected(j.as_str())))
        .collect();
    let firsts = first_periods(
        pool,
        &expected
            .iter()
            .filter_map(|(j, e)| {
                e.as_ref()
                    .ok()
                    .map(|e| (j.clone(), e.covers == crate::schedule::Covers::Firing))
            })
            .collect::<Vec<_>>(),
    )
    .await?;
    // Each job's candidate periods, then one probe for all of them.
    let mut windows: BTreeMap<String, (Vec<DuePeriod>, bool, DateTime<Utc>)> = BTreeMap::new();
    for (job, e) in &expected {
        if let Ok(e) = e {
            let w = Window {
                now,
                first: firsts.get(job).copied(),
                known_since: stored.declared.get(job).map(|(_, at)| *at),
            };
            windows.insert(job.clone(), due_in_window(e, &w));
        }
    }
    let probe: Vec<(&str, &DuePeriod)> = windows
        .iter()
        .flat_map(|(j, (ps, _, _))| ps.iter().map(move |p| (j.as_str(), p)))
        .collect();
    let missing_keys = without_runs(pool, &probe).await?;
    let count = |g: &super::JobGauges, s: RunStatus| {
        g.runs
            .iter()
            .find(|(st, _)| *st == s)
            .map_or(0, |(_, n)| *n)
    };
    let mut jobs = Vec::with_capacity(gauges.len());
    for (name, g) in &gauges {
        let job = name.to_string();
        let (workers, producers) = reg.per_job.get(&job).copied().unwrap_or((0, 0));
        let e = expected.get(&job).and_then(|e| e.as_ref().ok());
        let missing = match (e, windows.get(&job)) {
            (Some(e), Some((periods, cut, start))) => {
                let gone: Vec<&DuePeriod> = periods
                    .iter()
                    .filter(|p| missing_keys.contains(&format!("{job}:{}", p.key_part)))
                    .collect();
                Missing {
                    known: true,
                    why_not: None,
                    count: gone.len(),
                    at_least: *cut,
                    periods: gone
                        .iter()
                        .take(MISSING_LISTED)
                        .map(|p| MissingPeriod {
                            key: format!("{job}:{}", p.key_part),
                            period: p.key_part.clone(),
                            due_at: p.due_at,
                            due_local: e.local(p.due_at),
                            why: why_missing(e, p, now, producers, &reg.producers),
                        })
                        .collect(),
                    window_start: Some(*start),
                }
            }
            _ => Missing {
                why_not: expected.get(&job).and_then(|e| e.as_ref().err().cloned()),
                ..Missing::default()
            },
        };
        let (waiting, due_now, overdue) = due.get(&job).copied().unwrap_or((0, 0, 0));
        jobs.push(JobHealth {
            missing,
            overdue,
            failed: count(g, RunStatus::Failed),
            stale: g.stale,
            pending: count(g, RunStatus::Pending),
            running: count(g, RunStatus::Running),
            succeeded: count(g, RunStatus::Succeeded),
            skipped: count(g, RunStatus::Skipped),
            paused_seconds: g.paused_seconds,
            oldest_due_seconds: g.oldest_pending_seconds,
            waiting,
            due: due_now,
            workers,
            producers,
            schedule: e.map(|e| ScheduleInfo {
                schedule: e.schedule.as_str().to_owned(),
                timezone: e.timezone.name().to_owned(),
                covers: e.covers.as_str().to_owned(),
                catch_up: short_age(e.catch_up.num_seconds() as f64),
                source: e.source,
            }),
            job_name: job,
        });
    }
    let mut banners: Vec<Banner> = jobs
        .iter()
        .filter(|j| j.waiting > 0 && j.workers == 0 && reg.workers_without_jobs == 0)
        .map(|j| Banner::NoWorker {
            job_name: j.job_name.clone(),
            waiting: j.waiting,
            due: j.due,
            oldest_due_seconds: j.oldest_due_seconds,
        })
        .collect();
    let scheduled: Vec<String> = jobs
        .iter()
        .filter(|j| j.schedule.is_some())
        .map(|j| j.job_name.clone())
        .collect();
    if !scheduled.is_empty() && reg.producers.live == 0 {
        banners.push(Banner::NoProducer {
            scheduled_jobs: scheduled,
            last_seen: reg.producers.last_seen,
            last_seen_age_seconds: reg.producers.last_seen_age_seconds,
        });
    }
    Ok(Health {
        read_at: now,
        jobs,
        producers: reg.producers,
        workers_without_jobs: reg.workers_without_jobs,
        banners,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn banners_say_what_is_wrong_and_what_to_do() {
        let b = Banner::NoWorker {
            job_name: "settle".into(),
            waiting: 3,
            due: 2,
            oldest_due_seconds: 425.0,
        };
        assert_eq!(
            b.message(),
            "No live worker serves settle: 3 PENDING runs wait, 2 due now, the oldest for 7m 5s. \
             Start a worker whose configuration declares it."
        );
        assert_eq!(b.command_hint(), "batchonce worker --jobs settle");
        let p = Banner::NoProducer {
            scheduled_jobs: vec!["settle".into(), "sync".into()],
            last_seen: None,
            last_seen_age_seconds: None,
        };
        assert!(p.message().contains("none has ever registered"));
        assert!(p.message().contains("settle, sync"));
        let shown = Missing {
            known: true,
            count: 1000,
            at_least: true,
            ..Missing::default()
        };
        assert_eq!(shown.shown(), "at least 1000");
        assert_eq!(Missing::default().shown(), "—");
    }
}
