//! `batchonce_enqueue_declared`, the SQL an application (the Node.js
//! package's `enqueue`) enqueues with: the configuration comes from the live
//! processes that declare the job, and each run stores exactly the context
//! `batchonce enqueue` would give it; duplicates and calendar skips are
//! reported; without one agreed declaration, and on bad input, it refuses
//! with one error and writes nothing.

use std::time::Duration;

use batchonce::config::context::RunContext;
use batchonce::config::JobConfig;
use batchonce::queue;
use batchonce::runtime::worker_registry::{self, Role};
use batchonce::schedule::{Covers, Period};
use batchonce::testing::TestDb;
use batchonce::{JobKey, JobName};
use chrono::{NaiveDate, Weekday};
use sqlx::PgPool;

fn job() -> JobName {
    JobName::parse("nightly-invoices").unwrap()
}

fn cfg() -> JobConfig {
    JobConfig {
        timezone: "Asia/Seoul".parse().unwrap(),
        covers: Covers::PreviousDay,
        max_attempts: 5,
        lease_ttl: Duration::from_secs(45),
        stale_after: Duration::from_secs(90 * 60),
        backoff: Duration::from_millis(1500),
        backoff_max: Duration::from_secs(3600 + 120),
        skip_weekdays: vec![Weekday::Sat],
        skip_dates: vec![NaiveDate::from_ymd_opt(2026, 12, 25).unwrap()],
        ..JobConfig::default()
    }
}

async fn declare(pool: &PgPool, process: &str, c: &JobConfig) {
    worker_registry::register_process(
        pool,
        process,
        Role::Producer,
        "test",
        Duration::from_secs(60),
        &[(job(), c)],
    )
    .await
    .unwrap();
}

async fn enqueue(pool: &PgPool, dates: &[&str]) -> Result<Vec<(String, String)>, sqlx::Error> {
    let dates: Vec<NaiveDate> = dates.iter().map(|d| d.parse().unwrap()).collect();
    sqlx::query_as("SELECT job_key, outcome FROM batchonce_enqueue_declared($1, $2, $3)")
        .bind(job().as_str())
        .bind(&dates)
        .bind(serde_json::json!({"source": "app"}))
        .fetch_all(pool)
        .await
}

fn sqlstate(e: &sqlx::Error) -> String {
    e.as_database_error()
        .and_then(|d| d.code().map(|c| c.into_owned()))
        .unwrap_or_default()
}

async fn runs(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM batch_job_run")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn runs_get_the_declared_context_and_duplicates_and_skips_are_reported() {
    let db = TestDb::new(&[]).await;
    let c = cfg();
    declare(&db.pool, "producer-1", &c).await;
    // 2026-09-18 is a Friday, 2026-09-19 a Saturday (skip_weekdays), and
    // 2026-12-25 is in skip_dates.
    let out = enqueue(&db.pool, &["2026-09-18", "2026-09-19", "2026-12-25"])
        .await
        .unwrap();
    assert_eq!(
        out,
        vec![
            ("nightly-invoices:2026-09-18".into(), "enqueued".into()),
            ("nightly-invoices:2026-09-19".into(), "skipped".into()),
            ("nightly-invoices:2026-12-25".into(), "skipped".into()),
        ]
    );
    let again = enqueue(&db.pool, &["2026-09-18", "2026-09-20"])
        .await
        .unwrap();
    assert_eq!(
        again,
        vec![
            ("nightly-invoices:2026-09-18".into(), "duplicate".into()),
            ("nightly-invoices:2026-09-20".into(), "enqueued".into()),
        ]
    );
    for d in ["2026-09-18", "2026-09-19", "2026-12-25", "2026-09-20"] {
        let date: NaiveDate = d.parse().unwrap();
        let key = JobKey::parse(&format!("nightly-invoices:{d}")).unwrap();
        let (run, _) = queue::show_run(&db.pool, &key).await.unwrap().unwrap();
        let want = RunContext::new(&c, &Period::day(date)).unwrap();
        assert_eq!(run.context.as_ref(), Some(&want), "the context of {key}");
        assert_eq!(run.max_attempts, 5);
        let payload: serde_json::Value =
            sqlx::query_scalar("SELECT payload FROM batch_job_run WHERE job_key = $1")
                .bind(key.as_str())
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!(payload, serde_json::json!({"source": "app"}));
        match c.skip_reason(date) {
            Some(reason) => {
                assert_eq!(run.status, queue::RunStatus::Skipped);
                assert_eq!(run.error_message.as_deref(), Some(reason.as_str()));
            }
            None => assert_eq!(run.status, queue::RunStatus::Pending),
        }
    }
}

#[tokio::test]
async fn without_one_agreed_live_declaration_nothing_is_enqueued() {
    let db = TestDb::new(&[]).await;
    let e = enqueue(&db.pool, &["2026-09-18"]).await.unwrap_err();
    assert_eq!(sqlstate(&e), "BO002", "{e}");
    assert!(e
        .to_string()
        .contains("no live batchonce process declares job nightly-invoices"));

    declare(&db.pool, "producer-1", &cfg()).await;
    let other = JobConfig {
        max_attempts: 9,
        ..cfg()
    };
    declare(&db.pool, "worker-2", &other).await;
    let e = enqueue(&db.pool, &["2026-09-18"]).await.unwrap_err();
    assert_eq!(sqlstate(&e), "BO003", "{e}");

    // A process whose registration has lapsed no longer counts.
    sqlx::query("UPDATE batch_worker SET live_until = now() - interval '1 second' WHERE worker_id = 'worker-2'")
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(enqueue(&db.pool, &["2026-09-18"]).await.unwrap().len(), 1);

    let firing = JobConfig {
        covers: Covers::Firing,
        schedule: Some("*/15 * * * *".parse().unwrap()),
        ..cfg()
    };
    sqlx::query("DELETE FROM batch_worker")
        .execute(&db.pool)
        .await
        .unwrap();
    declare(&db.pool, "producer-3", &firing).await;
    let e = enqueue(&db.pool, &["2026-09-19"]).await.unwrap_err();
    assert_eq!(sqlstate(&e), "BO004", "{e}");
    assert_eq!(runs(&db.pool).await, 1);
}

#[tokio::test]
async fn bad_input_is_one_error_and_writes_nothing() {
    let db = TestDb::new(&[]).await;
    declare(&db.pool, "producer-1", &cfg()).await;
    let many: Vec<String> = (0..367)
        .map(|i| (NaiveDate::from_ymd_opt(2026, 1, 1).unwrap() + chrono::Days::new(i)).to_string())
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    for dates in [
        vec![],
        many,
        vec!["2300-01-01"],
        vec!["1969-12-31"],
        vec!["2026-09-18", "2026-09-18"],
    ] {
        let e = enqueue(&db.pool, &dates).await.unwrap_err();
        assert_eq!(sqlstate(&e), "22023", "{dates:?}: {e}");
    }
    for name in ["Nightly", "a--b", "", "x y"] {
        let e =
            sqlx::query("SELECT * FROM batchonce_enqueue_declared($1, ARRAY[DATE '2026-09-18'])")
                .bind(name)
                .execute(&db.pool)
                .await
                .unwrap_err();
        assert_eq!(sqlstate(&e), "22023", "{name:?}: {e}");
    }
    assert_eq!(runs(&db.pool).await, 0);
}

#[tokio::test]
async fn a_declared_partitioned_job_is_enqueued_with_its_partitions() {
    let db = TestDb::new(&[]).await;
    let c = JobConfig {
        partitions: 3,
        ..cfg()
    };
    declare(&db.pool, "producer-1", &c).await;
    let out = enqueue(&db.pool, &["2026-09-18", "2026-09-19"])
        .await
        .unwrap();
    assert_eq!(
        out[0],
        ("nightly-invoices:2026-09-18".into(), "enqueued".into())
    );
    let rows: Vec<(String, String, Option<i16>)> =
        sqlx::query_as("SELECT job_key, status, partition_no FROM batch_job_run ORDER BY job_key")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let keys: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        keys,
        [
            "nightly-invoices:2026-09-18",
            "nightly-invoices:2026-09-18.p1",
            "nightly-invoices:2026-09-18.p2",
            "nightly-invoices:2026-09-18.p3",
            "nightly-invoices:2026-09-19",
            "nightly-invoices:2026-09-19.p1",
            "nightly-invoices:2026-09-19.p2",
            "nightly-invoices:2026-09-19.p3",
        ]
    );
    // The calendar-skipped Saturday is skipped with its partitions.
    assert!(rows[4..].iter().all(|r| r.1 == "SKIPPED"), "{rows:?}");
    assert!(rows[..4].iter().all(|r| r.1 == "PENDING"), "{rows:?}");
}
