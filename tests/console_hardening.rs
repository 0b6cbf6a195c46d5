//! What a password guesser and a crafted link can make the console do, over
//! HTTP against the console served in this process: tries sent at once are
//! counted before their passwords are verified, argon2 verifications run a
//! few at a time, `X-Forwarded-For` counts only from a trusted proxy, the
//! sign-in page shows only its own messages, a one-time login works once,
//! and cookies are `Secure` unless the console listens on loopback.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use batchonce::console::auth::{hash_password, Role, Users};
use batchonce::console::client_addr::Cidr;
use batchonce::console::limits::{VerifyStats, MAX_FAILED_LOGINS, MAX_VERIFICATIONS};
use batchonce::console::{router, ConsoleOptions};
use common::console::{csrf_of, set_cookie, start_with, Console, PASSWORD};
use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use reqwest::StatusCode;

fn users() -> Users {
    let hash = hash_password(PASSWORD).unwrap();
    Users::from_hashes(&[
        ("alice", Role::Operator, hash.clone()),
        ("bob", Role::Operator, hash),
    ])
}

/// A console with `trusted` proxies; the count of its verifications.
async fn console(trusted: &[&str]) -> (Console, Arc<VerifyStats>) {
    let users = users();
    let stats = users.verifications();
    let mut opts = ConsoleOptions::new("127.0.0.1:0".parse().unwrap(), users);
    opts.trusted_proxies = trusted.iter().map(|t| Cidr::parse(t).unwrap()).collect();
    (start_with(opts).await, stats)
}

/// A sign-in form's token, fetched ahead so that the tries themselves can
/// be sent at the same moment.
async fn form_token(c: &Console) -> String {
    let res = c.http.get(c.url("/login")).send().await.unwrap();
    set_cookie(&res, "batchonce_login").unwrap()
}

/// Sends a sign-in form with `token`, from the address `xff` names (if
/// any); the status and the `Location`.
async fn try_sign_in(
    c: &Console,
    token: &str,
    user: &str,
    password: &str,
    xff: Option<&str>,
) -> (StatusCode, String) {
    let mut req = c
        .http
        .post(c.url("/login"))
        .header(COOKIE, format!("batchonce_login={token}"))
        .form(&[
            ("csrf", token),
            ("user", user),
            ("password", password),
            ("next", "/"),
        ]);
    if let Some(x) = xff {
        req = req.header("x-forwarded-for", x);
    }
    let res = req.send().await.unwrap();
    let to = res
        .headers()
        .get(LOCATION)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (res.status(), to)
}

/// Sends `tries` (user, password, X-Forwarded-For) all at once; their
/// statuses.
async fn at_once(c: &Console, tries: &[(String, String, Option<String>)]) -> Vec<StatusCode> {
    let mut tokens = Vec::new();
    for _ in tries {
        tokens.push(form_token(c).await);
    }
    let sent = tries
        .iter()
        .zip(&tokens)
        .map(|((u, p, x), t)| async move { try_sign_in(c, t, u, p, x.as_deref()).await.0 });
    futures_util::future::join_all(sent).await
}

fn count(statuses: &[StatusCode], s: StatusCode) -> usize {
    statuses.iter().filter(|x| **x == s).count()
}

#[tokio::test]
async fn wrong_passwords_sent_at_once_are_counted_before_they_are_verified() {
    let (c, stats) = console(&[]).await;
    // 30 wrong passwords for one user from one address, all at once.
    let tries: Vec<_> = (0..30)
        .map(|i| ("bob".to_owned(), format!("guess-{i}"), None))
        .collect();
    let statuses = at_once(&c, &tries).await;
    // Only the allowed tries were verified (a redirect back to the form);
    // every other one was refused before its verification.
    assert_eq!(
        count(&statuses, StatusCode::SEE_OTHER),
        MAX_FAILED_LOGINS,
        "{statuses:?}"
    );
    assert_eq!(
        count(&statuses, StatusCode::TOO_MANY_REQUESTS),
        30 - MAX_FAILED_LOGINS,
        "{statuses:?}"
    );
    assert_eq!(
        stats.total.load(Ordering::SeqCst),
        MAX_FAILED_LOGINS,
        "argon2 verifications run for 30 tries at once"
    );
    // Even the right password waits now.
    let t = form_token(&c).await;
    let (s, _) = try_sign_in(&c, &t, "bob", PASSWORD, None).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(stats.total.load(Ordering::SeqCst), MAX_FAILED_LOGINS);
}

#[tokio::test]
async fn argon2_verifications_run_a_few_at_a_time() {
    // Behind a trusted proxy, 24 tries from 24 clients for 24 names: the
    // limit per address and name refuses none of them, so only the bound
    // on verifications at once holds them back.
    let (c, stats) = console(&["127.0.0.1/32"]).await;
    let tries: Vec<_> = (0..24)
        .map(|i| {
            (
                format!("guess{i}"),
                "wrong password".to_owned(),
                Some(format!("203.0.113.{i}")),
            )
        })
        .collect();
    let statuses = at_once(&c, &tries).await;
    let total = stats.total.load(Ordering::SeqCst);
    let peak = stats.peak.load(Ordering::SeqCst);
    assert!(
        peak <= MAX_VERIFICATIONS,
        "{peak} verifications at once (at most {MAX_VERIFICATIONS})"
    );
    assert!(peak >= 2, "the tries did not overlap: {peak}");
    // Each try was verified (a redirect), or refused as busy after its
    // bounded wait, never both, never neither.
    assert_eq!(
        count(&statuses, StatusCode::SEE_OTHER),
        total,
        "{statuses:?}"
    );
    assert_eq!(
        count(&statuses, StatusCode::SEE_OTHER) + count(&statuses, StatusCode::TOO_MANY_REQUESTS),
        24,
        "{statuses:?}"
    );
}

#[tokio::test]
async fn x_forwarded_for_counts_only_from_a_trusted_proxy() {
    // No trusted proxy: a header naming a new client each time is
    // ignored, and the peer's address runs out of tries.
    let (c, _) = console(&[]).await;
    // Its audit records the peer, not the header.
    audit_address_is(&c, "alice", Some("198.51.100.201"), "127.0.0.1").await;
    for i in 0..MAX_FAILED_LOGINS {
        let t = form_token(&c).await;
        let xff = format!("198.51.100.{i}");
        let (s, _) = try_sign_in(&c, &t, &format!("u{i}"), "wrong", Some(&xff)).await;
        assert_eq!(s, StatusCode::SEE_OTHER, "try {i}");
    }
    let t = form_token(&c).await;
    let (s, _) = try_sign_in(&c, &t, "fresh", "wrong", Some("198.51.100.200")).await;
    assert_eq!(
        s,
        StatusCode::TOO_MANY_REQUESTS,
        "an untrusted peer's X-Forwarded-For was believed"
    );

    // The peer is a trusted proxy: the client it reports is counted, and
    // a client cannot escape by writing hops of its own to the left.
    let (c, _) = console(&["127.0.0.1/32"]).await;
    audit_address_is(
        &c,
        "alice",
        Some("198.51.100.9"),
        "198.51.100.9 via 127.0.0.1",
    )
    .await;
    // A name has its own count, whichever clients try it.
    for i in 0..MAX_FAILED_LOGINS {
        let t = form_token(&c).await;
        let xff = format!("192.0.2.{i}");
        let (s, _) = try_sign_in(&c, &t, "carol", "wrong", Some(&xff)).await;
        assert_eq!(s, StatusCode::SEE_OTHER, "try {i}");
    }
    let t = form_token(&c).await;
    let (s, _) = try_sign_in(&c, &t, "carol", "wrong", Some("192.0.2.99")).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "the name's tries ran out");
    for i in 0..MAX_FAILED_LOGINS {
        let t = form_token(&c).await;
        let xff = format!("10.9.9.{i}, 198.51.100.7");
        let (s, _) = try_sign_in(&c, &t, &format!("u{i}"), "wrong", Some(&xff)).await;
        assert_eq!(s, StatusCode::SEE_OTHER, "try {i}");
    }
    let t = form_token(&c).await;
    let (s, _) = try_sign_in(&c, &t, "fresh", "wrong", Some("10.9.9.99, 198.51.100.7")).await;
    assert_eq!(
        s,
        StatusCode::TOO_MANY_REQUESTS,
        "the client's tries ran out"
    );
    // Another client behind the same proxy still has its own.
    let t = form_token(&c).await;
    let (s, _) = try_sign_in(&c, &t, "fresh", "wrong", Some("198.51.100.8")).await;
    assert_eq!(
        s,
        StatusCode::SEE_OTHER,
        "one client's tries were another's"
    );
}

/// Signs `user` in and re-runs a failed run, sending `xff`; the audit row
/// records `want` as the remote address.
async fn audit_address_is(c: &Console, user: &str, xff: Option<&str>, want: &str) {
    c.runs("settle", &[("2026-09-15", "FAILED", None)]).await;
    let t = form_token(c).await;
    let res = {
        let mut r = c
            .http
            .post(c.url("/login"))
            .header(COOKIE, format!("batchonce_login={t}"))
            .form(&[("csrf", t.as_str()), ("user", user), ("password", PASSWORD)]);
        if let Some(x) = xff {
            r = r.header("x-forwarded-for", x);
        }
        r.send().await.unwrap()
    };
    let cookie = set_cookie(&res, "batchonce_session").expect("signed in");
    let page = c.get_as(&cookie, "/runs/settle:2026-09-15").await;
    let csrf = csrf_of(&page.text().await.unwrap());
    let mut r = c
        .http
        .post(c.url("/runs/settle:2026-09-15/apply"))
        .header(COOKIE, format!("batchonce_session={cookie}"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("action", "rerun"),
            ("reason", "address check"),
        ]);
    if let Some(x) = xff {
        r = r.header("x-forwarded-for", x);
    }
    assert_eq!(r.send().await.unwrap().status(), StatusCode::SEE_OTHER);
    let addr: Option<String> = sqlx::query_scalar(
        "SELECT remote_addr FROM batch_operator_action ORDER BY id DESC LIMIT 1",
    )
    .fetch_one(&c.db.pool)
    .await
    .unwrap();
    assert_eq!(addr.as_deref(), Some(want));
}

#[tokio::test]
async fn the_sign_in_page_shows_only_its_own_messages() {
    let (c, _) = console(&[]).await;
    let page = |q: &'static str| {
        let c = &c;
        async move {
            c.http
                .get(c.url(&format!("/login{q}")))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    // A wrong password comes back with a code, which picks the message.
    let t = form_token(&c).await;
    let (s, to) = try_sign_in(&c, &t, "bob", "wrong", None).await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    assert_eq!(to, "/login?error=wrong&next=%2F");
    assert!(page("?error=wrong")
        .await
        .contains("Wrong user or password."));
    // Any other text is not shown: a generic message instead.
    let crafted = page("?error=Your+account+is+locked.+Call+support+at+555-0100").await;
    assert!(!crafted.contains("555-0100"), "{crafted}");
    assert!(!crafted.contains("account is locked"), "{crafted}");
    assert!(crafted.contains("Sign-in failed; try again."), "{crafted}");
    // No code, no message.
    let plain = page("").await;
    assert!(!plain.contains("class=\"error\""), "{plain}");
}

#[tokio::test]
async fn a_one_time_login_works_once() {
    let hash = hash_password(PASSWORD).unwrap();
    let users = Users::one_time(&[("demo", Role::Operator, hash)]);
    let c = start_with(ConsoleOptions::new("127.0.0.1:0".parse().unwrap(), users)).await;
    let first = c.login("demo").await;
    // The same password again, from another browser (or the first one
    // after signing out): the sign-in page with its fixed message.
    let res = c.send_sign_in("demo", PASSWORD, "/").await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert!(
        set_cookie(&res, "batchonce_session").is_none(),
        "a second session"
    );
    let to = res.headers()[LOCATION].to_str().unwrap().to_owned();
    assert!(to.starts_with("/login?error=spent"), "{to}");
    let body = c
        .http
        .get(c.url(&to))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        body.contains("This one-time sign-in has been used already"),
        "{body}"
    );
    // The session it opened keeps working.
    assert_eq!(c.get_as(&first.cookie, "/").await.status(), StatusCode::OK);

    // Two browsers at once with the right password: one session.
    let hash = hash_password(PASSWORD).unwrap();
    let users = Users::one_time(&[("demo", Role::Operator, hash)]);
    let c = start_with(ConsoleOptions::new("127.0.0.1:0".parse().unwrap(), users)).await;
    let (a, b) = tokio::join!(
        c.send_sign_in("demo", PASSWORD, "/"),
        c.send_sign_in("demo", PASSWORD, "/")
    );
    let sessions = [a, b]
        .iter()
        .filter(|r| set_cookie(r, "batchonce_session").is_some())
        .count();
    assert_eq!(sessions, 1);
}

/// The `Set-Cookie` of the sign-in form's cookie from a console with
/// `listen` and `secure`. The page needs no database: the pool never
/// connects.
async fn login_cookie(listen: &str, secure: Option<bool>) -> String {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .connect_lazy("postgres://nobody@127.0.0.1:1/none")
        .unwrap();
    let mut opts = ConsoleOptions::new(listen.parse().unwrap(), users());
    opts.secure_cookies = secure;
    let app = router(pool, opts).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await
    });
    let res = reqwest::get(format!("http://{addr}/login")).await.unwrap();
    server.abort();
    res.headers()
        .get_all(SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|v| v.starts_with("batchonce_login="))
        .unwrap()
}

#[tokio::test]
async fn cookies_are_secure_unless_the_console_listens_on_loopback() {
    for (listen, told, secure) in [
        ("127.0.0.1:8470", None, false),
        ("[::1]:8470", None, false),
        ("0.0.0.0:8470", None, true),
        ("[::]:8470", None, true),
        ("10.1.2.3:8470", None, true),
        // As told, both ways.
        ("0.0.0.0:8470", Some(false), false),
        ("127.0.0.1:8470", Some(true), true),
    ] {
        let cookie = login_cookie(listen, told).await;
        assert_eq!(
            cookie.contains("; Secure"),
            secure,
            "{listen} {told:?}: {cookie}"
        );
        assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
    }
}
