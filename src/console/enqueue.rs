//! Enqueue a job's missing periods: the periods its schedule expected by
//! now that have no run at all (MISSING on the calendar), chosen on the
//! job's calendar page, which posts them here as repeated `period` fields
//! (`2026-09-15`, or `2026-09-15T10:15` for a job that runs per firing).
//!
//! Two requests, as every console action: the preview checks each period
//! and writes nothing, listing the key each would get and what would happen
//! to it; the apply checks them all again, needs a reason, and enqueues the
//! periods still missing through `queue::operator_enqueue`, which writes
//! one audit row per run. A period is refused when its text is no period of
//! the job, when the schedule does not expect it (or not yet), or when a
//! run exists for it (live or archived); at most
//! [`queue::MAX_OPERATOR_ENQUEUE`] periods go in one request.
//!
//! What defines each run (time zone, period bounds, covers, partitions,
//! calendar skips, policies) comes from the job's declaration in the
//! database (`batch_job_declared`, written by `batchonce migrate`) through
//! the producer's own `runs_for_periods`, never from a file on the
//! console's machine. The declaration does not say which scopes a scoped
//! job has, so a scoped job's periods are refused as a whole.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use chrono::{DateTime, Days, NaiveTime, Utc};
use maud::{html, Markup};

use super::html::{self, at, badge, encode, run_href};
use super::{db_error, known_job, refuse_act, App, Authed};
use crate::config::JobConfig;
use crate::key::{JobKey, JobName};
use crate::queue::{self, NewRun, RunStatus, MAX_OPERATOR_ENQUEUE};
use crate::schedule::{self, Covers, Period};

/// Most firings one window of the expected-period check may hold: far more
/// than any schedule's firings in a few days around the periods asked for.
const MAX_FIRINGS: usize = 200_000;

/// The form: the session's token, the periods, and (to apply) the reason.
#[derive(Debug, Default)]
struct EnqueueForm {
    csrf: Option<String>,
    periods: Vec<String>,
    reason: Option<String>,
}

/// Reads a form body with repeated `period` fields, which axum's `Form`
/// (serde_urlencoded) cannot gather into a list.
fn read_form(body: &str) -> EnqueueForm {
    let mut f = EnqueueForm::default();
    for (k, v) in url::form_urlencoded::parse(body.as_bytes()) {
        match k.as_ref() {
            "csrf" => f.csrf = Some(v.into_owned()),
            "period" => {
                let v = v.trim();
                if !v.is_empty() && !f.periods.iter().any(|p| p == v) {
                    f.periods.push(v.to_owned());
                }
            }
            "reason" => f.reason = Some(v.into_owned()),
            _ => {}
        }
    }
    f
}

/// One period asked for, and what would happen to it.
struct Line {
    /// As the form gave it (shortened for the page).
    period: String,
    key: Option<JobKey>,
    outcome: Result<NewRun, String>,
}

/// Every period checked against the job's declaration, its schedule and
/// the runs that exist; `Err` is a refusal of the whole request.
async fn check(
    app: &App,
    a: &Authed,
    job: &JobName,
    periods: &[String],
) -> Result<Vec<Line>, Box<Response>> {
    let refuse = |status, why: String| Err(Box::new(page_refusal(a, job, status, &why)));
    if periods.is_empty() {
        return refuse(
            StatusCode::BAD_REQUEST,
            "Choose at least one missing period on the calendar.".into(),
        );
    }
    if periods.len() > MAX_OPERATOR_ENQUEUE {
        return refuse(
            StatusCode::BAD_REQUEST,
            format!(
                "{} periods chosen; at most {MAX_OPERATOR_ENQUEUE} can be enqueued at once. Choose fewer, or a shorter range.",
                periods.len()
            ),
        );
    }
    let settings = match queue::declared_job(&app.pool, job).await {
        Ok(Some(s)) => s,
        Ok(None) => {
            return refuse(
                StatusCode::CONFLICT,
                format!(
                    "Job {job} is not declared: the console enqueues only jobs that `batchonce migrate` declared, \
                     with what the declaration says. Run migrate with the configuration file that declares it."
                ),
            )
        }
        Err(e) => return Err(Box::new(db_error(e))),
    };
    let declared = match queue::config_from_declared(&settings) {
        Ok(d) => d,
        Err(why) => {
            return refuse(
                StatusCode::CONFLICT,
                format!("Job {job}'s declaration cannot be read by this release: {why}."),
            )
        }
    };
    if declared.scoped {
        return refuse(
            StatusCode::CONFLICT,
            format!(
                "Job {job} runs once per scope, and its declaration does not say which scopes it has, \
                 so the console cannot enqueue its periods. Enqueue them with `batchonce enqueue` and its scopes."
            ),
        );
    }
    let cfg = declared.config;
    let Some(sched) = cfg.schedule.clone() else {
        return refuse(
            StatusCode::CONFLICT,
            format!("Job {job} has no schedule, so no period of it is ever missing: it runs only what is enqueued."),
        );
    };
    let now = match queue::database_now(&app.pool).await {
        Ok(n) => n,
        Err(e) => return Err(Box::new(db_error(e))),
    };
    let mut lines: Vec<Line> = periods.iter().map(|p| line_of(job, &cfg, p)).collect();
    // Expected: a firing of the stored schedule, due by the database's now,
    // covers the period (the calendar's rule for MISSING).
    let wanted: Vec<Period> = lines
        .iter()
        .filter_map(|l| l.outcome.as_ref().ok().map(period_of_run))
        .collect();
    let firings = match firing_of_periods(&sched, &cfg, &wanted) {
        Ok(f) => f,
        Err(why) => return refuse(StatusCode::BAD_REQUEST, why),
    };
    let keys: Vec<JobKey> = lines.iter().filter_map(|l| l.key.clone()).collect();
    let existing: HashMap<String, String> = match queue::existing_runs(&app.pool, &keys).await {
        Ok(rows) => rows.into_iter().collect(),
        Err(e) => return Err(Box::new(db_error(e))),
    };
    for line in &mut lines {
        let Ok(run) = &line.outcome else { continue };
        let why = match firings.get(&period_of_run(run)) {
            None => Some("the job's schedule expects no run for this period".to_owned()),
            Some(due) if *due > now => Some(format!("not due yet: it is due at {}", at(*due))),
            Some(_) => existing
                .get(run.key.as_str())
                .map(|status| match status.as_str() {
                    "ARCHIVED" => "it has a run already (archived)".to_owned(),
                    s => format!("it has a run already ({s})"),
                }),
        };
        if let Some(why) = why {
            line.outcome = Err(why);
        }
    }
    Ok(lines)
}

/// One period as the form gave it: its key and its run, or why it is no
/// period of the job.
fn line_of(job: &JobName, cfg: &JobConfig, text: &str) -> Line {
    let built = parse_period(text, cfg.covers).and_then(|period| {
        let key =
            JobKey::parse(&format!("{job}:{}", period.key_part())).map_err(|e| e.to_string())?;
        Ok((key, runs_of(job, cfg, period)))
    });
    let (key, outcome) = match built {
        Ok((key, run)) => (Some(key), run),
        Err(why) => (None, Err(why)),
    };
    Line {
        period: text.chars().take(40).collect(),
        key,
        outcome,
    }
}

/// The period of a run built by `runs_of` (its key's period part).
fn period_of_run(run: &NewRun) -> Period {
    let minute = run
        .key
        .period()
        .split_once('T')
        .and_then(|(_, hm)| NaiveTime::parse_from_str(hm, "%H:%M").ok());
    Period {
        date: run.business_date,
        minute,
    }
}

/// The run of one period, as the producer would enqueue it.
fn runs_of(job: &JobName, cfg: &JobConfig, period: Period) -> Result<NewRun, String> {
    crate::runtime::producer::runs_for_periods(job, cfg, &[period])
        .map_err(|e| e.to_string())?
        .into_iter()
        .next()
        .ok_or_else(|| "no run for this period".to_owned())
}

/// A period as the key writes it, of the kind the job's `covers` makes.
fn parse_period(s: &str, covers: Covers) -> Result<Period, String> {
    let bad = |how: &str| format!("not a period of this job: write {how}");
    let daily = "its business date, e.g. 2026-09-15";
    let firing = "its date and minute, e.g. 2026-09-15T10:15";
    match (s.split_once('T'), covers) {
        (None, Covers::Firing) => Err(bad(firing)),
        (None, _) => crate::key::parse_date(s)
            .map(Period::day)
            .map_err(|_| bad(daily)),
        (Some(_), Covers::SameDay | Covers::PreviousDay) => Err(bad(daily)),
        (Some((d, hm)), Covers::Firing) => {
            let date = crate::key::parse_date(d).map_err(|_| bad(firing))?;
            let minute = (hm.len() == 5)
                .then(|| NaiveTime::parse_from_str(hm, "%H:%M").ok())
                .flatten()
                .ok_or_else(|| bad(firing))?;
            Ok(Period {
                date,
                minute: Some(minute),
            })
        }
    }
}

/// For each period some firing of `sched` covers, the first such firing's
/// instant. The firings are searched around the periods' dates only (two
/// days either side, as the calendar does), dates close together in one
/// window.
fn firing_of_periods(
    sched: &schedule::CronSchedule,
    cfg: &JobConfig,
    periods: &[Period],
) -> Result<HashMap<Period, DateTime<Utc>>, String> {
    let mut dates: Vec<_> = periods.iter().map(|p| p.date).collect();
    dates.sort();
    dates.dedup();
    let mut out: HashMap<Period, DateTime<Utc>> = HashMap::new();
    let mut i = 0;
    while i < dates.len() {
        let first = dates[i];
        let mut last = first;
        while i + 1 < dates.len()
            && dates[i + 1] <= last.checked_add_days(Days::new(4)).unwrap_or(last)
        {
            i += 1;
            last = dates[i];
        }
        i += 1;
        let after = schedule::start_of_day(
            first.checked_sub_days(Days::new(2)).unwrap_or(first),
            cfg.timezone,
        );
        let upto = schedule::start_of_day(
            last.checked_add_days(Days::new(2)).unwrap_or(last),
            cfg.timezone,
        );
        let (firings, cut) = sched.firings(cfg.timezone, after, upto, MAX_FIRINGS);
        if cut {
            return Err(format!(
                "the schedule fires more than {MAX_FIRINGS} times around the periods chosen; choose periods closer together"
            ));
        }
        for f in firings {
            out.entry(schedule::period_of(&f, cfg.timezone, cfg.covers))
                .or_insert(f.at);
        }
    }
    Ok(out)
}

/// A whole request refused: the page frame, the reason, the way back.
fn page_refusal(a: &Authed, job: &JobName, status: StatusCode, why: &str) -> Response {
    let body = html! {
        h1 { "Enqueue missing periods of " (job.as_str()) }
        (html::message("error", why))
        p { a href={ "/jobs/" (encode(job.as_str())) } { "Back to the calendar" } }
    };
    (
        status,
        html::page(&format!("Enqueue {}", job.as_str()), &a.session, body),
    )
        .into_response()
}

/// What a ready run will be: PENDING, or SKIPPED with the calendar's reason.
fn will_be(run: &NewRun) -> Markup {
    html! {
        @match &run.skip_reason {
            None => { "enqueued " (badge(RunStatus::Pending.as_str())) }
            Some(why) => { "recorded " (badge(RunStatus::Skipped.as_str())) " (" (why) ")" }
        }
    }
}

/// The table of every period asked for.
fn lines_table(lines: &[Line], outcome: impl Fn(&Line) -> Markup) -> Markup {
    html! {
        table {
            tr { th scope="col" { "Period" } th scope="col" { "Key" } th scope="col" { "Outcome" } }
            @for l in lines {
                tr {
                    td { (l.period) }
                    td { @if let Some(k) = &l.key { code { (k.as_str()) } } @else { "—" } }
                    td { (outcome(l)) }
                }
            }
        }
    }
}

/// The form of an operator's request with its token checked, and the job
/// it names if the database knows it; otherwise the page refusing it.
async fn form_and_job(
    app: &App,
    a: &Authed,
    job: &str,
    body: &str,
) -> Result<(EnqueueForm, JobName), Box<Response>> {
    let form = read_form(body);
    if let Some(res) = refuse_act(a, form.csrf.as_deref()) {
        return Err(Box::new(res));
    }
    let job = known_job(app, a, job).await?;
    Ok((form, job))
}

pub(crate) async fn preview(
    State(app): State<Arc<App>>,
    Extension(a): Extension<Authed>,
    Path(job): Path<String>,
    body: String,
) -> Response {
    let (form, job) = match form_and_job(&app, &a, &job, &body).await {
        Ok(f) => f,
        Err(res) => return *res,
    };
    let lines = match check(&app, &a, &job, &form.periods).await {
        Ok(l) => l,
        Err(res) => return *res,
    };
    let ready: Vec<&NewRun> = lines
        .iter()
        .filter_map(|l| l.outcome.as_ref().ok())
        .collect();
    let body = html! {
        h1 { "Enqueue missing periods of " (job.as_str()) }
        p { "Each run gets the time zone, period, partitions and policies of the job's declaration in the database \
             (what `batchonce migrate` stored), as the producer would have enqueued it. Nothing is written until you apply." }
        (lines_table(&lines, |l| match &l.outcome {
            Ok(run) => will_be(run),
            Err(why) => html! { "refused: " (why) },
        }))
        @if ready.is_empty() {
            (html::message("note", "Nothing to enqueue: every period chosen is refused."))
        } @else {
            form.act method="post" action={ "/jobs/" (encode(job.as_str())) "/enqueue/apply" } {
                input type="hidden" name="csrf" value=(a.session.csrf);
                @for run in &ready { input type="hidden" name="period" value=(run.key.period()); }
                label { "Reason (required)" input.reason type="text" name="reason" required minlength="3" maxlength="500"
                    value=(form.reason.as_deref().unwrap_or("")); }
                button type="submit" { "Enqueue " (ready.len()) @if ready.len() == 1 { " run" } @else { " runs" } }
            }
            p.muted { "Recorded in the audit log as operator " strong { (a.session.user.name) } " from " (a.remote)
                ", one row per run enqueued." }
        }
        p { a href={ "/jobs/" (encode(job.as_str())) } { "Back to the calendar" } }
    };
    html::page(&format!("Enqueue {}", job.as_str()), &a.session, body).into_response()
}

pub(crate) async fn apply(
    State(app): State<Arc<App>>,
    Extension(a): Extension<Authed>,
    Path(job): Path<String>,
    body: String,
) -> Response {
    let (form, job) = match form_and_job(&app, &a, &job, &body).await {
        Ok(f) => f,
        Err(res) => return *res,
    };
    let reason = match crate::text::reason(form.reason.as_deref().unwrap_or("")) {
        Ok(r) => r,
        Err(e) => return page_refusal(&a, &job, StatusCode::BAD_REQUEST, &format!("Reason: {e}.")),
    };
    let lines = match check(&app, &a, &job, &form.periods).await {
        Ok(l) => l,
        Err(res) => return *res,
    };
    let ready: Vec<NewRun> = lines
        .iter()
        .filter_map(|l| l.outcome.as_ref().ok().cloned())
        .collect();
    let done = if ready.is_empty() {
        queue::OperatorEnqueued::default()
    } else {
        match queue::operator_enqueue(
            &app.pool,
            &ready,
            &a.session.user.name,
            &reason,
            Some(&a.remote),
        )
        .await
        {
            Ok(d) => d,
            // The database's own refusal (the declaration's check of an
            // operator's login, a bound): one line, nothing enqueued.
            Err(queue::QueueError::Database(e))
                if matches!(
                    e.as_database_error().and_then(|d| d.code()).as_deref(),
                    Some("22023" | "BO008" | "BO011")
                ) =>
            {
                let why = e
                    .as_database_error()
                    .map(|d| d.message().to_owned())
                    .unwrap_or_default();
                return page_refusal(
                    &a,
                    &job,
                    StatusCode::CONFLICT,
                    &format!("The database refused the enqueue, so nothing was enqueued: {why}"),
                );
            }
            Err(e) => return db_error(e),
        }
    };
    let enqueued: BTreeMap<&str, &str> = done
        .enqueued
        .iter()
        .map(|(k, s)| (k.as_str(), s.as_str()))
        .collect();
    tracing::info!(
        operator = %a.session.user.name, remote = %a.remote, job = %job,
        enqueued = done.enqueued.len(), "console enqueue applied"
    );
    let summary = format!(
        "{} of {} periods enqueued; {} had a run already; {} refused.",
        done.enqueued.len(),
        lines.len(),
        done.duplicates.len(),
        lines.len() - ready.len()
    );
    let status = if done.enqueued.is_empty() {
        StatusCode::CONFLICT
    } else {
        StatusCode::OK
    };
    let body = html! {
        h1 { "Enqueued missing periods of " (job.as_str()) }
        (html::message(if done.enqueued.is_empty() { "error" } else { "done" }, &summary))
        p { "Reason: " (reason) }
        (lines_table(&lines, |l| match (&l.outcome, l.key.as_ref()) {
            (Ok(_), Some(k)) => match enqueued.get(k.as_str()) {
                Some(state) => html! { "enqueued " (badge(state)) " " a href=(run_href(k.as_str())) { "open" } },
                None => html! { "not enqueued: it has a run already (nothing changed) " a href=(run_href(k.as_str())) { "open" } },
            },
            (Ok(_), None) => html! { "—" },
            (Err(why), _) => html! { "refused: " (why) },
        }))
        p { a href={ "/jobs/" (encode(job.as_str())) } { "Back to the calendar" } " · "
            a href={ "/audit?action=enqueue&job=" (encode(job.as_str())) } { "Audit log" } }
    };
    (
        status,
        html::page(&format!("Enqueued {}", job.as_str()), &a.session, body),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_with_repeated_periods_is_read_in_order_without_repeats() {
        let f = read_form("csrf=t0k&period=2026-09-15&period=2026-09-16&period=2026-09-15&period=%20&reason=late+data");
        assert_eq!(f.csrf.as_deref(), Some("t0k"));
        assert_eq!(f.periods, ["2026-09-15", "2026-09-16"]);
        assert_eq!(f.reason.as_deref(), Some("late data"));
    }

    #[test]
    fn periods_are_of_the_kind_the_job_runs() {
        let d = parse_period("2026-09-15", Covers::SameDay).unwrap();
        assert_eq!(d.key_part(), "2026-09-15");
        let m = parse_period("2026-09-15T10:15", Covers::Firing).unwrap();
        assert_eq!(m.key_part(), "2026-09-15T10:15");
        for (bad, covers) in [
            ("2026-09-15T10:15", Covers::SameDay),
            ("2026-09-15", Covers::Firing),
            ("2026-9-15", Covers::PreviousDay),
            ("2026-09-15T10:15:00", Covers::Firing),
            ("2026-09-15T25:00", Covers::Firing),
            ("<script>", Covers::SameDay),
        ] {
            assert!(parse_period(bad, covers).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_period_is_expected_when_a_firing_covers_it() {
        let cfg = JobConfig {
            timezone: chrono_tz::Asia::Seoul,
            covers: Covers::PreviousDay,
            schedule: Some(schedule::CronSchedule::parse("0 1 * * *").unwrap()),
            ..JobConfig::default()
        };
        let sched = cfg.schedule.clone().unwrap();
        let day = |s: &str| Period::day(crate::key::parse_date(s).unwrap());
        let f = firing_of_periods(&sched, &cfg, &[day("2026-09-15"), day("2026-12-01")]).unwrap();
        // The 15th is covered by the firing at 01:00 Seoul on the 16th.
        assert_eq!(
            f[&day("2026-09-15")].to_rfc3339(),
            "2026-09-15T16:00:00+00:00"
        );
        assert!(f.contains_key(&day("2026-12-01")));
        let weekly = JobConfig {
            schedule: Some(schedule::CronSchedule::parse("0 1 * * 1").unwrap()),
            ..cfg
        };
        let sched = weekly.schedule.clone().unwrap();
        // 2026-09-14 is a Monday: its firing covers Sunday the 13th only.
        let f =
            firing_of_periods(&sched, &weekly, &[day("2026-09-13"), day("2026-09-15")]).unwrap();
        assert!(f.contains_key(&day("2026-09-13")));
        assert!(!f.contains_key(&day("2026-09-15")));
    }
}
