//! `batchonce console`: the operator's web console. Server-rendered HTML
//! from this process (no script, no asset from anywhere else), read from
//! the database on every request, with the same audited actions as the
//! command line.
//!
//! - `auth.rs`: users, sessions, CSRF tokens.
//! - `login.rs`: the sign-in page and form, and the sign-out.
//! - `limits.rs`: the sign-in limit and the bound on argon2 verifications.
//! - `client_addr.rs`: the client's address, behind a trusted proxy too.
//! - `html.rs`: the page frame, the style sheet and small markup helpers.
//! - `overview.rs`: every job's health (`queue::job_health`, what `status`
//!   prints too) with the banners, refreshing itself.
//! - `pages.rs`: runs, stale runs, audit log, workers.
//! - `run_query.rs`: the run list's filter, which `bulk.rs` acts on too.
//! - `calendar.rs`: a job's business periods, including missing ones, in
//!   its time zone.
//! - `chart.rs`: a job's newest runs as an inline SVG chart.
//! - `run_page.rs`: one run, and the fail / rerun / skip actions with their
//!   preview.
//! - `job_actions.rs`: pausing and resuming a job, and its paused state
//!   with the form for the job's pages.
//! - `bulk.rs`: re-run or skip every run a filter of the run list shows,
//!   with one reason, a preview naming every key, and a report per key.
//! - `enqueue.rs`: enqueue a job's missing periods, with a preview and a
//!   reason, from the job's declaration in the database.
//!
//! An address that names no page, job or run answers 404 with the page
//! frame (its navigation), once signed in.
//!
//! Every route but `/healthz`, `/login` and the style sheet needs a
//! session; every POST needs the session's CSRF token and a same-origin
//! request; only the `operator` role may act. Every response forbids
//! framing, scripts and caching. The console must never write a job table
//! with its own SQL: its actions are the queue's `blockers::act_from`, which
//! calls the audited database functions, and the database role of
//! `batchonce roles` (`<prefix>_console`) can do nothing else.

pub mod auth;
mod bulk;
mod calendar;
mod chart;
pub mod client_addr;
mod enqueue;
mod html;
mod job_actions;
pub mod limits;
mod login;
mod overview;
mod pages;
mod run_page;
mod run_query;
mod scopes_page;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use maud::html;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use auth::{Session, Sessions, Users};
use client_addr::{Cidr, ClientAddr};
use limits::{LoginLimiter, VerifyGate};

/// The header a trusted reverse proxy puts the shared secret in.
pub const PROXY_SECRET_HEADER: &str = "x-batchonce-proxy-secret";
/// The session cookie, and the login form's double-submit cookie.
pub(crate) const SESSION_COOKIE: &str = "batchonce_session";
pub(crate) const LOGIN_COOKIE: &str = "batchonce_login";

/// Sign-in through a trusted reverse proxy.
#[derive(Clone)]
pub struct ProxyAuth {
    /// The header holding the signed-in user's name (lower case).
    pub user_header: String,
    /// What the proxy sends in [`PROXY_SECRET_HEADER`].
    pub secret: String,
}

/// How the console is served.
pub struct ConsoleOptions {
    pub listen: SocketAddr,
    pub users: Users,
    pub proxy: Option<ProxyAuth>,
    /// Mark cookies `Secure` (browsers then send them only over HTTPS):
    /// `None` marks them unless `listen` is a loopback address, where a
    /// browser reaches the console without TLS.
    pub secure_cookies: Option<bool>,
    /// Reverse proxies whose `X-Forwarded-For` names the client.
    pub trusted_proxies: Vec<Cidr>,
}

impl ConsoleOptions {
    /// Options with no proxy and the defaults for `listen`.
    pub fn new(listen: SocketAddr, users: Users) -> Self {
        Self {
            listen,
            users,
            proxy: None,
            secure_cookies: None,
            trusted_proxies: Vec::new(),
        }
    }

    /// Whether cookies are marked `Secure`: as told, or unless the console
    /// listens on loopback.
    pub fn secure(&self) -> bool {
        self.secure_cookies
            .unwrap_or(!self.listen.ip().is_loopback())
    }
}

/// Why the console could not start.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("no way to sign in: give --users FILE (with at least one user), or --proxy-user-header with --proxy-secret-env")]
    NoUsers,
    #[error("the console stopped: {0}")]
    Serve(std::io::Error),
}

pub(crate) struct App {
    pub pool: PgPool,
    pub users: Users,
    pub proxy: Option<ProxyAuth>,
    pub secure: bool,
    pub sessions: Sessions,
    pub limiter: LoginLimiter,
    pub gate: VerifyGate,
    pub trusted_proxies: Vec<Cidr>,
}

/// The signed-in request: its session and where it came from.
#[derive(Clone)]
pub(crate) struct Authed {
    pub session: Session,
    pub remote: String,
}

/// The console's routes over `pool`.
pub fn router(pool: PgPool, opts: ConsoleOptions) -> Result<Router, ConsoleError> {
    if opts.users.is_empty() && opts.proxy.is_none() {
        return Err(ConsoleError::NoUsers);
    }
    let secure = opts.secure();
    let app = Arc::new(App {
        pool,
        gate: VerifyGate::new(opts.users.stats()),
        users: opts.users,
        proxy: opts.proxy,
        secure,
        sessions: Sessions::default(),
        limiter: LoginLimiter::default(),
        trusted_proxies: opts.trusted_proxies,
    });
    let signed_in = Router::new()
        .route("/", get(overview::overview))
        .route("/runs", get(pages::runs))
        .route("/runs/bulk", get(bulk::preview))
        .route("/runs/bulk/apply", post(bulk::apply))
        .route("/runs/{key}", get(run_page::show))
        .route("/runs/{key}/preview", post(run_page::preview))
        .route("/runs/{key}/apply", post(run_page::apply))
        .route("/jobs/{job}", get(calendar))
        .route("/jobs/{job}/pause", post(job_actions::pause))
        .route("/jobs/{job}/resume", post(job_actions::resume))
        .route("/jobs/{job}/enqueue/preview", post(enqueue::preview))
        .route("/jobs/{job}/enqueue/apply", post(enqueue::apply))
        .route("/scopes", get(scopes_page::scopes))
        .route("/stale", get(pages::stale))
        .route("/audit", get(pages::audit))
        .route("/workers", get(pages::workers))
        .route("/logout", post(login::logout))
        // Behind the sign-in like every page: an address that names
        // nothing asks a signed-out browser to sign in first.
        .fallback(no_such_page)
        .layer(middleware::from_fn_with_state(app.clone(), authenticate));
    Ok(Router::new()
        .route("/healthz", get(healthz))
        .route("/console.css", get(css))
        // Browsers ask for it on every page; answered here, it never
        // becomes a redirect to the sign-in page (which would replace the
        // sign-in form's token while the form is open).
        .route("/favicon.ico", get(|| async { StatusCode::NOT_FOUND }))
        .route("/login", get(login::login_form).post(login::login))
        .merge(signed_in)
        .layer(middleware::from_fn(same_origin))
        .layer(middleware::map_response(security_headers))
        .with_state(app))
}

/// Serves the console on `opts.listen` until `stop`.
pub async fn serve(
    pool: PgPool,
    opts: ConsoleOptions,
    stop: CancellationToken,
) -> Result<(), ConsoleError> {
    let addr = opts.listen;
    let app = router(pool, opts)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ConsoleError::Listen { addr, source })?;
    tracing::info!(%addr, "console listening");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move { stop.cancelled().await })
    .await
    .map_err(ConsoleError::Serve)
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn css() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        html::CSS,
    )
        .into_response()
}

/// No framing, no script, no plug-in, nothing from elsewhere, no caching
/// of pages that show runs, and no referrer carrying a key to another site.
async fn security_headers(mut res: Response) -> Response {
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        // Not `no-referrer`: with it, Chromium sends `Origin: null` on the
        // console's own forms, which the same-origin check must refuse.
        HeaderValue::from_static("same-origin"),
    );
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    res
}

/// A POST from another site is refused before anything reads its form,
/// whatever cookie it carries (the CSRF token is checked as well).
async fn same_origin(req: Request, next: Next) -> Response {
    if req.method() == Method::POST {
        let h = req.headers();
        // The host the browser used: ours, or the one a reverse proxy says
        // it forwarded (a form on another site cannot set that header).
        let hosts: Vec<&str> = [header::HOST.as_str(), "x-forwarded-host"]
            .iter()
            .filter_map(|n| h.get(*n).and_then(|v| v.to_str().ok()))
            .filter_map(|v| v.split(',').next())
            .map(str::trim)
            .collect();
        let origin = h.get(header::ORIGIN).and_then(|v| v.to_str().ok());
        // What the browser itself says about where the request comes from;
        // a page cannot set it.
        let fetch_site = h.get("sec-fetch-site").and_then(|v| v.to_str().ok());
        let cross_origin = match origin {
            // An opaque origin (a sandboxed frame, a privacy setting) is
            // trusted only when the browser says the form is our own.
            Some("null") => fetch_site != Some("same-origin"),
            Some(o) => {
                let authority = o.split_once("://").map(|(_, a)| a).unwrap_or(o);
                !hosts.contains(&authority)
            }
            None => false,
        };
        let cross_site = fetch_site.is_some_and(|s| s == "cross-site" || s == "same-site");
        if cross_origin || cross_site {
            return refuse(
                StatusCode::FORBIDDEN,
                "refused: the form was sent from another site",
            );
        }
    }
    next.run(req).await
}

pub(crate) fn cookie_value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

pub(crate) fn set_cookie(app: &App, name: &str, value: &str, max_age: Option<u64>) -> HeaderValue {
    let mut c = format!("{name}={value}; Path=/; HttpOnly; SameSite=Strict");
    if let Some(age) = max_age {
        c.push_str(&format!("; Max-Age={age}"));
    }
    if app.secure {
        c.push_str("; Secure");
    }
    // Names and values are ours: ASCII letters, digits, `_` and `=`.
    HeaderValue::from_str(&c).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// A plain page saying why a request was refused.
pub(crate) fn refuse(status: StatusCode, why: &str) -> Response {
    let body = html::bare(
        "Refused",
        html! { main { h1 { "Refused" } (html::message("error", why)) p { a href="/" { "Back to the overview" } } } },
    );
    (status, body).into_response()
}

/// The checks every action request passes before its form is looked at:
/// the session's CSRF token, and the operator role. A refusal is the page
/// to answer with.
pub(crate) fn refuse_act(a: &Authed, csrf: Option<&str>) -> Option<Response> {
    match csrf {
        Some(t) if auth::same_secret(t, &a.session.csrf) => {}
        _ => {
            return Some(refuse(
                StatusCode::FORBIDDEN,
                "refused: missing or wrong CSRF token; reload the page and try again",
            ))
        }
    }
    if !html::may_act(a.session.user.role) {
        return Some(refuse(
            StatusCode::FORBIDDEN,
            "refused: only an operator may act; you are a viewer",
        ));
    }
    None
}

/// A 404 with the page frame, so the navigation is there to go on from.
pub(crate) fn not_found(a: &Authed, why: &str) -> Response {
    let body = html! {
        h1 { "Not found" }
        (html::message("error", why))
        p { a href="/" { "Overview" } " · " a href="/runs" { "Runs" } }
    };
    (
        StatusCode::NOT_FOUND,
        html::page("Not found", &a.session, body),
    )
        .into_response()
}

async fn no_such_page(Extension(a): Extension<Authed>) -> Response {
    not_found(&a, "There is no page at this address.")
}

/// A job's calendar, for a job the database knows (declared, run or
/// recorded); any other name is a 404.
async fn calendar(
    State(app): State<Arc<App>>,
    Extension(a): Extension<Authed>,
    Path(job): Path<String>,
    query: Query<calendar::CalendarQuery>,
) -> Response {
    match known_job(&app, &a, &job).await {
        Ok(_) => calendar::calendar(State(app), Extension(a), Path(job), query).await,
        Err(res) => *res,
    }
}

/// The job `name` names, if the database knows it; otherwise the 404 (or
/// the database error) to answer with.
pub(crate) async fn known_job(
    app: &App,
    a: &Authed,
    name: &str,
) -> Result<crate::key::JobName, Box<Response>> {
    let shown: String = name.chars().take(80).collect();
    let unknown = || Box::new(not_found(a, &format!("No job is named {shown}.")));
    let Ok(job) = crate::key::JobName::parse(name) else {
        return Err(unknown());
    };
    match crate::queue::job_known(&app.pool, &job).await {
        Ok(true) => Ok(job),
        Ok(false) => Err(unknown()),
        Err(e) => Err(Box::new(db_error(e))),
    }
}

/// The client a request comes from: see `client_addr.rs`. The peer is a
/// trusted proxy when its address is in `--trusted-proxy`, or when it
/// sends the proxy secret.
pub(crate) fn client_of(app: &App, peer: SocketAddr, headers: &HeaderMap) -> ClientAddr {
    let with_secret = app.proxy.as_ref().is_some_and(|p| {
        headers
            .get(PROXY_SECRET_HEADER)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|s| auth::same_secret(s, &p.secret))
    });
    ClientAddr::of(peer, headers, &app.trusted_proxies, with_secret)
}

/// Resolves the session (or the proxy's user) and passes it on; without
/// one, a page asks to sign in and anything else is refused.
async fn authenticate(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut req: Request,
    next: Next,
) -> Response {
    let headers = req.headers().clone();
    let cookie = cookie_value(&headers, SESSION_COOKIE).map(str::to_owned);
    let mut new_cookie = None;
    let session = if let Some(proxy) = &app.proxy {
        let secret = headers
            .get(PROXY_SECRET_HEADER)
            .and_then(|v| v.to_str().ok());
        let user = headers
            .get(proxy.user_header.as_str())
            .and_then(|v| v.to_str().ok());
        match (secret, user) {
            (Some(s), Some(name)) if auth::same_secret(s, &proxy.secret) => {
                let Some(user) = app.users.proxied(name) else {
                    return refuse(
                        StatusCode::FORBIDDEN,
                        "refused: the proxy's user is not in the console's users file",
                    );
                };
                match cookie.as_deref().and_then(|id| app.sessions.get(id)) {
                    Some(s) if s.proxied && s.user.name == user.name => Some(s),
                    _ => {
                        let id = app.sessions.open(user, true);
                        let s = app.sessions.get(&id);
                        new_cookie = Some(id);
                        s
                    }
                }
            }
            (Some(_), _) => {
                return refuse(
                    StatusCode::FORBIDDEN,
                    "refused: wrong proxy secret or no user header",
                )
            }
            // Without the proxy's secret, only a password session counts.
            (None, _) => cookie
                .as_deref()
                .and_then(|id| app.sessions.get(id))
                .filter(|s| !s.proxied),
        }
    } else {
        cookie
            .as_deref()
            .and_then(|id| app.sessions.get(id))
            .filter(|s| !s.proxied)
    };
    let Some(session) = session else {
        if req.method() == Method::GET {
            let next = req
                .uri()
                .path_and_query()
                .map(|p| p.as_str())
                .unwrap_or("/");
            return Redirect::to(&format!("/login?next={}", html::encode(next))).into_response();
        }
        return refuse(StatusCode::UNAUTHORIZED, "refused: sign in first");
    };
    req.extensions_mut().insert(Authed {
        session,
        remote: client_of(&app, peer, &headers).to_string(),
    });
    let mut res = next.run(req).await;
    if let Some(id) = new_cookie {
        res.headers_mut().append(
            header::SET_COOKIE,
            set_cookie(&app, SESSION_COOKIE, &id, None),
        );
    }
    res
}

/// A database error as a page: the message, never a panic.
pub(crate) fn db_error(e: impl std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "console could not read the database");
    refuse(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!("the database could not be read: {e}"),
    )
}
