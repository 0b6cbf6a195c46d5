//! The configuration layer: what the operator declares (`batchonce.toml`:
//! one `[jobs.<name>]` table per job with its time zone and policies, in
//! `mod.rs`, and command jobs' keys in `command.rs`) and what a run is
//! frozen with when it is enqueued (`context.rs`). Parsing is strict: an
//! unknown key, a bad time zone or a bad duration is an error that names the
//! key.
//!
//! This layer must never touch the database or the clock, and never decide
//! anything about a run that already exists: once enqueued, a run is judged
//! by the context stored with it, not by any file.
//!
//! The `batchonce.toml` parser. It produces a `Config` holding a `JobConfig` per job the file
//! declares: for a registered kind named by a `[jobs.<name>]` table, the kind's `default_config()`
//! with the table applied on top, and one per command job. `Config::empty()` (no file) declares
//! nothing; `Config::defaults(kinds)` and `Config::declare_all` declare every given kind, for
//! `demo` and library tests.
//!
//! It also holds `LeaseExpiryPolicy` (`retry` or `hold`) and `parse_duration` (humantime; zero
//! rejected; only `chunk_pause` and `catch_up` accept a literal `"0"` or `"0s"`). The scheduling
//! keys are `schedule` (a `CronSchedule`), `covers`, `catch_up` (at most `MAX_CATCH_UP`, 400 days),
//! `skip_dates` (strict `YYYY-MM-DD`), `skip_weekdays` (chrono's weekday names) and `enabled`.
//! `JobConfig::default` has no schedule, `covers = same-day`, `catch_up = 3d`, no skips and
//! `enabled = true`. `JobConfig::skip_reason(date)` gives the business calendar's reason to skip a
//! date, checking `skip_dates` first, then `skip_weekdays`. Parsing is strict. Unknown keys,
//! unregistered job names, bad time zones, bad durations, out-of-range numbers broken cross-key
//! rules and bad or never-firing cron expressions, dates or weekday names each produce a
//! `ConfigError`: one line naming the file and the dotted key. The cross-key rules are `lease_ttl`
//! between 1s and 24h, `lease_ttl <= stale_after <= 30d`, `backoff <= backoff_max <= 7d`,
//! `chunk_pause <= 60s`, and, for every job with a `schedule`, whatever its `covers`, a `catch_up`
//! window holding at most `schedule::MAX_PERIODS_PER_TICK` (20,000) firings, because one tick walks
//! every firing of its window. That last rule estimates the firings per day from a one-week sample
//! of the schedule (the firings in `(2026-01-05T00:00Z, 2026-01-12T00:00Z]`, from a Monday, in the
//! job's zone, so a schedule of some weekdays only is counted fairly), scales it to `catch_up`, and
//! fails naming `catch_up` (`holds about N firings of this schedule; the limit is 20000: shorten
//! it`). It counts firings, not periods, because the producer's cap does too (see
//! `src/runtime/producer.rs`). The cross-key rules run in `job_table.rs`'s `apply_job_table`, so they check the jobs that
//! have a `[jobs.<name>]` table in the file; a kind's `default_config()` alone is not checked.
//!
//! Five kinds of keys sit in a job table besides the scheduling and policy keys above:
//!
//! - `scopes` makes the job scoped: one run per scope and period, keyed `<job>:<period>@<scope>`,
//!   from a fixed list or a SQL query (`src/config/scopes.rs`); only a kind whose
//!   `default_config` sets `scopable`, or a command job, accepts it, and a listed scope must
//!   leave the key within 120 characters.
//! - `partitions` (1–256, default 1) splits each run into that many partitions, leased apart
//!   (`src/queue/partitions.rs`); only a kind whose `default_config` sets `partitionable`, or a
//!   command job, accepts more than 1.
//! - `max_item_failures` (`Option<u64>`, default `None`, meaning no limit) is a common key that
//!   every job accepts. Only a kind that counts failed items reads it; among the bundled kinds that
//!   is `notification-send`.
//! - A kind's own keys are held in `JobConfig.options`, a `KindOptions { keys, check, values }`.
//!   The kind declares `keys` and `check` (an `OptionCheck`, `fn(&toml::Table) -> Result<(),
//!   OptionError>`) in its `default_config()`. `apply_job_table` copies a key listed in `keys` into
//!   `values` as raw TOML, and after the loop runs `check` on `values`; an `OptionError { key,
//!   message }` becomes a `ConfigError` naming `jobs.<name>.<key>`. The kind reads the values with
//!   `KindOptions::str`, `int` and `duration`. A key that no kind lists is an unknown key, and the
//!   error lists the keys the table accepts. Like the cross-key rules, the check runs only for a
//!   job with a table in the file.
//! - `command` makes the job a command job, with a `CommandSpec`: `argv` (a non-empty array of
//!   strings, at most 64 KiB, no NUL, the first not blank), `timeout` (default 1 h, at most 7 d),
//!   `kill_grace` (default 10 s, at most `timeout`), `working_dir`, `env` (names of letters, digits
//!   and `_` not starting with a digit, never `BATCHONCE_*` or `DATABASE_URL`; values at most 64
//!   KiB), `pass_env` (at most 100 distinct such names, never `BATCHONCE_*`, `DATABASE_URL` or a
//!   name of `env`), `database_url_env` (one such name), `skipped_exit_code` (default 3, 1–255) and
//!   `fatal_exit_codes` (default `[2, 126, 127]`, each 1–255, not containing `skipped_exit_code`).
//!   `CommandSpec::new` holds the defaults. `CommandSpec` and its keys live in the submodule
//!   `src/config/command.rs`. The command-only keys (`COMMAND_KEYS`) are applied by
//!   `apply_command_keys` after the loop, once `command` is known, and a table without `command`
//!   that gives one is refused. In `Config::parse`, a table whose name is not a registered kind is
//!   accepted only if it has `command`, and it starts from `JobConfig::default()`; a table of a
//!   registered kind may not have `command` (`give the command job a name of its own`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{NaiveDate, Weekday};
use chrono_tz::Tz;

use crate::key::JobName;
use crate::schedule::{Covers, CronSchedule};

mod command;
pub mod context;
mod job_table;
mod scopes;
mod value;

pub use command::{is_variable_name, CommandSpec};
use job_table::apply_job_table;
pub use scopes::{ScopeSource, MAX_LISTED_SCOPES};

/// Longest catch-up window: a year and a month of missed periods.
pub const MAX_CATCH_UP: Duration = Duration::from_secs(400 * 86_400);

/// What happens to a run whose lease expired (DESIGN.md §4.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseExpiryPolicy {
    /// Back to PENDING with a new token; counts as an attempt.
    Retry,
    /// Stays RUNNING and is reported stale for an operator.
    Hold,
}

impl LeaseExpiryPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retry => "retry",
            Self::Hold => "hold",
        }
    }
}

/// The policies of one job kind, after defaults and the file are merged.
#[derive(Debug, Clone, PartialEq)]
pub struct JobConfig {
    /// The business time zone: business dates are computed in it.
    pub timezone: Tz,
    /// Attempts before a run is FAILED (claims, including lease expiries).
    pub max_attempts: u32,
    /// How long a lease lasts without a heartbeat.
    pub lease_ttl: Duration,
    /// Age of a RUNNING run after which it is reported stale.
    pub stale_after: Duration,
    /// Items per fenced transaction.
    pub chunk_size: u32,
    /// First retry delay; doubles per failed attempt, with jitter.
    pub backoff: Duration,
    /// Upper bound of the retry delay.
    pub backoff_max: Duration,
    /// Pause between chunks, to spare the source database (0 = none).
    pub chunk_pause: Duration,
    pub on_lease_expiry: LeaseExpiryPolicy,
    /// When the producer enqueues periods; `None`: only by `enqueue`.
    pub schedule: Option<CronSchedule>,
    /// Which business period a firing is about.
    pub covers: Covers,
    /// How far back the producer enqueues missed periods after downtime.
    pub catch_up: Duration,
    /// Business dates recorded as SKIPPED instead of run.
    pub skip_dates: Vec<NaiveDate>,
    /// Weekdays recorded as SKIPPED instead of run.
    pub skip_weekdays: Vec<Weekday>,
    /// A disabled job is not produced (manual `enqueue` still works).
    pub enabled: bool,
    /// Item failures a run may count and still succeed (job kinds that
    /// count item failures, e.g. undeliverable notifications); `None`: any.
    pub max_item_failures: Option<u64>,
    /// The keys a job kind takes besides the common ones, and their values.
    pub options: KindOptions,
    /// Set for a job that runs an external program (`command = [...]`).
    pub command: Option<CommandSpec>,
    /// Partitions of each run (1: a whole run). Stored with the run when it
    /// is enqueued, so changing it never splits an enqueued run another way.
    pub partitions: u16,
    /// Whether the kind can work on one partition of a run and has a final
    /// step (set by the kind's `default_config`; command jobs can).
    pub partitionable: bool,
    /// Where a scoped job's scopes come from (`None`: one run per period).
    /// The scope is part of each run's key, so it is fixed with the run.
    pub scopes: Option<ScopeSource>,
    /// Whether the kind can work on one scope's items alone (set by the
    /// kind's `default_config`; command jobs can).
    pub scopable: bool,
}

impl JobConfig {
    /// Why a business date is skipped by the calendar, if it is.
    pub fn skip_reason(&self, date: NaiveDate) -> Option<String> {
        calendar_skip_reason(date, &self.skip_dates, &self.skip_weekdays)
    }
}

/// Why a business calendar of `skip_dates` and `skip_weekdays` skips
/// `date`, if it does: the producer's rule, which the console's calendar
/// applies to a recorded configuration too.
pub fn calendar_skip_reason(
    date: NaiveDate,
    skip_dates: &[NaiveDate],
    skip_weekdays: &[chrono::Weekday],
) -> Option<String> {
    use chrono::Datelike;
    if skip_dates.contains(&date) {
        return Some(format!("business calendar: {date} is in skip_dates"));
    }
    if skip_weekdays.contains(&date.weekday()) {
        return Some(format!(
            "business calendar: {date} is a {:?}, in skip_weekdays",
            date.weekday()
        ));
    }
    None
}

impl Default for JobConfig {
    fn default() -> Self {
        Self {
            timezone: Tz::UTC,
            max_attempts: 5,
            lease_ttl: Duration::from_secs(30),
            stale_after: Duration::from_secs(20 * 60),
            chunk_size: 500,
            backoff: Duration::from_secs(10),
            backoff_max: Duration::from_secs(600),
            chunk_pause: Duration::ZERO,
            on_lease_expiry: LeaseExpiryPolicy::Retry,
            schedule: None,
            covers: Covers::SameDay,
            catch_up: Duration::from_secs(3 * 86_400),
            skip_dates: Vec::new(),
            skip_weekdays: Vec::new(),
            enabled: true,
            max_item_failures: None,
            options: KindOptions::default(),
            command: None,
            partitions: 1,
            partitionable: false,
            scopes: None,
            scopable: false,
        }
    }
}

/// A job kind's own configuration keys (e.g. notification-send's `sender`).
/// The kind declares them in its default config; the file's values are
/// checked at load time, so a typo or a bad value stops the process at start.
#[derive(Debug, Clone, Default)]
pub struct KindOptions {
    /// The keys the kind accepts.
    pub keys: &'static [&'static str],
    /// Checks the values given; an error names the key.
    pub check: Option<OptionCheck>,
    /// The values given in the file.
    pub values: toml::Table,
}

/// A job kind's check of its options.
pub type OptionCheck = fn(&toml::Table) -> Result<(), OptionError>;

/// A bad job-kind option: the key and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionError {
    pub key: String,
    pub message: String,
}

impl OptionError {
    pub fn new(key: &str, message: impl Into<String>) -> Self {
        Self {
            key: key.to_owned(),
            message: message.into(),
        }
    }
}

impl PartialEq for KindOptions {
    /// Compares what was configured; the check function is the kind's code.
    fn eq(&self, other: &Self) -> bool {
        self.keys == other.keys && self.values == other.values
    }
}

impl KindOptions {
    /// A string option, if given.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.values.get(key).and_then(toml::Value::as_str)
    }

    /// An integer option, if given.
    pub fn int(&self, key: &str) -> Option<i64> {
        self.values.get(key).and_then(toml::Value::as_integer)
    }

    /// A duration option (`"10s"`), if given and valid.
    pub fn duration(&self, key: &str) -> Option<Duration> {
        self.str(key).and_then(|s| parse_duration(s).ok())
    }
}

/// A configuration problem, printed as one line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{origin}: line {line}: {message}")]
    Syntax {
        origin: String,
        line: usize,
        message: String,
    },
    #[error("{origin}: `{key}`: {message}")]
    Key {
        origin: String,
        key: String,
        message: String,
    },
}

/// The whole configuration: the jobs it declares, and nothing else. A
/// registered job kind that the file does not declare does not exist for
/// this process: it is not migrated, scheduled or run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it came from (a path, "no configuration file", or "built-in
    /// defaults").
    pub origin: String,
    pub jobs: BTreeMap<JobName, JobConfig>,
}

impl Config {
    /// Every given job kind declared with its defaults: the demo's own
    /// declaration of the bundled kinds, and tests of the library.
    pub fn defaults(kinds: &BTreeMap<JobName, JobConfig>) -> Self {
        Self {
            origin: "built-in defaults".into(),
            jobs: kinds.clone(),
        }
    }

    /// No file: no job is declared. Operator commands work (what they show
    /// comes from the database); a worker or producer has nothing to do.
    pub fn empty() -> Self {
        Self {
            origin: "no configuration file".into(),
            jobs: BTreeMap::new(),
        }
    }

    /// Declares, with its defaults, every kind of `kinds` that this
    /// configuration does not declare yet (what `demo` runs).
    pub fn declare_all(mut self, kinds: &BTreeMap<JobName, JobConfig>) -> Self {
        for (name, cfg) in kinds {
            self.jobs.entry(name.clone()).or_insert_with(|| cfg.clone());
        }
        self
    }

    /// Reads and validates a file against the registered job kinds.
    pub fn load(path: &Path, kinds: &BTreeMap<JobName, JobConfig>) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string(), kinds)
    }

    /// Parses configuration text; `origin` names it in errors.
    pub fn parse(
        text: &str,
        origin: &str,
        kinds: &BTreeMap<JobName, JobConfig>,
    ) -> Result<Self, ConfigError> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
                .unwrap_or(0);
            ConfigError::Syntax {
                origin: origin.to_owned(),
                line,
                message: e
                    .message()
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .collect::<Vec<_>>()
                    .join("; "),
            }
        })?;
        let key_err = |key: &str, message: String| ConfigError::Key {
            origin: origin.to_owned(),
            key: key.to_owned(),
            message,
        };
        // Only what the file declares: a bundled kind is a sample until a
        // `[jobs.<name>]` table names it.
        let mut jobs = BTreeMap::new();
        for (top, value) in &table {
            if top != "jobs" {
                return Err(key_err(top, "unknown key (expected `jobs`)".into()));
            }
            let toml::Value::Table(job_tables) = value else {
                return Err(key_err(
                    "jobs",
                    "must be a table of [jobs.<name>] tables".into(),
                ));
            };
            for (name, job_value) in job_tables {
                let path = format!("jobs.{name}");
                let toml::Value::Table(fields) = job_value else {
                    return Err(key_err(&path, "must be a table".into()));
                };
                let known: Vec<&str> = kinds.keys().map(JobName::as_str).collect();
                let parsed = JobName::parse(name);
                let job_name = match parsed {
                    Ok(n) if kinds.contains_key(&n) => {
                        if fields.contains_key("command") {
                            return Err(key_err(
                                &format!("{path}.command"),
                                format!(
                                    "{n} is a built-in job kind; give the command job a name of its own"
                                ),
                            ));
                        }
                        jobs.insert(n.clone(), kinds[&n].clone());
                        n
                    }
                    // A job of the user's own: it runs a program.
                    Ok(n) if fields.contains_key("command") => {
                        jobs.insert(n.clone(), JobConfig::default());
                        n
                    }
                    Ok(_) => {
                        return Err(key_err(
                            &path,
                            format!(
                                "unknown job (registered: {}; a job of your own needs `command = [...]`)",
                                known.join(", ")
                            ),
                        ))
                    }
                    Err(e) => return Err(key_err(&path, e.to_string())),
                };
                // Invariant: job_name is in `jobs` (inserted by one of the arms above).
                let cfg = jobs.get_mut(&job_name).expect("configured job");
                apply_job_table(cfg, fields, &path).map_err(|(k, m)| key_err(&k, m))?;
            }
        }
        Ok(Self {
            origin: origin.to_owned(),
            jobs,
        })
    }

    pub fn job(&self, name: &JobName) -> Option<&JobConfig> {
        self.jobs.get(name)
    }
}

/// Parses a human duration such as `30s`, `5m`, `1h30m`; zero is rejected.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|_| format!("invalid duration {s:?} (use e.g. \"30s\", \"5m\", \"1h\")"))?;
    if d.is_zero() {
        return Err(format!("duration {s:?} must be greater than zero"));
    }
    Ok(d)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// One registered kind, for the parser's tests here and in `command`.
    pub(crate) fn kinds() -> BTreeMap<JobName, JobConfig> {
        let mut m = BTreeMap::new();
        m.insert(
            JobName::parse("daily-settlement").unwrap(),
            JobConfig::default(),
        );
        m
    }

    /// The error a configuration text gets.
    pub(crate) fn err(text: &str) -> String {
        Config::parse(text, "t.toml", &kinds())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_schedule_that_never_fires_is_refused_at_parse_time() {
        let e = err("[jobs.daily-settlement]\nschedule = \"0 1 31 2 *\"");
        assert!(
            e.contains("`jobs.daily-settlement.schedule`: \"0 1 31 2 *\" never fires (there is no 31 February)"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
        for never in [
            "0 0 30 2 *",
            "0 0 31 4 *",
            "0 0 31 4,6,9,11 *",
            "0 0 31 2 +1",
        ] {
            let e = err(&format!("[jobs.daily-settlement]\nschedule = \"{never}\""));
            assert!(
                e.contains("`jobs.daily-settlement.schedule`") && e.contains("never fires"),
                "{never}: {e}"
            );
        }
        // Leap days and cron's OR of the two day fields stay valid.
        for rare in ["0 0 29 2 *", "0 0 31 2 1", "0 0 * 2 1#5"] {
            let text = format!("[jobs.daily-settlement]\nschedule = \"{rare}\"");
            assert!(Config::parse(&text, "t.toml", &kinds()).is_ok(), "{rare}");
        }
    }

    #[test]
    fn only_declared_jobs_exist() {
        let none = Config::parse("", "t.toml", &kinds()).unwrap();
        assert!(none.jobs.is_empty());
        let own = Config::parse(
            "[jobs.nightly-invoices]\ncommand = [\"node\", \"x.js\"]\n",
            "t.toml",
            &kinds(),
        )
        .unwrap();
        let names: Vec<&str> = own.jobs.keys().map(JobName::as_str).collect();
        assert_eq!(names, ["nightly-invoices"]);
        // An empty table declares a bundled kind with its defaults.
        let sample = Config::parse("[jobs.daily-settlement]\n", "t.toml", &kinds()).unwrap();
        let names: Vec<&str> = sample.jobs.keys().map(JobName::as_str).collect();
        assert_eq!(names, ["daily-settlement"]);
        assert!(Config::empty().jobs.is_empty());
        assert_eq!(Config::empty().declare_all(&kinds()).jobs.len(), 1);
    }

    #[test]
    fn parses_a_full_table() {
        let c = Config::parse(
            r#"
[jobs.daily-settlement]
timezone = "Asia/Seoul"
max_attempts = 3
lease_ttl = "45s"
stale_after = "20m"
chunk_size = 100
backoff = "5s"
backoff_max = "1h"
chunk_pause = "0s"
on_lease_expiry = "hold"
"#,
            "t.toml",
            &kinds(),
        )
        .unwrap();
        let j = c.job(&JobName::parse("daily-settlement").unwrap()).unwrap();
        assert_eq!(j.timezone, chrono_tz::Asia::Seoul);
        assert_eq!(j.max_attempts, 3);
        assert_eq!(j.lease_ttl, Duration::from_secs(45));
        assert_eq!(j.chunk_size, 100);
        assert_eq!(j.on_lease_expiry, LeaseExpiryPolicy::Hold);
        let c = Config::parse(
            "[jobs.daily-settlement]\nschedule = \"0 1 * * *\"\ncovers = \"previous-day\"\ncatch_up = \"7d\"\nskip_dates = [\"2026-12-25\"]\nskip_weekdays = [\"sat\", \"Sun\"]\nenabled = false\n",
            "t.toml",
            &kinds(),
        )
        .unwrap();
        let j = c.job(&JobName::parse("daily-settlement").unwrap()).unwrap();
        assert_eq!(j.schedule.as_ref().unwrap().as_str(), "0 1 * * *");
        assert_eq!(j.covers, Covers::PreviousDay);
        assert_eq!(j.catch_up, Duration::from_secs(7 * 86_400));
        assert!(!j.enabled);
        let d = |s| NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap();
        assert!(j
            .skip_reason(d("2026-12-25"))
            .unwrap()
            .contains("skip_dates"));
        assert!(j
            .skip_reason(d("2026-09-19"))
            .unwrap()
            .contains("skip_weekdays"));
        assert!(j.skip_reason(d("2026-09-18")).is_none());
    }

    #[test]
    fn errors_name_the_key() {
        assert!(err("[jobs.daily-settlement]\ncolour = 1")
            .contains("`jobs.daily-settlement.colour`: unknown key"));
        assert!(err("[jobs.daily-settlement]\ntimezone = \"Mars/Base\"")
            .contains("`jobs.daily-settlement.timezone`: unknown time zone"));
        assert!(err("[jobs.daily-settlement]\nlease_ttl = \"soon\"")
            .contains("`jobs.daily-settlement.lease_ttl`: invalid duration"));
        assert!(err("[jobs.daily-settlement]\nlease_ttl = 30").contains("expected a string"));
        assert!(err("[jobs.daily-settlement]\nmax_attempts = 0").contains("out of range"));
        assert!(
            err("[jobs.daily-settlement]\nchunk_size = \"big\"").contains("expected an integer")
        );
        assert!(
            err("[jobs.daily-settlement]\non_lease_expiry = \"pray\"").contains("unknown policy")
        );
        assert!(
            err("[jobs.daily-settlement]\nlease_ttl = \"1h\"\nstale_after = \"1m\"")
                .contains("stale_after")
        );
        assert!(err("[jobs.daily-settlement]\nbackoff = \"2h\"")
            .contains("`jobs.daily-settlement.backoff`: must not be longer than backoff_max"));
        assert!(err("[jobs.daily-settlement]\nbackoff_max = \"30d\"")
            .contains("`jobs.daily-settlement.backoff_max`"));
        assert!(err("[jobs.daily-settlement]\nchunk_pause = \"5m\"")
            .contains("`jobs.daily-settlement.chunk_pause`"));
        assert!(err("[jobs.daily-settlement]\nstale_after = \"0s\"").contains("greater than zero"));
        assert!(err("[jobs.daily-settlement]\nchunk_size = 1000000")
            .contains("`jobs.daily-settlement.chunk_size`"));
        assert!(err("[jobs.daily-settlement]\nschedule = \"0 25 * * *\"")
            .contains("`jobs.daily-settlement.schedule`: invalid cron expression"));
        assert!(err("[jobs.daily-settlement]\nschedule = \"every day\"")
            .contains("`jobs.daily-settlement.schedule`"));
        assert!(err("[jobs.daily-settlement]\ncovers = \"tomorrow\"")
            .contains("`jobs.daily-settlement.covers`: unknown value"));
        assert!(err("[jobs.daily-settlement]\ncatch_up = \"1000d\"")
            .contains("`jobs.daily-settlement.catch_up`: 1000d is longer than the limit"));
        assert!(err("[jobs.daily-settlement]\ncatch_up = \"soon\"")
            .contains("`jobs.daily-settlement.catch_up`: invalid duration"));
        assert!(
            err("[jobs.daily-settlement]\nskip_dates = [\"2026-02-30\"]")
                .contains("`jobs.daily-settlement.skip_dates`: invalid date")
        );
        assert!(err("[jobs.daily-settlement]\nskip_dates = \"2026-12-25\"")
            .contains("expected an array"));
        assert!(
            err("[jobs.daily-settlement]\nskip_weekdays = [\"caturday\"]")
                .contains("`jobs.daily-settlement.skip_weekdays`: unknown weekday")
        );
        assert!(err("[jobs.daily-settlement]\nenabled = \"yes\"")
            .contains("`jobs.daily-settlement.enabled`: expected true or false"));
        assert!(
            err("[jobs.daily-settlement]\nschedule = \"* * * * *\"\ncovers = \"firing\"\ncatch_up = \"30d\"")
                .contains("`jobs.daily-settlement.catch_up`: holds about 43200 firings")
        );
        assert!(err("[jobs.daily-settlement]\nschedule = \"* * * * 1\"\ncovers = \"firing\"\ncatch_up = \"400d\"")
            .contains("`jobs.daily-settlement.catch_up`: holds about"));
        assert!(err("jobs = 3").contains("`jobs`: must be a table"));
        assert!(err("[jobs.nightly]\n")
            .contains("`jobs.nightly`: unknown job (registered: daily-settlement;"));
        assert!(err("[worker]\n").contains("`worker`: unknown key"));
        assert!(err("[jobs.daily-settlement\n").contains("t.toml: line 1"));
        // Every message is one line.
        assert!(!err("[jobs.daily-settlement\n").contains('\n'));
    }

    #[test]
    fn kind_options_are_checked_by_the_kind() {
        fn check(t: &toml::Table) -> Result<(), OptionError> {
            match t.get("sender").and_then(toml::Value::as_str) {
                Some("outbox") | None => Ok(()),
                Some(_) => Err(OptionError::new("sender", "unknown sender")),
            }
        }
        let mut k = kinds();
        k.insert(
            JobName::parse("notify").unwrap(),
            JobConfig {
                options: KindOptions {
                    keys: &["sender"],
                    check: Some(check),
                    values: toml::Table::new(),
                },
                ..JobConfig::default()
            },
        );
        let c = Config::parse(
            "[jobs.notify]\nsender = \"outbox\"\nmax_item_failures = 3",
            "t.toml",
            &k,
        )
        .unwrap();
        let j = &c.jobs[&JobName::parse("notify").unwrap()];
        assert_eq!(j.options.str("sender"), Some("outbox"));
        assert_eq!(j.max_item_failures, Some(3));
        let e = Config::parse("[jobs.notify]\nsender = \"pigeon\"", "t.toml", &k)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`jobs.notify.sender`: unknown sender"), "{e}");
        // Another kind does not take the key.
        assert!(err("[jobs.daily-settlement]\nsender = \"outbox\"").contains("unknown key"));
    }
}
