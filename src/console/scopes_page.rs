//! The console's page of scoped runs: for each scoped job, its newest period
//! and every older one with scopes not done, with how many of the period's
//! scopes are in each state and which (the first few by name, each linked
//! to its run; the count links to the run list of that state). It reads
//! `queue::scope_periods`, the view `status` prints, so both tell the same.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use maud::html;

use super::html::{self, badge, encode, run_href};
use super::{db_error, refuse, App, Authed};
use crate::key::JobName;
use crate::queue;

#[derive(serde::Deserialize, Default)]
pub(crate) struct ScopesQuery {
    job: Option<String>,
    /// How many of each job's newest periods to show (1–30), besides the
    /// older ones with scopes not done.
    periods: Option<i64>,
}

/// Scoped jobs' periods, their scopes per state, and which.
pub(crate) async fn scopes(
    State(app): State<Arc<App>>,
    Extension(a): Extension<Authed>,
    Query(q): Query<ScopesQuery>,
) -> Response {
    let job = match q
        .job
        .as_deref()
        .map(str::trim)
        .filter(|j| !j.is_empty())
        .map(JobName::parse)
        .transpose()
    {
        Ok(j) => j,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let newest = q.periods.unwrap_or(3);
    if !(1..=30).contains(&newest) {
        return refuse(StatusCode::BAD_REQUEST, "periods must be 1 to 30");
    }
    let periods = match queue::scope_periods(&app.pool, job.as_ref(), newest).await {
        Ok(p) => p,
        Err(e) => return db_error(e),
    };
    let body = html! {
        h1 { "Scoped runs" }
        form.filter method="get" action="/scopes" {
            label { "Job" input type="text" name="job" value=(job.as_ref().map_or("", JobName::as_str)); }
            label { "Newest periods" input type="number" name="periods" min="1" max="30" value=(newest); }
            button type="submit" { "Show" }
        }
        p.muted { "Each job's newest periods, and every older period with a scope PENDING, RUNNING or FAILED. A scope's run is an ordinary run: open it to see its attempts or to act on it." }
        @if periods.is_empty() { p.muted { "No scoped run matches." } }
        @for p in &periods {
            h2 { (p.period_key) " — " (p.scopes) " scopes" @if p.open() > 0 { ", " (p.open()) " not done" } }
            table {
                tr { th scope="col" { "State" } th scope="col" { "Scopes" } th scope="col" { "Which" } }
                @for s in p.states.iter().filter(|s| s.count > 0) {
                    @let list = format!("/runs?job={}&status={}&key={}", encode(&p.job_name), encode(s.status.as_str()), encode(&format!("{}@", p.period_key)));
                    tr {
                        td { (badge(s.status.as_str())) }
                        td.num { a href=(list) { (s.count) } }
                        td {
                            @for (i, scope) in s.named.iter().enumerate() {
                                @if i > 0 { ", " }
                                a href=(run_href(&format!("{}@{}", p.period_key, scope))) { (scope) }
                            }
                            @if s.count > s.named.len() as i64 {
                                " and " a href=(list) { (s.count - s.named.len() as i64) " more" }
                            }
                        }
                    }
                }
            }
        }
        @if periods.len() as i64 >= queue::MAX_PERIODS {
            (html::message("note", &format!("Only {} periods are shown; choose a job.", queue::MAX_PERIODS)))
        }
    };
    html::page("Scoped runs", &a.session, body).into_response()
}
