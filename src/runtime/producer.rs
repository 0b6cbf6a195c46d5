//! The producer: turns each job's schedule into job keys and enqueues them.
//! [`tick`] plans every job ([`plan`]) from one "now" and enqueues all their
//! runs in one statement; [`run`] is the loop of `produce`. `enqueue` shares
//! [`runs_for_periods`] and [`periods_for_dates`], so a run enqueued by hand
//! gets exactly the key a scheduled one would.
//!
//! Invariants:
//!
//! - One tick takes one "now" for all jobs: the database clock unless a
//!   moment is simulated (`produce --now`).
//! - Every period due within a job's catch-up window is enqueued; periods
//!   that already exist are duplicates and change nothing, so any number of
//!   producers may run at once.
//! - The producer never plans a date that `enqueue` refuses: every planned
//!   business date lies in `key::date_range()`.
//! - A tick walks at most `schedule::MAX_PERIODS_PER_TICK` firings per job;
//!   a window that held more is reported truncated.
//! - Errors never end the loop; only its cancellation token, fired by
//!   SIGTERM/SIGINT, does.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::clock::Clock;
use crate::config::context::{PeriodError, RunContext};
use crate::config::{Config, JobConfig, ScopeSource};
use crate::key::{self, JobKey, JobName, Scope};
use crate::queue::{self, NewRun, QueueError};
use crate::schedule::{self, Covers, Period};

/// Most days one `enqueue --from --to` may cover.
pub const MAX_BACKFILL_DAYS: i64 = 366;

/// The runs for these periods, each with the context it is defined by from
/// now on (time zone, period instants, policies); calendar-skipped periods
/// become SKIPPED runs. A scoped job gets one run per configured scope and
/// period: the listed scopes here, or, for a scope query, one template per
/// period that the enqueue statement expands (`queue::enqueue`).
pub fn runs_for_periods(
    job: &JobName,
    cfg: &JobConfig,
    periods: &[Period],
) -> Result<Vec<NewRun>, PeriodError> {
    match &cfg.scopes {
        None => base_runs(job, cfg, periods),
        // The configuration checked that every listed scope fits the key.
        Some(ScopeSource::List(list)) => {
            runs_for_scopes(job, cfg, periods, list).map_err(PeriodError)
        }
        Some(ScopeSource::Query(q)) => {
            let q: Arc<str> = Arc::from(q.as_str());
            let mut runs = base_runs(job, cfg, periods)?;
            for r in &mut runs {
                r.scope_query = Some(q.clone());
            }
            Ok(runs)
        }
    }
}

/// The runs of these periods for the given scopes of a scoped job
/// (`enqueue --scope`), in period order, then scope order.
pub fn runs_for_scopes(
    job: &JobName,
    cfg: &JobConfig,
    periods: &[Period],
    scopes: &[Scope],
) -> Result<Vec<NewRun>, String> {
    let mut out = Vec::with_capacity(periods.len() * scopes.len());
    for base in base_runs(job, cfg, periods).map_err(|e| e.to_string())? {
        for scope in scopes {
            let key = base.key.with_scope(scope).ok_or_else(|| {
                format!(
                    "the key {}@{scope} would be longer than 120 characters: use a shorter scope",
                    base.key
                )
            })?;
            out.push(NewRun {
                key,
                ..base.clone()
            });
        }
    }
    Ok(out)
}

/// One unscoped run per period.
fn base_runs(
    job: &JobName,
    cfg: &JobConfig,
    periods: &[Period],
) -> Result<Vec<NewRun>, PeriodError> {
    periods
        .iter()
        .map(|p| {
            Ok(NewRun {
                // Invariant: a valid job name and a formatted period make a valid key.
                key: JobKey::parse(&format!("{job}:{}", p.key_part())).expect("valid key"),
                job: job.clone(),
                business_date: p.date,
                max_attempts: cfg.max_attempts,
                payload: serde_json::json!({}),
                skip_reason: cfg.skip_reason(p.date),
                context: RunContext::new(cfg, p)?,
                partitions: cfg.partitions,
                scope_query: None,
            })
        })
        .collect()
}

/// The periods of whole business dates for `enqueue`: one per date for
/// daily jobs, every firing of the schedule within each local date's
/// `day_bounds` for `covers = "firing"` jobs, which need a schedule.
pub fn periods_for_dates(cfg: &JobConfig, dates: &[NaiveDate]) -> Result<Vec<Period>, String> {
    if cfg.covers != Covers::Firing {
        return Ok(dates.iter().copied().map(Period::day).collect());
    }
    let sched = cfg
        .schedule
        .as_ref()
        .ok_or("a job with covers = \"firing\" needs a schedule to enqueue by date")?;
    let mut out = Vec::new();
    for d in dates {
        let (start, end) = schedule::day_bounds(*d, cfg.timezone);
        let before = start - chrono::Duration::microseconds(1);
        let (firings, _) = sched.firings(
            cfg.timezone,
            before,
            end - chrono::Duration::microseconds(1),
            schedule::MAX_PERIODS_PER_TICK,
        );
        out.extend(
            firings
                .into_iter()
                .map(|f| schedule::period_of(&f, cfg.timezone, Covers::Firing)),
        );
    }
    Ok(out)
}

/// The dates of an inclusive range (`enqueue --from --to`), at most
/// [`MAX_BACKFILL_DAYS`].
pub fn date_range(from: NaiveDate, to: NaiveDate) -> Result<Vec<NaiveDate>, String> {
    if to < from {
        return Err(format!("--to {to} is before --from {from}"));
    }
    let days = (to - from).num_days() + 1;
    if days > MAX_BACKFILL_DAYS {
        return Err(format!(
            "the range {from}..{to} is {days} days; the limit is {MAX_BACKFILL_DAYS}: split it"
        ));
    }
    Ok(from.iter_days().take(days as usize).collect())
}

/// What one job's schedule asks for at one moment.
#[derive(Debug, Clone)]
pub struct JobPlan {
    pub job: JobName,
    pub window_start: DateTime<Utc>,
    pub runs: Vec<NewRun>,
    /// The window held more periods than one tick enqueues.
    pub truncated: bool,
}

/// Every period of `job` whose firing falls in `(now - catch_up, now]` and
/// whose business date lies in [`key::date_range`]: a window that starts
/// before 1970-01-01 is clamped to its first instant, and a period outside
/// the range (a local date before 1970 west of UTC, or after 2199 east of
/// it) is never planned, so the producer enqueues only dates that
/// `enqueue` accepts. `None` for a job the producer does not schedule (no
/// `schedule`, or `enabled = false`).
///
/// A zero `catch_up` means the last 15 minutes. Firings are mapped to
/// periods, dropping repeats. A clamped window includes a firing at
/// 1970-01-01T00:00:00Z and reports the clamped start as `window_start`;
/// `now` is capped at the range's last instant. Examples of dropped
/// periods: the 20:00 firing of 1969-12-31 in New York is
/// 1970-01-01T01:00Z, and an 08:00 firing of 2200-01-01 in Seoul is
/// 2199-12-31T23:00Z. Before this rule, `produce --now` enqueued 1969 dates
/// and dates past 2199, and from the year 5000 on, where croner stops
/// searching, silently nothing.
///
/// The plan also says whether the window held more than
/// `schedule::MAX_PERIODS_PER_TICK` (20,000) firings; the tick then takes
/// the earliest 20,000, and the newest periods are the ones missing. The
/// cap counts firings before they become periods. The configuration
/// rejects a `catch_up` that holds more on average over its one-week
/// sample, whatever the `covers`, so only an uneven schedule, or a kind's
/// unchecked built-in defaults, reaches the cap.
pub fn plan(
    job: &JobName,
    cfg: &JobConfig,
    now: DateTime<Utc>,
) -> Result<Option<JobPlan>, PeriodError> {
    let Some(sched) = cfg.schedule.as_ref().filter(|_| cfg.enabled) else {
        return Ok(None);
    };
    let window = chrono::Duration::from_std(cfg.catch_up).unwrap_or(chrono::Duration::days(1));
    // A zero catch-up still takes the firings of the last 15 minutes, so a
    // producer ticking on its timer never misses the current one.
    let window = if window.is_zero() {
        chrono::Duration::minutes(15)
    } else {
        window
    };
    let (first, end) = key::instant_range();
    let unclamped = now.checked_sub_signed(window).unwrap_or(first);
    let window_start = unclamped.max(first);
    // The window is exclusive at its start: a clamped one takes a firing
    // at 1970-01-01T00:00:00Z itself. The end is clamped too, so the walk
    // never reaches instants that chrono cannot shift by a day.
    let after = if unclamped < first {
        first - chrono::Duration::microseconds(1)
    } else {
        window_start
    };
    let upto = now.min(end - chrono::Duration::nanoseconds(1));
    let (firings, truncated) =
        sched.firings(cfg.timezone, after, upto, schedule::MAX_PERIODS_PER_TICK);
    let (min, max) = key::date_range();
    let mut periods: Vec<Period> = firings
        .into_iter()
        .map(|f| schedule::period_of(&f, cfg.timezone, cfg.covers))
        .filter(|p| (min..=max).contains(&p.date))
        .collect();
    periods.dedup();
    Ok(Some(JobPlan {
        job: job.clone(),
        window_start,
        runs: runs_for_periods(job, cfg, &periods)?,
        truncated,
    }))
}

/// One job's share of a tick.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct JobTick {
    pub job: String,
    pub window_start: Option<DateTime<Utc>>,
    pub enqueued: Vec<String>,
    pub skipped: Vec<String>,
    pub duplicates: usize,
    pub truncated: bool,
    /// The start of the latest period the schedule has made due (the
    /// newest in the catch-up window); `None` if the window holds none.
    pub due_period_start: Option<DateTime<Utc>>,
    /// Ids the job's scope query returned that are not valid scopes (never
    /// enqueued), as error messages quote them.
    pub invalid_scopes: Vec<String>,
    /// Why nothing of the job was enqueued this tick (its scope query
    /// failed, or `migrate` did not declare it as this file does).
    pub error: Option<String>,
}

/// One producer tick at `clock`'s now: plans every job, enqueues all runs in
/// one statement, and reports per job ([`JobTick`]: the keys enqueued, the
/// keys inserted as SKIPPED, the number of duplicates, the window's start
/// and whether it was truncated). "Now" is `SELECT now()` on the database,
/// or the `Clock::At` moment of `produce --now`, which stamps the runs only
/// if the login may choose the engine's clock (`queue::may_choose_clock`).
pub async fn tick(
    pool: &PgPool,
    config: &Config,
    clock: Clock,
) -> Result<Vec<JobTick>, QueueError> {
    let now = match clock {
        Clock::At(t) => t,
        Clock::Db => {
            let mut stmt = crate::db::statement(pool).await?;
            let now = crate::db::query_scalar("SELECT now()")
                .fetch_one(stmt.conn())
                .await?;
            stmt.done().await?;
            now
        }
    };
    let mut plans = Vec::new();
    for (name, cfg) in &config.jobs {
        if let Some(p) = plan(name, cfg, now).map_err(|e| QueueError::Invalid(e.to_string()))? {
            plans.push(p);
        }
    }
    let all: Vec<NewRun> = plans.iter().flat_map(|p| p.runs.iter().cloned()).collect();
    // A login that does not own the schema (a producer's) enqueues on the
    // database's clock, whatever `produce --now` simulates (it still
    // chooses which periods are due), and only the jobs `migrate` declared
    // as this file declares them: a job the database would refuse costs
    // its own tick, not the other jobs'.
    let owner = all.is_empty() || queue::may_choose_clock(pool).await?;
    let clock = if owner { clock } else { Clock::Db };
    let undeclared = if owner {
        Vec::new()
    } else {
        let jobs: Vec<(&JobName, &JobConfig)> = plans
            .iter()
            .filter_map(|p| config.jobs.get_key_value(&p.job))
            .collect();
        queue::not_as_declared(pool, &jobs).await?
    };
    let all: Vec<NewRun> = all
        .into_iter()
        .filter(|r| !undeclared.iter().any(|(j, _)| *j == r.job))
        .collect();
    let (report, broken) = match queue::enqueue(pool, &all, clock).await {
        Ok(r) => (r, Vec::new()),
        // A failing scope query would fail every job's tick: find the
        // jobs whose queries fail on their own, and enqueue the others.
        Err(e) if all.iter().any(|r| r.scope_query.is_some()) => {
            let broken = broken_scope_queries(pool, config).await?;
            if broken.is_empty() {
                return Err(e);
            }
            let rest: Vec<NewRun> = all
                .iter()
                .filter(|r| !broken.iter().any(|(j, _)| *j == r.job))
                .cloned()
                .collect();
            (queue::enqueue(pool, &rest, clock).await?, broken)
        }
        Err(e) => return Err(e),
    };
    Ok(plans
        .iter()
        .map(|p| {
            let mut t = JobTick {
                job: p.job.to_string(),
                window_start: Some(p.window_start),
                truncated: p.truncated,
                due_period_start: p.runs.iter().map(|r| r.context.period_start).max(),
                ..JobTick::default()
            };
            if let Some((_, e)) = broken.iter().chain(&undeclared).find(|(j, _)| *j == p.job) {
                t.error = Some(e.clone());
                return t;
            }
            // Keys come back from the statement: a scope query's runs are
            // only known once it has run, and share their template's reason.
            let skip: std::collections::HashMap<&str, bool> = p
                .runs
                .iter()
                .map(|r| (r.key.as_str(), r.skip_reason.is_some()))
                .collect();
            for k in report
                .enqueued
                .iter()
                .filter(|k| k.job_name() == p.job.as_str())
            {
                let unscoped = k.unscoped();
                let skipped = skip
                    .get(k.as_str())
                    .or_else(|| skip.get(unscoped.as_str()))
                    .copied()
                    .unwrap_or(false);
                if skipped {
                    t.skipped.push(k.to_string());
                } else {
                    t.enqueued.push(k.to_string());
                }
            }
            t.duplicates = report
                .duplicates
                .iter()
                .filter(|k| k.job_name() == p.job.as_str())
                .count();
            t.invalid_scopes = report
                .invalid
                .iter()
                .filter(|(k, _)| k.job_name() == p.job.as_str())
                .map(|(_, s)| crate::key::shown(s))
                .collect();
            t
        })
        .collect())
}

/// The scoped jobs of `config` whose scope query fails on its own, with
/// the database's error: run one by one, as the enqueue statement would.
async fn broken_scope_queries(
    pool: &PgPool,
    config: &Config,
) -> Result<Vec<(JobName, String)>, QueueError> {
    let mut broken = Vec::new();
    for (name, cfg) in &config.jobs {
        let Some(ScopeSource::Query(q)) = &cfg.scopes else {
            continue;
        };
        if let Err(e) = queue::count_scopes(pool, q).await {
            match e {
                QueueError::Database(sqlx::Error::Database(d)) => {
                    broken.push((name.clone(), format!("scope query failed: {}", d.message())))
                }
                other => return Err(other),
            }
        }
    }
    Ok(broken)
}

/// Logs and counts one tick's report: it warns `shorten catch_up` for a
/// truncated job, and counts the tick in `batchonce_producer_ticks_total`
/// and `batchonce_producer_last_tick_timestamp_seconds` (Unix time from the
/// process's clock). `produce --once` calls it too, but serves no metrics.
pub fn log_tick(report: &[JobTick]) {
    metrics::counter!(crate::telemetry::PRODUCER_TICKS).increment(1);
    metrics::gauge!(crate::telemetry::PRODUCER_LAST_TICK)
        .set(Utc::now().timestamp_millis() as f64 / 1000.0);
    for t in report {
        // What the missed-run alert compares with the newest period done
        // (docs/metrics.md): the latest period that should exist by now.
        if let Some(start) = t.due_period_start {
            metrics::gauge!(crate::telemetry::DUE_PERIOD, "job" => t.job.clone())
                .set(start.timestamp_millis() as f64 / 1000.0);
        }
        info!(
            job = %t.job, enqueued = t.enqueued.len(), skipped = t.skipped.len(),
            duplicates = t.duplicates, truncated = t.truncated,
            window_start = t.window_start.map(|w| w.to_rfc3339()).as_deref(),
            "producer tick"
        );
        if let Some(e) = &t.error {
            warn!(job = %t.job, error = %e, "nothing of this job was enqueued this tick, the other jobs were");
        }
        if !t.invalid_scopes.is_empty() {
            warn!(job = %t.job, count = t.invalid_scopes.len(),
                  examples = ?t.invalid_scopes.iter().take(3).collect::<Vec<_>>(),
                  "the scope query returned ids that are not scopes (1-36 lowercase letters, digits and single dashes, within the key's 120 characters); they were not enqueued");
        }
        if t.truncated {
            // Config validation bounds catch_up so this cannot happen; if it
            // does, the newest periods are the ones missing.
            warn!(job = %t.job, limit = schedule::MAX_PERIODS_PER_TICK,
                  "catch-up window holds more periods than one tick enqueues; shorten catch_up");
        }
    }
}

/// The time between the ticks of `produce` when `--interval` is not given.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15);

/// The longest a producer may promise to be back: every view faults a
/// `live_until` more than 31 days after `last_seen` (`queue::WORKER_PROBLEM`).
const MAX_ONCE_LIVE: Duration = Duration::from_secs(30 * 86_400);

/// How long `produce --once` counts as live after its tick, by the loop's
/// rule (three intervals and 10 s): its timer's period when `--interval`
/// gives it; else the shortest time between two firings of its enabled
/// jobs' schedules, which a timer must fire at least as often as; else
/// (no schedule) the default interval. At most 30 days.
pub fn once_live_for(config: &Config, interval: Option<Duration>) -> Duration {
    let every = interval.unwrap_or_else(|| shortest_gap(config).unwrap_or(DEFAULT_INTERVAL));
    every
        .saturating_mul(3)
        .saturating_add(Duration::from_secs(10))
        .min(MAX_ONCE_LIVE)
}

/// The shortest time between two consecutive firings of any enabled job's
/// schedule, over 400 days from a fixed instant, so the answer does not
/// depend on when it is asked (and covers every weekday, month and DST
/// change of a year). A schedule that fires at most once in them counts
/// as 400 days.
fn shortest_gap(config: &Config) -> Option<Duration> {
    let sample = chrono::Duration::days(400);
    let from = DateTime::<Utc>::from_timestamp(1_767_571_200, 0)?; // 2026-01-05, a Monday
    config
        .jobs
        .values()
        .filter(|c| c.enabled)
        .filter_map(|c| {
            let (firings, _) = c
                .schedule
                .as_ref()?
                .firings(c.timezone, from, from + sample, 2_000);
            Some(
                firings
                    .windows(2)
                    .map(|w| w[1].at - w[0].at)
                    .min()
                    .unwrap_or(sample),
            )
        })
        .min()
        .and_then(|d| d.to_std().ok())
}

/// Records this producer and the configuration of every job it plans in the
/// process registry, so operators see when producers disagree. A failure
/// is logged and never stops the producer: producing is what matters.
pub async fn register(pool: &PgPool, config: &Config, process_id: &str, live_for: Duration) {
    let jobs: Vec<(JobName, &JobConfig)> =
        config.jobs.iter().map(|(n, c)| (n.clone(), c)).collect();
    if let Err(e) = crate::runtime::worker_registry::register_process(
        pool,
        process_id,
        crate::runtime::worker_registry::Role::Producer,
        env!("CARGO_PKG_VERSION"),
        live_for,
        &jobs,
    )
    .await
    {
        warn!(error = %e, "could not record this producer's configuration");
    }
}

/// The producer loop: a tick every `interval`, truncated or not, until
/// `stop`. A failed tick is logged and retried with a backoff from 200 ms,
/// doubling up to the interval (at least 1 s); it never ends the loop. With a
/// simulated start (`Clock::At`), simulated time advances with real time.
/// The process registers as `process_id` and deregisters when it stops.
pub async fn run(
    pool: PgPool,
    config: Config,
    start: Clock,
    interval: Duration,
    process_id: String,
    stop: CancellationToken,
) {
    crate::telemetry::serve_jobs(crate::telemetry::Role::Producer, config.jobs.keys());
    // Back within an interval; a few more before it counts as gone.
    let live_for = interval * 3 + Duration::from_secs(10);
    let mut registered = false;
    let began = std::time::Instant::now();
    let mut delay = Duration::from_millis(200);
    loop {
        let clock = match start {
            Clock::Db => Clock::Db,
            Clock::At(t) => {
                Clock::At(t + chrono::Duration::from_std(began.elapsed()).unwrap_or_default())
            }
        };
        let wait = match tick(&pool, &config, clock).await {
            Ok(report) => {
                log_tick(&report);
                if !registered {
                    register(&pool, &config, &process_id, live_for).await;
                    registered = true;
                } else if let Err(e) = crate::runtime::worker_registry::touch(
                    &pool,
                    &process_id,
                    env!("CARGO_PKG_VERSION"),
                    live_for,
                )
                .await
                {
                    warn!(error = %e, "could not refresh this producer's registration");
                }
                delay = Duration::from_millis(200);
                interval
            }
            Err(e) => {
                warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "producer tick failed; retrying");
                let d = delay;
                delay = (delay * 2).min(interval.max(Duration::from_secs(1)));
                d
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => break,
        }
    }
    if registered {
        if let Err(e) = crate::runtime::worker_registry::deregister(&pool, &process_id).await {
            warn!(error = %e, "could not deregister this producer");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_shot_producer_is_live_for_three_of_its_periods() {
        let mut config = Config {
            origin: "test".into(),
            jobs: Default::default(),
        };
        let every = |cron: &str| JobConfig {
            schedule: Some(crate::schedule::CronSchedule::parse(cron).unwrap()),
            ..JobConfig::default()
        };
        let name = |n: &str| JobName::parse(n).unwrap();
        // No schedule: the loop's default interval.
        assert_eq!(once_live_for(&config, None), Duration::from_secs(55));
        config.jobs.insert(name("daily"), every("0 1 * * *"));
        // A daily schedule: three days (a DST change makes no gap shorter
        // in UTC), and the timer's period when it is given.
        assert_eq!(
            once_live_for(&config, None),
            Duration::from_secs(3 * 86_400 + 10)
        );
        assert_eq!(
            once_live_for(&config, Some(Duration::from_secs(300))),
            Duration::from_secs(910)
        );
        config.jobs.insert(name("quarter"), every("*/15 * * * *"));
        assert_eq!(once_live_for(&config, None), Duration::from_secs(2710));
        // Never past what every view believes.
        config.jobs.clear();
        config.jobs.insert(name("yearly"), every("0 0 1 1 *"));
        assert_eq!(once_live_for(&config, None), MAX_ONCE_LIVE);
    }
}
