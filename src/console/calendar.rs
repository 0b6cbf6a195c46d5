//! A job's calendar (`/jobs/JOB`): one cell per business period over a
//! range, coloured by the state of its run (a scoped period by its worst
//! scope), the periods the stored schedule made due that have no run at
//! all (MISSING, each with why, written under the grid), and those the
//! business calendar skips. The schedule is the one `queue::job_schedule`
//! reads (declared, else recorded by a producer), never the console's own
//! file, so the calendar, the overview and `status` agree.
//!
//! - Periods are shown in the job's business time zone, each with its UTC
//!   start in its `title`; daily periods in a week grid (Monday to Sunday),
//!   sub-daily ones under their local date.
//! - Nothing is MISSING before the job's first period (its earliest run,
//!   archived ones included); the default range starts at the later of that
//!   and the catch-up horizon, at most 41 days back (one day for sub-daily
//!   periods). An earlier range asked for shows older gaps too, saying that
//!   the producer no longer enqueues them.
//! - A period without a run in the range read is MISSING only once the
//!   queue finds no run of it by key, scoped or archived; one it finds is
//!   shown as ARCHIVED.
//! - An operator gets a checkbox on each MISSING cell, in one form posting
//!   the selected periods to `/jobs/JOB/enqueue/preview`.
//! - Above the grid, the newest runs as a chart (`chart.rs`).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use chrono::{DateTime, Datelike, Days, NaiveDate, Utc};
use maud::{html, Markup};

use super::chart::{self, Size};
use super::html::{self, badge, encode, run_href};
use super::run_query::opt;
use super::{db_error, refuse, App, Authed};
use crate::clock::Clock;
use crate::key::{JobKey, JobName};
use crate::queue::{
    self, DuePeriod, Expected, JobSchedule, RunFilter, RunStatus, RunView, Window, RECENT_RUNS,
};
use crate::schedule::{self, Covers};

/// At most this many cells on one page; a longer range is cut, saying so.
pub const MAX_CELLS: usize = 1_500;

/// How far back the default range goes, daily and sub-daily periods: as
/// far as MISSING periods are counted (`Expected::lookback`).
const DAYS_BACK: u64 = crate::queue::LOOKBACK_DAYS as u64;
const DAYS_BACK_SUB_DAILY: u64 = crate::queue::LOOKBACK_DAYS_SUB_DAILY as u64;

/// One business period of the calendar.
#[derive(Debug, Clone)]
pub struct Cell {
    /// The period part of the key: `2026-09-15` or `2026-09-15T10:15`.
    pub period: String,
    pub date: NaiveDate,
    /// Its first instant in UTC, when known.
    pub start: Option<DateTime<Utc>>,
    /// The run's state (a scoped period's worst scope's); `MISSING` for a
    /// due period without any run, `SKIPPED` for one the calendar skips,
    /// `ARCHIVED` for one whose run is not among the live runs read.
    pub state: CellState,
    /// Where the cell leads: its run, or a scoped period's run list.
    pub href: Option<String>,
    /// Why the period has no run, or the run's error, or its scopes.
    pub note: Option<String>,
}

/// A calendar cell's state: a run's, or one no run has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellState {
    Run(RunStatus),
    /// A due period without any run.
    Missing,
    /// A period whose run is not among the live runs read.
    Archived,
}

impl CellState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Run(s) => s.as_str(),
            Self::Missing => "MISSING",
            Self::Archived => "ARCHIVED",
        }
    }
}

impl std::fmt::Display for CellState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// The states a scoped period's cell takes, worst first.
const WORST_FIRST: [RunStatus; 5] = [
    RunStatus::Failed,
    RunStatus::Running,
    RunStatus::Pending,
    RunStatus::Succeeded,
    RunStatus::Skipped,
];

/// The cells of the runs in `[from, to]`, one per period, and the periods
/// `expected` made due by `window.now` that have none: skipped ones as
/// cells, the others returned to be probed. `cut` is set when the schedule
/// gave more firings than the page shows.
pub fn plan(
    job: &str,
    from: NaiveDate,
    to: NaiveDate,
    runs: Vec<RunView>,
    expected: Option<&Expected>,
    window: &Window,
) -> (BTreeMap<String, Cell>, Vec<DuePeriod>, bool) {
    let mut by_period: BTreeMap<String, Vec<RunView>> = BTreeMap::new();
    for run in runs {
        let period = JobKey::parse(&run.job_key)
            .map(|k| k.period().to_owned())
            .unwrap_or_else(|_| run.job_key.clone());
        by_period.entry(period).or_default().push(run);
    }
    let mut out: BTreeMap<String, Cell> = BTreeMap::new();
    for (period, runs) in by_period {
        let start = runs
            .iter()
            .find_map(|r| r.context.as_ref().map(|c| c.period_start));
        let date = runs.first().map_or(from, |r| r.business_date);
        let cell = match runs.as_slice() {
            [one] if one.scope.is_none() => Cell {
                period: period.clone(),
                date,
                start,
                state: CellState::Run(one.status),
                href: Some(run_href(&one.job_key)),
                note: one.error_message.clone(),
            },
            many => {
                let state = WORST_FIRST
                    .iter()
                    .find(|s| many.iter().any(|r| r.status == **s))
                    .copied()
                    .unwrap_or(RunStatus::Pending);
                let per: Vec<String> = WORST_FIRST
                    .iter()
                    .filter_map(|s| {
                        let n = many.iter().filter(|r| r.status == *s).count();
                        (n > 0).then(|| format!("{n} {s}"))
                    })
                    .collect();
                Cell {
                    period: period.clone(),
                    date,
                    start,
                    state: CellState::Run(state),
                    href: Some(format!(
                        "/runs?job={}&from={date}&to={date}&key={}",
                        encode(job),
                        encode(&format!("{job}:{period}"))
                    )),
                    note: Some(format!("{} scopes: {}", many.len(), per.join(", "))),
                }
            }
        };
        out.insert(period, cell);
    }
    let mut due = Vec::new();
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
                .min(window.now);
        let (periods, limited) = e.due_periods(after, upto, MAX_CELLS * 2);
        cut |= limited;
        for p in periods {
            if p.period.date < from
                || p.period.date > to
                || out.contains_key(&p.key_part)
                || window.before_first(&p)
            {
                continue;
            }
            match &p.skip {
                Some(reason) => {
                    out.insert(
                        p.key_part.clone(),
                        Cell {
                            period: p.key_part.clone(),
                            date: p.period.date,
                            start: Some(p.start),
                            state: CellState::Run(RunStatus::Skipped),
                            href: None,
                            note: Some(format!("{reason}; no run recorded")),
                        },
                    );
                }
                None => due.push(p),
            }
        }
    }
    (out, due, cut)
}

/// Adds the probed periods: MISSING where `without_runs` names them (with
/// why), ARCHIVED where a run exists that the page did not read.
pub fn resolve(
    cells: &mut BTreeMap<String, Cell>,
    due: Vec<DuePeriod>,
    without_runs: &HashSet<String>,
    expected: &Expected,
    sched: &JobSchedule,
) {
    for p in due {
        let missing = without_runs.contains(&p.key_part);
        let note = if missing {
            queue::why_missing(
                expected,
                &p,
                sched.window.now,
                sched.job_producers,
                &sched.producers,
            )
        } else {
            "a run of this period exists outside the live runs shown here: it is archived (`batchonce runs show`)".to_owned()
        };
        cells.insert(
            p.key_part.clone(),
            Cell {
                period: p.key_part.clone(),
                date: p.period.date,
                start: Some(p.start),
                state: if missing {
                    CellState::Missing
                } else {
                    CellState::Archived
                },
                href: None,
                note: Some(note),
            },
        );
    }
}

#[derive(serde::Deserialize, Default)]
pub(crate) struct CalendarQuery {
    from: Option<String>,
    to: Option<String>,
}

/// The default range's first date: the later of the job's first period and
/// its catch-up horizon, at most `back` days before `today`.
fn default_from(
    today: NaiveDate,
    back: u64,
    sched: &JobSchedule,
    e: Option<&Expected>,
) -> NaiveDate {
    let earliest = today.checked_sub_days(Days::new(back)).unwrap_or(today);
    let tz = e.map_or(chrono_tz::UTC, |e| e.timezone);
    let first = sched.window.first.map(|f| f.date).or_else(|| {
        sched
            .window
            .known_since
            .map(|k| schedule::business_date(k, tz))
    });
    // The catch-up horizon matters only for a job without runs, as for
    // its MISSING count (`Window::missing_since`).
    let horizon = e
        .filter(|_| sched.window.first.is_none())
        .map(|e| schedule::business_date(e.horizon(sched.window.now), tz));
    [Some(earliest), first, horizon]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(earliest)
        .min(today)
}

/// A job's business periods over a range, with the missing ones.
pub(crate) async fn calendar(
    State(app): State<Arc<App>>,
    Extension(a): Extension<Authed>,
    Path(job): Path<String>,
    Query(q): Query<CalendarQuery>,
) -> Response {
    let job = match JobName::parse(&job) {
        Ok(j) => j,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let sched = match queue::job_schedule(&app.pool, &job, Clock::Db).await {
        Ok(s) => s,
        Err(e) => return db_error(e),
    };
    let expected = sched.expected.as_ref().ok();
    let tz = expected.map_or(chrono_tz::UTC, |e| e.timezone);
    let sub_daily = expected.is_some_and(|e| e.covers == Covers::Firing);
    // The database's today, in the job's zone: the default range ends there.
    let today = sched.window.now.with_timezone(&tz).date_naive();
    let parse = |s: Option<&str>| s.map(crate::key::parse_date).transpose();
    let (from, to) = match (parse(opt(&q.from)), parse(opt(&q.to))) {
        (Ok(f), Ok(t)) => {
            let to = t.unwrap_or(today);
            let back = if sub_daily {
                DAYS_BACK_SUB_DAILY
            } else {
                DAYS_BACK
            };
            (
                f.unwrap_or_else(|| default_from(to.min(today), back, &sched, expected)),
                to,
            )
        }
        (Err(e), _) | (_, Err(e)) => return refuse(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    if from > to {
        return refuse(StatusCode::BAD_REQUEST, "the range ends before it starts");
    }
    let filter = RunFilter {
        job: Some(job.clone()),
        from: Some(from),
        to: Some(to),
        ..RunFilter::default()
    };
    let runs = match queue::search_runs(&app.pool, &filter, None, MAX_CELLS as u32 + 1).await {
        Ok(r) => r,
        Err(e) => return db_error(e),
    };
    let (mut cells, due, mut cut) = plan(job.as_str(), from, to, runs, expected, &sched.window);
    if let Some(e) = expected {
        let probe: Vec<&DuePeriod> = due.iter().collect();
        let without = match queue::periods_without_runs(&app.pool, &job, &probe).await {
            Ok(w) => w,
            Err(e) => return db_error(e),
        };
        resolve(&mut cells, due, &without, e, &sched);
    }
    let mut cells: Vec<Cell> = cells.into_values().collect();
    if cells.len() > MAX_CELLS {
        cells.truncate(MAX_CELLS);
        cut = true;
    }
    let recent =
        match queue::recent_runs(&app.pool, &[job.to_string()], RECENT_RUNS, Clock::Db).await {
            Ok(mut r) => r.remove(job.as_str()).unwrap_or_default(),
            Err(e) => return db_error(e),
        };
    let paused = match queue::paused_jobs(&app.pool, Clock::Db).await {
        Ok(p) => p.into_iter().find(|p| p.job == job.as_str()),
        Err(e) => return db_error(e),
    };
    let controls = super::job_actions::pause_controls(job.as_str(), paused.as_ref(), &a.session);
    let body = page_body(&a, &job, from, to, &cells, cut, &sched, &recent, controls);
    html::page(&format!("Calendar of {}", job.as_str()), &a.session, body).into_response()
}

/// Everything under the header of the calendar page.
#[allow(clippy::too_many_arguments)]
fn page_body(
    a: &Authed,
    job: &JobName,
    from: NaiveDate,
    to: NaiveDate,
    cells: &[Cell],
    cut: bool,
    sched: &JobSchedule,
    recent: &[queue::RecentRun],
    controls: Markup,
) -> Markup {
    let expected = sched.expected.as_ref().ok();
    let tz = expected.map_or(chrono_tz::UTC, |e| e.timezone);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for c in cells {
        *counts.entry(c.state.as_str()).or_default() += 1;
    }
    let missing: Vec<&Cell> = cells
        .iter()
        .filter(|c| c.state == CellState::Missing)
        .collect();
    let skipped: Vec<&Cell> = cells
        .iter()
        .filter(|c| c.state == CellState::Run(RunStatus::Skipped))
        .collect();
    // Only an operator may ask to enqueue what is missing.
    let select = html::may_act(a.session.user.role) && !missing.is_empty();
    let grid = html! {
        @if expected.is_some_and(|e| e.covers == Covers::Firing) {
            (by_date(cells, select))
        } @else {
            (weeks(from, to, cells, select))
        }
    };
    html! {
        h1 { "Calendar of " (job.as_str()) }
        (controls)
        form.filter method="get" action={ "/jobs/" (encode(job.as_str())) } {
            label { "From" input type="date" name="from" value=(from.to_string()); }
            label { "To" input type="date" name="to" value=(to.to_string()); }
            button type="submit" { "Show" }
        }
        @match &sched.expected {
            Ok(e) => p.muted {
                "Schedule " code { (e.schedule.as_str()) } " in " (e.timezone.name())
                ", covers " (e.covers.as_str()) ", catch-up " (humantime::format_duration(e.catch_up.to_std().unwrap_or_default()))
                ", " (e.source.describe()) ". Periods are shown in " (e.timezone.name())
                @if e.timezone != chrono_tz::UTC { " (hover for UTC)" } ", up to now."
                @if let Some(f) = &sched.window.first { " The job's first period is on " (f.date) "." }
                " The catch-up horizon is " (e.local(e.horizon(sched.window.now))) "."
            },
            Err(why) => (html::message("note", &format!("Missing periods cannot be shown: {why}. Only the runs that exist are shown."))),
        }
        @if !recent.is_empty() {
            h2 { "Newest runs" }
            (chart::runs_chart(job.as_str(), recent, Size::Large))
        }
        @if cut { (html::message("note", &format!("Only the first {MAX_CELLS} periods are shown; narrow the range."))) }
        p { @for (state, n) in &counts { (badge(state)) " " (n) "  " } }
        @if select {
            form method="post" action={ "/jobs/" (encode(job.as_str())) "/enqueue/preview" } {
                input type="hidden" name="csrf" value=(a.session.csrf);
                (grid)
                p { button type="submit" { "Preview enqueue of the selected periods" } }
            }
        } @else {
            (grid)
        }
        @if cells.is_empty() { p.muted { "No period in this range." } }
        @if !missing.is_empty() {
            h2 { "Missing periods" }
            table {
                tr { th scope="col" { "Period (" (tz.name()) ")" } th scope="col" { "Starts (UTC)" } th scope="col" { "Why" } }
                @for c in &missing {
                    tr { td { (c.period) } td { (utc(c.start)) } td { (c.note.as_deref().unwrap_or("—")) } }
                }
            }
        }
        @if !skipped.is_empty() {
            h2 { "Skipped periods" }
            table {
                tr { th scope="col" { "Period" } th scope="col" { "Why" } }
                @for c in &skipped { tr { td { (c.period) } td { (c.note.as_deref().unwrap_or("—")) } } }
            }
        }
    }
}

fn utc(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(
        || "—".into(),
        |t| t.format("%Y-%m-%d %H:%M UTC").to_string(),
    )
}

/// One cell: its period and state, its UTC start and note on hover, and,
/// when `select`, a checkbox on a MISSING one.
fn cell(c: &Cell, select: bool) -> Markup {
    let mut title = format!("starts {}", utc(c.start));
    if let Some(n) = &c.note {
        title.push_str(" · ");
        title.push_str(n);
    }
    html! {
        @match &c.href {
            Some(href) => a class={ "cell " (c.state) } href=(href) title=(title) { (c.period) br; (c.state) },
            None => span class={ "cell " (c.state) } title=(title) { (c.period) br; (c.state) },
        }
        @if select && c.state == CellState::Missing {
            label.pick { input type="checkbox" name="period" value=(c.period); " enqueue" }
        }
    }
}

/// Daily periods in weeks, Monday to Sunday; a date of the range without a
/// period says so, dates outside it are blank.
fn weeks(from: NaiveDate, to: NaiveDate, cells: &[Cell], select: bool) -> Markup {
    let by_date: BTreeMap<NaiveDate, &Cell> = cells.iter().map(|c| (c.date, c)).collect();
    let monday = from
        .checked_sub_days(Days::new(u64::from(from.weekday().num_days_from_monday())))
        .unwrap_or(from);
    let mut rows: Vec<Vec<NaiveDate>> = Vec::new();
    let mut day = monday;
    while day <= to && rows.len() < MAX_CELLS / 7 + 2 {
        rows.push(day.iter_days().take(7).collect());
        day = match day.checked_add_days(Days::new(7)) {
            Some(d) => d,
            None => break,
        };
    }
    html! {
        table.weeks {
            tr { @for d in ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"] { th scope="col" { (d) } } }
            @for week in &rows {
                tr {
                    @for d in week {
                        @if *d < from || *d > to {
                            td.out {}
                        } @else if let Some(c) = by_date.get(d) {
                            td { (cell(c, select)) }
                        } @else {
                            td.none { (d.to_string()) br; "no period" }
                        }
                    }
                }
            }
        }
    }
}

/// Sub-daily periods under their local date.
fn by_date(cells: &[Cell], select: bool) -> Markup {
    let mut dates: BTreeMap<NaiveDate, Vec<&Cell>> = BTreeMap::new();
    for c in cells {
        dates.entry(c.date).or_default().push(c);
    }
    html! {
        @for (d, cs) in &dates {
            h2 { (d.to_string()) " (" (d.weekday().to_string()) ")" }
            div.cal { @for c in cs { div { (cell(c, select)) } } }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::{FirstPeriod, SettingsSource};

    fn settings(cron: &str, covers: &str) -> serde_json::Value {
        serde_json::json!({
            "schedule": cron, "timezone": "Asia/Seoul", "covers": covers,
            "skip_dates": ["2026-09-16"], "skip_weekdays": ["Sun"], "catch_up": "3d",
        })
    }

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn d(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    fn window(now: &str, first: Option<&str>) -> Window {
        Window {
            now: utc(now),
            first: first.map(|f| FirstPeriod {
                date: d(f),
                start: None,
            }),
            known_since: None,
        }
    }

    #[test]
    fn daily_periods_without_runs_are_probed_or_skipped_by_the_calendar() {
        let e = Expected::from_settings(
            &settings("0 1 * * *", "previous-day"),
            SettingsSource::Declared,
        )
        .unwrap();
        // 2026-09-19 01:00 Seoul has fired (covering the 18th); the 19th's
        // period is not due yet. The job's first period is the 14th.
        let w = window("2026-09-19T00:00:00Z", Some("2026-09-14"));
        let (cells, due, cut) = plan(
            "settle",
            d("2026-09-10"),
            d("2026-09-20"),
            vec![],
            Some(&e),
            &w,
        );
        assert!(!cut);
        let due: Vec<&str> = due.iter().map(|p| p.key_part.as_str()).collect();
        assert_eq!(
            due,
            ["2026-09-14", "2026-09-15", "2026-09-17", "2026-09-18"]
        );
        let skipped: Vec<&str> = cells.keys().map(String::as_str).collect();
        // 2026-09-13 is a Sunday before the first period: not shown; the
        // 20th is a Sunday, but not due yet.
        assert_eq!(skipped, ["2026-09-16"]);
        assert!(cells["2026-09-16"]
            .note
            .as_deref()
            .unwrap()
            .contains("skip_dates"));
    }

    #[test]
    fn quarter_hours_start_at_the_first_period() {
        let e = Expected::from_settings(
            &settings("*/15 * * * *", "firing"),
            SettingsSource::Recorded,
        )
        .unwrap();
        let mut w = window("2026-09-15T01:00:00Z", None); // 10:00 in Seoul
        w.first = Some(FirstPeriod {
            date: d("2026-09-15"),
            start: Some(utc("2026-09-14T23:00:00Z")), // 08:00 in Seoul
        });
        let (_, due, _) = plan(
            "sync",
            d("2026-09-15"),
            d("2026-09-15"),
            vec![],
            Some(&e),
            &w,
        );
        assert_eq!(due.len(), 9, "08:00 to 10:00 in quarter hours");
        assert_eq!(due[0].key_part, "2026-09-15T08:00");
        assert_eq!(due[8].key_part, "2026-09-15T10:00");
        assert_eq!(due[0].start, utc("2026-09-14T23:00:00Z"));
    }
}
