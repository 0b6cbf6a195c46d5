//! The console's views and actions, over HTTP against a real database:
//! two operators acting at once get one winner, the calendar shows missing
//! and skipped periods from the recorded schedule, the run list pages
//! through any number of runs, and an action behind a held row names the
//! holder and can end it, audited; a partitioned run is listed once; and
//! the Scopes page counts a period's scopes per state and names them.

mod common;

use std::time::Duration;

use batchonce::{JobConfig, JobName};
use chrono::NaiveDate;
use common::console::{start, Browser};
use reqwest::header::COOKIE;
use reqwest::StatusCode;

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
    let (winner, loser) = if ra.status() == StatusCode::CONFLICT {
        (rb, ra)
    } else {
        (ra, rb)
    };
    // The winner's page says what the audit log holds, never text from the
    // address.
    let to = winner.headers()[reqwest::header::LOCATION]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(to, "/runs/settle%3A2026-09-15?done=1");
    let page = c.get_as(&alice.cookie, &to).await.text().await.unwrap();
    assert!(page.contains("rerun applied by"), "{page}");
    assert!(
        page.contains("FAILED → PENDING): data fixed, INC-7"),
        "{page}"
    );
    let spoof = c
        .get_as(
            &alice.cookie,
            "/runs/settle:2026-09-15?done=transfer%20approved",
        )
        .await
        .text()
        .await
        .unwrap();
    assert!(!spoof.contains("transfer approved"), "{spoof}");
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

#[tokio::test]
async fn a_partitioned_run_is_listed_once_and_its_page_shows_its_partitions() {
    let c = start(None).await;
    let cfg = batchonce::JobConfig {
        partitions: 3,
        ..Default::default()
    };
    let date = NaiveDate::from_ymd_opt(2026, 9, 15).unwrap();
    let key = batchonce::JobKey::parse("settle:2026-09-15").unwrap();
    batchonce::queue::enqueue(
        &c.db.pool,
        &[batchonce::queue::NewRun::new(key, date, &cfg).unwrap()],
        batchonce::Clock::Db,
    )
    .await
    .unwrap();
    let op = c.login("alice").await;
    let list = c
        .get_as(&op.cookie, "/runs?job=settle")
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(list.matches("href=\"/runs/settle%3A").count(), 1, "{list}");
    let page = c
        .get_as(&op.cookie, "/runs/settle%3A2026-09-15")
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains("<h2>Partitions</h2>"), "{page}");
    for p in 1..=3 {
        assert!(page.contains(&format!("settle:2026-09-15.p{p}")), "{page}");
    }
    assert!(page.contains("its partitions have all succeeded"), "{page}");
    let part = c
        .get_as(&op.cookie, "/runs/settle%3A2026-09-15.p2")
        .await
        .text()
        .await
        .unwrap();
    assert!(part.contains("2 of 3 of"), "{part}");
}

#[tokio::test]
async fn the_scopes_page_counts_a_periods_scopes_per_state_and_names_them() {
    let c = start(None).await;
    let date = NaiveDate::from_ymd_opt(2026, 9, 15).unwrap();
    let cfg = batchonce::JobConfig::default();
    let runs: Vec<_> = (1..=14)
        .map(|i| {
            let key = batchonce::JobKey::parse(&format!("settle:2026-09-15@seller-{i}")).unwrap();
            batchonce::queue::NewRun::new(key, date, &cfg).unwrap()
        })
        .collect();
    batchonce::queue::enqueue(&c.db.pool, &runs, batchonce::Clock::Db)
        .await
        .unwrap();
    // Two scopes FAILED, the rest still PENDING (set directly: the page
    // reads states, however they came about).
    sqlx::query(
        "UPDATE batch_job_run SET status = 'FAILED', finished_at = now(), error_message = 'x' \
         WHERE scope IN ('seller-3', 'seller-12')",
    )
    .execute(&c.db.pool)
    .await
    .unwrap();
    let op = c.login("alice").await;
    let page = c
        .get_as(&op.cookie, "/scopes?job=settle")
        .await
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("settle:2026-09-15 — 14 scopes, 14 not done"),
        "{page}"
    );
    assert!(
        page.contains(
            "href=\"/runs?job=settle&amp;status=FAILED&amp;key=settle%3A2026-09-15%40\">2</a>"
        ),
        "{page}"
    );
    assert!(
        page.contains("href=\"/runs/settle%3A2026-09-15%40seller-12\">seller-12</a>"),
        "{page}"
    );
    // Twelve PENDING: ten by name (in text order), then the count of the
    // rest.
    assert!(page.contains("seller-7</a> and <a"), "{page}");
    assert!(page.contains(">2 more</a>"), "{page}");
    // The run list filters by scope; a bad scope is one clear refusal.
    let list = c
        .get_as(&op.cookie, "/runs?scope=seller-3")
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(list.matches("href=\"/runs/settle%3A").count(), 1, "{list}");
    let bad = c.get_as(&op.cookie, "/runs?scope=Seller%203").await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let bad = c.get_as(&op.cookie, "/scopes?periods=0").await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
}
