//! What a job's stored schedule expects: the periods that were due, read
//! from the settings the database holds, never from a configuration file.
//! `batch_job_declared.settings` (written by `batchonce migrate`) comes
//! first; a job that is not declared falls back to the settings a producer
//! (or else any process) recorded in `batch_process_config`. A declaration
//! of a release that stored no `catch_up` or `enabled` takes them from the
//! recorded settings, else the engine's defaults (3 days, enabled).
//!
//! - `Expected::from_settings` reads one settings object; `Err` says why it
//!   cannot give periods (no schedule, disabled, a value this release cannot
//!   read).
//! - `Expected::due_periods(after, upto, limit)` lists the periods whose
//!   firing falls in `(after, upto]` the way the producer plans them
//!   (`schedule::period_of`, repeats dropped, inside `key::date_range`),
//!   each with its UTC start and, for a period the business calendar skips,
//!   why.
//! - `Window` is where MISSING periods can be: not before the job's first
//!   period (its earliest run, archived ones included), nor, for a job
//!   without runs, before it was declared; `horizon` is the producer's
//!   catch-up horizon (now − catch_up, 15 minutes for a zero one).
//!
//! Pure: the instants come from the caller, who reads the database clock.

use chrono::{DateTime, NaiveDate, Utc, Weekday};
use chrono_tz::Tz;

use crate::config::JobConfig;
use crate::schedule::{self, Covers, CronSchedule, Period};

/// Where a job's schedule was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SettingsSource {
    /// `batch_job_declared`, from `batchonce migrate`.
    Declared,
    /// `batch_process_config`, as a producer (or else a worker) recorded it.
    Recorded,
}

impl SettingsSource {
    pub fn describe(self) -> &'static str {
        match self {
            Self::Declared => "as `batchonce migrate` declared it",
            Self::Recorded => "as a producer (or else a worker) recorded it",
        }
    }
}

/// What a job's stored settings say about the periods it expects.
#[derive(Debug, Clone)]
pub struct Expected {
    pub schedule: CronSchedule,
    pub timezone: Tz,
    pub covers: Covers,
    pub skip_dates: Vec<NaiveDate>,
    pub skip_weekdays: Vec<Weekday>,
    /// The producer's catch-up window as it plans it (a zero one is the
    /// last 15 minutes).
    pub catch_up: chrono::Duration,
    pub source: SettingsSource,
}

/// One period a schedule made due.
#[derive(Debug, Clone)]
pub struct DuePeriod {
    pub period: Period,
    /// The period part of its key: `2026-09-15` or `2026-09-15T10:15`.
    pub key_part: String,
    /// When it was due: the firing that planned it.
    pub due_at: DateTime<Utc>,
    /// Its first instant (the run's `period_start`).
    pub start: DateTime<Utc>,
    /// Why the business calendar skips it, if it does.
    pub skip: Option<String>,
}

impl Expected {
    /// Reads stored settings; `Err` says why they give no periods.
    pub fn from_settings(
        settings: &serde_json::Value,
        source: SettingsSource,
    ) -> Result<Self, String> {
        let text = |k: &str| settings.get(k).and_then(|v| v.as_str());
        let Some(cron) = text("schedule") else {
            return Err("the job has no schedule: it runs only what is enqueued".into());
        };
        if settings.get("enabled").and_then(|v| v.as_bool()) == Some(false) {
            return Err("the job is disabled (enabled = false): no producer plans it".into());
        }
        let schedule = CronSchedule::parse(cron)?;
        let timezone: Tz = text("timezone")
            .unwrap_or("UTC")
            .parse()
            .map_err(|_| "the stored time zone is unknown".to_owned())?;
        let covers = Covers::parse(text("covers").unwrap_or("same-day"))
            .ok_or_else(|| "the stored period rule (covers) is unknown".to_owned())?;
        let catch_up = match text("catch_up") {
            Some(s) => humantime::parse_duration(s)
                .map_err(|_| "the stored catch_up is no duration".to_owned())?,
            None => JobConfig::default().catch_up,
        };
        let catch_up = chrono::Duration::from_std(catch_up)
            .map_err(|_| "the stored catch_up is too long".to_owned())?;
        // The producer's rule: a zero catch-up still takes the last 15
        // minutes (`producer::plan`).
        let catch_up = if catch_up.is_zero() {
            chrono::Duration::minutes(15)
        } else {
            catch_up
        };
        let list = |k: &str| -> Vec<String> {
            settings
                .get(k)
                .and_then(|v| v.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        let skip_dates = list("skip_dates")
            .iter()
            .filter_map(|d| NaiveDate::parse_from_str(d, "%Y-%m-%d").ok())
            .collect();
        let skip_weekdays = list("skip_weekdays")
            .iter()
            .filter_map(|d| d.parse::<Weekday>().ok())
            .collect();
        Ok(Self {
            schedule,
            timezone,
            covers,
            skip_dates,
            skip_weekdays,
            catch_up,
            source,
        })
    }

    /// Why the business calendar skips `date`, if it does.
    pub fn skip_reason(&self, date: NaiveDate) -> Option<String> {
        crate::config::calendar_skip_reason(date, &self.skip_dates, &self.skip_weekdays)
    }

    /// The producer's catch-up horizon at `now`: firings at or before it
    /// are no longer planned.
    /// How far back MISSING periods are counted for a job with runs, the
    /// calendar's default range too: 41 days of daily periods, one day of
    /// sub-daily ones, or the catch-up window when it is longer. Older gaps
    /// show on the calendar when an operator asks for an earlier range.
    pub fn lookback(&self) -> chrono::Duration {
        let days = if self.covers == crate::schedule::Covers::Firing {
            LOOKBACK_DAYS_SUB_DAILY
        } else {
            LOOKBACK_DAYS
        };
        chrono::Duration::days(days).max(self.catch_up)
    }

    pub fn horizon(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        now.checked_sub_signed(self.catch_up)
            .unwrap_or(DateTime::<Utc>::MIN_UTC)
    }

    /// The first instant of a period: the local day's start, or the
    /// firing's minute.
    pub fn start_of(&self, p: &Period) -> DateTime<Utc> {
        match p.minute {
            None => schedule::start_of_day(p.date, self.timezone),
            Some(m) => schedule::local_instant(p.date.and_time(m), self.timezone),
        }
    }

    /// The periods whose firing is in `(after, upto]`, oldest first, as the
    /// producer plans them; at most `limit` firings are walked, and the
    /// flag says whether that cut the list.
    pub fn due_periods(
        &self,
        after: DateTime<Utc>,
        upto: DateTime<Utc>,
        limit: usize,
    ) -> (Vec<DuePeriod>, bool) {
        let (first, last) = crate::key::instant_range();
        let after = after.max(first - chrono::Duration::microseconds(1));
        let upto = upto.min(last - chrono::Duration::nanoseconds(1));
        let (firings, cut) = self.schedule.firings(self.timezone, after, upto, limit);
        let (min, max) = crate::key::date_range();
        let mut out: Vec<DuePeriod> = Vec::with_capacity(firings.len());
        for f in firings {
            let period = schedule::period_of(&f, self.timezone, self.covers);
            if !(min..=max).contains(&period.date) || out.last().is_some_and(|p| p.period == period)
            {
                continue;
            }
            out.push(DuePeriod {
                key_part: period.key_part(),
                due_at: f.at,
                start: self.start_of(&period),
                skip: self.skip_reason(period.date),
                period,
            });
        }
        (out, cut)
    }

    /// An instant in the job's business time zone, to the minute, with the
    /// zone's abbreviation: `2026-09-17 01:00 KST`.
    pub fn local(&self, t: DateTime<Utc>) -> String {
        t.with_timezone(&self.timezone)
            .format("%Y-%m-%d %H:%M %Z")
            .to_string()
    }
}

/// The job's first period: the business date of its earliest run (archived
/// runs count) and, for a sub-daily job, the earliest period start on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct FirstPeriod {
    pub date: NaiveDate,
    pub start: Option<DateTime<Utc>>,
}

/// Where MISSING periods can be, at one instant of the database clock.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Window {
    pub now: DateTime<Utc>,
    /// The first period of the job, if it has any run.
    pub first: Option<FirstPeriod>,
    /// For a job without any run: since when it is declared.
    pub known_since: Option<DateTime<Utc>>,
}

/// Days of daily periods [`Expected::lookback`] covers.
pub const LOOKBACK_DAYS: i64 = 41;
/// Days of sub-daily periods [`Expected::lookback`] covers.
pub const LOOKBACK_DAYS_SUB_DAILY: i64 = 1;

impl Window {
    /// Since when a period due without a run is MISSING: for a job with
    /// runs, its first period or the lookback, whichever is later; for one
    /// without, the later of its declaration and its catch-up horizon (a
    /// newly declared job is not behind by a year).
    pub fn missing_since(&self, e: &Expected) -> DateTime<Utc> {
        let horizon = e.horizon(self.now);
        match (&self.first, self.known_since) {
            (Some(f), _) => {
                let start = f
                    .start
                    .unwrap_or_else(|| crate::schedule::start_of_day(f.date, e.timezone));
                let back = self
                    .now
                    .checked_sub_signed(e.lookback())
                    .unwrap_or(DateTime::<Utc>::MIN_UTC);
                // A day before the first period's start, so that its own
                // firing (for `previous-day`, the next morning) is taken.
                start
                    .checked_sub_signed(chrono::Duration::days(1))
                    .unwrap_or(start)
                    .max(back)
            }
            (None, Some(k)) => horizon.max(k),
            (None, None) => horizon,
        }
    }

    /// Whether the period `p`, due at `due_at`, comes before the job
    /// existed: before its first period, or, for a job without runs, due
    /// before it was declared.
    pub fn before_first(&self, p: &DuePeriod) -> bool {
        match &self.first {
            Some(f) => {
                p.period.date < f.date
                    || (p.period.date == f.date
                        && p.period.minute.is_some()
                        && f.start.is_some_and(|s| p.start < s))
            }
            None => self.known_since.is_some_and(|k| p.due_at <= k),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(cron: &str, covers: &str) -> serde_json::Value {
        serde_json::json!({
            "schedule": cron, "timezone": "Asia/Seoul", "covers": covers,
            "skip_dates": ["2026-09-16"], "skip_weekdays": ["Sun"], "catch_up": "2days",
        })
    }

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn due_periods_follow_the_producer_and_name_the_calendar_skips() {
        let e = Expected::from_settings(
            &settings("0 1 * * *", "previous-day"),
            SettingsSource::Declared,
        )
        .unwrap();
        assert_eq!(e.catch_up, chrono::Duration::days(2));
        let now = utc("2026-09-19T00:00:00Z");
        let (due, cut) = e.due_periods(e.horizon(now), now, 100);
        assert!(!cut);
        let got: Vec<(&str, bool)> = due
            .iter()
            .map(|p| (p.key_part.as_str(), p.skip.is_some()))
            .collect();
        // 01:00 Seoul on the 18th and 19th (16:00 UTC the day before)
        // cover the 17th and 18th.
        assert_eq!(got, [("2026-09-17", false), ("2026-09-18", false)]);
        assert_eq!(due[0].due_at, utc("2026-09-17T16:00:00Z"));
        assert_eq!(due[0].start, utc("2026-09-16T15:00:00Z"));
        assert_eq!(e.local(due[0].due_at), "2026-09-18 01:00 KST");
        let (due, _) = e.due_periods(utc("2026-09-14T00:00:00Z"), now, 100);
        assert_eq!(due[2].key_part, "2026-09-16");
        assert!(due[2].skip.as_deref().unwrap().contains("skip_dates"));
    }

    #[test]
    fn a_window_starts_at_the_first_period() {
        let e = Expected::from_settings(
            &settings("*/15 * * * *", "firing"),
            SettingsSource::Recorded,
        )
        .unwrap();
        let now = utc("2026-09-15T02:00:00Z"); // 11:00 in Seoul
        let (due, _) = e.due_periods(utc("2026-09-15T00:00:00Z"), now, 100);
        let w = Window {
            now,
            first: Some(FirstPeriod {
                date: NaiveDate::from_ymd_opt(2026, 9, 15).unwrap(),
                start: Some(utc("2026-09-15T01:15:00Z")),
            }),
            known_since: None,
        };
        let kept: Vec<&str> = due
            .iter()
            .filter(|p| !w.before_first(p))
            .map(|p| p.key_part.as_str())
            .collect();
        assert_eq!(kept.first(), Some(&"2026-09-15T10:15"));
        assert_eq!(kept.last(), Some(&"2026-09-15T11:00"));
        let disabled = serde_json::json!({ "schedule": "0 1 * * *", "enabled": false });
        assert!(Expected::from_settings(&disabled, SettingsSource::Declared)
            .unwrap_err()
            .contains("disabled"));
        let zero = serde_json::json!({ "schedule": "0 1 * * *", "catch_up": "0s" });
        let z = Expected::from_settings(&zero, SettingsSource::Declared).unwrap();
        assert_eq!(z.catch_up, chrono::Duration::minutes(15));
    }
}
