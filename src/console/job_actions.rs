//! Pausing and resuming a job from the console (issue 44): the POST routes
//! `/jobs/{job}/pause` and `/jobs/{job}/resume`, and [`pause_controls`], the
//! job's paused state with the form that changes it, for the job's pages.
//!
//! An action is one request (no preview: nothing about a run is changed,
//! and resume undoes pause), with a required reason. As for every console
//! action, the CSRF token and the same origin are checked (the latter by
//! `mod.rs`), only the `operator` role may act, the operator recorded is
//! the signed-in user, never a name from the form, and the audit row
//! records the client's address. The change itself is the queue's
//! `pause::pause` or `pause::resume`, which call the audited database
//! functions; a refusal (already paused, not paused, the due list busy) is
//! shown as the database said it, and nothing changes.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use maud::{html, Markup};

use super::auth::{self, Session};
use super::html::{self, age, at, encode};
use super::{db_error, refuse, App, Authed};
use crate::clock::Clock;
use crate::key::JobName;
use crate::queue::pause::{self, PauseError, PauseRequest};
use crate::queue::Paused;

/// The form of both routes.
#[derive(serde::Deserialize)]
pub(crate) struct JobActionForm {
    csrf: Option<String>,
    reason: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Pause,
    Resume,
}

impl Verb {
    fn as_str(self) -> &'static str {
        match self {
            Self::Pause => "pause",
            Self::Resume => "resume",
        }
    }
}

pub(crate) async fn pause(
    State(app): State<Arc<App>>,
    Extension(a): Extension<Authed>,
    Path(job): Path<String>,
    Form(f): Form<JobActionForm>,
) -> Response {
    act(&app, &a, &job, &f, Verb::Pause).await
}

pub(crate) async fn resume(
    State(app): State<Arc<App>>,
    Extension(a): Extension<Authed>,
    Path(job): Path<String>,
    Form(f): Form<JobActionForm>,
) -> Response {
    act(&app, &a, &job, &f, Verb::Resume).await
}

/// The checks of [`request`], then the action; back to the job's page when
/// it applied.
async fn act(app: &App, a: &Authed, job: &str, f: &JobActionForm, verb: Verb) -> Response {
    let req = match request(a, job, f) {
        Ok(r) => r,
        Err((status, why)) => return refuse(status, &why),
    };
    let remote = Some(a.remote.as_str());
    let done = match verb {
        Verb::Pause => pause::pause(&app.pool, &req, Clock::Db, remote)
            .await
            .map(|o| o.runs_held),
        Verb::Resume => pause::resume(&app.pool, &req, Clock::Db, remote)
            .await
            .map(|o| o.runs_released),
    };
    match done {
        Ok(runs) => {
            tracing::info!(
                operator = %req.operator, remote = %a.remote, action = verb.as_str(),
                job = %req.job, runs, "console job action applied"
            );
            Redirect::to(&format!("/jobs/{}", encode(req.job.as_str()))).into_response()
        }
        Err(PauseError::Conflict(why)) => refuse(StatusCode::CONFLICT, &why),
        Err(PauseError::Invalid(why)) => refuse(StatusCode::BAD_REQUEST, &why),
        Err(e @ PauseError::Busy { .. }) => refuse(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        Err(PauseError::Queue(e)) => db_error(e),
    }
}

/// The checks every job action passes: the CSRF token, the role, the job's
/// name and the reason. The operator is the session's user. A refusal is
/// its status and one line.
fn request(a: &Authed, job: &str, f: &JobActionForm) -> Result<PauseRequest, (StatusCode, String)> {
    match &f.csrf {
        Some(t) if auth::same_secret(t, &a.session.csrf) => {}
        _ => {
            return Err((
                StatusCode::FORBIDDEN,
                "refused: missing or wrong CSRF token; reload the page and try again".to_owned(),
            ))
        }
    }
    if !html::may_act(a.session.user.role) {
        return Err((
            StatusCode::FORBIDDEN,
            "refused: only an operator may act; you are a viewer".to_owned(),
        ));
    }
    let job = JobName::parse(job).map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))?;
    let reason = crate::text::reason(f.reason.as_deref().unwrap_or(""))
        .map_err(|e| (StatusCode::BAD_REQUEST, format!("reason: {e}")))?;
    Ok(PauseRequest {
        job,
        operator: a.session.user.name.clone(),
        reason,
    })
}

/// A job's paused state and, for an operator, the form that pauses or
/// resumes it (with the session's CSRF token and a required reason); a
/// viewer sees the state only. `paused` is the job's row of
/// `queue::paused_jobs`, `None` while it is not paused.
pub(crate) fn pause_controls(job: &str, paused: Option<&Paused>, session: &Session) -> Markup {
    let may_act = html::may_act(session.user.role);
    let (verb, label) = match paused {
        Some(_) => (Verb::Resume, "Resume"),
        None => (Verb::Pause, "Pause"),
    };
    html! {
        @if let Some(p) = paused {
            div.note {
                strong { "Paused" } " since " (at(p.paused_at)) " (" (age(p.paused_seconds)) ") by "
                (p.paused_by) ": " (p.reason)
                ". Its runs are not claimed (RUNNING runs finish); the producer still enqueues them."
            }
        }
        @if may_act {
            form.act method="post" action={ "/jobs/" (encode(job)) "/" (verb.as_str()) } {
                input type="hidden" name="csrf" value=(session.csrf);
                strong { (label) " " (job) }
                label { "Reason (required)" input.reason type="text" name="reason" required minlength="3" maxlength="500"; }
                button type="submit" { (label) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::auth::{Role, Sessions, User};

    fn session(role: Role) -> Session {
        let sessions = Sessions::default();
        let id = sessions.open(
            User {
                name: "alice".into(),
                role,
            },
            false,
        );
        sessions.get(&id).expect("the session just opened")
    }

    #[test]
    fn an_operator_gets_the_form_with_the_token_and_a_viewer_only_the_state() {
        let op = session(Role::Operator);
        let form = pause_controls("settle", None, &op).into_string();
        assert!(form.contains(r#"action="/jobs/settle/pause""#), "{form}");
        assert!(form.contains(&format!(r#"name="csrf" value="{}""#, op.csrf)));
        assert!(form.contains(r#"name="reason" required"#), "{form}");
        let paused = Paused {
            job: "settle".into(),
            paused_at: chrono::Utc::now(),
            paused_by: "bob".into(),
            reason: "<script>x</script> bank file late".into(),
            paused_seconds: 4000.0,
        };
        let page = pause_controls("settle", Some(&paused), &op).into_string();
        assert!(page.contains(r#"action="/jobs/settle/resume""#), "{page}");
        // Stored text is escaped, never markup.
        assert!(
            page.contains("&lt;script&gt;x&lt;/script&gt; bank file late"),
            "{page}"
        );
        assert!(!page.contains("<script>"), "{page}");
        let viewer = pause_controls("settle", Some(&paused), &session(Role::Viewer)).into_string();
        assert!(viewer.contains("Paused"), "{viewer}");
        assert!(!viewer.contains("<form"), "{viewer}");
    }
}
