//! `migrate --contract` (`ops::contract`): after it one generation at most of
//! each function family is left (`batchonce_claim`, `_claim2`, `_claim3` →
//! `_claim3`), this release's producer, worker and operator paths still work
//! through the library, a second contract drops nothing, and it refuses,
//! naming the process and dropping nothing, while a process of an earlier
//! release may still be running: live by its `live_until`, of a release that
//! records none and seen lately, or connected under its id.

use std::collections::BTreeMap;
use std::time::Duration;

use batchonce::ops::contract::{self, ContractError};
use batchonce::queue::{self, Action, ClaimSpec, Finish, HeldLease, NewRun, OperatorRequest};
use batchonce::testing::TestDb;
use batchonce::{Clock, JobKey, JobName};
use chrono::NaiveDate;
use sqlx::PgPool;

fn job() -> JobName {
    JobName::parse("test-job").unwrap()
}

fn run(day: u32) -> NewRun {
    let date = NaiveDate::from_ymd_opt(2026, 9, day).unwrap();
    NewRun::new(
        JobKey::daily(&job(), date),
        date,
        &batchonce::JobConfig::default(),
    )
    .unwrap()
}

/// The engine's functions by family: a name less its trailing digits.
async fn families(pool: &PgPool) -> BTreeMap<String, Vec<String>> {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT proname::text FROM pg_proc \
         WHERE pronamespace = current_schema()::regnamespace ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for n in names {
        let family = n.trim_end_matches(|c: char| c.is_ascii_digit()).to_owned();
        out.entry(family).or_default().push(n);
    }
    out
}

/// Registers a process as a release would, with `live_until` given as SQL.
async fn register(pool: &PgPool, id: &str, version: &str, live_until: &str, last_seen: &str) {
    sqlx::query(&format!(
        "INSERT INTO batch_worker (worker_id, host, pid, version, started_at, last_seen, role, live_until) \
         VALUES ($1, 'host-a', 4242, $2, now() - interval '1 hour', {last_seen}, 'worker', {live_until})"
    ))
    .bind(id)
    .bind(version)
    .execute(pool)
    .await
    .unwrap();
}

fn refused_naming(result: Result<contract::Contracted, ContractError>, ids: &[&str]) -> String {
    let e = match result {
        Err(e @ ContractError::EarlierReleaseRunning(_)) => e,
        other => panic!("expected a refusal naming {ids:?}, got {other:?}"),
    };
    let msg = e.to_string();
    for id in ids {
        assert!(msg.contains(id), "{msg}");
    }
    assert!(msg.contains("migrate --contract"), "{msg}");
    msg
}

async fn count_functions(pool: &PgPool, names: &[&str]) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_proc WHERE pronamespace = current_schema()::regnamespace \
         AND proname = ANY($1)",
    )
    .bind(names)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn one_generation_of_each_family_is_left_and_this_release_still_runs() {
    let db = TestDb::new(&[]).await;
    let pool = &db.pool;
    let before = families(pool).await;
    assert!(
        before.values().any(|g| g.len() > 1),
        "the migrated schema has no superseded generation: {before:?}"
    );
    let done = contract::run(pool).await.unwrap();
    assert_eq!(
        done.dropped,
        contract::drops(),
        "the first contract drops the file's list"
    );
    let after = families(pool).await;
    let doubled: Vec<&Vec<String>> = after.values().filter(|g| g.len() > 1).collect();
    assert!(
        doubled.is_empty(),
        "families with two generations: {doubled:?}"
    );
    assert_eq!(count_functions(pool, &contract::dropped_names()).await, 0);
    // The generation this release calls is the one left.
    for kept in ["batchonce_claim3", "batchonce_enqueue2", "batchonce_fence"] {
        assert_eq!(count_functions(pool, &[kept]).await, 1, "{kept}");
    }

    // Idempotent: nothing left to drop.
    let again = contract::run(pool).await.unwrap();
    assert!(again.dropped.is_empty(), "{again:?}");
    assert_eq!(again.already_gone, contract::drops());

    // The producer's enqueue, the worker's claim, heartbeat, fenced commit
    // and finish, lease recovery, and the operator's re-run and skip.
    let report = queue::enqueue(pool, &[run(1), run(2)], Clock::Db)
        .await
        .unwrap();
    assert_eq!(report.enqueued.len(), 2, "{report:?}");
    let spec = [ClaimSpec {
        job: job(),
        lease_ttl: Duration::from_secs(30),
    }];
    let leases = queue::claim(pool, "w-new", &spec, 2, Clock::Db)
        .await
        .unwrap();
    assert_eq!(leases.len(), 2);
    let held: Vec<HeldLease> = leases
        .iter()
        .map(|l| HeldLease {
            fence: l.fence(),
            lease_ttl: Duration::from_secs(30),
        })
        .collect();
    let beat = queue::heartbeat(pool, &held, Clock::Db).await.unwrap();
    assert_eq!(beat.extended.len(), 2, "{beat:?}");
    let tx = queue::begin_fenced(pool, &leases[0].fence(), Duration::from_secs(30), Clock::Db)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let status = queue::finish(pool, &leases[0].fence(), &Finish::Succeeded, Clock::Db)
        .await
        .unwrap();
    assert_eq!(status.as_str(), "SUCCEEDED");
    let status = queue::finish(
        pool,
        &leases[1].fence(),
        &Finish::Fatal {
            error: "broken input".into(),
        },
        Clock::Db,
    )
    .await
    .unwrap();
    assert_eq!(status.as_str(), "FAILED");
    queue::recover_expired(pool, &[job()], &[], Clock::Db)
        .await
        .unwrap();
    for (action, key, after) in [
        (Action::Rerun, &leases[1].key, "PENDING"),
        (Action::Skip, &leases[1].key, "SKIPPED"),
    ] {
        let req = OperatorRequest {
            action,
            key: key.clone(),
            operator: "olga".into(),
            reason: "after the contract".into(),
            force: false,
            stale_after: Duration::from_secs(3600),
            max_attempts: 3,
        };
        let out = queue::apply_action(pool, &req, Clock::Db)
            .await
            .unwrap()
            .unwrap_or_else(|r| panic!("{action:?} refused: {r:?}"));
        assert_eq!(out.after.as_str(), after, "{out:?}");
    }
}

#[tokio::test]
async fn it_refuses_while_a_process_of_an_earlier_release_may_run() {
    let db = TestDb::new(&[]).await;
    let pool = &db.pool;
    // This release's live processes never stop it.
    register(
        pool,
        "new-1",
        "0.2.0",
        "now() + interval '1 minute'",
        "now()",
    )
    .await;
    // A process of 0.1.0 that promised a sign of life a minute from now.
    register(
        pool,
        "old-1",
        "0.1.0",
        "now() + interval '1 minute'",
        "now()",
    )
    .await;
    let msg = refused_naming(contract::run(pool).await, &["old-1"]);
    assert!(
        msg.contains("version 0.1.0") && msg.contains("pid 4242"),
        "{msg}"
    );
    assert!(!msg.contains("new-1"), "{msg}");
    assert_eq!(
        count_functions(pool, &contract::dropped_names()).await,
        contract::drops().len() as i64,
        "a refused contract dropped something"
    );
    // Its promise passed: gone.
    sqlx::query("UPDATE batch_worker SET live_until = now() - interval '1 second' WHERE worker_id = 'old-1'")
        .execute(pool)
        .await
        .unwrap();

    // 0.1.0 records no live_until: seen lately, it counts; an unparseable
    // version is an earlier release's.
    register(
        pool,
        "old-2",
        "0.1.0",
        "NULL",
        "now() - interval '10 seconds'",
    )
    .await;
    register(
        pool,
        "odd-3",
        "unknown",
        "now() + interval '1 minute'",
        "now()",
    )
    .await;
    refused_naming(contract::run(pool).await, &["old-2", "odd-3"]);
    sqlx::query("DELETE FROM batch_worker WHERE worker_id = 'odd-3'")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE batch_worker SET last_seen = now() - interval '1 hour' WHERE worker_id = 'old-2'",
    )
    .execute(pool)
    .await
    .unwrap();

    // Whatever its row says, a session under its id is a running process.
    let connected = batchonce::db::connect(&db.url, "old-1", 1).await.unwrap();
    sqlx::query("SELECT 1").execute(&connected).await.unwrap();
    let msg = refused_naming(contract::run(pool).await, &["old-1"]);
    assert!(msg.contains("connected") && !msg.contains("old-2"), "{msg}");
    connected.close().await;
    // The server ends the backend once it reads the client's goodbye, which
    // a loaded machine may take a while to schedule.
    batchonce::testing::wait_until(
        "old-1's session to end",
        Duration::from_secs(60),
        || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity \
                 WHERE datname = current_database() AND application_name = 'old-1')",
            )
            .fetch_one(pool)
            .await
            .unwrap()
        },
    )
    .await;

    let done = contract::run(pool).await.unwrap();
    assert_eq!(done.dropped, contract::drops());
}
