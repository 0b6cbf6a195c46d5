//! Who may use the console, over HTTP against a real database: nobody gets
//! in without signing in, sign-in checks its form token and password and is
//! rate-limited, a viewer cannot act, every POST needs its CSRF token and the
//! same origin, markup from the database and the request is shown as text,
//! and the proxy header needs its secret and a listed user.

mod common;

use batchonce::console::ProxyAuth;
use common::console::{csrf_of, set_cookie, start, PASSWORD};
use reqwest::header::{COOKIE, LOCATION, ORIGIN, SET_COOKIE};
use reqwest::StatusCode;

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
    let res = c.send_sign_in("alice", PASSWORD, "/").await;
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
    // Markup in a key, a filter or a sign-in error comes back as text; a
    // key or a job that names nothing is a 404.
    for (path, status) in [
        (
            "/runs/%3Cscript%3Ealert(1)%3C%2Fscript%3E",
            StatusCode::NOT_FOUND,
        ),
        ("/runs?job=%3Cscript%3E", StatusCode::BAD_REQUEST),
        ("/jobs/%3Cscript%3E", StatusCode::NOT_FOUND),
        ("/runs?from=%3Cscript%3E", StatusCode::BAD_REQUEST),
    ] {
        let res = c.get_as(&op.cookie, path).await;
        assert_eq!(res.status(), status, "{path}");
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
    let res = c.send_sign_in("alice", PASSWORD, "//evil.example/").await;
    assert_eq!(res.headers()[LOCATION], "/");
    // Nor into a second header.
    let res = c
        .send_sign_in("alice", PASSWORD, "/runs\r\nSet-Cookie: x=1")
        .await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(res.headers()[LOCATION], "/");
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
