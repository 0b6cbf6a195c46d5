//! The overview (`/`): the banners, then every job's numbers from
//! `queue::job_health`, the very answer `batchonce status` prints (MISSING
//! periods, overdue, FAILED, stale, PENDING and RUNNING runs, live workers),
//! each with a chart of its newest runs, the MISSING periods with why, then
//! the live processes and configuration drift. It reloads itself every
//! [`REFRESH_SECONDS`](super::html::REFRESH_SECONDS) seconds (a meta
//! refresh: no script), unless `?refresh=off`.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use maud::{html, Markup};

use super::chart::{self, Size};
use super::html::{self, age, at, badge, encode, run_href};
use super::pages::registry_note;
use super::{db_error, App, Authed};
use crate::clock::Clock;
use crate::queue::{self, JobHealth, RECENT_RUNS};
use crate::runtime::worker_registry;

#[derive(serde::Deserialize, Default)]
pub(crate) struct OverviewQuery {
    /// `off` stops the page refreshing itself.
    refresh: Option<String>,
}

/// A count linked to the runs it counts, or a plain 0.
fn linked(n: i64, href: String) -> Markup {
    html! { @if n > 0 { a href=(href) { (n) } } @else { "0" } }
}

/// The MISSING cell: the count linked to the calendar, or why it is not
/// known.
fn missing_cell(j: &JobHealth) -> Markup {
    let m = &j.missing;
    html! {
        @if !m.known {
            span.muted title=(m.why_not.as_deref().unwrap_or("")) { (m.shown()) }
        } @else if m.count > 0 {
            a href={ "/jobs/" (encode(&j.job_name)) } { (m.shown()) }
        } @else {
            (m.shown())
        }
    }
}

/// Every job's health, the banners, the live processes and drift.
pub(crate) async fn overview(
    State(app): State<Arc<App>>,
    Extension(a): Extension<Authed>,
    Query(q): Query<OverviewQuery>,
) -> Response {
    let health = match queue::job_health(&app.pool, Clock::Db).await {
        Ok(h) => h,
        Err(e) => return db_error(e),
    };
    let names: Vec<String> = health.jobs.iter().map(|j| j.job_name.clone()).collect();
    let recent = match queue::recent_runs(&app.pool, &names, RECENT_RUNS, Clock::Db).await {
        Ok(r) => r,
        Err(e) => return db_error(e),
    };
    let processes = match worker_registry::processes(&app.pool).await {
        Ok(p) => p,
        Err(e) => return db_error(e),
    };
    let drift = match worker_registry::config_drift(&app.pool).await {
        Ok(d) => d,
        Err(e) => return db_error(e),
    };
    let (left_out, left_out_n) = match queue::registry_problems(&app.pool).await {
        Ok(p) => p,
        Err(e) => return db_error(e),
    };
    let refresh = html::refresh_on(q.refresh.as_deref());
    let live: Vec<_> = processes.iter().filter(|p| p.live).collect();
    let with_missing: Vec<&JobHealth> = health
        .jobs
        .iter()
        .filter(|j| !j.missing.periods.is_empty())
        .collect();
    let body = html! {
        (html::refresh_toggle("/", refresh))
        h1 { "Overview" }
        @for b in &health.banners { div.error.banner role="alert" { (b.message()) } }
        @if health.workers_without_jobs > 0 {
            div.note {
                (health.workers_without_jobs) " live worker(s) recorded no jobs (a release before the registry recorded them, or re-registered after an operator deleted its row): counted as serving every job."
            }
        }
        table.jobs {
            tr {
                th scope="col" { "Job" } th scope="col" { "Last " (RECENT_RUNS) " runs" } th scope="col" { "Newest period" } th scope="col" { "State" }
                th scope="col" { "MISSING" } th scope="col" { "Overdue" } th scope="col" { "FAILED" } th scope="col" { "Stale" } th scope="col" { "Pending" }
                th scope="col" { "Oldest due" } th scope="col" { "Running" } th scope="col" { "Workers" } th scope="col" { "Calendar" }
            }
            @for j in &health.jobs {
                @let job = &j.job_name;
                @let runs = recent.get(job).map(Vec::as_slice).unwrap_or(&[]);
                tr id={ "job-" (job) } {
                    td { a href={ "/runs?job=" (encode(job)) } { (job) }
                         @if j.paused_seconds.is_some() { " " span.badge.PAUSED { "paused" } } }
                    td { @if !runs.is_empty() { (chart::runs_chart(job, runs, Size::Small)) } }
                    @match runs.first() {
                        Some(r) => {
                            td { a href=(run_href(&r.job_key)) { (r.job_key) } }
                            td { (badge(r.status.as_str())) }
                        }
                        None => { td.muted { "no runs" } td { (html::nbsp()) } }
                    }
                    td.num.missing { (missing_cell(j)) }
                    td.num.overdue { (linked(j.overdue, format!("/runs?status=PENDING&job={}", encode(job)))) }
                    td.num.failed { (linked(j.failed, format!("/runs?status=FAILED&job={}", encode(job)))) }
                    td.num.stale { (linked(j.stale, "/stale".to_owned())) }
                    td.num.pending { (j.pending) }
                    td.num { @if j.due > 0 { (age(j.oldest_due_seconds)) } @else { "—" } }
                    td.num.running { (j.running) }
                    td.num.workers { (j.workers) }
                    td { a href={ "/jobs/" (encode(job)) } { "calendar" } }
                }
            }
        }
        @if health.jobs.is_empty() { p.muted { "No job is declared, recorded or has runs." } }
        @if !with_missing.is_empty() {
            h2 { "Missing periods" }
            table {
                tr { th scope="col" { "Job" } th scope="col" { "Period" } th scope="col" { "Why" } }
                @for j in &with_missing {
                    @for m in &j.missing.periods {
                        tr { td { (j.job_name) } td { (m.period) } td { (m.why) } }
                    }
                    @if j.missing.count > j.missing.periods.len() {
                        tr { td { (j.job_name) } td.muted colspan="2" {
                            "and " (j.missing.count - j.missing.periods.len())
                            @if j.missing.at_least { " or more" } " more: "
                            a href={ "/jobs/" (encode(&j.job_name)) } { "see the calendar" }
                        } }
                    }
                }
            }
        }
        h2 { "Live processes: " (live.len()) }
        @if live.is_empty() { p.muted { "No worker or producer is live." } }
        @else {
            table {
                tr { th scope="col" { "Process" } th scope="col" { "Role" } th scope="col" { "Host" } th scope="col" { "Version" } th scope="col" { "Last seen" } }
                @for p in &live {
                    tr { td { (p.worker_id) } td { (p.role) } td { (p.host) } td { (p.version) } td { (at(p.last_seen)) } }
                }
            }
        }
        (registry_note(&left_out, left_out_n))
        h2 { "Configuration drift" }
        @if drift.is_empty() { p.muted { "Every live process runs the same configuration of each job." } }
        @for d in &drift {
            div.note {
                strong { (d.job_name) } ": live processes disagree on " (d.keys.join(", ")) "."
                ul { @for p in &d.processes {
                    li { (p.process_id) " (" (p.role) " on " (p.host) "): fingerprint " code { (p.fingerprint) } }
                } }
            }
        }
    };
    html::page_with(
        "Overview",
        &a.session,
        body,
        refresh.then_some(html::REFRESH_SECONDS),
    )
    .into_response()
}
