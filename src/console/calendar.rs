//! A job's calendar: one cell per business period over a range, coloured by
//! the state of its run, including the periods the schedule expected that
//! have no run at all (MISSING) and those the business calendar skips. The
//! schedule, time zone, period rule and calendar are the ones a producer
//! recorded in the database (`batch_process_config`), never the console's
//! own file, so every console shows the same calendar.

use std::collections::BTreeMap;

use chrono::{DateTime, Days, NaiveDate, Utc, Weekday};
use chrono_tz::Tz;

use crate::queue::RunView;
use crate::schedule::{self, Covers, CronSchedule};

/// At most this many cells on one page; a longer range is cut, saying so.
pub const MAX_CELLS: usize = 1_500;

/// What the calendar knows of a job's schedule, from a producer's record.
#[derive(Debug, Clone)]
pub struct Expected {
    pub schedule: CronSchedule,
    pub timezone: Tz,
    pub covers: Covers,
    pub skip_dates: Vec<NaiveDate>,
    pub skip_weekdays: Vec<Weekday>,
}

impl Expected {
    /// Reads the recorded settings; `Err` says why they cannot give the
    /// expected periods (no schedule, or a value this release cannot read).
    pub fn from_settings(settings: &serde_json::Value) -> Result<Self, String> {
        let text = |k: &str| settings.get(k).and_then(|v| v.as_str());
        let Some(cron) = text("schedule") else {
            return Err("the job has no schedule: it runs only what is enqueued".into());
        };
        let schedule = CronSchedule::parse(cron)?;
        let timezone: Tz = text("timezone")
            .unwrap_or("UTC")
            .parse()
            .map_err(|_| "the recorded time zone is unknown".to_owned())?;
        let covers = Covers::parse(text("covers").unwrap_or("same-day"))
            .ok_or_else(|| "the recorded period rule (covers) is unknown".to_owned())?;
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
        })
    }

    fn skip_reason(&self, date: NaiveDate) -> Option<String> {
        crate::config::calendar_skip_reason(date, &self.skip_dates, &self.skip_weekdays)
    }
}

/// One business period of the calendar.
#[derive(Debug, Clone)]
pub struct Cell {
    /// The period part of the key: `2026-09-15` or `2026-09-15T10:15`.
    pub period: String,
    /// The run's state; `MISSING` for an expected period without a run,
    /// `SKIPPED` for one the calendar skips (with or without a run).
    pub state: String,
    pub run: Option<RunView>,
    /// Why the period has no run, or the run's error or skip reason.
    pub note: Option<String>,
}

/// The calendar of `[from, to]`: every run in `runs`, and every period
/// `expected` says was due by `now` and has none. `cut` is set when there
/// were more cells than [`MAX_CELLS`].
pub fn cells(
    job: &str,
    from: NaiveDate,
    to: NaiveDate,
    runs: Vec<RunView>,
    expected: Option<&Expected>,
    now: DateTime<Utc>,
) -> (Vec<Cell>, bool) {
    let mut out: BTreeMap<String, Cell> = BTreeMap::new();
    let prefix = format!("{job}:");
    for run in runs {
        let period = run
            .job_key
            .strip_prefix(&prefix)
            .unwrap_or(&run.job_key)
            .to_owned();
        let note = run.error_message.clone();
        out.insert(
            period.clone(),
            Cell {
                period,
                state: run.status.clone(),
                run: Some(run),
                note,
            },
        );
    }
    let mut cut = false;
    if let Some(e) = expected {
        // Firings from two days before the range to two days after it: a
        // firing covers its own date, the date before, or its own minute.
        let after = schedule::start_of_day(
            from.checked_sub_days(Days::new(2)).unwrap_or(from),
            e.timezone,
        );
        let upto =
            schedule::start_of_day(to.checked_add_days(Days::new(2)).unwrap_or(to), e.timezone)
                .min(now);
        let (firings, limited) = e.schedule.firings(e.timezone, after, upto, MAX_CELLS * 2);
        cut |= limited;
        for f in firings {
            let p = schedule::period_of(&f, e.timezone, e.covers);
            if p.date < from || p.date > to {
                continue;
            }
            let period = p.key_part();
            if out.contains_key(&period) {
                continue;
            }
            let (state, note) = match e.skip_reason(p.date) {
                Some(reason) => ("SKIPPED", format!("{reason}; no run recorded")),
                None => (
                    "MISSING",
                    format!("due at {} and no run exists", super::html::at(f.at)),
                ),
            };
            out.insert(
                period.clone(),
                Cell {
                    period,
                    state: state.into(),
                    run: None,
                    note: Some(note),
                },
            );
        }
    }
    let mut cells: Vec<Cell> = out.into_values().collect();
    if cells.len() > MAX_CELLS {
        cells.truncate(MAX_CELLS);
        cut = true;
    }
    (cells, cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(cron: &str, covers: &str) -> serde_json::Value {
        serde_json::json!({
            "schedule": cron, "timezone": "Asia/Seoul", "covers": covers,
            "skip_dates": ["2026-09-16"], "skip_weekdays": ["Sun"],
        })
    }

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn d(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    #[test]
    fn daily_periods_without_runs_are_missing_or_skipped_by_the_calendar() {
        let e = Expected::from_settings(&settings("0 1 * * *", "previous-day")).unwrap();
        // 2026-09-19 01:00 Seoul has fired (covering the 18th); the 19th's
        // period is not due yet.
        let now = utc("2026-09-19T00:00:00Z");
        let (cells, cut) = cells(
            "settle",
            d("2026-09-14"),
            d("2026-09-20"),
            vec![],
            Some(&e),
            now,
        );
        assert!(!cut);
        let got: Vec<(String, String)> = cells
            .iter()
            .map(|c| (c.period.clone(), c.state.clone()))
            .collect();
        assert_eq!(
            got,
            [
                ("2026-09-14", "MISSING"),
                ("2026-09-15", "MISSING"),
                ("2026-09-16", "SKIPPED"),
                ("2026-09-17", "MISSING"),
                ("2026-09-18", "MISSING"),
            ]
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
        );
        // 2026-09-20 is a Sunday, but not due yet: not shown at all.
        assert!(cells[2].note.as_deref().unwrap().contains("skip_dates"));
    }

    #[test]
    fn quarter_hours_are_cells_and_bad_settings_say_why() {
        let e = Expected::from_settings(&settings("*/15 * * * *", "firing")).unwrap();
        let now = utc("2026-09-15T01:00:00Z"); // 10:00 in Seoul
        let (cells, _) = cells(
            "sync",
            d("2026-09-15"),
            d("2026-09-15"),
            vec![],
            Some(&e),
            now,
        );
        assert_eq!(cells.len(), 41, "00:00 to 10:00 in quarter hours");
        assert_eq!(cells[0].period, "2026-09-15T00:00");
        assert_eq!(cells[40].period, "2026-09-15T10:00");
        let none = serde_json::json!({ "schedule": null });
        assert!(Expected::from_settings(&none)
            .unwrap_err()
            .contains("no schedule"));
        let bad = serde_json::json!({ "schedule": "0 1 * * *", "timezone": "Mars/Base" });
        assert!(Expected::from_settings(&bad)
            .unwrap_err()
            .contains("time zone"));
    }
}
