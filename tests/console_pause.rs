//! Pausing and resuming a job from the console (issue 44), over HTTP
//! against a real database: only a signed-in operator with the session's
//! CSRF token, from the console's own origin and with a reason, may act;
//! the audit row names the signed-in user (never a name from the form) and
//! the client's address; a second pause or resume is refused as the
//! database says; the overview marks a paused job and the audit log lists
//! the rows by job.

mod common;

use common::console::start;
use reqwest::header::{COOKIE, ORIGIN};
use reqwest::StatusCode;

async fn paused_by(pool: &sqlx::PgPool) -> Vec<(String, String)> {
    sqlx::query_as("SELECT job_name::text, paused_by::text FROM batch_job_pause ORDER BY 1")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn only_an_operator_with_the_token_pauses_and_the_audit_says_who_and_from_where() {
    let c = start(None).await;
    c.runs("settle", &[("2026-09-15", "PENDING", None)]).await;
    let path = "/jobs/settle/pause";
    let (alice, vera) = (c.login("alice").await, c.login("vera").await);

    // No session, a viewer, no token, a wrong token, another site, no
    // reason: each refused, nothing written.
    let anonymous = c
        .http
        .post(c.url(path))
        .form(&[("reason", "hold")])
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    let viewer = c
        .post_as(
            &vera,
            path,
            &[("csrf", vera.csrf.as_str()), ("reason", "hold it")],
        )
        .await;
    assert_eq!(viewer.status(), StatusCode::FORBIDDEN);
    assert!(viewer.text().await.unwrap().contains("only an operator"));
    for form in [
        vec![("reason", "hold it")],
        vec![("csrf", "not-the-token"), ("reason", "hold it")],
    ] {
        let res = c.post_as(&alice, path, &form).await;
        assert_eq!(res.status(), StatusCode::FORBIDDEN, "{form:?}");
        assert!(res.text().await.unwrap().contains("CSRF"));
    }
    let cross = c
        .http
        .post(c.url(path))
        .header(COOKIE, format!("batchonce_session={}", alice.cookie))
        .header(ORIGIN, "https://evil.example")
        .form(&[("csrf", alice.csrf.as_str()), ("reason", "hold it")])
        .send()
        .await
        .unwrap();
    assert_eq!(cross.status(), StatusCode::FORBIDDEN);
    let blank = c
        .post_as(
            &alice,
            path,
            &[("csrf", alice.csrf.as_str()), ("reason", "  ")],
        )
        .await;
    assert_eq!(blank.status(), StatusCode::BAD_REQUEST);
    assert!(paused_by(&c.db.pool).await.is_empty());

    // The operator is the signed-in user, whatever the form says.
    let res = c
        .post_as(
            &alice,
            path,
            &[
                ("csrf", alice.csrf.as_str()),
                ("reason", "bank file late (INC-12)"),
                ("operator", "mallory"),
            ],
        )
        .await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(res.headers()[reqwest::header::LOCATION], "/jobs/settle");
    assert_eq!(
        paused_by(&c.db.pool).await,
        [("settle".to_owned(), "alice".to_owned())]
    );
    // Twice: the database's refusal, and nothing changes.
    let again = c
        .post_as(
            &alice,
            path,
            &[("csrf", alice.csrf.as_str()), ("reason", "again")],
        )
        .await;
    assert_eq!(again.status(), StatusCode::CONFLICT);
    assert!(again.text().await.unwrap().contains("already paused"));

    // The overview marks the job; the audit log lists the row by job.
    let overview = c.get_as(&alice.cookie, "/").await.text().await.unwrap();
    assert!(
        overview.contains(r#"<span class="badge PAUSED">paused</span>"#),
        "{overview}"
    );

    let resume = "/jobs/settle/resume";
    let res = c
        .post_as(
            &vera,
            resume,
            &[("csrf", vera.csrf.as_str()), ("reason", "go")],
        )
        .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let res = c
        .post_as(
            &alice,
            resume,
            &[("csrf", alice.csrf.as_str()), ("reason", "file arrived")],
        )
        .await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert!(paused_by(&c.db.pool).await.is_empty());
    let res = c
        .post_as(
            &alice,
            resume,
            &[("csrf", alice.csrf.as_str()), ("reason", "again")],
        )
        .await;
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert!(res.text().await.unwrap().contains("is not paused"));
    let overview = c.get_as(&alice.cookie, "/").await.text().await.unwrap();
    assert!(!overview.contains("badge PAUSED"), "{overview}");

    let rows: Vec<(String, String, String, String, Option<String>)> = sqlx::query_as(
        "SELECT operator, action, job_key, reason, remote_addr FROM batch_operator_action ORDER BY id",
    )
    .fetch_all(&c.db.pool)
    .await
    .unwrap();
    let row = |action: &str, reason: &str| {
        (
            "alice".to_owned(),
            action.to_owned(),
            "settle:*".to_owned(),
            reason.to_owned(),
            Some("127.0.0.1".to_owned()),
        )
    };
    assert_eq!(
        rows,
        [
            row("pause", "bank file late (INC-12)"),
            row("resume", "file arrived")
        ]
    );
    let audit = c
        .get_as(&alice.cookie, "/audit?job=settle&action=pause")
        .await
        .text()
        .await
        .unwrap();
    assert!(audit.contains("<td>settle:*</td>"), "{audit}");
    assert!(audit.contains("console, 127.0.0.1"), "{audit}");
    assert!(!audit.contains("/runs/settle%3A%2A"), "{audit}");
}

#[tokio::test]
async fn a_job_name_that_is_none_is_refused() {
    let c = start(None).await;
    let alice = c.login("alice").await;
    for path in ["/jobs/Not%20A%20Job/pause", "/jobs/nobody/pause"] {
        let res = c
            .post_as(
                &alice,
                path,
                &[("csrf", alice.csrf.as_str()), ("reason", "hold it")],
            )
            .await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{path}");
    }
    assert!(paused_by(&c.db.pool).await.is_empty());
}
