//! Re-run or skip every run a filter of the run list shows: all FAILED runs
//! of a job over a range of business dates, say. The run list offers it to
//! an operator when its filter names a job and a state the action starts
//! from (re-run: FAILED; skip: PENDING or FAILED).
//!
//! Two requests, as every console action. The preview (a GET: it writes
//! nothing) lists every key the action would touch, at most
//! [`MAX_BULK`] (a filter matching more is refused, asking for a narrower
//! one), and asks for one reason. The apply takes exactly the keys the
//! preview listed and acts on each through the queue's
//! `blockers::act_from`, the audited path of a single run's action, with the
//! previewed state as the state each run must still be in: a run that left
//! it in between is reported and left alone, never acted on in its new
//! state. Each run applied writes its own audit row. The answer reports,
//! key by key, what happened: applied, refused (its state changed), or
//! blocked (another session held its row for [`LOCK_TIMEOUT`]).

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use maud::{html, Markup};

use super::html::{self, badge, encode, run_href};
use super::run_query::{opt, query_path, run_filter, RunsQuery};
use super::{db_error, refuse, refuse_act, App, Authed};
use crate::clock::Clock;
use crate::key::{JobKey, JobName};
use crate::queue::blockers::{self, ActError, ActOptions};
use crate::queue::{self, Action, OperatorRequest, Origin, RunFilter, RunStatus};

/// Most runs one bulk action touches.
pub const MAX_BULK: usize = 500;

/// How long each run's action waits for its row: shorter than a single
/// action's 5 s, since one request acts on up to [`MAX_BULK`] runs; a run
/// held longer is reported as blocked, to act on from its own page.
const LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The bulk actions and the states each starts from without force.
fn action_of(s: &str) -> Option<(Action, &'static [RunStatus])> {
    match s {
        "rerun" => Some((Action::Rerun, &[RunStatus::Failed])),
        "skip" => Some((Action::Skip, &[RunStatus::Pending, RunStatus::Failed])),
        _ => None,
    }
}

fn label(action: Action) -> &'static str {
    match action {
        Action::Rerun => "Re-run",
        Action::Skip => "Skip",
        Action::Fail => "Fail",
    }
}

/// The run list's offer, for an operator whose filter names a job and a
/// state a bulk action starts from: "Re-run all N shown…" and the like,
/// each a link to its preview. Empty otherwise.
pub(crate) async fn offer(
    app: &App,
    a: &Authed,
    filter: &RunFilter,
    base: &str,
) -> Result<Markup, Box<Response>> {
    let (Some(_), Some(status)) = (&filter.job, filter.status) else {
        return Ok(html! {});
    };
    if !html::may_act(a.session.user.role) {
        return Ok(html! {});
    }
    let actions: Vec<Action> = ["rerun", "skip"]
        .into_iter()
        .filter_map(action_of)
        .filter(|(_, from)| from.contains(&status))
        .map(|(a, _)| a)
        .collect();
    if actions.is_empty() {
        return Ok(html! {});
    }
    let n = match queue::search_runs(&app.pool, filter, None, MAX_BULK as u32 + 1).await {
        Ok(r) => r.len(),
        Err(e) => return Err(Box::new(db_error(e))),
    };
    if n == 0 {
        return Ok(html! {});
    }
    let shown = if n > MAX_BULK {
        format!("more than {MAX_BULK}")
    } else {
        n.to_string()
    };
    let query = base.strip_prefix("/runs?").unwrap_or("");
    Ok(html! {
        p.bulk {
            @for action in &actions {
                a href={ "/runs/bulk?action=" (action.as_str()) (query) } {
                    (label(*action)) " all " (shown) " shown…"
                }
                " "
            }
            span.muted { "Each opens a preview of every run it would touch; nothing changes until you apply it." }
        }
    })
}

#[derive(serde::Deserialize, Default)]
pub(crate) struct BulkQuery {
    action: Option<String>,
    #[serde(flatten)]
    filter: RunsQuery,
}

/// A refusal of the whole request, in the page frame.
fn refusal(a: &Authed, status: StatusCode, why: &str) -> Response {
    let body = html! {
        h1 { "Bulk action" }
        (html::message("error", why))
        p { a href="/runs" { "Back to the runs" } }
    };
    (status, html::page("Bulk action", &a.session, body)).into_response()
}

pub(crate) async fn preview(
    State(app): State<Arc<App>>,
    Extension(a): Extension<Authed>,
    Query(q): Query<BulkQuery>,
) -> Response {
    if !html::may_act(a.session.user.role) {
        return refuse(
            StatusCode::FORBIDDEN,
            "refused: only an operator may act; you are a viewer",
        );
    }
    let filter = match run_filter(&q.filter) {
        Ok(f) => f,
        Err(e) => return refusal(&a, StatusCode::BAD_REQUEST, &e),
    };
    let back = query_path(
        "/runs",
        &[
            ("job", &q.filter.job),
            ("status", &q.filter.status),
            ("from", &q.filter.from),
            ("to", &q.filter.to),
            ("key", &q.filter.key),
            ("scope", &q.filter.scope),
        ],
    );
    let (Some(job), Some(status)) = (&filter.job, filter.status) else {
        return refusal(
            &a,
            StatusCode::BAD_REQUEST,
            "A bulk action needs a filter that names one job and one state.",
        );
    };
    let Some((action, from)) = opt(&q.action).and_then(action_of) else {
        return refusal(
            &a,
            StatusCode::BAD_REQUEST,
            "Unknown bulk action: re-run or skip.",
        );
    };
    if !from.contains(&status) {
        return refusal(
            &a,
            StatusCode::BAD_REQUEST,
            &format!(
                "{} applies to {} runs, not {status}.",
                label(action),
                from.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        );
    }
    let rows = match queue::search_runs(&app.pool, &filter, None, MAX_BULK as u32 + 1).await {
        Ok(r) => r,
        Err(e) => return db_error(e),
    };
    if rows.len() > MAX_BULK {
        return refusal(
            &a,
            StatusCode::CONFLICT,
            &format!(
                "More than {MAX_BULK} runs match this filter; one bulk action touches at most {MAX_BULK}. \
                 Narrow the filter (a shorter range of business dates, or part of the key) and try again."
            ),
        );
    }
    let title = format!("{} {} {status} runs of {job}", label(action), rows.len());
    let body = html! {
        h1 { (title) }
        @if rows.is_empty() {
            (html::message("note", "No run matches the filter any more: nothing to do."))
        } @else {
            p { (label(action)) " applies to each run below only if it is still " (badge(status.as_str()))
                " when you apply; a run that changed in between is reported and left alone. "
                "Each run applied gets its own row in the audit log, with the one reason below." }
            form.act method="post" action="/runs/bulk/apply" {
                input type="hidden" name="csrf" value=(a.session.csrf);
                input type="hidden" name="action" value=(action.as_str());
                input type="hidden" name="job" value=(job.as_str());
                input type="hidden" name="expected" value=(status.as_str());
                @for r in &rows { input type="hidden" name="key" value=(r.job_key); }
                label { "Reason (required)" input.reason type="text" name="reason" required minlength="3" maxlength="500"; }
                button type="submit" { "Apply: " (label(action).to_lowercase()) " all " (rows.len()) }
                " "
                a href=(back) { "Cancel" }
            }
            p.muted { "Recorded as operator " strong { (a.session.user.name) } " from " (a.remote) "." }
            table {
                tr { th scope="col" { "Key" } th scope="col" { "Business date" } th scope="col" { "State" } th scope="col" { "Attempts" } }
                @for r in &rows {
                    tr {
                        td { a href=(run_href(&r.job_key)) { (r.job_key) } }
                        td { (r.business_date) }
                        td { (badge(r.status.as_str())) }
                        td.num { (r.attempts) "/" (r.max_attempts) }
                    }
                }
            }
        }
    };
    html::page(&title, &a.session, body).into_response()
}

/// The apply form: the token, the action, the job, the previewed state,
/// the previewed keys (repeated) and the reason.
#[derive(Debug, Default)]
struct ApplyForm {
    csrf: Option<String>,
    action: String,
    job: String,
    expected: String,
    keys: Vec<String>,
    reason: String,
}

fn read_form(body: &str) -> ApplyForm {
    let mut f = ApplyForm::default();
    for (k, v) in url::form_urlencoded::parse(body.as_bytes()) {
        match k.as_ref() {
            "csrf" => f.csrf = Some(v.into_owned()),
            "action" => f.action = v.into_owned(),
            "job" => f.job = v.into_owned(),
            "expected" => f.expected = v.into_owned(),
            "key" if !f.keys.iter().any(|x| *x == v) => f.keys.push(v.into_owned()),
            "reason" => f.reason = v.into_owned(),
            _ => {}
        }
    }
    f
}

/// What happened to one run.
enum RunResult {
    Applied { before: RunStatus, after: RunStatus },
    Refused(String),
    Blocked(String),
    NotTried(String),
}

/// A bulk apply's form, checked: every field as the preview gave it.
struct Checked {
    action: Action,
    expected: RunStatus,
    job: JobName,
    reason: String,
    keys: Vec<JobKey>,
}

/// The form's fields, or why it is refused (a 400 page).
fn check(f: &ApplyForm) -> Result<Checked, String> {
    let (action, from) =
        action_of(&f.action).ok_or_else(|| "Unknown bulk action: re-run or skip.".to_owned())?;
    let expected = RunStatus::parse(&f.expected)
        .filter(|s| from.contains(s))
        .ok_or_else(|| "The previewed state is missing or wrong; preview again.".to_owned())?;
    let job = JobName::parse(&f.job)
        .map_err(|_| "The job is missing or wrong; preview again.".to_owned())?;
    let reason = crate::text::reason(&f.reason).map_err(|e| format!("Reason: {e}."))?;
    if f.keys.is_empty() || f.keys.len() > MAX_BULK {
        return Err(format!(
            "Give 1 to {MAX_BULK} runs, as the preview lists them, not {}.",
            f.keys.len()
        ));
    }
    let keys = f
        .keys
        .iter()
        .map(|k| match JobKey::parse(k) {
            Ok(key) if key.job_name() == job.as_str() => Ok(key),
            _ => Err(format!(
                "{} is not a key of job {job}; preview again.",
                crate::text::truncate(k)
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Checked {
        action,
        expected,
        job,
        reason,
        keys,
    })
}

/// Applies `action` to each run, only if it is still `expected`; stops
/// trying once the database fails.
async fn act_each(
    app: &App,
    a: &Authed,
    action: Action,
    expected: RunStatus,
    reason: &str,
    keys: Vec<JobKey>,
) -> Vec<(JobKey, RunResult)> {
    let origin = Origin {
        remote_addr: a.remote.clone(),
        expected_before: Some(expected),
    };
    let opts = ActOptions {
        lock_timeout: LOCK_TIMEOUT,
        terminate_blocker: false,
        dry_run: false,
    };
    let defaults = crate::config::JobConfig::default();
    let mut results: Vec<(JobKey, RunResult)> = Vec::with_capacity(keys.len());
    let mut failed: Option<String> = None;
    for key in keys {
        if let Some(why) = &failed {
            results.push((key, RunResult::NotTried(why.clone())));
            continue;
        }
        let req = OperatorRequest {
            action,
            key: key.clone(),
            operator: a.session.user.name.clone(),
            reason: reason.to_owned(),
            force: false,
            stale_after: defaults.stale_after,
            max_attempts: defaults.max_attempts,
        };
        let r = match blockers::act_from(&app.pool, &req, Clock::Db, opts, Some(&origin)).await {
            Ok(report) => RunResult::Applied {
                before: report.outcome.before,
                after: report.outcome.after,
            },
            Err(ActError::Refused(r)) => RunResult::Refused(r.without_remedy()),
            Err(ActError::Blocked(b)) => {
                let holders: Vec<String> =
                    b.blockers.iter().map(|x| x.session.describe()).collect();
                RunResult::Blocked(format!(
                    "another session held the run's row for {} s ({}); act on it from its page",
                    b.lock_timeout_seconds,
                    if holders.is_empty() {
                        "it ended before it could be named".to_owned()
                    } else {
                        holders.join("; ")
                    }
                ))
            }
            Err(ActError::Queue(queue::QueueError::Invalid(why))) => RunResult::Refused(why),
            Err(ActError::Queue(e)) => {
                // The database is not answering: stop rather than try every
                // remaining run against it.
                let why = format!("not tried: the database failed ({e})");
                failed = Some(why.clone());
                RunResult::NotTried(why)
            }
        };
        results.push((key, r));
    }
    results
}

pub(crate) async fn apply(
    State(app): State<Arc<App>>,
    Extension(a): Extension<Authed>,
    body: String,
) -> Response {
    let f = read_form(&body);
    if let Some(res) = refuse_act(&a, f.csrf.as_deref()) {
        return res;
    }
    let Checked {
        action,
        expected,
        job,
        reason,
        keys,
    } = match check(&f) {
        Ok(c) => c,
        Err(why) => return refusal(&a, StatusCode::BAD_REQUEST, &why),
    };
    let results = act_each(&app, &a, action, expected, &reason, keys).await;
    let applied = results
        .iter()
        .filter(|(_, r)| matches!(r, RunResult::Applied { .. }))
        .count();
    let refused = results
        .iter()
        .filter(|(_, r)| matches!(r, RunResult::Refused(_)))
        .count();
    let blocked = results
        .iter()
        .filter(|(_, r)| matches!(r, RunResult::Blocked(_)))
        .count();
    let not_tried = results.len() - applied - refused - blocked;
    tracing::info!(
        operator = %a.session.user.name, remote = %a.remote, action = %action.as_str(), job = %job,
        applied, refused, blocked, not_tried, "console bulk action applied"
    );
    let summary = format!(
        "{applied} of {} applied, {refused} refused, {blocked} blocked{}.",
        results.len(),
        if not_tried > 0 {
            format!(", {not_tried} not tried")
        } else {
            String::new()
        }
    );
    let back = format!(
        "/runs?job={}&status={}",
        encode(job.as_str()),
        expected.as_str()
    );
    let body = html! {
        h1 { (label(action)) " of " (results.len()) " " (expected.as_str()) " runs of " (job.as_str()) }
        (html::message(if applied == results.len() { "done" } else { "note" }, &summary))
        p { "Reason: " (reason) }
        table {
            tr { th scope="col" { "Key" } th scope="col" { "Result" } }
            @for (key, r) in &results {
                tr {
                    td { a href=(run_href(key.as_str())) { (key.as_str()) } }
                    td { @match r {
                        RunResult::Applied { before, after } => { "applied: " (badge(before.as_str())) " → " (badge(after.as_str())) }
                        RunResult::Refused(why) => { "refused: " (why) }
                        RunResult::Blocked(why) => { "blocked: " (why) }
                        RunResult::NotTried(why) => { (why) }
                    } }
                }
            }
        }
        p { a href=(back) { "Back to the runs" } " · " a href={ "/audit?job=" (encode(job.as_str())) } { "Audit log" } }
    };
    let status = if applied == 0 {
        StatusCode::CONFLICT
    } else {
        StatusCode::OK
    };
    (status, html::page("Bulk action", &a.session, body)).into_response()
}
