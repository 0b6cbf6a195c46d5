//! The configuration layer: what the operator declares in `batchonce.toml`
//! (one `[jobs.<name>]` table per job, parsed into a [`Config`] holding a
//! [`JobConfig`] per declared job) and what a run is frozen with when it is
//! enqueued (`context.rs`). `job_table.rs` applies one table to a job
//! (each key, then the rules between keys), `command.rs` holds a command
//! job's keys ([`CommandSpec`]), and `scopes.rs` where a scoped job's scopes
//! come from. What each key means, with its default and bounds, is in
//! `docs/configuration.md` and, for command jobs, `docs/command-jobs.md`.
//!
//! Invariants:
//!
//! - Parsing is strict. Unknown keys, unregistered job names, bad time
//!   zones, bad durations, out-of-range numbers, broken rules between keys,
//!   and bad or never-firing cron expressions, dates or weekday names each
//!   produce a [`ConfigError`]: one line naming the file and the dotted key.
//! - Only declared jobs exist: a registered kind that the file does not
//!   name is not migrated, scheduled or run by this process.
//! - This layer never touches the database or the clock, and never decides
//!   anything about a run that already exists: once enqueued, a run is
//!   judged by the context stored with it, not by any file.

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

/// What happens to a run whose lease expired (`on_lease_expiry`, see
/// `docs/operations.md` and the transitions of `docs/state_machine.md`).
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
    /// Item failures a run may count and still succeed; `None` (the
    /// default): any. Every job accepts the key, but only a kind that
    /// counts failed items reads it; among the bundled kinds that is
    /// `notification-send`.
    pub max_item_failures: Option<u64>,
    /// The keys a job kind takes besides the common ones, and their values.
    pub options: KindOptions,
    /// Set for a job that runs an external program (`command = [...]`).
    /// The command-only keys are applied once `command` is known (see
    /// [`CommandSpec`] and `docs/command-jobs.md` for their bounds).
    pub command: Option<CommandSpec>,
    /// Partitions of each run (1–256; 1: a whole run), leased apart
    /// (`src/queue/partitions.rs`). Only a kind whose `default_config` sets
    /// `partitionable`, or a command job, accepts more than 1. Stored with
    /// the run when it is enqueued, so changing it never splits an
    /// enqueued run another way.
    pub partitions: u16,
    /// Whether the kind can work on one partition of a run and has a final
    /// step (set by the kind's `default_config`; command jobs can).
    pub partitionable: bool,
    /// Where a scoped job's scopes come from (`None`: one run per period):
    /// a fixed list or a SQL query. A scoped job has one run per scope and
    /// period, keyed `<job>:<period>@<scope>`; only a kind whose
    /// `default_config` sets `scopable`, or a command job, accepts the key,
    /// and a listed scope must leave the key within 120 characters. The
    /// scope is part of each run's key, so it is fixed with the run.
    pub scopes: Option<ScopeSource>,
    /// Whether the kind can work on one scope's items alone (set by the
    /// kind's `default_config`; command jobs can).
    pub scopable: bool,
}

impl JobConfig {
    /// Why a business date is skipped by the calendar, if it is:
    /// `skip_dates` is checked first, then `skip_weekdays`.
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

/// No schedule, `covers = same-day`, `catch_up = 3d`, no skips,
/// `enabled = true`, the policies of `docs/configuration.md`'s example, and
/// no command, partitions or scopes.
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
///
/// `apply_job_table` copies a key listed in `keys` into `values` as raw
/// TOML, and after the loop runs `check` on `values`; an [`OptionError`]
/// becomes a [`ConfigError`] naming `jobs.<name>.<key>`. The kind reads the
/// values with [`KindOptions::str`], `int` and `duration`. A key that no
/// kind lists is an unknown key, and the error lists the keys the table
/// accepts. Like the rules between keys, the check runs only for a job with
/// a table in the file; a kind's `default_config()` alone is not checked.
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
    ///
    /// A table named after a registered kind starts from the kind's
    /// `default_config()`, with the table applied on top; such a table may
    /// not have `command` (`give the command job a name of its own`). A
    /// table whose name is not a registered kind is accepted only if it has
    /// `command`, and it starts from `JobConfig::default()`.
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

/// Parses a human duration such as `30s`, `5m`, `1h30m` (humantime); zero
/// is rejected. Only `chunk_pause` and `catch_up` accept a literal `"0"` or
/// `"0s"`, which `job_table.rs` reads before calling this.
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
