//! The console's bulk actions and its wording, over HTTP against a real
//! database: re-running every FAILED run of a job over a range of dates
//! from the run list, with a preview naming every key and one audit row per
//! run, a run that changed between preview and apply reported and left
//! alone; the refusals of a viewer, a wrong token, a filter too wide or
//! without a job and a state; a 404 page with the navigation for unknown
//! paths, jobs and keys; the run page's actions first, Force explained,
//! an operator's reason never shown as the last error, no next attempt for
//! a finished run; no command-line flag in any page; and the Stale page's
//! Fail for a dead run.

mod common;

use std::time::Duration;

use batchonce::queue::{self, ClaimSpec, NewRun};
use batchonce::{Clock, JobConfig, JobKey, JobName};
use chrono::NaiveDate;
use common::console::{start, Browser, Console};
use reqwest::header::{COOKIE, LOCATION};
use reqwest::StatusCode;
use sqlx::PgPool;

async fn post(c: &Console, b: &Browser, path: &str, form: &[(&str, String)]) -> reqwest::Response {
    c.http
        .post(c.url(path))
        .header(COOKIE, format!("batchonce_session={}", b.cookie))
        .form(form)
        .send()
        .await
        .unwrap()
}

async fn page(c: &Console, b: &Browser, path: &str) -> (StatusCode, String) {
    let res = c.get_as(&b.cookie, path).await;
    (res.status(), res.text().await.unwrap())
}

async fn status_of(pool: &PgPool, key: &str) -> String {
    sqlx::query_scalar("SELECT status FROM batch_job_run WHERE job_key = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The values of a page's hidden `key` fields, in order.
fn hidden_keys(body: &str) -> Vec<String> {
    body.split("name=\"key\" value=\"")
        .skip(1)
        .map(|s| s.split('"').next().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn every_failed_run_of_a_job_over_a_range_is_rerun_with_one_reason_and_one_audit_row_each() {
    let c = start(None).await;
    c.runs(
        "settle",
        &[
            ("2026-09-10", "FAILED", Some("bad data")),
            ("2026-09-11", "FAILED", Some("bad data")),
            ("2026-09-12", "SUCCEEDED", None),
            ("2026-09-13", "FAILED", Some("bad data")),
            ("2026-09-14", "FAILED", Some("bad data")),
            ("2026-09-15", "FAILED", Some("outside the range")),
        ],
    )
    .await;
    c.runs("bill", &[("2026-09-11", "FAILED", None)]).await;
    let (alice, bob, vera) = (
        c.login("alice").await,
        c.login("bob").await,
        c.login("vera").await,
    );
    let filter = "job=settle&status=FAILED&from=2026-09-10&to=2026-09-14";
    // The run list offers the bulk actions to an operator, with the count.
    let (_, list) = page(&c, &alice, &format!("/runs?{filter}")).await;
    assert!(list.contains("Re-run all 4 shown…"), "{list}");
    assert!(list.contains("Skip all 4 shown…"), "{list}");
    let (_, list) = page(&c, &vera, &format!("/runs?{filter}")).await;
    assert!(
        !list.contains("shown…"),
        "a viewer is offered nothing: {list}"
    );
    // Without a state, nothing is offered.
    let (_, list) = page(&c, &alice, "/runs?job=settle").await;
    assert!(!list.contains("shown…"), "{list}");

    // The preview lists every key it would touch, and only those.
    let (status, preview) = page(&c, &alice, &format!("/runs/bulk?action=rerun&{filter}")).await;
    assert_eq!(status, StatusCode::OK, "{preview}");
    let keys = hidden_keys(&preview);
    assert_eq!(
        keys,
        [
            "settle:2026-09-14",
            "settle:2026-09-13",
            "settle:2026-09-11",
            "settle:2026-09-10"
        ]
    );
    assert!(
        preview.contains("Re-run 4 FAILED runs of settle"),
        "{preview}"
    );
    assert_eq!(status_of(&c.db.pool, "settle:2026-09-10").await, "FAILED");

    // Between preview and apply, bob re-runs one of them himself.
    let res = post(
        &c,
        &bob,
        "/runs/settle:2026-09-13/apply",
        &[
            ("csrf", bob.csrf.clone()),
            ("action", "rerun".into()),
            ("reason", "mine first".into()),
            ("expected", "FAILED".into()),
        ],
    )
    .await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);

    let mut form: Vec<(&str, String)> = vec![
        ("csrf", alice.csrf.clone()),
        ("action", "rerun".into()),
        ("job", "settle".into()),
        ("expected", "FAILED".into()),
        ("reason", "source fixed, INC-12".into()),
    ];
    form.extend(keys.iter().map(|k| ("key", k.clone())));
    let res = post(&c, &alice, "/runs/bulk/apply", &form).await;
    assert_eq!(res.status(), StatusCode::OK);
    let report = res.text().await.unwrap();
    assert!(
        report.contains("3 of 4 applied, 1 refused, 0 blocked"),
        "{report}"
    );
    assert!(
        report.contains("refused: rerun refused for settle:2026-09-13: it is PENDING"),
        "{report}"
    );
    for day in ["10", "11", "14"] {
        assert_eq!(
            status_of(&c.db.pool, &format!("settle:2026-09-{day}")).await,
            "PENDING"
        );
    }
    // Outside the filter: untouched.
    assert_eq!(status_of(&c.db.pool, "settle:2026-09-15").await, "FAILED");
    assert_eq!(status_of(&c.db.pool, "bill:2026-09-11").await, "FAILED");
    // One audit row per run, with the one reason; bob's row stays his.
    let rows: Vec<(String, String, String, String, Option<String>)> = sqlx::query_as(
        "SELECT operator, job_key, reason, before_status || '>' || after_status, remote_addr \
         FROM batch_operator_action WHERE action = 'rerun' ORDER BY job_key",
    )
    .fetch_all(&c.db.pool)
    .await
    .unwrap();
    let alice_row = |day: &str| {
        (
            "alice".to_owned(),
            format!("settle:2026-09-{day}"),
            "source fixed, INC-12".to_owned(),
            "FAILED>PENDING".to_owned(),
            Some("127.0.0.1".to_owned()),
        )
    };
    assert_eq!(
        rows,
        [
            alice_row("10"),
            alice_row("11"),
            (
                "bob".to_owned(),
                "settle:2026-09-13".to_owned(),
                "mine first".to_owned(),
                "FAILED>PENDING".to_owned(),
                Some("127.0.0.1".to_owned())
            ),
            alice_row("14"),
        ]
    );
    // Applying the same preview again changes nothing: every run left FAILED.
    let res = post(&c, &alice, "/runs/bulk/apply", &form).await;
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert!(res
        .text()
        .await
        .unwrap()
        .contains("0 of 4 applied, 4 refused"));
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM batch_operator_action")
        .fetch_one(&c.db.pool)
        .await
        .unwrap();
    assert_eq!(n, 4);
}

#[tokio::test]
async fn bulk_actions_refuse_viewers_bad_tokens_and_filters_too_wide_or_too_vague() {
    let c = start(None).await;
    // 501 FAILED runs of one job.
    let cfg = JobConfig::default();
    let job = JobName::parse("settle").unwrap();
    let first = NaiveDate::from_ymd_opt(2025, 1, 1).unwrap();
    let runs: Vec<NewRun> = (0..501)
        .map(|n| {
            let d = first + chrono::Days::new(n);
            NewRun::new(JobKey::daily(&job, d), d, &cfg).unwrap()
        })
        .collect();
    queue::enqueue(&c.db.pool, &runs, Clock::Db).await.unwrap();
    sqlx::query("UPDATE batch_job_run SET status = 'FAILED', attempts = 1, finished_at = now()")
        .execute(&c.db.pool)
        .await
        .unwrap();
    let (alice, vera) = (c.login("alice").await, c.login("vera").await);
    let (_, list) = page(&c, &alice, "/runs?job=settle&status=FAILED").await;
    assert!(list.contains("Re-run all more than 500 shown…"), "{list}");
    let (status, body) = page(
        &c,
        &alice,
        "/runs/bulk?action=rerun&job=settle&status=FAILED",
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(
        body.contains("More than 500 runs match this filter"),
        "{body}"
    );
    assert!(body.contains("Narrow the filter"), "{body}");
    // One job and one state, or nothing.
    let (status, _) = page(&c, &alice, "/runs/bulk?action=rerun&status=FAILED").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = page(
        &c,
        &alice,
        "/runs/bulk?action=rerun&job=settle&status=PENDING",
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body.contains("Re-run applies to FAILED runs, not PENDING"),
        "{body}"
    );
    // A narrower filter is fine.
    let (status, body) = page(
        &c,
        &alice,
        "/runs/bulk?action=skip&job=settle&status=FAILED&from=2025-01-01&to=2025-01-03",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let keys = hidden_keys(&body);
    assert_eq!(keys.len(), 3);
    // Between preview and apply, one of them is re-run: PENDING, a state a
    // skip starts from too, but not the state the preview showed.
    let res = post(
        &c,
        &alice,
        "/runs/settle:2025-01-02/apply",
        &[
            ("csrf", alice.csrf.clone()),
            ("action", "rerun".into()),
            ("reason", "one more try".into()),
            ("expected", "FAILED".into()),
        ],
    )
    .await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    let mut skip: Vec<(&str, String)> = vec![
        ("csrf", alice.csrf.clone()),
        ("action", "skip".into()),
        ("job", "settle".into()),
        ("expected", "FAILED".into()),
        ("reason", "not needed".into()),
    ];
    skip.extend(keys.iter().map(|k| ("key", k.clone())));
    let res = post(&c, &alice, "/runs/bulk/apply", &skip).await;
    assert_eq!(res.status(), StatusCode::OK);
    let report = res.text().await.unwrap();
    assert!(report.contains("2 of 3 applied, 1 refused"), "{report}");
    assert!(
        report.contains("skip refused for settle:2025-01-02: it is PENDING now, not FAILED as when the action was previewed"),
        "{report}"
    );
    assert_eq!(status_of(&c.db.pool, "settle:2025-01-02").await, "PENDING");
    assert_eq!(status_of(&c.db.pool, "settle:2025-01-03").await, "SKIPPED");
    // A viewer may not preview or apply.
    let (status, _) = page(
        &c,
        &vera,
        "/runs/bulk?action=rerun&job=settle&status=FAILED",
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let form = |csrf: &str, key: &str| {
        vec![
            ("csrf", csrf.to_owned()),
            ("action", "skip".to_owned()),
            ("job", "settle".to_owned()),
            ("expected", "FAILED".to_owned()),
            ("reason", "not needed".to_owned()),
            ("key", key.to_owned()),
        ]
    };
    let res = post(
        &c,
        &vera,
        "/runs/bulk/apply",
        &form(&vera.csrf, "settle:2025-01-01"),
    )
    .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let res = post(
        &c,
        &alice,
        "/runs/bulk/apply",
        &form("forged", "settle:2025-01-01"),
    )
    .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    // A key of another job than the one previewed.
    let res = post(
        &c,
        &alice,
        "/runs/bulk/apply",
        &form(&alice.csrf, "bill:2025-01-01"),
    )
    .await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    // Only the re-run and the two skips above were audited.
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM batch_operator_action")
        .fetch_one(&c.db.pool)
        .await
        .unwrap();
    assert_eq!(n, 3);
    assert_eq!(status_of(&c.db.pool, "settle:2025-01-04").await, "FAILED");
}

#[tokio::test]
async fn unknown_paths_jobs_and_keys_are_404_pages_with_the_navigation() {
    let c = start(None).await;
    c.runs("settle", &[("2026-09-15", "FAILED", None)]).await;
    let alice = c.login("alice").await;
    for (path, says) in [
        ("/no/such/page", "There is no page at this address."),
        ("/jobs/ghost", "No job is named ghost."),
        ("/jobs/Not%20A%20Job", "No job is named Not A Job."),
        (
            "/runs/settle:2030-01-01",
            "No run has the key settle:2030-01-01.",
        ),
        ("/runs/garbage", "No run has this key"),
    ] {
        let (status, body) = page(&c, &alice, path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert!(body.contains("<nav aria-label=\"Main\">"), "{path}: {body}");
        assert!(body.contains(says), "{path}: {body}");
    }
    // A job that exists keeps its calendar.
    let (status, _) = page(&c, &alice, "/jobs/settle").await;
    assert_eq!(status, StatusCode::OK);
    // An action on a key without a run is a 404 too.
    let res = post(
        &c,
        &alice,
        "/runs/settle:2030-01-01/preview",
        &[
            ("csrf", alice.csrf.clone()),
            ("action", "skip".into()),
            ("reason", "not needed".into()),
        ],
    )
    .await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    // Signed out, an unknown path still asks to sign in first.
    let res = c.http.get(c.url("/no/such/page")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(res.headers()[LOCATION], "/login?next=%2Fno%2Fsuch%2Fpage");
}

#[tokio::test]
async fn the_run_page_acts_first_in_console_words_and_labels_an_operators_reason() {
    let c = start(None).await;
    c.runs(
        "settle",
        &[
            ("2026-09-14", "SUCCEEDED", None),
            ("2026-09-15", "FAILED", Some("bad data")),
            ("2026-09-16", "PENDING", None),
        ],
    )
    .await;
    let alice = c.login("alice").await;
    // Actions come before the run's details; Force is explained.
    let (_, body) = page(&c, &alice, "/runs/settle:2026-09-14").await;
    let actions = body.find("<h2>Actions</h2>").unwrap();
    assert!(actions < body.find("<h2>Run</h2>").unwrap(), "{body}");
    assert!(actions < body.find("<h2>Attempts</h2>").unwrap());
    assert!(
        body.contains("Force re-runs a run that SUCCEEDED or was SKIPPED, as a correction"),
        "{body}"
    );
    assert!(body.contains("<th scope=\"row\">Job</th>"), "{body}");
    // A finished run has no next attempt; a PENDING one with attempts left does.
    assert!(!body.contains("Next attempt"), "{body}");
    let (_, pending) = page(&c, &alice, "/runs/settle:2026-09-16").await;
    assert!(pending.contains("Next attempt not before"), "{pending}");
    assert!(
        pending.contains("Force fails the run even if it has not started"),
        "{pending}"
    );
    // A PENDING run with no attempt left will not be claimed: no next attempt.
    sqlx::query(
        "UPDATE batch_job_run SET attempts = max_attempts WHERE job_key = 'settle:2026-09-16'",
    )
    .execute(&c.db.pool)
    .await
    .unwrap();
    let (_, spent) = page(&c, &alice, "/runs/settle:2026-09-16").await;
    assert!(!spent.contains("Next attempt"), "{spent}");

    // Refusals say what to do here, never which flag to add.
    let mut bodies = Vec::new();
    for (key, action) in [
        ("settle:2026-09-14", "rerun"),
        ("settle:2026-09-16", "fail"),
        ("settle:2026-09-14", "skip"),
    ] {
        let res = post(
            &c,
            &alice,
            &format!("/runs/{key}/preview"),
            &[
                ("csrf", alice.csrf.clone()),
                ("action", action.into()),
                ("reason", "checking the words".into()),
            ],
        )
        .await;
        bodies.push(res.text().await.unwrap());
    }
    assert!(
        bodies[0].contains("re-running it is a correction: tick Force"),
        "{}",
        bodies[0]
    );
    assert!(
        bodies[1].contains("to fail a run that has not started, tick Force"),
        "{}",
        bodies[1]
    );

    // An operator's skip: its reason is the operator's, with who and when,
    // not the last error.
    let res = post(
        &c,
        &alice,
        "/runs/settle:2026-09-15/apply",
        &[
            ("csrf", alice.csrf.clone()),
            ("action", "skip".into()),
            ("reason", "the bank was closed".into()),
            ("expected", "FAILED".into()),
        ],
    )
    .await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    let (_, skipped) = page(&c, &alice, "/runs/settle:2026-09-15").await;
    assert!(
        skipped.contains(
            "<th scope=\"row\">Operator's reason</th><td>the bank was closed (skip by alice at "
        ),
        "{skipped}"
    );
    assert!(!skipped.contains("Last error"), "{skipped}");
    assert!(!skipped.contains("Next attempt"), "{skipped}");
    bodies.push(skipped);
    for path in [
        "/runs",
        "/runs?job=settle&status=FAILED",
        "/stale",
        "/audit",
        "/workers",
        "/scopes",
    ] {
        bodies.push(page(&c, &alice, path).await.1);
    }
    for path in ["/", "/jobs/settle"] {
        bodies.push(page(&c, &alice, path).await.1);
    }
    for b in &bodies {
        assert!(!b.contains("<th>"), "a th without scope: {b}");
        assert!(!b.contains("--force") && !b.contains(" --"), "{b}");
    }
}

#[tokio::test]
async fn the_stale_page_offers_fail_for_a_dead_run_to_an_operator() {
    let c = start(None).await;
    let job = JobName::parse("settle").unwrap();
    let date = NaiveDate::from_ymd_opt(2026, 9, 15).unwrap();
    let key = JobKey::daily(&job, date);
    // Claimed an hour ago by a worker that is gone: its lease has expired
    // and nothing of it is left.
    let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&c.db.pool)
        .await
        .unwrap();
    let then = now - chrono::Duration::hours(1);
    let run = NewRun::new(key.clone(), date, &JobConfig::default()).unwrap();
    queue::enqueue(
        &c.db.pool,
        &[run],
        Clock::At(then - chrono::Duration::minutes(1)),
    )
    .await
    .unwrap();
    let spec = ClaimSpec {
        job: job.clone(),
        lease_ttl: Duration::from_secs(30),
    };
    let leases = queue::claim(&c.db.pool, "gone-worker", &[spec], 1, Clock::At(then))
        .await
        .unwrap();
    assert_eq!(leases.len(), 1);
    let (alice, vera) = (c.login("alice").await, c.login("vera").await);
    let (_, stale) = page(&c, &alice, "/stale").await;
    assert!(stale.contains("dead"), "{stale}");
    assert!(
        stale.contains("action=\"/runs/settle%3A2026-09-15/preview\""),
        "{stale}"
    );
    assert!(stale.contains("Fail…"), "{stale}");
    let (_, seen) = page(&c, &vera, "/stale").await;
    assert!(
        !seen.contains("Fail…"),
        "a viewer is offered nothing: {seen}"
    );
    // The button leads to the run page's preview of the fail.
    let res = post(
        &c,
        &alice,
        "/runs/settle%3A2026-09-15/preview",
        &[
            ("csrf", alice.csrf.clone()),
            ("action", "fail".into()),
            ("reason", "its worker is gone".into()),
        ],
    )
    .await;
    assert_eq!(res.status(), StatusCode::OK);
    let body = res.text().await.unwrap();
    assert!(body.contains("Apply: fail settle:2026-09-15"), "{body}");
    assert_eq!(status_of(&c.db.pool, key.as_str()).await, "RUNNING");
}
