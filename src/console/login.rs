//! Signing in and out: the sign-in page, its form, and the sign-out.
//!
//! - The page shows only fixed messages, chosen by a code in `?error=`
//!   ([`LoginError`]): a link cannot make the console's own page say
//!   something else. An unknown code shows a generic message.
//! - A try is counted per client address (`client_addr.rs`) and per name
//!   before its password is verified, and waits for its turn among the
//!   verifications that may run at once (`limits.rs`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Form, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;

use super::auth::{self, Refusal};
use super::html::{self};
use super::{
    client_of, cookie_value, refuse, set_cookie, App, Authed, LOGIN_COOKIE, SESSION_COOKIE,
};

/// Why the sign-in page is shown again: the only messages it shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginError {
    Wrong,
    Spent,
    Other,
}

impl LoginError {
    fn code(self) -> &'static str {
        match self {
            Self::Wrong => "wrong",
            Self::Spent => "spent",
            Self::Other => "failed",
        }
    }

    fn from_code(code: &str) -> Self {
        match code {
            "wrong" => Self::Wrong,
            "spent" => Self::Spent,
            _ => Self::Other,
        }
    }

    fn text(self) -> &'static str {
        match self {
            Self::Wrong => "Wrong user or password.",
            Self::Spent => {
                "This one-time sign-in has been used already; start the demo again for a new one."
            }
            Self::Other => "Sign-in failed; try again.",
        }
    }
}

#[derive(serde::Deserialize)]
pub(super) struct LoginQuery {
    next: Option<String>,
    error: Option<String>,
}

/// Only a path of this console, never another site, and only visible
/// ASCII (it goes into a `Location` header).
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && !n.contains('\\')
                && n.len() <= 2000
                && n.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            n.to_owned()
        }
        _ => "/".into(),
    }
}

pub(super) async fn login_form(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Query(q): Query<LoginQuery>,
) -> Response {
    // Another tab's sign-in form keeps working: the token is reused while
    // its cookie lasts.
    let token = cookie_value(&headers, LOGIN_COOKIE)
        .filter(|t| t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_owned)
        .unwrap_or_else(auth::random_token);
    let next = safe_next(q.next.as_deref());
    let error = q.error.as_deref().map(LoginError::from_code);
    let body = html::bare(
        "Sign in",
        html! {
            div.login {
                h1 { "batchonce console" }
                @if let Some(e) = error { (html::message("error", e.text())) }
                form method="post" action="/login" {
                    input type="hidden" name="csrf" value=(token);
                    input type="hidden" name="next" value=(next);
                    label { "User" input type="text" name="user" autocomplete="username" required; }
                    label { "Password" input type="password" name="password" autocomplete="current-password" required; }
                    button type="submit" { "Sign in" }
                }
            }
        },
    );
    let mut res = body.into_response();
    res.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(&app, LOGIN_COOKIE, &token, Some(600)),
    );
    res
}

#[derive(serde::Deserialize)]
pub(super) struct LoginForm {
    csrf: String,
    user: String,
    password: String,
    next: Option<String>,
}

/// A 429 with how long to wait.
fn too_many(why: &str, wait_secs: u64) -> Response {
    let wait = wait_secs.max(1);
    let mut res = refuse(
        StatusCode::TOO_MANY_REQUESTS,
        &format!("{why}; try again in {wait} s"),
    );
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(wait));
    res
}

pub(super) async fn login(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    let again = |why: LoginError| {
        Redirect::to(&format!(
            "/login?error={}&next={}",
            why.code(),
            html::encode(&safe_next(f.next.as_deref()))
        ))
        .into_response()
    };
    match cookie_value(&headers, LOGIN_COOKIE) {
        Some(c) if auth::same_secret(c, &f.csrf) => {}
        _ => {
            return refuse(
                StatusCode::FORBIDDEN,
                "refused: the sign-in form expired or came from elsewhere; open /login again",
            )
        }
    }
    let client = client_of(&app, peer, &headers);
    let name = crate::text::truncate(&f.user);
    // Counted now, before the verification: tries sent at once cannot all
    // slip under the limit while the first ones are still being verified.
    let attempt = match app.limiter.begin(&client.limit_key(), &name) {
        Ok(t) => t,
        Err(wait) => {
            tracing::warn!(user = %name, remote = %client, "console sign-in refused: too many tries");
            return too_many(
                "too many failed sign-ins from this address or for this user",
                wait.as_secs(),
            );
        }
    };
    let Some(turn) = app.gate.turn().await else {
        // No verification ran: the try costs nothing.
        app.limiter.refund(attempt);
        tracing::warn!(user = %name, remote = %client, "console sign-in refused: too many at once");
        return too_many(
            "the console is busy verifying other sign-ins",
            super::limits::VERIFY_WAIT.as_secs(),
        );
    };
    // argon2 is deliberately slow: off the async threads. The turn goes
    // with it, so a client that hangs up does not free it early.
    let users_app = app.clone();
    let (user, password) = (f.user.clone(), f.password.clone());
    let verified = tokio::task::spawn_blocking(move || {
        turn.run(|memory| users_app.users.verify_in(memory, &user, &password))
    })
    .await
    .unwrap_or(Err(Refusal::Wrong));
    let user = match verified {
        Ok(user) => user,
        Err(why) => {
            tracing::warn!(user = %name, remote = %client, reason = ?why, "console sign-in failed");
            return again(match why {
                Refusal::Wrong => LoginError::Wrong,
                Refusal::Spent => LoginError::Spent,
            });
        }
    };
    app.limiter.refund(attempt);
    tracing::info!(user = %user.name, remote = %client, "console sign-in");
    let id = app.sessions.open(user, false);
    let mut res = Redirect::to(&safe_next(f.next.as_deref())).into_response();
    let h = res.headers_mut();
    h.append(
        header::SET_COOKIE,
        set_cookie(&app, SESSION_COOKIE, &id, None),
    );
    h.append(
        header::SET_COOKIE,
        set_cookie(&app, LOGIN_COOKIE, "", Some(0)),
    );
    res
}

#[derive(serde::Deserialize)]
pub(super) struct CsrfOnly {
    csrf: String,
}

pub(super) async fn logout(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    axum::Extension(a): axum::Extension<Authed>,
    Form(f): Form<CsrfOnly>,
) -> Response {
    if !auth::same_secret(&f.csrf, &a.session.csrf) {
        return refuse(
            StatusCode::FORBIDDEN,
            "refused: missing or wrong CSRF token",
        );
    }
    if let Some(id) = cookie_value(&headers, SESSION_COOKIE) {
        app.sessions.close(id);
    }
    let mut res = Redirect::to("/login").into_response();
    res.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(&app, SESSION_COOKIE, "", Some(0)),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_choose_fixed_messages() {
        for e in [LoginError::Wrong, LoginError::Spent, LoginError::Other] {
            assert_eq!(LoginError::from_code(e.code()), e);
        }
        assert_eq!(LoginError::from_code("<b>call 555</b>"), LoginError::Other);
    }
}
