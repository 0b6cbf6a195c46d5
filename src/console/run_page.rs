//! One run: the operator actions first, then its context, its attempts as
//! a timeline, progress, the stale evidence and verdict, and its audited
//! history. The run's message is labelled by who wrote it: an operator's
//! reason (with who and when, from the audit log), the business calendar's
//! skip, or the last error of an attempt; the next attempt is shown only
//! for a PENDING run that has one left.
//!
//! An action is two requests: a preview, which checks it against the run's
//! current state without writing and shows the change, and a confirmation,
//! which applies it through the queue's `blockers::act_from` only if the run
//! is still in the previewed state. The operator is the signed-in user,
//! never a name from the form; the reason is required. An action waits at
//! most five seconds for the run's row, then names the session holding it
//! and offers to end it (audited first) and act, as `--terminate-blocker`.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use maud::{html, Markup};

use super::html::{self, age, at, at_opt, badge, encode, run_href};
use super::pages::stale_evidence;
use super::{auth, db_error, not_found, refuse, App, Authed};
use crate::clock::Clock;
use crate::key::JobKey;
use crate::queue::blockers::{self, ActError, ActOptions};
use crate::queue::{self, Action, OperatorRequest, Origin, RunStatus};

/// How long an action waits for the run's row before it names the session
/// holding it, as `runs fail|rerun|skip` do by default.
const LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(serde::Deserialize, Default)]
pub(crate) struct ShowQuery {
    /// Set after an action applied: the page then says what the audit log
    /// holds last for the run (never text from the address).
    done: Option<String>,
    /// `off` stops an unfinished run's page refreshing itself.
    refresh: Option<String>,
}

pub(crate) async fn show(
    State(app): State<Arc<App>>,
    Extension(a): Extension<Authed>,
    Path(key): Path<String>,
    Query(q): Query<ShowQuery>,
) -> Response {
    let key = match JobKey::parse(&key) {
        Ok(k) => k,
        Err(e) => return not_found(&a, &format!("No run has this key: {e}.")),
    };
    let message = match q.done {
        None => None,
        Some(_) => match queue::actions(&app.pool, &key).await {
            Ok(h) => h.into_iter().last().map(|l| {
                (
                    "done",
                    format!(
                        "{} applied by {} at {} ({} → {}): {}",
                        l.action,
                        l.operator,
                        at(l.at),
                        l.before_status,
                        l.after_status,
                        l.reason
                    ),
                )
            }),
            Err(e) => return db_error(e),
        },
    };
    let refresh = html::refresh_on(q.refresh.as_deref());
    render(&app, &a, &key, message, None, Some(refresh)).await
}

/// The run's page, with an optional message box and an optional preview
/// (with its confirmation form) above the actions.
async fn render(
    app: &App,
    a: &Authed,
    key: &JobKey,
    message: Option<(&str, String)>,
    preview: Option<Markup>,
    // Whether an unfinished run's page refreshes itself; `None` for the
    // answer to a form, whose address a reload must not send again.
    refresh: Option<bool>,
) -> Response {
    let (run, attempts) = match queue::show_run(&app.pool, key).await {
        Ok(Some(r)) => r,
        Ok(None) => return not_found(a, &format!("No run has the key {}.", key.as_str())),
        Err(e) => return db_error(e),
    };
    let history = match queue::actions(&app.pool, key).await {
        Ok(h) => h,
        Err(e) => return db_error(e),
    };
    let partitions = match queue::partitions(&app.pool, key).await {
        Ok(p) => p,
        Err(e) => return db_error(e),
    };
    let stale = match queue::stale_runs(&app.pool, Clock::Db).await {
        Ok(s) => s.into_iter().find(|s| s.job_key == run.job_key),
        Err(e) => return db_error(e),
    };
    let context: Vec<(String, String)> = run
        .context
        .as_ref()
        .and_then(|c| c.to_json().as_object().cloned())
        .map(|m| {
            m.into_iter()
                .map(|(k, v)| {
                    let v = v
                        .as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| v.to_string());
                    (k, v)
                })
                .collect()
        })
        .unwrap_or_default();
    let may_act = html::may_act(a.session.user.role);
    let said = run_message(&run, &history);
    // Only a PENDING run that will be claimed again has a next attempt.
    let next_attempt = run.status == RunStatus::Pending && run.attempts < run.max_attempts;
    // An unfinished run changes by itself: its page follows it.
    let unfinished = matches!(run.status, RunStatus::Pending | RunStatus::Running);
    let refreshing = unfinished && refresh == Some(true);
    let body = html! {
        @if unfinished {
            @if let Some(on) = refresh { (html::refresh_toggle(&run_href(&run.job_key), on)) }
        }
        h1 { (run.job_key) " " (badge(run.status.as_str())) }
        @if let Some((class, text)) = &message { (html::message(class, text)) }
        @if let Some(p) = preview { (p) }
        h2 { "Actions" }
        @if !may_act { p.muted { "You are a viewer: only an operator may act." } }
        @else {
            @let forms: Vec<Markup> = [Action::Fail, Action::Rerun, Action::Skip]
                .into_iter()
                .filter_map(|action| action_form(a, &run.job_key, run.status, action))
                .collect();
            @if forms.is_empty() { p.muted { "No action applies to a " (run.status) " run." } }
            @for f in &forms { (f) }
        }
        h2 { "Run" }
        table {
            tr { th scope="row" { "Job" } td { a href={ "/jobs/" (encode(&run.job_name)) } { (run.job_name) } } }
            tr { th scope="row" { "Business date" } td { (run.business_date) } }
            @if let (queue::Step::Partition { no, count }, Some(parent)) = (run.step, &run.partition_of) {
                tr { th scope="row" { "Partition" } td { (no) " of " (count) " of " a href=(run_href(parent)) { (parent) } } }
            }
            tr { th scope="row" { "Attempts" } td { (run.attempts) " of " (run.max_attempts) } }
            tr { th scope="row" { "Progress" } td { (run.processed_count) " items processed, " (run.failed_count) " failed" } }
            tr { th scope="row" { "Enqueued" } td { (at(run.enqueued_at)) } }
            tr { th scope="row" { "Started" } td { (at_opt(run.started_at)) } }
            tr { th scope="row" { "Finished" } td { (at_opt(run.finished_at)) } }
            @if next_attempt && queue::is_waiting(&run) {
                tr { th scope="row" { "Next attempt" } td { "once its partitions have all succeeded" } }
            } @else if next_attempt {
                tr { th scope="row" { "Next attempt not before" } td { (at(run.next_run_at)) } }
            }
            @if run.status == RunStatus::Running {
                tr { th scope="row" { "Lease" } td {
                    (run.lease_owner.as_deref().unwrap_or("—")) ", attempt " (run.attempts)
                    ", expires " (at_opt(run.lease_expires_at))
                    ", last heartbeat " (at_opt(run.heartbeat_at))
                } }
            }
            @if let Some((label, text)) = &said {
                tr { th scope="row" { (label) } td { (text) } }
            }
        }
        h2 { "Context (fixed when enqueued)" }
        @if context.is_empty() { p.muted { "Enqueued by an earlier release without a stored context." } }
        @else { table { @for (k, v) in &context { tr { th scope="row" { (k) } td { code { (v) } } } } } }
        @if let Some(s) = &stale { (stale_evidence(s)) }
        @if !partitions.is_empty() {
            h2 { "Partitions" }
            p.muted { "Each partition is leased, retried and recovered on its own; the attempts below are the final step, which runs once all have succeeded. A re-run of this run re-runs only its FAILED and SKIPPED partitions." }
            (super::pages::run_table(&partitions))
        }
        h2 { "Attempts" }
        @if attempts.is_empty() { p.muted { "No attempt yet." } }
        @for t in &attempts {
            div {
                h3 { "Attempt " (t.attempt) " — " (t.outcome.as_deref().unwrap_or("running")) }
                p {
                    "Worker " code { (t.worker_id) } ", "
                    (at(t.started_at)) " → " (at_opt(t.finished_at))
                    @if let Some(f) = t.finished_at { " (" (age((f - t.started_at).num_milliseconds() as f64 / 1000.0)) ")" }
                    ", " (t.processed_count) " items, " (t.failed_count) " failed"
                }
                @if let Some(e) = &t.error_message { pre { (e) } }
                @if let Some(o) = &t.output { details { summary { "Output" } pre { (o) } } }
            }
        }
        h2 { "Operator history" }
        @if history.is_empty() { p.muted { "No operator has acted on this run." } }
        @else {
            table {
                tr { th scope="col" { "When" } th scope="col" { "Operator" } th scope="col" { "Action" } th scope="col" { "Change" } th scope="col" { "Reason" } }
                @for h in &history {
                    tr { td { (at(h.at)) } td { (h.operator) } td { (h.action) }
                         td { (h.before_status) " → " (h.after_status) } td { (h.reason) } }
                }
            }
        }
    };
    html::page_with(
        &run.job_key,
        &a.session,
        body,
        refreshing.then_some(html::REFRESH_SECONDS),
    )
    .into_response()
}

/// A preview form for `action`, offered when the run's state allows it,
/// with Force (and what it does, in plain words) where the state or a live
/// lease needs it.
fn action_form(a: &Authed, key: &str, status: RunStatus, action: Action) -> Option<Markup> {
    use RunStatus::*;
    let (plain, forced): (&[RunStatus], &[RunStatus]) = match action {
        Action::Fail => (&[Running], &[Pending]),
        Action::Rerun => (&[Failed], &[Succeeded, Skipped]),
        Action::Skip => (&[Pending, Failed], &[]),
    };
    let needs_force = forced.contains(&status);
    if !plain.contains(&status) && !needs_force {
        return None;
    }
    let label = match action {
        Action::Fail => "Fail",
        Action::Rerun => "Re-run",
        Action::Skip => "Skip",
    };
    Some(html! {
        form.act method="post" action={ (run_href(key)) "/preview" } {
            input type="hidden" name="csrf" value=(a.session.csrf);
            input type="hidden" name="action" value=(action.as_str());
            strong { (label) }
            label { "Reason (required)" input.reason type="text" name="reason" required minlength="3" maxlength="500"; }
            @if needs_force || action == Action::Fail {
                label { "Force" input type="checkbox" name="force" value="true" checked[needs_force]; }
                span.muted { (force_meaning(action)) }
            }
            button type="submit" { "Preview" }
        }
    })
}

/// What Force does for `action`, in plain words, shown beside its box.
fn force_meaning(action: Action) -> &'static str {
    match action {
        Action::Fail => {
            "Force fails the run even if it has not started (PENDING) or its worker's lease is still live: \
             the worker can no longer write or finish it, and its attempt ends as failed. \
             Without Force, only a RUNNING run whose lease expired or that is past its stale threshold is failed."
        }
        Action::Rerun => {
            "Force re-runs a run that SUCCEEDED or was SKIPPED, as a correction: it goes back to PENDING \
             with a new attempt budget and runs again."
        }
        Action::Skip => "",
    }
}

/// A refusal in the console's words: the queue's text, without the command
/// line's flags, and what to do here instead.
pub(crate) fn refused_text(r: &queue::Refused) -> String {
    let what = match r.remedy {
        queue::Remedy::None => "",
        queue::Remedy::ForceCorrection => {
            "; re-running it is a correction: tick Force and preview again"
        }
        queue::Remedy::ForceNotStarted => {
            "; to fail a run that has not started, tick Force and preview again"
        }
        queue::Remedy::CheckStaleOrForce => {
            "; check its stale verdict (the Stale page) first, or tick Force and preview again"
        }
    };
    format!("{}{what}", r.without_remedy())
}

/// What the run's message is and who wrote it: `(label, text)`. An
/// operator's action writes its reason into the run's message; that is
/// the operator's reason, with who and when from the audit log, never the
/// last error. A calendar skip says why the run was skipped. Otherwise the
/// message is the last attempt's error.
fn run_message(run: &queue::RunView, history: &[queue::ActionView]) -> Option<(String, String)> {
    let msg = run.error_message.as_deref()?;
    for h in history.iter().rev() {
        let verb = match h.action.as_str() {
            "fail" => "failed",
            "rerun" => "re-run",
            "skip" => "skipped",
            _ => continue,
        };
        let written =
            crate::text::truncate(&format!("{verb} by operator {}: {}", h.operator, h.reason));
        if written == msg {
            return Some((
                "Operator's reason".into(),
                format!(
                    "{} ({} by {} at {})",
                    h.reason,
                    h.action,
                    h.operator,
                    at(h.at)
                ),
            ));
        }
    }
    // A partition carries its parent's action, whose audit row is the
    // parent's: `rerun of KEY: re-run by operator …`.
    let inner = msg.split_once(": ").filter(|(head, _)| {
        ["fail of ", "rerun of ", "skip of "]
            .iter()
            .any(|p| head.starts_with(p))
    });
    if let Some((head, rest)) = inner {
        if [
            "failed by operator ",
            "re-run by operator ",
            "skipped by operator ",
        ]
        .iter()
        .any(|p| rest.starts_with(p))
        {
            return Some((
                "Operator's reason (on its parent run)".into(),
                format!("{head}: {rest}"),
            ));
        }
    }
    if run.status == RunStatus::Skipped && msg.starts_with("business calendar:") {
        return Some(("Why skipped".into(), msg.to_owned()));
    }
    Some(("Last error".into(), msg.to_owned()))
}

#[derive(serde::Deserialize)]
pub(crate) struct ActionForm {
    csrf: Option<String>,
    action: String,
    reason: String,
    force: Option<String>,
    /// On confirmation: the state the preview showed.
    expected: Option<String>,
    /// On confirmation after a lock: end the sessions holding the run's row
    /// (audited), then act.
    terminate_blocker: Option<String>,
}

/// The checks every action request passes: the CSRF token, the role, the
/// key, the action and the reason. The operator is the session's user. A
/// refusal is its status and one line.
fn request(a: &Authed, key: &str, f: &ActionForm) -> Result<OperatorRequest, (StatusCode, String)> {
    let refused = |status: StatusCode, why: &str| (status, why.to_owned());
    match &f.csrf {
        Some(t) if auth::same_secret(t, &a.session.csrf) => {}
        _ => {
            return Err(refused(
                StatusCode::FORBIDDEN,
                "refused: missing or wrong CSRF token; reload the page and try again",
            ))
        }
    }
    if !html::may_act(a.session.user.role) {
        return Err(refused(
            StatusCode::FORBIDDEN,
            "refused: only an operator may act; you are a viewer",
        ));
    }
    let key = JobKey::parse(key)
        .map_err(|e| (StatusCode::NOT_FOUND, format!("No run has this key: {e}.")))?;
    let action = match f.action.as_str() {
        "fail" => Action::Fail,
        "rerun" => Action::Rerun,
        "skip" => Action::Skip,
        _ => return Err(refused(StatusCode::BAD_REQUEST, "unknown action")),
    };
    let reason = crate::text::reason(&f.reason)
        .map_err(|e| (StatusCode::BAD_REQUEST, format!("reason: {e}")))?;
    Ok(OperatorRequest {
        action,
        key,
        operator: a.session.user.name.clone(),
        reason,
        force: f.force.as_deref() == Some("true"),
        stale_after: crate::config::JobConfig::default().stale_after,
        max_attempts: crate::config::JobConfig::default().max_attempts,
    })
}

pub(crate) async fn preview(
    State(app): State<Arc<App>>,
    Extension(a): Extension<Authed>,
    Path(key): Path<String>,
    Form(f): Form<ActionForm>,
) -> Response {
    let req = match request(&a, &key, &f) {
        Ok(r) => r,
        Err((StatusCode::NOT_FOUND, why)) => return not_found(&a, &why),
        Err((status, why)) => return refuse(status, &why),
    };
    match queue::preview_action(&app.pool, &req, Clock::Db).await {
        // No run with this key: the run's page says so, as a 404.
        Err(queue::QueueError::Invalid(why)) => {
            render(&app, &a, &req.key, Some(("error", why)), None, None).await
        }
        Err(e) => db_error(e),
        Ok(Err(refused)) => {
            render(
                &app,
                &a,
                &req.key,
                Some(("error", refused_text(&refused))),
                None,
                None,
            )
            .await
        }
        Ok(Ok(outcome)) => {
            let confirm = html! {
                div.note {
                    p { strong { (outcome.action) } " " (outcome.job_key) ": "
                        (badge(outcome.before.as_str())) " → " (badge(outcome.after.as_str()))
                        @if req.force { " (forced)" } }
                    p { "Reason: " (req.reason) }
                    p { "Recorded as operator " strong { (req.operator) } " from " (a.remote) "." }
                    form method="post" action={ (run_href(&outcome.job_key)) "/apply" } {
                        input type="hidden" name="csrf" value=(a.session.csrf);
                        input type="hidden" name="action" value=(outcome.action);
                        input type="hidden" name="reason" value=(req.reason);
                        input type="hidden" name="expected" value=(outcome.before);
                        @if req.force { input type="hidden" name="force" value="true"; }
                        button type="submit" { "Apply: " (outcome.action) " " (outcome.job_key) }
                        " "
                        a href=(run_href(&outcome.job_key)) { "Cancel" }
                    }
                }
            };
            render(&app, &a, &req.key, None, Some(confirm), None).await
        }
    }
}

pub(crate) async fn apply(
    State(app): State<Arc<App>>,
    Extension(a): Extension<Authed>,
    Path(key): Path<String>,
    Form(f): Form<ActionForm>,
) -> Response {
    let req = match request(&a, &key, &f) {
        Ok(r) => r,
        Err((StatusCode::NOT_FOUND, why)) => return not_found(&a, &why),
        Err((status, why)) => return refuse(status, &why),
    };
    // The state the preview showed, exactly as it printed it: anything else
    // is a form the preview did not write.
    let expected_before = match f.expected.as_deref().filter(|e| !e.is_empty()) {
        None => None,
        Some(e) => match e.parse::<RunStatus>() {
            Ok(s) => Some(s),
            Err(_) => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    "The previewed state is wrong; preview again.",
                )
            }
        },
    };
    let origin = Origin {
        remote_addr: a.remote.clone(),
        expected_before,
    };
    let terminate = f.terminate_blocker.as_deref() == Some("true");
    let opts = ActOptions {
        lock_timeout: LOCK_TIMEOUT,
        terminate_blocker: terminate,
        dry_run: false,
    };
    let refused = match blockers::act_from(&app.pool, &req, Clock::Db, opts, Some(&origin)).await {
        Ok(report) => {
            let outcome = report.outcome;
            tracing::info!(
                operator = %req.operator, remote = %a.remote, action = %outcome.action,
                key = %outcome.job_key, "console action applied"
            );
            return Redirect::to(&format!("{}?done=1", run_href(&outcome.job_key))).into_response();
        }
        Err(ActError::Queue(queue::QueueError::Database(e)))
            if e.as_database_error().and_then(|d| d.code()).as_deref() == Some("55P03") =>
        {
            // The holder locks the row against the audit row's key check
            // too (FOR UPDATE): nothing was ended and nothing changed.
            let why = format!(
                "{} {}: the session holding the run's row also keeps the audit row from being written, \
                 so it was not ended and nothing changed; see Stale for the session, and end it from psql \
                 (pg_terminate_backend) or wait for it",
                req.action.as_str(),
                req.key
            );
            return conflict(&app, &a, &req.key, why, None).await;
        }
        Err(ActError::Queue(queue::QueueError::Invalid(why))) => {
            return render(&app, &a, &req.key, Some(("error", why)), None, None).await
        }
        Err(ActError::Queue(e)) => return db_error(e),
        Err(ActError::Blocked(b)) => {
            // It names the holder and offers, as a second confirmation, to
            // end it (audited) and try once more, as `--terminate-blocker`.
            let mut why = format!(
                "{} {}: gave up after {} s waiting for the run's row, which another session holds",
                b.action, b.job_key, b.lock_timeout_seconds
            );
            for line in b.detail() {
                why.push_str(&format!("; {}", line.trim()));
            }
            if !b.terminated.is_empty() {
                why.push_str(" (even after ending the sessions that held it)");
            }
            let offer = (!terminate && !b.blockers.is_empty()).then(|| {
                html! {
                    div.note {
                        p { "Check the run's stale verdict first: ending a live worker's session fails its attempt. \
                             Ending the session writes a terminate-blocker row to the audit log first." }
                        form method="post" action={ (run_href(&req.key.to_string())) "/apply" } {
                            input type="hidden" name="csrf" value=(a.session.csrf);
                            input type="hidden" name="action" value=(req.action.as_str());
                            input type="hidden" name="reason" value=(req.reason);
                            input type="hidden" name="expected" value=(origin.expected_before.map_or("", RunStatus::as_str));
                            @if req.force { input type="hidden" name="force" value="true"; }
                            input type="hidden" name="terminate_blocker" value="true";
                            button type="submit" { "End the holding session and " (req.action.as_str()) }
                        }
                    }
                }
            });
            return conflict(&app, &a, &req.key, why, offer).await;
        }
        Err(ActError::Refused(r)) => r,
    };
    // Say who got there first, from the audit log.
    let last = queue::actions(&app.pool, &req.key)
        .await
        .ok()
        .and_then(|h| h.into_iter().last());
    let mut why = refused_text(&refused);
    if let Some(l) = last {
        why.push_str(&format!(
            ". Last action: {} by {} at {} ({} → {}): {}",
            l.action,
            l.operator,
            at(l.at),
            l.before_status,
            l.after_status,
            l.reason
        ));
    }
    conflict(&app, &a, &req.key, why, None).await
}

/// The run's page with `why` in an error box (and an optional offer), as a
/// 409: the action did not apply.
async fn conflict(
    app: &App,
    a: &Authed,
    key: &JobKey,
    why: String,
    offer: Option<Markup>,
) -> Response {
    let mut res = render(app, a, key, Some(("error", why)), offer, None).await;
    *res.status_mut() = StatusCode::CONFLICT;
    res
}
