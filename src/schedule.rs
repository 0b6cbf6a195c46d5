//! Schedules and business periods: which instants a cron expression
//! ([`CronSchedule`]) fires at in a job's IANA time zone, and which business
//! period ([`Period`], a date or a local minute, per [`Covers`]) each firing
//! is about ([`period_of`]); also a date's bounds in UTC ([`day_bounds`]).
//! `docs/configuration.md` describes the keys and the DST rule for
//! operators.
//!
//! Invariants:
//!
//! - Everything here is pure: it takes instants and zones as arguments and
//!   never reads the process's clock, local time zone or `TZ`.
//! - The DST rule ([`local_instant`]): the cron expression is matched
//!   against local wall-clock times. A local time that does not exist (the
//!   clock jumps forward over it) fires once at the first valid instant after
//!   the gap; an ambiguous local time (the clock falls back over it) fires
//!   once, at its earlier occurrence.
//! - A daily schedule covers every existing local date once: its periods
//!   strictly increase and none is covered twice, even across a gap that
//!   swallows a whole local date (Pacific/Apia skipped 2011-12-30).
//! - A schedule that never fires is refused when it is parsed, never found
//!   out by a producer.
//!
//! The property tests at the end of this file (`proptest`) check over eight
//! zones, among them Lord Howe's half-hour shift and Apia's skipped day,
//! that business dates and [`local_instant`] are monotone, that an existing
//! local time maps to itself, and the daily schedule's invariant above;
//! `proptest-regressions/schedule.txt` keeps the cases they once shrank
//! (see `proptest-regressions/` in `docs/development.md`).

use std::str::FromStr;

use chrono::{
    DateTime, Datelike, Days, NaiveDate, NaiveDateTime, NaiveTime, TimeZone, Timelike, Utc,
};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

/// Most firings one job's catch-up window may hold (a 7-day window of a job
/// every minute is 10,080); config validation enforces it, and the producer
/// walks at most this many firings per job and tick.
pub const MAX_PERIODS_PER_TICK: usize = 20_000;

/// Which business period a firing is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Covers {
    /// The local date of the firing.
    SameDay,
    /// The local date before the firing (settlement at 01:00 covers yesterday).
    PreviousDay,
    /// The firing's own local minute, for periods finer than a day
    /// (`inventory-sync:2026-09-15T10:15`).
    Firing,
}

impl Covers {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "same-day" => Some(Self::SameDay),
            "previous-day" => Some(Self::PreviousDay),
            "firing" => Some(Self::Firing),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::SameDay => "same-day",
            Self::PreviousDay => "previous-day",
            Self::Firing => "firing",
        }
    }
}

/// A business period: a date, or a local minute of a date.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Period {
    pub date: NaiveDate,
    /// Set for `covers = "firing"`: the local time, to the minute.
    pub minute: Option<NaiveTime>,
}

impl Period {
    pub fn day(date: NaiveDate) -> Self {
        Self { date, minute: None }
    }

    /// The period half of a job key: `2026-09-15` or `2026-09-15T10:15`.
    pub fn key_part(&self) -> String {
        match self.minute {
            None => self.date.format("%Y-%m-%d").to_string(),
            Some(t) => format!("{}T{}", self.date.format("%Y-%m-%d"), t.format("%H:%M")),
        }
    }
}

/// One firing: the instant it happens and the local wall-clock time the
/// schedule named. They differ only inside a DST gap, where the firing moves
/// to the first valid instant after it; the business period follows the
/// scheduled time, so a gap that swallows a whole local date (Apia skipped
/// 2011-12-30) neither loses the period before it nor covers one twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Firing {
    pub at: DateTime<Utc>,
    pub scheduled: NaiveDateTime,
}

/// A parsed cron expression (five fields: minute hour day-of-month month
/// day-of-week), kept with its text.
#[derive(Debug, Clone)]
pub struct CronSchedule {
    text: String,
    cron: Cron,
}

impl PartialEq for CronSchedule {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl CronSchedule {
    /// Parses a standard five-field expression (minute, hour, day of month,
    /// month, day of week) with the `croner` crate; seconds and years are
    /// refused because periods are keyed to the minute. An expression that
    /// never fires is refused by name (`"0 1 31 2 *" never fires (there is no
    /// 31 February); name a day the month has, or L for its last day`, or,
    /// when the day-of-week field takes part, `no date matches its
    /// day-of-month, month and day-of-week fields together`), from
    /// [`first_firing_date`].
    pub fn parse(text: &str) -> Result<Self, String> {
        let fields = text.split_whitespace().count();
        if fields != 5 {
            return Err(format!(
                "invalid cron expression {text:?}: expected 5 fields (minute hour day-of-month month day-of-week), found {fields}"
            ));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build()
            .parse(text)
            .map_err(|e| format!("invalid cron expression {text:?}: {e}"))?;
        if first_firing_date(&cron).is_none() {
            return Err(never_fires(text, &cron));
        }
        Ok(Self {
            text: text.to_owned(),
            cron,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Every firing instant in `(after, upto]`, in order, at most `limit`;
    /// the second value says whether the limit cut the list. It walks the
    /// cron expression over local wall-clock times, from 26 hours before
    /// `after` to 26 hours after `upto` in local time, and maps each match
    /// with [`local_instant`]; several gap times that map to one instant are
    /// one firing.
    pub fn firings(
        &self,
        tz: Tz,
        after: DateTime<Utc>,
        upto: DateTime<Utc>,
        limit: usize,
    ) -> (Vec<Firing>, bool) {
        let mut out: Vec<Firing> = Vec::new();
        if upto <= after {
            return (out, false);
        }
        // Walk local wall-clock times from a little before `after` (a gap
        // can move a local time up to a few hours later), map each to its
        // instant, and keep those in the window.
        let start = after.with_timezone(&tz).naive_local() - chrono::Duration::hours(26);
        let end = upto.with_timezone(&tz).naive_local() + chrono::Duration::hours(26);
        let mut cursor: NaiveDateTime = start;
        while let Ok(next) = self.cron.find_next_occurrence(&cursor, false) {
            if next > end {
                break;
            }
            cursor = next;
            let instant = local_instant(next, tz);
            if instant <= after || instant > upto {
                continue;
            }
            // Several local times in one gap map to one instant: one firing.
            if out.last().map(|f| f.at) == Some(instant) {
                continue;
            }
            if out.len() == limit {
                return (out, true);
            }
            out.push(Firing {
                at: instant,
                scheduled: next,
            });
        }
        (out, false)
    }
}

/// The years the never-fires check walks. Without a year field, whether a
/// cron expression matches a date depends only on its month, day, weekday
/// and the month's length, so only on the kind of its year: the weekday of
/// 1 January, and leap or not. There are 14 kinds, and these 30 years, with
/// no century year among them, hold all of them (a test checks it), among
/// them every kind of 1970-2199, 2100 (not a leap year) included. So an
/// expression that never matches here never matches a business date, and
/// the walk is at most 30 × 366 days, whatever the expression.
const PROBE_YEARS: std::ops::RangeInclusive<i32> = 2026..=2055;

/// The first date in [`PROBE_YEARS`] on which `cron` fires, by croner's own
/// rules for the day fields (day-of-month OR day-of-week when both are
/// given, AND with a `+` day-of-week, `L`, `W`, `#`), asking croner's
/// `month_match` and `day_match`; a test checks that its first date agrees
/// with croner's `find_next_occurrence`. `0 0 29 2 +4`, 29 February on a
/// Thursday, fires first in 2052 and is accepted. croner's own search for a
/// next firing of a never-firing expression runs on to the year 5000, two
/// orders of magnitude slower than this walk of at most 30 × 366 days,
/// which is why it is not used for this.
fn first_firing_date(cron: &Cron) -> Option<NaiveDate> {
    let p = &cron.pattern;
    // A pattern that parsed has some hour and some minute; checked anyway,
    // because "fires" means a time of day too.
    let some_time = (0..24).any(|h| p.hour_match(h).unwrap_or(false))
        && (0..60).any(|m| p.minute_match(m).unwrap_or(false));
    if !some_time {
        return None;
    }
    let first = NaiveDate::from_ymd_opt(*PROBE_YEARS.start(), 1, 1)?;
    let last = NaiveDate::from_ymd_opt(*PROBE_YEARS.end(), 12, 31)?;
    first
        .iter_days()
        .take_while(|d| *d <= last)
        .filter(|d| p.month_match(d.month()).unwrap_or(false))
        .find(|d| {
            p.day_match(d.year(), d.month(), d.day(), weekday(*d))
                .unwrap_or(false)
        })
}

/// croner's weekday of a date.
fn weekday(d: NaiveDate) -> croner::Weekday {
    croner::Weekday::from_days_from_sunday(d.weekday().num_days_from_sunday())
}

/// Why an expression never fires, as specific as the fields allow.
fn never_fires(text: &str, cron: &Cron) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let p = &cron.pattern;
    let months: Vec<&str> = (1..=12u32)
        .filter(|m| p.month_match(*m).unwrap_or(false))
        .map(|m| MONTHS[m as usize - 1])
        .collect();
    // The days of month named, read off a month of 31 days (January 2026).
    let days: Vec<String> = (1..=31u32)
        .filter(|d| {
            NaiveDate::from_ymd_opt(2026, 1, *d)
                .and_then(|date| p.day_match(2026, 1, *d, weekday(date)).ok())
                .unwrap_or(false)
        })
        .map(|d| d.to_string())
        .collect();
    let dom_only = p.is_dow_wildcard() && !p.matches_dom_and_dow();
    let why = match (dom_only, months.as_slice(), days.as_slice()) {
        (true, [month], [day]) => format!("there is no {day} {month}"),
        (true, [], _) | (true, _, []) | (false, _, _) => {
            return format!(
                "{text:?} never fires: no date matches its day-of-month, month and day-of-week fields together; check them"
            )
        }
        (true, months, days) => format!(
            "{} {} no day {}",
            join(months, "and"),
            if months.len() == 1 { "has" } else { "have" },
            join(days, "or")
        ),
    };
    format!("{text:?} never fires ({why}); name a day the month has, or L for its last day")
}

/// `a`, `a and b`, `a, b and c`.
fn join<S: AsRef<str>>(items: &[S], word: &str) -> String {
    match items {
        [] => String::new(),
        [one] => one.as_ref().to_owned(),
        [rest @ .., last] => format!(
            "{} {word} {}",
            rest.iter()
                .map(|s| s.as_ref())
                .collect::<Vec<_>>()
                .join(", "),
            last.as_ref()
        ),
    }
}

impl FromStr for CronSchedule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s)
    }
}

/// The instant of a local wall-clock time: the first valid instant after a
/// DST gap, the earlier occurrence when ambiguous.
pub fn local_instant(local: NaiveDateTime, tz: Tz) -> DateTime<Utc> {
    if let Some(t) = tz.from_local_datetime(&local).earliest() {
        return t.with_timezone(&Utc);
    }
    // Inside a gap: the first valid minute after it. Gaps are whole minutes
    // in every zone of the tz database and at most a day (Pacific/Apia 2011).
    let mut probe = local.with_second(0).unwrap_or(local);
    for _ in 0..(25 * 60) {
        probe += chrono::Duration::minutes(1);
        if let Some(t) = tz.from_local_datetime(&probe).earliest() {
            // The gap ends at a whole minute: its first instant.
            return t.with_timezone(&Utc);
        }
    }
    Utc.from_utc_datetime(&local)
}

/// The local business date of an instant in a zone.
pub fn business_date(instant: DateTime<Utc>, tz: Tz) -> NaiveDate {
    instant.with_timezone(&tz).date_naive()
}

/// The business period a firing covers: daily periods follow the scheduled
/// local date, not the date of the instant; sub-daily ones the local minute
/// the firing happens at (so the times of one DST gap share the first valid
/// minute after it). Keyed by the instant's date, `1 0 * * *` under
/// `previous-day` would have settled Apia's 2011-12-30 twice and 2011-12-29
/// never; the property tests found this, and
/// `a_swallowed_local_date_neither_loses_nor_doubles_a_period` keeps it.
pub fn period_of(firing: &Firing, tz: Tz, covers: Covers) -> Period {
    let day = firing.scheduled.date();
    let local = firing.at.with_timezone(&tz);
    match covers {
        Covers::SameDay => Period::day(day),
        Covers::PreviousDay => Period::day(day.checked_sub_days(Days::new(1)).unwrap_or(day)),
        Covers::Firing => Period {
            date: local.date_naive(),
            minute: NaiveTime::from_hms_opt(local.hour(), local.minute(), 0),
        },
    }
}

/// The first instant of a local date (the first valid time where local
/// midnight falls in a gap).
pub fn start_of_day(date: NaiveDate, tz: Tz) -> DateTime<Utc> {
    local_instant(date.and_time(NaiveTime::MIN), tz)
}

/// `[start, end)` of a local date in UTC.
pub fn day_bounds(date: NaiveDate, tz: Tz) -> (DateTime<Utc>, DateTime<Utc>) {
    let next = date.checked_add_days(Days::new(1)).unwrap_or(date);
    (start_of_day(date, tz), start_of_day(next, tz))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono_tz::America::New_York;

    fn ats(f: &[Firing]) -> Vec<DateTime<Utc>> {
        f.iter().map(|f| f.at).collect()
    }

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn daily_firing_in_seoul_covers_yesterday() {
        let s = CronSchedule::parse("0 1 * * *").unwrap();
        let tz = chrono_tz::Asia::Seoul;
        let (f, cut) = s.firings(
            tz,
            utc("2026-09-14T00:00:00Z"),
            utc("2026-09-16T00:00:00Z"),
            10,
        );
        assert!(!cut);
        // 01:00 KST = 16:00 UTC the day before.
        assert_eq!(
            ats(&f),
            vec![utc("2026-09-14T16:00:00Z"), utc("2026-09-15T16:00:00Z")]
        );
        let p = period_of(&f[0], tz, Covers::PreviousDay);
        assert_eq!(p.key_part(), "2026-09-14");
        assert_eq!(
            period_of(&f[0], tz, Covers::SameDay).key_part(),
            "2026-09-15"
        );
    }

    #[test]
    fn a_missing_local_time_fires_once_after_the_gap() {
        // 2026-03-08 02:30 does not exist in New York (02:00 → 03:00 EDT).
        let s = CronSchedule::parse("30 2 * * *").unwrap();
        let (f, _) = s.firings(
            New_York,
            utc("2026-03-07T12:00:00Z"),
            utc("2026-03-09T12:00:00Z"),
            10,
        );
        assert_eq!(
            ats(&f),
            vec![utc("2026-03-08T07:00:00Z"), utc("2026-03-09T06:30:00Z")]
        );
        assert_eq!(
            f[0].at.with_timezone(&New_York).format("%H:%M").to_string(),
            "03:00"
        );
    }

    #[test]
    fn a_swallowed_local_date_neither_loses_nor_doubles_a_period() {
        // Apia skipped 2011-12-30 entirely (23:59:59 on the 29th was followed
        // by 00:00 on the 31st). Found by the property test below.
        let tz = chrono_tz::Pacific::Apia;
        let s = CronSchedule::parse("1 0 * * *").unwrap();
        let (f, _) = s.firings(
            tz,
            utc("2011-12-26T00:00:00Z"),
            utc("2012-01-03T00:00:00Z"),
            100,
        );
        let prev: Vec<String> = f
            .iter()
            .map(|x| period_of(x, tz, Covers::PreviousDay).key_part())
            .collect();
        let dedup: std::collections::BTreeSet<&String> = prev.iter().collect();
        assert_eq!(
            dedup.len(),
            prev.len(),
            "a period is covered twice: {prev:?}"
        );
        assert!(
            prev.contains(&"2011-12-29".to_owned()),
            "2011-12-29 is never settled: {prev:?}"
        );
        assert!(prev.contains(&"2011-12-31".to_owned()), "{prev:?}");
    }

    #[test]
    fn an_ambiguous_local_time_fires_once() {
        // 2026-11-01 01:30 happens twice in New York; it fires at the first.
        let s = CronSchedule::parse("30 1 * * *").unwrap();
        let (f, _) = s.firings(
            New_York,
            utc("2026-10-31T12:00:00Z"),
            utc("2026-11-01T12:00:00Z"),
            10,
        );
        assert_eq!(ats(&f), vec![utc("2026-11-01T05:30:00Z")]);
    }

    #[test]
    fn sub_daily_periods_are_local_minutes() {
        let s = CronSchedule::parse("*/15 * * * *").unwrap();
        let tz = chrono_tz::Asia::Seoul;
        let (f, _) = s.firings(
            tz,
            utc("2026-09-15T01:00:00Z"),
            utc("2026-09-15T02:00:00Z"),
            100,
        );
        assert_eq!(f.len(), 4);
        assert_eq!(
            period_of(&f[0], tz, Covers::Firing).key_part(),
            "2026-09-15T10:15"
        );
        // Every 15 minutes over the fall-back night: the repeated hour does
        // not fire again, and keys stay unique.
        let (f, _) = s.firings(
            New_York,
            utc("2026-11-01T04:00:00Z"),
            utc("2026-11-01T08:00:00Z"),
            100,
        );
        let keys: std::collections::BTreeSet<String> = f
            .iter()
            .map(|i| period_of(i, New_York, Covers::Firing).key_part())
            .collect();
        assert_eq!(keys.len(), f.len());
    }

    #[test]
    fn limits_are_reported() {
        let s = CronSchedule::parse("* * * * *").unwrap();
        let (f, cut) = s.firings(
            Tz::UTC,
            utc("2026-01-01T00:00:00Z"),
            utc("2026-01-02T00:00:00Z"),
            5,
        );
        assert_eq!(f.len(), 5);
        assert!(cut);
    }

    #[test]
    fn schedules_that_never_fire_are_refused_by_name() {
        for (text, why) in [
            ("0 1 31 2 *", "(there is no 31 February)"),
            ("0 0 30 2 *", "(there is no 30 February)"),
            ("0 0 31 4 *", "(there is no 31 April)"),
            ("0 0 31 FEB *", "(there is no 31 February)"),
            ("* * 31 2 ?", "(there is no 31 February)"),
            ("0 0 30,31 2 *", "(February has no day 30 or 31)"),
            (
                "0 0 31 4,6,9,11 *",
                "(April, June, September and November have no day 31)",
            ),
            ("0 0 31 2,4 *", "(February and April have no day 31)"),
            // croner's `W` keeps to the month: no weekday near 30 February.
            ("0 0 30W 2 *", "(there is no 30 February)"),
            // With `+`, croner requires the day of month AND the weekday.
            (
                "0 0 31 2 +1",
                "no date matches its day-of-month, month and day-of-week fields together",
            ),
            ("0 0 1 1 +1#5", "no date matches"),
        ] {
            let Err(e) = CronSchedule::parse(text) else {
                panic!("{text} was accepted");
            };
            assert!(e.starts_with(&format!("{text:?} never fires")), "{e}");
            assert!(e.contains(why), "{text}: {e}");
            assert!(!e.contains('\n'));
        }
    }

    #[test]
    fn rare_schedules_still_parse() {
        // (expression, its first firing date from 2026 on, as croner says)
        for (text, first) in [
            // Leap years only.
            ("0 0 29 2 *", "2028-02-29"),
            // Both day fields without `+`: croner ORs them, like cron, so
            // this is every Monday in February.
            ("0 0 31 2 1", "2026-02-02"),
            ("0 0 31 2 MON", "2026-02-02"),
            ("0 0 30 2 0", "2026-02-01"),
            // 29 February on a Thursday: once in 28 years (2052).
            ("0 0 29 2 +4", "2052-02-29"),
            ("0 0 29 2 +5", "2036-02-29"),
            // A fifth Monday in February: leap years starting on a Monday.
            ("0 0 * 2 1#5", "2044-02-29"),
            ("0 0 L 2 *", "2026-02-28"),
            ("0 0 31 * *", "2026-01-31"),
            ("0 0 1W 2 *", "2026-02-02"),
        ] {
            let s = CronSchedule::parse(text).unwrap_or_else(|e| panic!("{e}"));
            let walked = first_firing_date(&s.cron).unwrap();
            assert_eq!(walked.to_string(), first, "{text}");
            // The walk agrees with croner's own search.
            let start = NaiveDate::from_ymd_opt(2026, 1, 1)
                .unwrap()
                .and_time(NaiveTime::MIN);
            let next = s.cron.find_next_occurrence(&start, true).unwrap();
            assert_eq!(next.date(), walked, "{text}");
        }
        // The OR rule fires on every February Monday and on no other day.
        let s = CronSchedule::parse("0 0 31 2 1").unwrap();
        let (f, _) = s.firings(
            Tz::UTC,
            utc("2026-01-01T00:00:00Z"),
            utc("2027-01-01T00:00:00Z"),
            100,
        );
        let days: Vec<String> = f.iter().map(|f| f.at.date_naive().to_string()).collect();
        assert_eq!(
            days,
            ["2026-02-02", "2026-02-09", "2026-02-16", "2026-02-23"]
        );
    }

    #[test]
    fn the_probe_years_hold_every_kind_of_year_of_the_business_dates() {
        let kind = |y: i32| {
            let jan1 = NaiveDate::from_ymd_opt(y, 1, 1).unwrap().weekday();
            (jan1, NaiveDate::from_ymd_opt(y, 2, 29).is_some())
        };
        let probed: std::collections::HashSet<_> = PROBE_YEARS.map(kind).collect();
        assert_eq!(probed.len(), 14);
        let (min, max) = crate::key::date_range();
        for y in min.year()..=max.year() {
            assert!(probed.contains(&kind(y)), "{y}");
        }
    }

    #[test]
    fn bad_expressions() {
        for bad in [
            "",
            "0 1 * *",
            "0 0 1 * * *",
            "61 * * * *",
            "0 25 * * *",
            "x y z w v",
            "0 1 * * * 2026",
        ] {
            assert!(CronSchedule::parse(bad).is_err(), "{bad:?}");
        }
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    const ZONES: [Tz; 8] = [
        chrono_tz::Asia::Seoul,
        chrono_tz::America::New_York,
        chrono_tz::Europe::Berlin,
        chrono_tz::America::Sao_Paulo,
        chrono_tz::Australia::Lord_Howe,
        chrono_tz::Pacific::Apia,
        chrono_tz::Asia::Kolkata,
        chrono_tz::UTC,
    ];

    fn instant(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(secs, 0).expect("in range")
    }

    // 1970-01-01 .. 2100-01-01
    const LO: i64 = 0;
    const HI: i64 = 4_102_444_800;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn business_date_is_monotone(z in 0usize..8, a in LO..HI, d in 0i64..(3 * 86_400)) {
            let tz = ZONES[z];
            let (t1, t2) = (instant(a), instant(a + d));
            prop_assert!(business_date(t1, tz) <= business_date(t2, tz));
        }

        #[test]
        fn local_instant_is_monotone_and_lands_on_or_after(z in 0usize..8, a in LO..HI, d in 0i64..7200) {
            let tz = ZONES[z];
            let l1 = instant(a).with_timezone(&tz).naive_local();
            let l2 = l1 + chrono::Duration::seconds(d);
            let (i1, i2) = (local_instant(l1, tz), local_instant(l2, tz));
            prop_assert!(i1 <= i2);
            // An existing local time maps to itself.
            prop_assert_eq!(i1.with_timezone(&tz).naive_local(), l1);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn a_daily_schedule_fires_once_per_local_date(
            z in 0usize..8,
            start in LO..(HI - 40 * 86_400),
            hour in 0u32..24,
            minute in 0u32..60,
        ) {
            let tz = ZONES[z];
            let sched = CronSchedule::parse(&format!("{minute} {hour} * * *")).unwrap();
            let (after, upto) = (instant(start), instant(start + 30 * 86_400));
            let (firings, cut) = sched.firings(tz, after, upto, 1000);
            prop_assert!(!cut);
            // Strictly increasing instants and strictly increasing dates: at
            // most one firing per business date.
            for w in firings.windows(2) {
                prop_assert!(w[0].at < w[1].at);
                let (p0, p1) = (period_of(&w[0], tz, Covers::SameDay), period_of(&w[1], tz, Covers::SameDay));
                prop_assert!(p0 < p1, "two firings for {:?} in {}", p1, tz.name());
                // previous-day periods are as strictly increasing.
                prop_assert!(period_of(&w[0], tz, Covers::PreviousDay) < period_of(&w[1], tz, Covers::PreviousDay));
            }
            // And at least one for every whole local date inside the window
            // that exists (Apia skipped 2011-12-30 entirely).
            let dates: std::collections::BTreeSet<NaiveDate> =
                firings.iter().map(|f| period_of(f, tz, Covers::SameDay).date).collect();
            let first = business_date(after, tz).succ_opt().unwrap();
            let last = business_date(upto, tz).pred_opt().unwrap();
            for d in first.iter_days().take_while(|d| *d <= last) {
                let (s, e) = day_bounds(d, tz);
                if s < e && business_date(s, tz) == d {
                    prop_assert!(dates.contains(&d), "no firing on {} in {}", d, tz.name());
                }
            }
        }
    }
}
