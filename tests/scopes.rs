//! Scoped runs (issue 24, first part): a scoped job's runs are one per scope
//! and period, keyed `<job>:<period>@<scope>`, from a list or from a scope
//! query run inside the one enqueue statement; ids that are not scopes are
//! reported and never inserted; a second enqueue is all duplicates; this
//! release's claim takes scoped runs and the previous releases' picks leave
//! them alone.

use std::sync::Arc;
use std::time::Duration;

use batchonce::clock::Clock;
use batchonce::config::{JobConfig, ScopeSource};
use batchonce::queue::{self, ClaimSpec};
use batchonce::runtime::producer;
use batchonce::schedule::Period;
use batchonce::testing::TestDb;
use batchonce::{JobName, Scope};
use chrono::NaiveDate;
use sqlx::Row;

fn job() -> JobName {
    JobName::parse("seller-payout").unwrap()
}

fn date() -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 9, 15).unwrap()
}

#[tokio::test]
async fn a_scope_query_enqueues_one_run_per_scope_in_one_statement() {
    let db = TestDb::new(&[]).await;
    sqlx::query("CREATE TABLE sellers (id bigint PRIMARY KEY, active boolean NOT NULL)")
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO sellers SELECT g, g % 10 <> 0 FROM generate_series(1, 200) g")
        .execute(&db.pool)
        .await
        .unwrap();
    let q = "SELECT 'seller-' || id FROM sellers WHERE active UNION ALL SELECT 'Not A Scope'";
    let cfg = JobConfig {
        scopes: Some(ScopeSource::Query(q.to_owned())),
        ..JobConfig::default()
    };
    let runs = producer::runs_for_periods(&job(), &cfg, &[Period::day(date())]).unwrap();
    assert_eq!(runs.len(), 1, "one template per period");
    assert_eq!(runs[0].scope_query.as_deref(), Some(q));

    let first = queue::enqueue(&db.pool, &runs, Clock::Db).await.unwrap();
    assert_eq!(first.enqueued.len(), 180);
    assert!(first.duplicates.is_empty());
    assert_eq!(first.invalid.len(), 1);
    assert_eq!(first.invalid[0].1, "Not A Scope");
    assert!(first
        .enqueued
        .iter()
        .any(|k| k.as_str() == "seller-payout:2026-09-15@seller-7"));
    assert!(!first
        .enqueued
        .iter()
        .any(|k| k.as_str() == "seller-payout:2026-09-15@seller-10"));

    let second = queue::enqueue(&db.pool, &runs, Clock::Db).await.unwrap();
    assert!(second.enqueued.is_empty());
    assert_eq!(second.duplicates.len(), 180);

    // The scope column follows the key, and every run has its own context.
    let row = sqlx::query(
        "SELECT count(*) AS n, count(DISTINCT scope) AS scopes, \
                count(*) FILTER (WHERE timezone IS NULL) AS no_context \
         FROM batch_job_run WHERE job_name = 'seller-payout'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(row.get::<i64, _>("n"), 180);
    assert_eq!(row.get::<i64, _>("scopes"), 180);
    assert_eq!(row.get::<i64, _>("no_context"), 0);

    // The previous releases' picks leave scoped runs alone; this one's claim
    // takes them, and a claimed run names its scope.
    let old: Vec<String> = sqlx::query_scalar(
        "SELECT batchonce_due_runs(ARRAY['seller-payout'], 10, now() + interval '1 minute')",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(old.is_empty(), "{old:?}");
    let old2: Vec<String> = sqlx::query_scalar(
        "SELECT job_key FROM batchonce_claim2(ARRAY['seller-payout'], ARRAY[30::float8], 10, 'old', NULL)",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(old2.is_empty(), "{old2:?}");
    let spec = ClaimSpec {
        job: job(),
        lease_ttl: Duration::from_secs(30),
    };
    let leases = queue::claim(&db.pool, "w1", &[spec], 5, Clock::Db)
        .await
        .unwrap();
    assert_eq!(leases.len(), 5);
    for l in &leases {
        assert!(
            l.key.scope().is_some_and(|s| s.starts_with("seller-")),
            "{}",
            l.key
        );
        assert_eq!(l.key.period(), "2026-09-15");
    }
}

#[tokio::test]
async fn listed_scopes_and_a_failing_scope_query() {
    let db = TestDb::new(&[]).await;
    let list: Vec<Scope> = ["eu", "us", "apac"]
        .iter()
        .map(|s| Scope::parse(s).unwrap())
        .collect();
    let cfg = JobConfig {
        scopes: Some(ScopeSource::List(list.clone())),
        partitions: 2,
        partitionable: true,
        ..JobConfig::default()
    };
    let runs = producer::runs_for_periods(&job(), &cfg, &[Period::day(date())]).unwrap();
    let keys: Vec<&str> = runs.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "seller-payout:2026-09-15@eu",
            "seller-payout:2026-09-15@us",
            "seller-payout:2026-09-15@apac"
        ]
    );
    let report = queue::enqueue(&db.pool, &runs, Clock::Db).await.unwrap();
    assert_eq!(report.enqueued.len(), 3);
    // A scoped run's partitions carry the scope too.
    let parts: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT job_key, scope FROM batch_job_run WHERE partition_of IS NOT NULL ORDER BY job_key",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(parts.len(), 6);
    assert_eq!(
        parts[0],
        (
            "seller-payout:2026-09-15@apac.p1".to_owned(),
            Some("apac".to_owned())
        )
    );

    // A query that fails fails its statement with the database's error and
    // writes nothing.
    let broken = JobConfig {
        scopes: Some(ScopeSource::Query(
            "SELECT id FROM no_such_table".to_owned(),
        )),
        ..JobConfig::default()
    };
    let mut runs = producer::runs_for_periods(
        &job(),
        &broken,
        &[Period::day(NaiveDate::from_ymd_opt(2026, 9, 16).unwrap())],
    )
    .unwrap();
    runs[0].scope_query = Some(Arc::from("SELECT id FROM no_such_table"));
    let e = queue::enqueue(&db.pool, &runs, Clock::Db)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no_such_table"), "{e}");
    let e = queue::count_scopes(&db.pool, "SELECT id FROM no_such_table")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no_such_table"), "{e}");
    let n: i64 =
        sqlx::query_scalar("SELECT count(*) FROM batch_job_run WHERE business_date = '2026-09-16'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(n, 0);
}
