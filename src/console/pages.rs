//! The console's read-only pages: the run list, stale runs with their
//! evidence, the audit log and the registered processes (the overview is
//! `overview.rs`, a job's calendar `calendar.rs`). Each reads the queue's
//! and the registry's views on the database clock; none writes.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use maud::{html, Markup};

use super::html::{self, age, at, at_opt, badge, encode, run_href};
use super::run_query::{cursor, opt, query_path, run_filter, RunsQuery};
use super::{db_error, refuse, App, Authed};
use crate::clock::Clock;
use crate::key::JobName;
use crate::queue::{self, AuditFilter, RunStatus, StaleRun};
use crate::runtime::worker_registry;

/// Rows per page of the run list and the audit log.
const PAGE: u32 = 100;

/// The first [`PAGE`] of `rows` (read as one more than a page), and whether
/// there is more.
fn page_of<T>(rows: &[T]) -> (&[T], bool) {
    (
        &rows[..rows.len().min(PAGE as usize)],
        rows.len() > PAGE as usize,
    )
}

/// Runs filtered by job, state, business date range and key, a page at a
/// time, newest business date first.
pub(crate) async fn runs(
    State(app): State<Arc<App>>,
    Extension(a): Extension<Authed>,
    Query(q): Query<RunsQuery>,
) -> Response {
    let (filter, after) = match (run_filter(&q), cursor(&q)) {
        (Ok(f), Ok(c)) => (f, c),
        (Err(e), _) | (_, Err(e)) => return refuse(StatusCode::BAD_REQUEST, &e),
    };
    let rows = match queue::search_runs(&app.pool, &filter, after.as_ref(), PAGE + 1).await {
        Ok(r) => r,
        Err(e) => return db_error(e),
    };
    let (rows, more) = page_of(&rows);
    let base = query_path(
        "/runs",
        &[
            ("job", &q.job),
            ("status", &q.status),
            ("from", &q.from),
            ("to", &q.to),
            ("key", &q.key),
            ("scope", &q.scope),
        ],
    );
    // An operator's bulk actions on what the filter shows (bulk.rs).
    let bulk = match super::bulk::offer(&app, &a, &filter, &base).await {
        Ok(m) => m,
        Err(res) => return *res,
    };
    let next = rows.last().filter(|_| more).map(|r| {
        format!(
            "{base}&after={}",
            encode(&format!("{}|{}", r.business_date, r.job_key))
        )
    });
    let body = html! {
        h1 { "Runs" }
        form.filter method="get" action="/runs" {
            label { "Job" input type="text" name="job" value=(opt(&q.job).unwrap_or("")); }
            label { "State" select name="status" {
                option value="" { "any" }
                @for s in RunStatus::ALL {
                    option value=(s) selected[opt(&q.status) == Some(s.as_str())] { (s) }
                }
            } }
            label { "From" input type="date" name="from" value=(opt(&q.from).unwrap_or("")); }
            label { "To" input type="date" name="to" value=(opt(&q.to).unwrap_or("")); }
            label { "Key contains" input type="text" name="key" value=(opt(&q.key).unwrap_or("")); }
            label { "Scope" input type="text" name="scope" value=(opt(&q.scope).unwrap_or("")); }
            button type="submit" { "Filter" }
        }
        (bulk)
        (run_table(rows))
        @if rows.is_empty() { p.muted { "No run matches." } }
        p {
            @if after.is_some() { a href=(base) { "First page" } " " }
            @if let Some(n) = next { a href=(n) { "Next page" } }
        }
    };
    html::page("Runs", &a.session, body).into_response()
}

pub(crate) fn run_table(rows: &[queue::RunView]) -> Markup {
    html! {
        table {
            tr { th scope="col" { "Key" } th scope="col" { "State" } th scope="col" { "Attempts" } th scope="col" { "Processed" }
                 th scope="col" { "Failed items" } th scope="col" { "Finished" } th scope="col" { "Last error or reason" } }
            @for r in rows {
                tr {
                    td { a href=(run_href(&r.job_key)) { (r.job_key) } }
                    td { (badge(r.status.as_str())) }
                    td.num { (r.attempts) "/" (r.max_attempts) }
                    td.num { (r.processed_count) }
                    td.num { (r.failed_count) }
                    td { (at_opt(r.finished_at)) }
                    td { (r.error_message.as_deref().unwrap_or("")) }
                }
            }
        }
    }
}

/// Stale runs with their evidence and conclusion, as `runs stale` gives
/// them.
pub(crate) async fn stale(
    State(app): State<Arc<App>>,
    Extension(a): Extension<Authed>,
) -> Response {
    let runs = match queue::stale_runs(&app.pool, Clock::Db).await {
        Ok(r) => r,
        Err(e) => return db_error(e),
    };
    let may_act = html::may_act(a.session.user.role);
    let body = html! {
        h1 { "Stale runs" }
        @if runs.is_empty() { p.muted { "No run is stale." } }
        @for r in &runs {
            (stale_evidence(r))
            // A dead run's worker is gone: failing it is the way on. The
            // run page's preview shows the change before it applies.
            @if may_act && r.conclusion == queue::Conclusion::Dead {
                form.act method="post" action={ (run_href(&r.job_key)) "/preview" } {
                    input type="hidden" name="csrf" value=(a.session.csrf);
                    input type="hidden" name="action" value="fail";
                    label { "Reason (required)" input.reason type="text" name="reason" required minlength="3" maxlength="500"; }
                    button type="submit" { "Fail…" }
                    span.muted { "Its worker is gone; failing it ends its attempt. The next page shows the change before it applies." }
                }
            }
        }
    };
    html::page("Stale runs", &a.session, body).into_response()
}

/// One stale run's evidence and verdict (also on the run's page).
pub(crate) fn stale_evidence(r: &StaleRun) -> Markup {
    html! {
        h2 { a href=(run_href(&r.job_key)) { (r.job_key) } " — " strong { (r.conclusion) } }
        table {
            tr { th scope="row" { "Attempt" } td { (r.attempt) } }
            tr { th scope="row" { "Worker" } td { (r.worker_id.as_deref().unwrap_or("—")) } }
            tr { th scope="row" { "Running for" } td { (age(r.running_seconds)) } }
            tr { th scope="row" { "Lease expired" } td { (if r.lease_expired { "yes" } else { "no" }) } }
            tr { th scope="row" { "Heartbeat age" } td { (r.heartbeat_age_seconds.map(age).unwrap_or_else(|| "never".into())) } }
            tr { th scope="row" { "Processed" } td { (r.processed_count) (if r.advanced_since_heartbeat { " (advancing)" } else { " (not advancing)" }) } }
            tr { th scope="row" { "Worker last seen" } td { (r.worker_last_seen_age_seconds.map(|s| format!("{} ago", age(s))).unwrap_or_else(|| "never".into())) } }
            tr { th scope="row" { "Database session" } td { (if r.session_alive { "connected" } else { "none" }) } }
            @if let Some(w) = &r.lock_wait {
                tr { th scope="row" { "Waiting on a lock" } td {
                    "session " (w.pid) " waits"
                    (w.waiting_seconds.map(|s| format!(" for {}", age(s))).unwrap_or_default())
                    ul { @for b in &w.blockers { li { (b.session.describe()) } } }
                } }
            }
        }
    }
}

#[derive(serde::Deserialize, Default)]
pub(crate) struct AuditQuery {
    job: Option<String>,
    key: Option<String>,
    operator: Option<String>,
    action: Option<String>,
    before: Option<i64>,
}

/// The audit log, newest first, filtered and paged.
pub(crate) async fn audit(
    State(app): State<Arc<App>>,
    Extension(a): Extension<Authed>,
    Query(q): Query<AuditQuery>,
) -> Response {
    let job = match opt(&q.job).map(JobName::parse).transpose() {
        Ok(j) => j,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let filter = AuditFilter {
        job,
        key: opt(&q.key).map(|k| k.chars().take(120).collect()),
        operator: opt(&q.operator).map(|o| o.chars().take(80).collect()),
        action: opt(&q.action).map(|o| o.chars().take(20).collect()),
    };
    let rows = match queue::audit_log(&app.pool, &filter, q.before, PAGE + 1).await {
        Ok(r) => r,
        Err(e) => return db_error(e),
    };
    let (rows, more) = page_of(&rows);
    let base = query_path(
        "/audit",
        &[
            ("job", &q.job),
            ("key", &q.key),
            ("operator", &q.operator),
            ("action", &q.action),
        ],
    );
    let body = html! {
        h1 { "Audit log" }
        form.filter method="get" action="/audit" {
            label { "Job" input type="text" name="job" value=(opt(&q.job).unwrap_or("")); }
            label { "Key contains" input type="text" name="key" value=(opt(&q.key).unwrap_or("")); }
            label { "Operator" input type="text" name="operator" value=(opt(&q.operator).unwrap_or("")); }
            label { "Action" select name="action" {
                option value="" { "any" }
                @for s in ["fail", "rerun", "skip", "enqueue", "terminate-blocker", "archive", "pause", "resume"] {
                    option value=(s) selected[opt(&q.action) == Some(s)] { (s) }
                }
            } }
            button type="submit" { "Filter" }
        }
        table {
            tr { th scope="col" { "When" } th scope="col" { "Operator" } th scope="col" { "From" } th scope="col" { "Action" }
                 th scope="col" { "Run" } th scope="col" { "Change" } th scope="col" { "Reason" } }
            @for r in rows {
                tr {
                    td { (at(r.at)) }
                    td { (r.operator) br; span.muted { "db user " (r.session_user) } }
                    td { (r.remote_addr.as_deref().map(|x| format!("console, {x}")).unwrap_or_else(|| "command line".into())) }
                    td { (r.action) }
                    // An archive, pause or resume row names a job (`job:*`), not one run to link to.
                    td { @if r.job_key.ends_with(":*") { (r.job_key) } @else { a href=(run_href(&r.job_key)) { (r.job_key) } } }
                    td { (badge(&r.before_status)) " → " (badge(&r.after_status)) }
                    td { (r.reason) @if let Some(d) = &r.detail { br; span.muted { (d) } } }
                }
            }
        }
        @if rows.is_empty() { p.muted { "No audited action matches." } }
        p {
            @if q.before.is_some() { a href=(base) { "Newest" } " " }
            @if more { @if let Some(last) = rows.last() { a href={ (base) "&before=" (last.id) } { "Older" } } }
        }
    };
    html::page("Audit log", &a.session, body).into_response()
}

/// Registered processes: live first, with version and configuration
/// fingerprints.
pub(crate) async fn workers(
    State(app): State<Arc<App>>,
    Extension(a): Extension<Authed>,
) -> Response {
    let processes = match worker_registry::processes(&app.pool).await {
        Ok(p) => p,
        Err(e) => return db_error(e),
    };
    let (left_out, left_out_n) = match queue::registry_problems(&app.pool).await {
        Ok(p) => p,
        Err(e) => return db_error(e),
    };
    let body = html! {
        h1 { "Workers and producers" }
        (registry_note(&left_out, left_out_n))
        table {
            tr { th scope="col" { "Process" } th scope="col" { "Role" } th scope="col" { "Live" } th scope="col" { "Host" }
                 th scope="col" { "PID" } th scope="col" { "Version" } th scope="col" { "Started" } th scope="col" { "Last seen" }
                 th scope="col" { "Configuration" } }
            @for p in &processes {
                tr {
                    td { (p.worker_id) } td { (p.role) } td { (if p.live { "live" } else { "gone" }) }
                    td { (p.host) } td.num { (p.pid) } td { (p.version) }
                    td { (at(p.started_at)) } td { (at(p.last_seen)) }
                    td { @for (job, fp) in &p.jobs { (job) " " code { (fp) } br; } }
                }
            }
        }
        @if processes.is_empty() { p.muted { "No process has registered." } }
    };
    html::page("Workers", &a.session, body).into_response()
}

/// The registry rows every view leaves out (`queue::registry_problems`),
/// named on the page; nothing when there are none.
pub(crate) fn registry_note(rows: &[queue::RegistryProblem], total: i64) -> Markup {
    html! {
        @if total > 0 {
            div.note {
                strong { "Registry rows left out: " (total) } ". No view believes them; delete them as the tables' owner, or stop the process that writes them."
                ul { @for p in rows { li { (crate::text::escape_for_terminal(&p.describe())) } } }
            }
        }
    }
}
