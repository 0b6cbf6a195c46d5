//! The console over HTTP against a real database, as a browser would use
//! it: nobody gets in without signing in, a viewer cannot act, every POST
//! needs its CSRF token and the same origin, markup from the database is
//! shown as text, two operators acting at once get one winner, the calendar
//! shows missing and skipped periods, the proxy header needs its secret,
//! and the run list pages through any number of runs.

use std::net::SocketAddr;
use std::time::Duration;

use batchonce::console::auth::{hash_password, Role, Users};
use batchonce::console::{router, ConsoleOptions, ProxyAuth};
use batchonce::queue::{self, NewRun};
use batchonce::testing::TestDb;
use batchonce::{Clock, JobConfig, JobKey, JobName};
use chrono::NaiveDate;
use reqwest::header::{COOKIE, LOCATION, ORIGIN, SET_COOKIE};
use reqwest::StatusCode;
use tokio_util::sync::CancellationToken;

const PASSWORD: &str = "correct horse battery";

struct Console {
    base: String,
    db: TestDb,
    stop: CancellationToken,
    http: reqwest::Client,
}

impl Drop for Console {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start(proxy: Option<ProxyAuth>) -> Console {
    let db = TestDb::new(&[]).await;
    let hash = hash_password(PASSWORD).unwrap();
    let users = Users::from_hashes(&[
        ("alice", Role::Operator, hash.clone()),
        ("bob", Role::Operator, hash.clone()),
        ("vera", Role::Viewer, hash),
    ]);
    let app = router(
        db.pool.clone(),
        ConsoleOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            users,
            proxy,
            secure_cookies: false,
        },
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move { s.cancelled().await })
        .await
        .unwrap();
    });
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    Console {
        base: format!("http://{addr}"),
        db,
        stop,
        http,
    }
}

/// The value of `name` among a response's Set-Cookie headers.
fn set_cookie(res: &reqwest::Response, name: &str) -> Option<String> {
    res.headers()
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| {
            let first = c.split(';').next()?;
            let (k, v) = first.split_once('=')?;
            (k == name).then(|| v.to_owned())
        })
}

/// The first hidden `csrf` field of a page.
fn csrf_of(body: &str) -> String {
    let at = body.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    body[at..].split('"').next().unwrap().to_owned()
}

/// A signed-in browser: its session cookie and CSRF token.
struct Browser {
    cookie: String,
    csrf: String,
}

impl Console {
    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Signs in; `Err` is the response of a refused sign-in.
    async fn try_login(&self, user: &str, password: &str) -> Result<Browser, reqwest::Response> {
        let form = self.http.get(self.url("/login")).send().await.unwrap();
        let token = set_cookie(&form, "batchonce_login").expect("login cookie");
        let body = form.text().await.unwrap();
        assert_eq!(csrf_of(&body), token, "double-submit token");
        let res = self
            .http
            .post(self.url("/login"))
            .header(COOKIE, format!("batchonce_login={token}"))
            .form(&[
                ("csrf", token.as_str()),
                ("user", user),
                ("password", password),
                ("next", "/"),
            ])
            .send()
            .await
            .unwrap();
        let Some(cookie) = set_cookie(&res, "batchonce_session") else {
            return Err(res);
        };
        assert_eq!(res.status(), StatusCode::SEE_OTHER);
        let page = self.get_as(&cookie, "/").await;
        assert_eq!(page.status(), StatusCode::OK);
        let csrf = csrf_of(&page.text().await.unwrap());
        Ok(Browser { cookie, csrf })
    }

    async fn login(&self, user: &str) -> Browser {
        match self.try_login(user, PASSWORD).await {
            Ok(b) => b,
            Err(res) => panic!("login of {user} refused: {}", res.status()),
        }
    }

    async fn get_as(&self, cookie: &str, path: &str) -> reqwest::Response {
        self.http
            .get(self.url(path))
            .header(COOKIE, format!("batchonce_session={cookie}"))
            .send()
            .await
            .unwrap()
    }

    async fn post_as(&self, b: &Browser, path: &str, form: &[(&str, &str)]) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .header(COOKIE, format!("batchonce_session={}", b.cookie))
            .form(form)
            .send()
            .await
            .unwrap()
    }

    /// Runs of `job` for `dates`, then each put in `status` with `error`.
    async fn runs(&self, job: &str, dates: &[(&str, &str, Option<&str>)]) {
        let cfg = JobConfig::default();
        let name = JobName::parse(job).unwrap();
        let new: Vec<NewRun> = dates
            .iter()
            .map(|(d, _, _)| {
                let date = NaiveDate::parse_from_str(d, "%Y-%m-%d").unwrap();
                NewRun::new(JobKey::daily(&name, date), date, &cfg).unwrap()
            })
            .collect();
        queue::enqueue(&self.db.pool, &new, Clock::Db)
            .await
            .unwrap();
        for (d, status, error) in dates {
            // The test's own fixture, as the database owner: a finished run
            // in the state the test needs.
            sqlx::query(
                "UPDATE batch_job_run SET status = $2, attempts = 1, error_message = $3, \
                 finished_at = CASE WHEN $2 IN ('PENDING', 'RUNNING') THEN NULL ELSE now() END \
                 WHERE job_key = $1",
            )
            .bind(format!("{job}:{d}"))
            .bind(status)
            .bind(error)
            .execute(&self.db.pool)
            .await
            .unwrap();
        }
    }
}

#[tokio::test]
async fn anonymous_requests_are_refused_and_health_is_open() {
    let c = start(None).await;
    c.runs("settle", &[("2026-09-15", "FAILED", None)]).await;
    let health = c.http.get(c.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    for path in [
        "/",
        "/runs",
        "/runs/settle:2026-09-15",
        "/jobs/settle",
        "/stale",
        "/audit",
        "/workers",
    ] {
        let res = c.http.get(c.url(path)).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::SEE_OTHER, "{path}");
        let to = res.headers()[LOCATION].to_str().unwrap();
        assert!(to.starts_with("/login?next="), "{path}: {to}");
        let body = res.text().await.unwrap();
        assert!(!body.contains("settle:2026-09-15"), "{path} leaked a run");
    }
    // A forged or stale session cookie is nobody.
    let res = c.get_as("00ff", "/").await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    // An action without a session changes nothing.
    let res = c
        .http
        .post(c.url("/runs/settle:2026-09-15/apply"))
        .form(&[("action", "rerun"), ("reason", "no session"), ("csrf", "x")])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let status: String =
        sqlx::query_scalar("SELECT status FROM batch_job_run WHERE job_key = 'settle:2026-09-15'")
            .fetch_one(&c.db.pool)
            .await
            .unwrap();
    assert_eq!(status, "FAILED");
    // The browser's favicon request is no redirect to the sign-in page
    // (which would replace an open sign-in form's token).
    let res = c.http.get(c.url("/favicon.ico")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    // Not `no-referrer`, with which Chromium sends `Origin: null` on the
    // console's own forms.
    assert_eq!(health.headers()["referrer-policy"], "same-origin");
    // Every page forbids scripts and framing.
    let csp = health.headers()["content-security-policy"]
        .to_str()
        .unwrap();
    assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"));
}

#[tokio::test]
async fn sign_in_needs_the_form_token_the_password_and_is_rate_limited() {
    let c = start(None).await;
    let b = c.login("alice").await;
    // The session cookie is HttpOnly and SameSite=Strict.
    let form = c.http.get(c.url("/login")).send().await.unwrap();
    let token = set_cookie(&form, "batchonce_login").unwrap();
    let res = c
        .http
        .post(c.url("/login"))
        .header(COOKIE, format!("batchonce_login={token}"))
        .form(&[
            ("csrf", token.as_str()),
            ("user", "alice"),
            ("password", PASSWORD),
        ])
        .send()
        .await
        .unwrap();
    let raw = res
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|v| v.starts_with("batchonce_session="))
        .unwrap();
    assert!(
        raw.contains("HttpOnly") && raw.contains("SameSite=Strict"),
        "{raw}"
    );
    // A sign-in form from elsewhere (no matching cookie) is refused.
    let res = c
        .http
        .post(c.url("/login"))
        .form(&[("csrf", "abc"), ("user", "alice"), ("password", PASSWORD)])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    // Wrong passwords, then the limit: even the right one waits.
    for _ in 0..batchonce::console::auth::MAX_FAILED_LOGINS {
        let res = c.try_login("bob", "wrong password").await.err().unwrap();
        assert_eq!(res.status(), StatusCode::SEE_OTHER);
        let to = res.headers()[LOCATION].to_str().unwrap().to_owned();
        assert!(to.contains("error=wrong"), "{to}");
    }
    let res = c.try_login("bob", PASSWORD).await.err().unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().contains_key("retry-after"));
    // Signing out ends the session.
    let res = c.post_as(&b, "/logout", &[("csrf", b.csrf.as_str())]).await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        c.get_as(&b.cookie, "/").await.status(),
        StatusCode::SEE_OTHER
    );
}

#[tokio::test]
async fn a_viewer_cannot_act_and_every_post_needs_its_token_and_origin() {
    let c = start(None).await;
    c.runs("settle", &[("2026-09-15", "FAILED", None)]).await;
    let path = "/runs/settle:2026-09-15";
    let viewer = c.login("vera").await;
    let page = c.get_as(&viewer.cookie, path).await.text().await.unwrap();
    assert!(page.contains("only an operator may act"));
    assert!(!page.contains("/preview"), "a viewer sees no action form");
    for step in ["preview", "apply"] {
        let res = c
            .post_as(
                &viewer,
                &format!("{path}/{step}"),
                &[
                    ("csrf", viewer.csrf.as_str()),
                    ("action", "rerun"),
                    ("reason", "viewer tries"),
                ],
            )
            .await;
        assert_eq!(res.status(), StatusCode::FORBIDDEN, "{step}");
    }
    let op = c.login("alice").await;
    for csrf in [None, Some("0000"), Some(viewer.csrf.as_str())] {
        let mut form = vec![("action", "rerun"), ("reason", "csrf test")];
        if let Some(t) = csrf {
            form.push(("csrf", t));
        }
        let res = c.post_as(&op, &format!("{path}/apply"), &form).await;
        assert_eq!(res.status(), StatusCode::FORBIDDEN, "{csrf:?}");
    }
    // The right token from another origin is refused too.
    let res = c
        .http
        .post(c.url(&format!("{path}/apply")))
        .header(COOKIE, format!("batchonce_session={}", op.cookie))
        .header(ORIGIN, "http://evil.example")
        .form(&[
            ("csrf", op.csrf.as_str()),
            ("action", "rerun"),
            ("reason", "cross site"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    // An opaque origin counts as ours only when the browser says the form
    // is same-origin.
    for (fetch_site, want) in [
        ("cross-site", StatusCode::FORBIDDEN),
        ("same-origin", StatusCode::OK),
    ] {
        let res = c
            .http
            .post(c.url(&format!("{path}/preview")))
            .header(COOKIE, format!("batchonce_session={}", op.cookie))
            .header(ORIGIN, "null")
            .header("sec-fetch-site", fetch_site)
            .form(&[
                ("csrf", op.csrf.as_str()),
                ("action", "rerun"),
                ("reason", "opaque origin"),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), want, "{fetch_site}");
    }
    // Behind a reverse proxy the browser's origin is the host the proxy
    // forwarded: that is the same origin.
    let res = c
        .http
        .post(c.url(&format!("{path}/preview")))
        .header(COOKIE, format!("batchonce_session={}", op.cookie))
        .header(ORIGIN, "https://console.example")
        .header("x-forwarded-host", "console.example")
        .form(&[
            ("csrf", op.csrf.as_str()),
            ("action", "rerun"),
            ("reason", "via the proxy"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    // A blank reason is refused with one line.
    let res = c
        .post_as(
            &op,
            &format!("{path}/preview"),
            &[
                ("csrf", op.csrf.as_str()),
                ("action", "rerun"),
                ("reason", "  "),
            ],
        )
        .await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let (status, audits): (String, i64) = sqlx::query_as(
        "SELECT r.status, (SELECT count(*) FROM batch_operator_action) \
         FROM batch_job_run r WHERE r.job_key = 'settle:2026-09-15'",
    )
    .fetch_one(&c.db.pool)
    .await
    .unwrap();
    assert_eq!((status.as_str(), audits), ("FAILED", 0));
    // The preview changes nothing and shows what would change.
    let res = c
        .post_as(
            &op,
            &format!("{path}/preview"),
            &[
                ("csrf", op.csrf.as_str()),
                ("action", "rerun"),
                ("reason", "data fixed"),
            ],
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let body = res.text().await.unwrap();
    assert!(body.contains("Apply: rerun settle:2026-09-15"), "{body}");
    assert!(
        body.contains("Recorded as operator <strong>alice</strong>"),
        "{body}"
    );
    let status: String =
        sqlx::query_scalar("SELECT status FROM batch_job_run WHERE job_key = 'settle:2026-09-15'")
            .fetch_one(&c.db.pool)
            .await
            .unwrap();
    assert_eq!(status, "FAILED");
}

#[tokio::test]
async fn markup_from_the_database_and_the_request_is_shown_as_text() {
    let c = start(None).await;
    let evil = "<script>alert('x')</script><img src=x onerror=alert(1)>";
    c.runs("settle", &[("2026-09-15", "FAILED", Some(evil))])
        .await;
    let op = c.login("alice").await;
    for path in [
        "/runs/settle:2026-09-15",
        "/runs?status=FAILED",
        "/",
        "/jobs/settle?from=2026-09-10&to=2026-09-20",
    ] {
        let res = c.get_as(&op.cookie, path).await;
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        let body = res.text().await.unwrap();
        assert!(!body.contains("<script>"), "{path}: raw markup");
        assert!(!body.contains("<img src=x"), "{path}: raw markup");
        if path.starts_with("/runs") {
            assert!(
                body.contains("&lt;script&gt;alert("),
                "{path}: escaped text"
            );
        }
    }
    // Markup in a key, a filter or a sign-in error comes back as text.
    for path in [
        "/runs/%3Cscript%3Ealert(1)%3C%2Fscript%3E",
        "/runs?job=%3Cscript%3E",
        "/jobs/%3Cscript%3E",
        "/runs?from=%3Cscript%3E",
    ] {
        let res = c.get_as(&op.cookie, path).await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{path}");
        let body = res.text().await.unwrap();
        assert!(!body.contains("<script>"), "{path}: {body}");
    }
    let res = c
        .http
        .get(c.url("/login?error=%3Cscript%3Ex%3C%2Fscript%3E&next=%22%3E%3Cscript%3E"))
        .send()
        .await
        .unwrap();
    let body = res.text().await.unwrap();
    assert!(!body.contains("<script>"), "{body}");
    // `next` never leads to another site.
    let form = c.http.get(c.url("/login")).send().await.unwrap();
    let token = set_cookie(&form, "batchonce_login").unwrap();
    let res = c
        .http
        .post(c.url("/login"))
        .header(COOKIE, format!("batchonce_login={token}"))
        .form(&[
            ("csrf", token.as_str()),
            ("user", "alice"),
            ("password", PASSWORD),
            ("next", "//evil.example/"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers()[LOCATION], "/");
    // Nor into a second header.
    let form = c.http.get(c.url("/login")).send().await.unwrap();
    let token = set_cookie(&form, "batchonce_login").unwrap();
    let res = c
        .http
        .post(c.url("/login"))
        .header(COOKIE, format!("batchonce_login={token}"))
        .form(&[
            ("csrf", token.as_str()),
            ("user", "alice"),
            ("password", PASSWORD),
            ("next", "/runs\r\nSet-Cookie: x=1"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(res.headers()[LOCATION], "/");
}

#[tokio::test]
async fn two_operators_rerunning_at_once_one_wins_and_the_other_sees_why() {
    let c = start(None).await;
    c.runs("settle", &[("2026-09-15", "FAILED", Some("bad data"))])
        .await;
    let path = "/runs/settle:2026-09-15/apply";
    let (alice, bob) = (c.login("alice").await, c.login("bob").await);
    let form = |b: &Browser| {
        vec![
            ("csrf".to_owned(), b.csrf.clone()),
            ("action".to_owned(), "rerun".to_owned()),
            ("reason".to_owned(), "data fixed, INC-7".to_owned()),
            ("expected".to_owned(), "FAILED".to_owned()),
        ]
    };
    let send = |b: &Browser| {
        c.http
            .post(c.url(path))
            .header(COOKIE, format!("batchonce_session={}", b.cookie))
            .form(&form(b))
            .send()
    };
    let (ra, rb) = tokio::join!(send(&alice), send(&bob));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let mut statuses = [ra.status(), rb.status()];
    statuses.sort();
    assert_eq!(statuses, [StatusCode::SEE_OTHER, StatusCode::CONFLICT]);
    let loser = if ra.status() == StatusCode::CONFLICT {
        ra
    } else {
        rb
    };
    let body = loser.text().await.unwrap();
    assert!(
        body.contains("rerun refused for settle:2026-09-15"),
        "{body}"
    );
    assert!(body.contains("Last action: rerun by"), "{body}");
    let rows: Vec<(String, String, Option<String>, String)> = sqlx::query_as(
        "SELECT operator, action, remote_addr, after_status FROM batch_operator_action",
    )
    .fetch_all(&c.db.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(["alice", "bob"].contains(&rows[0].0.as_str()));
    assert_eq!(rows[0].1, "rerun");
    assert_eq!(rows[0].2.as_deref(), Some("127.0.0.1"));
    assert_eq!(rows[0].3, "PENDING");
    // A confirmation of a preview the run has since left is refused.
    let res = c
        .post_as(
            &alice,
            "/runs/settle:2026-09-15/apply",
            &[
                ("csrf", alice.csrf.as_str()),
                ("action", "skip"),
                ("reason", "skip it"),
                ("expected", "FAILED"),
            ],
        )
        .await;
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert!(res
        .text()
        .await
        .unwrap()
        .contains("not FAILED as when the action was previewed"));
    // The audit page shows who acted and from where.
    let audit = c
        .get_as(&alice.cookie, "/audit?job=settle")
        .await
        .text()
        .await
        .unwrap();
    assert!(audit.contains("console, 127.0.0.1"), "{audit}");
}

#[tokio::test]
async fn the_calendar_shows_missing_and_skipped_periods_from_the_recorded_schedule() {
    let c = start(None).await;
    c.runs(
        "settle",
        &[
            ("2026-09-14", "SUCCEEDED", None),
            ("2026-09-15", "FAILED", Some("bad data")),
            ("2026-09-17", "PENDING", None),
        ],
    )
    .await;
    let op = c.login("alice").await;
    let path = "/jobs/settle?from=2026-09-14&to=2026-09-20";
    // Without a recorded schedule: only the runs, saying why.
    let body = c.get_as(&op.cookie, path).await.text().await.unwrap();
    assert!(body.contains("Missing periods cannot be shown"), "{body}");
    assert!(!body.contains("class=\"MISSING\""));
    // A producer records the job's schedule: daily at 01:00 Seoul for the
    // day before, no Sundays (2026-09-20).
    let cfg = JobConfig {
        schedule: Some(batchonce::schedule::CronSchedule::parse("0 1 * * *").unwrap()),
        timezone: chrono_tz::Asia::Seoul,
        covers: batchonce::schedule::Covers::PreviousDay,
        skip_weekdays: vec![chrono::Weekday::Sun],
        ..JobConfig::default()
    };
    let name = JobName::parse("settle").unwrap();
    batchonce::runtime::worker_registry::register_process(
        &c.db.pool,
        "producer-test",
        batchonce::runtime::worker_registry::Role::Producer,
        "test",
        Duration::from_secs(60),
        &[(name, &cfg)],
    )
    .await
    .unwrap();
    let body = c.get_as(&op.cookie, path).await.text().await.unwrap();
    for (period, state) in [
        ("2026-09-14", "SUCCEEDED"),
        ("2026-09-15", "FAILED"),
        ("2026-09-16", "MISSING"),
        ("2026-09-17", "PENDING"),
        ("2026-09-18", "MISSING"),
        ("2026-09-19", "MISSING"),
        ("2026-09-20", "SKIPPED"),
    ] {
        let cell = format!("{period}<br>{state}");
        assert!(body.contains(&cell), "{period} should be {state}: {body}");
    }
    assert!(body.contains("in skip_weekdays"), "the skip reason");
    // The overview lists the job with its FAILED count and newest period.
    let body = c.get_as(&op.cookie, "/").await.text().await.unwrap();
    assert!(body.contains("settle:2026-09-17"), "{body}");
    assert!(
        body.contains("/runs?status=FAILED&amp;job=settle"),
        "{body}"
    );
}

#[tokio::test]
async fn the_proxy_header_needs_its_secret_and_a_listed_user() {
    let secret = "a-long-shared-secret-123";
    let c = start(Some(ProxyAuth {
        user_header: "x-forwarded-user".into(),
        secret: secret.into(),
    }))
    .await;
    let get = |user: &str, secret: Option<&str>| {
        let mut r = c
            .http
            .get(c.url("/"))
            .header("x-forwarded-user", user)
            .header("x-forwarded-for", "10.1.2.3");
        if let Some(s) = secret {
            r = r.header("x-batchonce-proxy-secret", s);
        }
        r.send()
    };
    // The header alone is nobody; a wrong secret is refused.
    assert_eq!(
        get("alice", None).await.unwrap().status(),
        StatusCode::SEE_OTHER
    );
    assert_eq!(
        get("alice", Some("wrong-secret-0000000000"))
            .await
            .unwrap()
            .status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        get("mallory", Some(secret)).await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    let res = get("vera", Some(secret)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.text().await.unwrap().contains("vera (viewer)"));
    // An operator through the proxy acts, recorded with the client's
    // address as the proxy reported it.
    c.runs("settle", &[("2026-09-15", "FAILED", None)]).await;
    let res = get("alice", Some(secret)).await.unwrap();
    let cookie = set_cookie(&res, "batchonce_session").unwrap();
    let csrf = csrf_of(
        &c.http
            .get(c.url("/runs/settle:2026-09-15"))
            .header("x-forwarded-user", "alice")
            .header("x-batchonce-proxy-secret", secret)
            .header("x-forwarded-for", "10.1.2.3")
            .header(COOKIE, format!("batchonce_session={cookie}"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    let res = c
        .http
        .post(c.url("/runs/settle:2026-09-15/apply"))
        .header("x-forwarded-user", "alice")
        .header("x-batchonce-proxy-secret", secret)
        .header("x-forwarded-for", "10.1.2.3")
        .header(COOKIE, format!("batchonce_session={cookie}"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("action", "rerun"),
            ("reason", "via proxy"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    let (op, addr): (String, Option<String>) =
        sqlx::query_as("SELECT operator, remote_addr FROM batch_operator_action")
            .fetch_one(&c.db.pool)
            .await
            .unwrap();
    assert_eq!(op, "alice");
    assert_eq!(addr.as_deref(), Some("10.1.2.3 via 127.0.0.1"));
}

#[tokio::test]
async fn the_run_list_pages_through_every_run_once() {
    let c = start(None).await;
    let start = NaiveDate::from_ymd_opt(2026, 1, 1).unwrap();
    let dates: Vec<String> = (0..230)
        .map(|i| (start + chrono::Days::new(i)).to_string())
        .collect();
    let rows: Vec<(&str, &str, Option<&str>)> = dates
        .iter()
        .map(|d| (d.as_str(), "SUCCEEDED", None))
        .collect();
    c.runs("settle", &rows).await;
    c.runs("other", &[("2026-03-01", "FAILED", None)]).await;
    let op = c.login("alice").await;
    let mut seen = std::collections::BTreeSet::new();
    let mut path = "/runs?job=settle".to_owned();
    for _ in 0..10 {
        let body = c.get_as(&op.cookie, &path).await.text().await.unwrap();
        for part in body.split("href=\"/runs/settle%3A").skip(1) {
            seen.insert(part.split('"').next().unwrap().to_owned());
        }
        assert!(!body.contains("other%3A"), "the job filter holds");
        let Some(at) = body.find("\">Next page") else {
            break;
        };
        let href = body[..at].rsplit("href=\"").next().unwrap();
        path = href.replace("&amp;", "&");
    }
    assert_eq!(seen.len(), 230);
    // The state and date filters narrow it.
    let body = c
        .get_as(
            &op.cookie,
            "/runs?status=FAILED&from=2026-02-01&to=2026-03-31",
        )
        .await
        .text()
        .await
        .unwrap();
    assert!(body.contains("other:2026-03-01"));
    assert!(!body.contains("settle:2026"));
}

#[tokio::test]
async fn an_action_behind_a_lock_names_the_holder_and_can_end_it_audited() {
    let c = start(None).await;
    c.runs("settle", &[("2026-09-15", "FAILED", None)]).await;
    let op = c.login("alice").await;
    // A session holding the run's row, as a stuck fenced transaction does.
    let mut holder = c.db.pool.begin().await.unwrap();
    let pid: i32 = sqlx::query_scalar(
        "SELECT pg_backend_pid() FROM batch_job_run WHERE job_key = 'settle:2026-09-15' \
         FOR KEY SHARE",
    )
    .fetch_one(&mut *holder)
    .await
    .unwrap();
    let began = std::time::Instant::now();
    let res = c
        .post_as(
            &op,
            "/runs/settle:2026-09-15/apply",
            &[
                ("csrf", op.csrf.as_str()),
                ("action", "rerun"),
                ("reason", "behind a lock"),
            ],
        )
        .await;
    let waited = began.elapsed();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    let body = res.text().await.unwrap();
    assert!(
        body.contains("gave up after 5 s waiting for the run"),
        "{body}"
    );
    assert!(body.contains(&format!("session {pid}")), "{body}");
    assert!(waited < Duration::from_secs(15), "{waited:?}");
    // Nothing changed, and nothing was audited.
    let audits: i64 = sqlx::query_scalar("SELECT count(*) FROM batch_operator_action")
        .fetch_one(&c.db.pool)
        .await
        .unwrap();
    assert_eq!(audits, 0);
    // The page offers to end the holder, as a second confirmation.
    assert!(body.contains("End the holding session and rerun"), "{body}");
    let res = c
        .post_as(
            &op,
            "/runs/settle:2026-09-15/apply",
            &[
                ("csrf", op.csrf.as_str()),
                ("action", "rerun"),
                ("reason", "behind a lock"),
                ("expected", "FAILED"),
                ("terminate_blocker", "true"),
            ],
        )
        .await;
    let status = res.status();
    assert_eq!(
        status,
        StatusCode::SEE_OTHER,
        "{}",
        res.text().await.unwrap()
    );
    // The holder's session is gone; the audit has the ending first, then
    // the action, both from the console user's address.
    assert!(holder.rollback().await.is_err(), "the holder was ended");
    let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT action, operator, remote_addr FROM batch_operator_action ORDER BY id",
    )
    .fetch_all(&c.db.pool)
    .await
    .unwrap();
    let addr = Some("127.0.0.1".to_owned());
    assert_eq!(
        rows,
        [
            (
                "terminate-blocker".to_owned(),
                "alice".to_owned(),
                addr.clone()
            ),
            ("rerun".to_owned(), "alice".to_owned(), addr)
        ]
    );
}
