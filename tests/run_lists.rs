//! The lists of PENDING and RUNNING runs (`batch_job_due`,
//! `batch_job_running`, migration 20261207000001) follow every writer of a
//! run: the claim and the finish, which keep them themselves, and every
//! other writer through the trigger (recovery, operator actions, the
//! previous release's direct statements, a partition's parent). And the
//! claim and the finish update the run row in place (HOT), which is what the
//! lists are for.

use std::time::Duration;

use batchonce::queue::{self, ClaimSpec, Fence, Finish, NewRun, RunStatus};
use batchonce::testing::{assert_lists_in_step, TestDb};
use batchonce::{Clock, JobKey, JobName};
use chrono::NaiveDate;
use sqlx::PgPool;

fn job() -> JobName {
    JobName::parse("test-job").unwrap()
}

fn run(day: u32, max_attempts: u32) -> NewRun {
    let date = NaiveDate::from_ymd_opt(2026, 1, 1).unwrap() + chrono::Days::new(day as u64);
    let cfg = batchonce::JobConfig {
        max_attempts,
        lease_ttl: Duration::from_secs(30),
        ..Default::default()
    };
    NewRun::new(JobKey::daily(&job(), date), date, &cfg).unwrap()
}

fn spec() -> Vec<ClaimSpec> {
    vec![ClaimSpec {
        job: job(),
        lease_ttl: Duration::from_secs(30),
    }]
}

async fn status(pool: &PgPool, key: &JobKey) -> String {
    sqlx::query_scalar("SELECT status FROM batch_job_run WHERE job_key = $1")
        .bind(key.as_str())
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn claim_all(pool: &PgPool, n: u32) -> Vec<Fence> {
    let leases = queue::claim(pool, "w", &spec(), n, Clock::Db)
        .await
        .unwrap();
    leases.iter().map(|l| l.fence()).collect()
}

#[tokio::test]
async fn the_lists_follow_every_writer() {
    let db = TestDb::new(&[]).await;
    let pool = &db.pool;
    let mut runs: Vec<NewRun> = (0..8).map(|d| run(d, 2)).collect();
    runs.push(NewRun {
        skip_reason: Some("holiday".into()),
        ..run(8, 2)
    });
    queue::enqueue(pool, &runs, Clock::Db).await.unwrap();
    assert_lists_in_step(pool).await;
    let due: i64 = sqlx::query_scalar("SELECT count(*) FROM batch_job_due")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(due, 8, "the skipped run is not due");

    // Claimed: out of the due list, into the running list.
    let fences = claim_all(pool, 6).await;
    assert_eq!(fences.len(), 6);
    assert_lists_in_step(pool).await;

    // Every way a finish ends an attempt, in one batch: done, back to due
    // (a retry with attempts left, a release), or failed.
    let kinds = [
        Finish::Succeeded,
        Finish::Skipped { reason: "x".into() },
        Finish::Retry {
            error: "again".into(),
            delay: Duration::from_secs(3600),
        },
        Finish::Fatal { error: "no".into() },
        Finish::Release,
    ];
    let batch: Vec<(Fence, Finish)> = fences[..5].iter().cloned().zip(kinds).collect();
    let out = queue::finish_many(pool, &batch, Clock::Db).await.unwrap();
    assert_eq!(
        out,
        vec![
            Some(RunStatus::Succeeded),
            Some(RunStatus::Skipped),
            Some(RunStatus::Pending),
            Some(RunStatus::Failed),
            Some(RunStatus::Pending),
        ]
    );
    assert_lists_in_step(pool).await;
    let retry_due: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT next_run_at FROM batch_job_due WHERE job_key = $1")
            .bind(fences[2].key.as_str())
            .fetch_one(pool)
            .await
            .unwrap();
    assert!(retry_due > chrono::Utc::now() + chrono::Duration::minutes(50));

    // Lease recovery (through the trigger): the sixth run's lease expires.
    let later = Clock::At(chrono::Utc::now() + chrono::Duration::seconds(60));
    let back = queue::recover_expired(pool, &[job()], &[], later)
        .await
        .unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(status(pool, &fences[5].key).await, "PENDING");
    assert_lists_in_step(pool).await;

    // An operator's actions: fail a PENDING run, re-run it, skip another.
    for (key, action, allowed, target) in [
        (&fences[5].key, "fail", "{PENDING}", "FAILED"),
        (&fences[5].key, "rerun", "{FAILED}", "PENDING"),
        (&fences[2].key, "skip", "{PENDING}", "SKIPPED"),
    ] {
        let done: Option<String> = sqlx::query_scalar(
            "SELECT batchonce_operator_apply($1, $2, $3::text[], $4, 'by hand', NULL, 3, \
             'op', 'test', $5)",
        )
        .bind(key.as_str())
        .bind(action)
        .bind(allowed)
        .bind(target)
        .bind(allowed.trim_matches(|c| c == '{' || c == '}'))
        .fetch_one(pool)
        .await
        .unwrap();
        assert_eq!(done.as_deref(), Some(key.as_str()), "{action}");
        assert_lists_in_step(pool).await;
    }

    // The previous release's statements: its own claim, its takeover, a
    // due time moved by hand, and a run deleted (preflight's scratch runs).
    let old = fences[4].key.as_str();
    sqlx::query(
        "UPDATE batch_job_run SET status = 'RUNNING', attempts = attempts + 1, \
         lease_token = 42, lease_owner = 'old', lease_expires_at = now() + interval '30 s' \
         WHERE job_key = $1",
    )
    .bind(old)
    .execute(pool)
    .await
    .unwrap();
    assert_lists_in_step(pool).await;
    sqlx::query(
        "UPDATE batch_job_run SET status = 'PENDING', lease_token = 43, \
         lease_expires_at = NULL WHERE job_key = $1",
    )
    .bind(old)
    .execute(pool)
    .await
    .unwrap();
    assert_lists_in_step(pool).await;
    sqlx::query(
        "UPDATE batch_job_run SET next_run_at = now() + interval '1 day' WHERE job_key = $1",
    )
    .bind(old)
    .execute(pool)
    .await
    .unwrap();
    assert_lists_in_step(pool).await;
    let fresh = run(30, 2);
    queue::enqueue(pool, std::slice::from_ref(&fresh), Clock::Db)
        .await
        .unwrap();
    sqlx::query("DELETE FROM batch_job_run WHERE job_key = $1")
        .bind(fresh.key.as_str())
        .execute(pool)
        .await
        .unwrap();
    assert_lists_in_step(pool).await;

    // Whatever is due is still claimed, and nothing that is not: the re-run
    // run and the two never claimed; the run moved to tomorrow stays.
    let rest = claim_all(pool, 100).await;
    let mut keys: Vec<String> = rest.iter().map(|f| f.key.to_string()).collect();
    keys.sort();
    // The first claim took six of the eight; the other two were never
    // claimed.
    let claimed_first: Vec<String> = fences.iter().map(|f| f.key.to_string()).collect();
    let never: Vec<String> = runs[..8]
        .iter()
        .map(|r| r.key.to_string())
        .filter(|k| !claimed_first.contains(k))
        .collect();
    assert_eq!(never.len(), 2);
    let mut want: Vec<String> = never;
    want.push(fences[5].key.to_string());
    want.sort();
    assert_eq!(keys, want, "the claim took exactly the due runs");
    assert_eq!(status(pool, &fences[4].key).await, "PENDING");
    assert_lists_in_step(pool).await;
}

/// A due entry whose run is no longer PENDING (a writer's list got ahead of
/// it) is dropped by the claim that picks it, and the run is not claimed.
#[tokio::test]
async fn a_stale_due_entry_is_dropped_by_the_claim() {
    let db = TestDb::new(&[]).await;
    let pool = &db.pool;
    let r = run(1, 2);
    queue::enqueue(pool, std::slice::from_ref(&r), Clock::Db)
        .await
        .unwrap();
    let fence = claim_all(pool, 1).await.remove(0);
    queue::finish(pool, &fence, &Finish::Succeeded, Clock::Db)
        .await
        .unwrap();
    sqlx::query("INSERT INTO batch_job_due VALUES ($1, 'test-job', now() - interval '1 s', false)")
        .bind(r.key.as_str())
        .execute(pool)
        .await
        .unwrap();
    // The earliest releases' claim, which updates whatever its pick
    // returns, leaves it alone; this release's claim drops it.
    let old: Vec<(String,)> = sqlx::query_as(
        "SELECT job_key FROM batchonce_claim('{test-job}', '{30}', 10, 'old', NULL)",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(old.is_empty(), "{old:?}");
    assert!(claim_all(pool, 10).await.is_empty());
    assert_eq!(status(pool, &r.key).await, "SUCCEEDED");
    assert_lists_in_step(pool).await;
}

/// The claim and the finish write the run row in place: no index of the run
/// table names a column they change, and the table leaves room on its pages.
/// An index on the status, or on the token, would make every one of them
/// write index entries again.
#[tokio::test]
async fn the_claim_and_the_finish_are_hot_updates() {
    let db = TestDb::new(&[]).await;
    let pool = &db.pool;
    let runs: Vec<NewRun> = (0..50).map(|d| run(d, 2)).collect();
    queue::enqueue(pool, &runs, Clock::Db).await.unwrap();
    // The claim, then the finish, each in a transaction of its own as in a
    // worker: the finish finds the claim's old versions dead and prunes them.
    let mut tx = pool.begin().await.unwrap();
    let claimed: Vec<(String, i64)> = sqlx::query_as(
        "SELECT job_key, lease_token FROM batchonce_claim3('{test-job}', '{30}', 50, 'w', NULL, false)",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    assert_eq!(claimed.len(), 50);
    assert_eq!(
        hot_updates(&mut tx).await,
        (50, 50),
        "the claim's updates, HOT"
    );
    tx.commit().await.unwrap();
    let (keys, tokens): (Vec<String>, Vec<i64>) = claimed.into_iter().unzip();
    let mut tx = pool.begin().await.unwrap();
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM batchonce_finish($1, $2, array_fill('succeeded'::text, ARRAY[50]), \
         array_fill(NULL::text, ARRAY[50]), array_fill(0::float8, ARRAY[50]), NULL)",
    )
    .bind(&keys)
    .bind(&tokens)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(n, 50);
    assert_eq!(
        hot_updates(&mut tx).await,
        (50, 50),
        "the finish's updates, HOT"
    );
    tx.commit().await.unwrap();
    assert_lists_in_step(pool).await;
}

/// Updates of the run table in the open transaction of `conn`, and how many
/// of them were HOT.
async fn hot_updates(conn: &mut sqlx::PgConnection) -> (i64, i64) {
    sqlx::query_as(
        "SELECT pg_stat_get_xact_tuples_updated('batch_job_run'::regclass), \
                pg_stat_get_xact_tuples_hot_updated('batch_job_run'::regclass)",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

/// Runs enqueued one at a time while claims run back to back are all
/// claimed: a claim never drops the due entry of a run it does not take.
/// (A pick in a function of its own read with a newer snapshot than the
/// claim's update: it deleted the entry of a run enqueued a moment before,
/// which the update did not see, and the run was never claimed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runs_enqueued_during_claims_are_all_claimed() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let db = TestDb::new(&[]).await;
    let total: u32 = 1200;
    let enqueued = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..4 {
        let pool = db.pool.clone();
        let enqueued = enqueued.clone();
        tasks.push(tokio::spawn(async move {
            let worker = format!("w{c}");
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while std::time::Instant::now() < deadline {
                let leases = queue::claim(&pool, &worker, &spec(), 3, Clock::Db)
                    .await
                    .unwrap();
                if leases.is_empty() {
                    let left: i64 = sqlx::query_scalar(
                        "SELECT count(*) FROM batch_job_run WHERE status <> 'SUCCEEDED'",
                    )
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                    if enqueued.load(Ordering::SeqCst) && left == 0 {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                let batch: Vec<(Fence, Finish)> = leases
                    .iter()
                    .map(|l| (l.fence(), Finish::Succeeded))
                    .collect();
                queue::finish_many(&pool, &batch, Clock::Db).await.unwrap();
            }
        }));
    }
    for d in 0..total {
        queue::enqueue(&db.pool, &[run(d, 2)], Clock::Db)
            .await
            .unwrap();
    }
    enqueued.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    let stuck: Vec<(String, String)> = sqlx::query_as(
        "SELECT job_key::text, status::text FROM batch_job_run WHERE status <> 'SUCCEEDED' \
         ORDER BY 1 LIMIT 10",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(stuck.is_empty(), "runs never claimed: {stuck:?}");
    let n: i64 =
        sqlx::query_scalar("SELECT count(*) FROM batch_job_run WHERE status = 'SUCCEEDED'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(n, i64::from(total));
    assert_lists_in_step(&db.pool).await;
}
