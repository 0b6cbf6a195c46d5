//! Worker runtime tests, in process against real PostgreSQL: concurrency,
//! retries, panics, lease loss cancelling the handler, graceful shutdown.

mod common;

use std::time::{Duration, Instant};

use async_trait::async_trait;
use batchonce::config::Config;
use batchonce::queue::{self, NewRun};
use batchonce::runtime::worker::{self, Shutdown, WorkerOptions};
use batchonce::testing::{wait_until, TestDb};
use batchonce::{Clock, Job, JobConfig, JobContext, JobError, JobKey, JobName, Outcome, Registry};
use chrono::NaiveDate;
use common::worker::Running;
use sqlx::PgPool;

/// Writes `items` rows into `test_item`, `chunk_size` per fenced transaction.
/// The payload steers it: `fail_first` (retryable error on attempt 1),
/// `panic_first`, `fatal`, `pause_ms` between chunks, and `stall_at` (the
/// chunk starting at that item blocks in a long statement after writing its
/// rows, without ever looking at its cancellation).
struct TestJob;

#[async_trait]
impl Job for TestJob {
    fn name(&self) -> JobName {
        JobName::parse("test-job").unwrap()
    }

    fn default_config(&self) -> JobConfig {
        JobConfig {
            lease_ttl: Duration::from_secs(2),
            chunk_size: 5,
            backoff: Duration::from_millis(200),
            backoff_max: Duration::from_millis(400),
            ..JobConfig::default()
        }
    }

    async fn run(&self, ctx: &JobContext) -> Result<Outcome, JobError> {
        let p = &ctx.payload;
        let items = p["items"].as_i64().unwrap_or(20);
        let pause = Duration::from_millis(p["pause_ms"].as_u64().unwrap_or(0));
        if p["fatal"].as_bool() == Some(true) {
            return Err(JobError::Fatal("bad source data".into()));
        }
        if ctx.attempt == 1 && p["panic_first"].as_bool() == Some(true) {
            panic!("handler bug");
        }
        if ctx.attempt == 1 && p["cancel_unasked"].as_bool() == Some(true) {
            return Err(JobError::Cancelled);
        }
        let mut n = 0;
        while n < items {
            ctx.pause(pause).await?;
            let mut tx = ctx.fenced().await?;
            let end = (n + ctx.config.chunk_size as i64).min(items);
            let written = sqlx::query(
                "INSERT INTO test_item (job_key, n, token) SELECT $1, g, $2 FROM generate_series($3, $4) g \
                 ON CONFLICT DO NOTHING",
            )
            .bind(ctx.key.as_str())
            .bind(ctx.lease_token)
            .bind(n)
            .bind(end - 1)
            .execute(tx.conn())
            .await?
            .rows_affected();
            if p["stall_at"].as_i64() == Some(n) {
                // A handler stuck in a statement, deaf to shutdown: only the
                // worker's abort after the grace period can end it.
                sqlx::query("SELECT pg_sleep(600)")
                    .execute(tx.conn())
                    .await?;
            }
            tx.add_progress(written as i64, 0);
            ctx.commit(tx).await?;
            n = end;
            if ctx.attempt == 1 && p["fail_first"].as_bool() == Some(true) && n >= items / 2 {
                return Err(JobError::Retryable("flaky upstream".into()));
            }
        }
        Ok(Outcome::Succeeded)
    }
}

fn registry() -> Registry {
    Registry::new().register(TestJob)
}

async fn setup() -> TestDb {
    let db = TestDb::new(&[]).await;
    sqlx::query(
        "CREATE TABLE test_item (job_key text NOT NULL, n bigint NOT NULL, token bigint NOT NULL, \
         created_at timestamptz NOT NULL DEFAULT clock_timestamp(), UNIQUE (job_key, n))",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    db
}

fn new_run(day: u64, payload: serde_json::Value) -> NewRun {
    let job = JobName::parse("test-job").unwrap();
    let date = NaiveDate::from_ymd_opt(2026, 3, 1).unwrap() + chrono::Days::new(day);
    // Enqueued as the producer would: with the job's configuration, which
    // the run keeps (its 2 s lease).
    let cfg = batchonce::JobConfig {
        max_attempts: 3,
        ..TestJob.default_config()
    };
    NewRun {
        payload,
        ..NewRun::new(JobKey::daily(&job, date), date, &cfg).unwrap()
    }
}

fn start(db: &TestDb, id: &str, concurrency: u32, grace: Duration) -> Running {
    common::worker::start(db, registry(), id, |opts| {
        opts.concurrency = concurrency;
        opts.poll_interval = Duration::from_millis(200);
        opts.grace = grace;
    })
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

async fn enqueue_one(pool: &PgPool, run: &NewRun) {
    queue::enqueue(pool, std::slice::from_ref(run), Clock::Db)
        .await
        .unwrap();
}

/// Waits until the first chunks of a run have committed.
async fn wait_under_way(pool: &PgPool) {
    wait_until("the run is under way", Duration::from_secs(20), || async {
        count(pool, "SELECT count(*) FROM test_item").await >= 10
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runs_everything_once_with_concurrency_and_stops_on_shutdown() {
    let db = setup().await;
    let w = start(&db, "w1", 3, Duration::from_secs(5));
    let runs: Vec<NewRun> = (0..10)
        .map(|d| new_run(d, serde_json::json!({"items": 23})))
        .collect();
    queue::enqueue(&db.pool, &runs, Clock::Db).await.unwrap();
    wait_until("all runs succeeded", Duration::from_secs(30), || async {
        count(
            &db.pool,
            "SELECT count(*) FROM batch_job_run WHERE status = 'SUCCEEDED'",
        )
        .await
            == 10
    })
    .await;
    assert_eq!(count(&db.pool, "SELECT count(*) FROM test_item").await, 230);
    assert_eq!(
        count(
            &db.pool,
            "SELECT sum(processed_count)::bigint FROM batch_job_run"
        )
        .await,
        230
    );
    assert_eq!(
        count(
            &db.pool,
            "SELECT sum(processed_count)::bigint FROM batch_job_attempt"
        )
        .await,
        230
    );
    w.signals.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), w.handle)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retryable_errors_and_panics_retry_and_fatal_fails() {
    let db = setup().await;
    let w = start(&db, "w1", 3, Duration::from_secs(5));
    let flaky = new_run(1, serde_json::json!({"items": 20, "fail_first": true}));
    let panicky = new_run(2, serde_json::json!({"items": 20, "panic_first": true}));
    let fatal = new_run(3, serde_json::json!({"fatal": true}));
    let unasked = new_run(4, serde_json::json!({"items": 20, "cancel_unasked": true}));
    queue::enqueue(
        &db.pool,
        &[
            flaky.clone(),
            panicky.clone(),
            fatal.clone(),
            unasked.clone(),
        ],
        Clock::Db,
    )
    .await
    .unwrap();
    wait_until("all runs finished", Duration::from_secs(30), || async {
        count(
            &db.pool,
            "SELECT count(*) FROM batch_job_run WHERE status IN ('SUCCEEDED', 'FAILED')",
        )
        .await
            == 4
    })
    .await;
    for (r, status, attempts) in [
        (&flaky, "SUCCEEDED", 2),
        (&panicky, "SUCCEEDED", 2),
        (&fatal, "FAILED", 1),
        (&unasked, "SUCCEEDED", 2),
    ] {
        let (view, hist) = queue::show_run(&db.pool, &r.key).await.unwrap().unwrap();
        assert_eq!(
            (view.status.as_str(), view.attempts),
            (status, attempts),
            "{}",
            r.key
        );
        if status == "SUCCEEDED" {
            assert_eq!(
                view.processed_count, 20,
                "a retry resumes without double counting"
            );
            assert_eq!(hist[0].outcome.as_deref(), Some("retried"));
        } else {
            assert_eq!(hist[0].outcome.as_deref(), Some("fatal"));
            assert_eq!(view.error_message.as_deref(), Some("bad source data"));
        }
    }
    let items: i64 = sqlx::query_scalar("SELECT count(*) FROM test_item WHERE job_key = $1")
        .bind(flaky.key.as_str())
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(items, 20);
    w.signals.shutdown.cancel();
    w.handle.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_lease_cancels_the_handler_and_its_writes_stop() {
    let db = setup().await;
    let r = new_run(1, serde_json::json!({"items": 400, "pause_ms": 100}));
    enqueue_one(&db.pool, &r).await;
    let w = start(&db, "w1", 1, Duration::from_secs(5));
    wait_under_way(&db.pool).await;
    let old_token: i64 = sqlx::query_scalar("SELECT lease_token FROM batch_job_run")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    // A takeover as another process's recovery would do it, with a clock a
    // little past the lease's end (ttl 2s); a chunk in flight is skipped, so retry.
    let mut taken = Vec::new();
    for _ in 0..100 {
        let db_now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        let soon = db_now + chrono::Duration::seconds(3);
        taken = queue::recover_expired(
            &db.pool,
            &[JobName::parse("test-job").unwrap()],
            &[],
            Clock::At(soon),
        )
        .await
        .unwrap();
        if !taken.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(taken.len(), 1);
    let taken_at: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    // The worker reclaims it as attempt 2 and finishes; nothing of attempt 1
    // commits after the takeover.
    wait_until("the run succeeded", Duration::from_secs(60), || async {
        count(
            &db.pool,
            "SELECT count(*) FROM batch_job_run WHERE status = 'SUCCEEDED'",
        )
        .await
            == 1
    })
    .await;
    let late: i64 =
        sqlx::query_scalar("SELECT count(*) FROM test_item WHERE token = $1 AND created_at > $2")
            .bind(old_token)
            .bind(taken_at)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(late, 0, "the old lease holder wrote after losing its lease");
    assert_eq!(count(&db.pool, "SELECT count(*) FROM test_item").await, 400);
    let (view, hist) = queue::show_run(&db.pool, &r.key).await.unwrap().unwrap();
    assert_eq!(view.attempts, 2);
    assert_eq!(hist[0].outcome.as_deref(), Some("lease_expired"));
    w.signals.shutdown.cancel();
    w.handle.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graceful_shutdown_releases_the_lease_at_a_chunk_boundary() {
    let db = setup().await;
    let r = new_run(1, serde_json::json!({"items": 1000, "pause_ms": 50}));
    enqueue_one(&db.pool, &r).await;
    let w = start(&db, "w1", 1, Duration::from_secs(10));
    wait_under_way(&db.pool).await;
    let t = Instant::now();
    w.signals.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), w.handle)
        .await
        .unwrap()
        .unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "stopped at the next chunk boundary"
    );
    let (view, hist) = queue::show_run(&db.pool, &r.key).await.unwrap().unwrap();
    assert_eq!(view.status, queue::RunStatus::Pending);
    assert!(view.lease_expires_at.is_none());
    assert_eq!(hist[0].outcome.as_deref(), Some("released"));
    let items = count(&db.pool, "SELECT count(*) FROM test_item").await;
    assert_eq!(view.processed_count, items, "counters match what committed");
    assert!(items < 1000);
}

/// A handler that ignores cancellation never reaches a chunk boundary: the
/// worker waits out the grace period, then abandons it, ends its database
/// session (which holds the run's row) and releases the run. Nothing of the
/// abandoned chunk commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn abort_after_grace_abandons_the_chunk_and_releases() {
    let db = setup().await;
    // The first chunk (items 0-4) commits; the second writes items 5-9 and
    // then blocks in `pg_sleep`, its transaction open.
    let r = new_run(1, serde_json::json!({"items": 10, "stall_at": 5}));
    enqueue_one(&db.pool, &r).await;
    let grace = Duration::from_millis(1500);
    let w = start(&db, "w1", 1, grace);
    wait_until(
        "the handler to block in its second chunk",
        Duration::from_secs(20),
        || async {
            count(&db.pool, STALLED).await == 1
                && count(&db.pool, "SELECT count(*) FROM test_item").await == 5
        },
    )
    .await;
    let token: i64 = sqlx::query_scalar("SELECT lease_token FROM batch_job_run")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let t = Instant::now();
    w.signals.shutdown.cancel();
    // The worker bounds everything after the abort by ABORT_BOUND; the extra
    // second absorbs a loaded machine's scheduling.
    let bound = grace + worker::ABORT_BOUND + Duration::from_secs(1);
    tokio::time::timeout(bound, w.handle)
        .await
        .unwrap_or_else(|_| panic!("the worker did not stop within {bound:?} of shutdown"))
        .unwrap();
    let took = t.elapsed();
    assert!(
        took >= grace,
        "the worker stopped {took:?} after shutdown, before its grace period of {grace:?} was over"
    );
    let (view, hist) = queue::show_run(&db.pool, &r.key).await.unwrap().unwrap();
    assert_eq!(
        view.status,
        queue::RunStatus::Pending,
        "the abandoned run was not released (stopped after {took:?})"
    );
    assert!(view.lease_expires_at.is_none(), "the lease was kept");
    // The views name no token; the owner reads the run's.
    let now_token: Option<i64> = sqlx::query_scalar("SELECT lease_token FROM batch_job_run")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_ne!(
        now_token,
        Some(token),
        "the abandoned attempt's token still owns the run"
    );
    assert!(
        w.signals.abort.is_cancelled(),
        "the worker did not abort when the grace period ended"
    );
    assert_eq!(hist.len(), 1, "{hist:?}");
    let first_token: i64 = sqlx::query_scalar(
        "SELECT lease_token FROM batch_job_attempt WHERE job_key = $1 AND attempt = $2",
    )
    .bind(r.key.as_str())
    .bind(hist[0].attempt)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(first_token, token);
    assert_eq!(hist[0].outcome.as_deref(), Some("released"), "{hist:?}");
    assert!(hist[0].finished_at.is_some(), "{hist:?}");
    // Only the first chunk committed, and the counters say so.
    assert_eq!(count(&db.pool, "SELECT count(*) FROM test_item").await, 5);
    assert_eq!(
        count(&db.pool, "SELECT count(*) FROM test_item WHERE n >= 5").await,
        0,
        "the abandoned chunk's items committed"
    );
    assert_eq!(view.processed_count, 5);
    assert_eq!(hist[0].processed_count, 5);
    // The release could only take the row once the abandoned statement's
    // session had ended; it must not linger either.
    wait_until(
        "the abandoned statement's session to end",
        Duration::from_secs(5),
        || async { count(&db.pool, STALLED).await == 0 },
    )
    .await;
}

/// The stalled handler's statement, running in this test's database.
const STALLED: &str = "SELECT count(*) FROM pg_stat_activity \
    WHERE datname = current_database() AND state = 'active' \
    AND query = 'SELECT pg_sleep(600)'";

/// An idle worker whose next poll is two minutes away picks up a new run at
/// once: only the enqueue's NOTIFY can have woken it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn notify_wakes_an_idle_worker_long_before_its_poll() {
    let db = setup().await;
    let reg = registry();
    // A long lease puts the worker's recovery pass 15 s apart (its longest),
    // so no other statement of the worker runs while the test watches it.
    let mut kinds = reg.default_configs();
    for cfg in kinds.values_mut() {
        cfg.lease_ttl = Duration::from_secs(600);
    }
    let config = Config::defaults(&kinds);
    // Pools of its own, named, so that this worker's sessions are told apart
    // from every other session in the cluster: claims on one, LISTEN on
    // another (as with --listen-url), heartbeats on a third.
    let idle = Duration::from_secs(60);
    let pool = batchonce::db::connect_worker(&db.url, "listener", 4, idle).unwrap();
    let heartbeats = batchonce::db::connect_worker(&db.url, "listener-heartbeat", 1, idle).unwrap();
    let listen = batchonce::db::connect_worker(&db.url, "listener-listen", 1, idle).unwrap();
    let mut opts = WorkerOptions::new("listener");
    let poll = Duration::from_secs(120);
    opts.poll_interval = poll;
    opts.listen_pool = Some(listen);
    let signals = Shutdown::default();
    let handle = tokio::spawn(worker::run(
        reg,
        config,
        pool,
        heartbeats,
        opts,
        signals.clone(),
    ));
    // The worker starts with a claim, which finds nothing, and a LISTEN.
    // Both must be over before the enqueue: a claim still to come could
    // pick the run up without any notification.
    let claimed = std::sync::atomic::AtomicBool::new(false);
    wait_until(
        "the worker's first claim and its LISTEN session",
        Duration::from_secs(20),
        || {
            let claimed = &claimed;
            let pool = &db.pool;
            async move {
                let claim = count(
                    pool,
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                     AND application_name = 'listener' AND state = 'idle' \
                     AND query LIKE '%batchonce_claim%'",
                )
                .await;
                // The claim's connection may serve another statement later:
                // once seen, the first claim is over for good.
                if claim > 0 {
                    claimed.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                let listening = count(
                    pool,
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                     AND application_name = 'listener-listen' AND state = 'idle' \
                     AND query LIKE 'LISTEN %batchonce_run%'",
                )
                .await;
                claimed.load(std::sync::atomic::Ordering::Relaxed) && listening == 1
            }
        },
    )
    .await;
    let t = Instant::now();
    queue::enqueue(
        &db.pool,
        &[new_run(1, serde_json::json!({"items": 5}))],
        Clock::Db,
    )
    .await
    .unwrap();
    wait_until(
        "the idle worker to run the new run (NOTIFY; its poll is 120 s away)",
        Duration::from_secs(20),
        || async {
            count(
                &db.pool,
                "SELECT count(*) FROM batch_job_run WHERE status = 'SUCCEEDED'",
            )
            .await
                == 1
        },
    )
    .await;
    assert!(
        t.elapsed() < poll / 6,
        "picked up after {:?}: not woken by NOTIFY",
        t.elapsed()
    );
    signals.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), handle)
        .await
        .expect("the worker did not stop within 10 s of shutdown")
        .unwrap();
}

#[tokio::test]
async fn worker_sessions_end_idle_transactions() {
    let db = TestDb::new(&[]).await;
    let pool = batchonce::db::connect_worker(&db.url, "w-idle", 1, Duration::from_secs(7)).unwrap();
    let v: String = sqlx::query_scalar("SHOW idle_in_transaction_session_timeout")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(v, "7s");
    let app: String = sqlx::query_scalar("SHOW application_name")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(app, "w-idle");
}
