//! Claiming ahead (the worker's local queue, `src/runtime/worker/prefetch.rs`),
//! in process against real PostgreSQL: a worker that claimed runs ahead and
//! then cannot start them gives them back within their deadline, so an idle
//! peer runs them, and no run succeeds twice.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use batchonce::queue::{self, NewRun};
use batchonce::testing::{wait_until, TestDb};
use batchonce::{Clock, Job, JobConfig, JobContext, JobError, JobKey, JobName, Outcome, Registry};
use chrono::NaiveDate;
use common::worker::Running;
use sqlx::PgPool;

/// Returns at once, or after `slow_ms` (honouring cancellation), and counts
/// the handlers that have returned.
#[derive(Default)]
struct PrefetchJob {
    returned: Arc<AtomicU64>,
}

#[async_trait]
impl Job for PrefetchJob {
    fn name(&self) -> JobName {
        JobName::parse("prefetch-job").unwrap()
    }

    fn default_config(&self) -> JobConfig {
        JobConfig {
            lease_ttl: Duration::from_secs(2),
            ..JobConfig::default()
        }
    }

    async fn run(&self, ctx: &JobContext) -> Result<Outcome, JobError> {
        if let Some(ms) = ctx.payload["slow_ms"].as_u64() {
            ctx.pause(Duration::from_millis(ms)).await?;
        }
        self.returned.fetch_add(1, Ordering::SeqCst);
        Ok(Outcome::Succeeded)
    }
}

fn registry(job: PrefetchJob) -> Registry {
    Registry::new().register(job)
}

fn run(day: u64, payload: serde_json::Value) -> NewRun {
    let job = JobName::parse("prefetch-job").unwrap();
    NewRun {
        payload,
        ..NewRun::new(
            JobKey::daily(&job, date(day)),
            date(day),
            &PrefetchJob::default().default_config(),
        )
        .unwrap()
    }
}

fn start(db: &TestDb, id: &str, concurrency: u32, prefetch: u32) -> Running {
    start_with(db, PrefetchJob::default(), id, concurrency, prefetch)
}

fn start_with(db: &TestDb, job: PrefetchJob, id: &str, concurrency: u32, prefetch: u32) -> Running {
    common::worker::start(db, registry(job), id, |opts| {
        opts.concurrency = concurrency;
        opts.prefetch = prefetch;
        opts.poll_interval = Duration::from_millis(100);
        opts.grace = Duration::from_secs(5);
    })
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runs_claimed_ahead_and_not_started_go_back_to_an_idle_peer() {
    let db = TestDb::new(&[]).await;
    // 300 no-op runs earn worker A a queue; the 12 slow runs after them
    // (later dates, so claimed last) each take 2 s, so A, with one slot,
    // would need 24 s for them alone.
    let mut runs: Vec<NewRun> = (0..300).map(|d| run(d, serde_json::json!({}))).collect();
    runs.extend((300..312).map(|d| run(d, serde_json::json!({ "slow_ms": 2000 }))));
    queue::enqueue(&db.pool, &runs, Clock::Db).await.unwrap();
    let a = start(&db, "hoarder", 1, 64);
    // The peer starts once A is into the slow runs (it has claimed them
    // ahead by then), with no queue of its own.
    wait_until("the no-op runs done", Duration::from_secs(30), || async {
        count(
            &db.pool,
            "SELECT count(*) FROM batch_job_run WHERE status = 'SUCCEEDED'",
        )
        .await
            >= 300
    })
    .await;
    let peer_started = Instant::now();
    let b = start(&db, "peer", 12, 0);
    wait_until("every run done", Duration::from_secs(20), || async {
        count(
            &db.pool,
            "SELECT count(*) FROM batch_job_run WHERE status = 'SUCCEEDED'",
        )
        .await
            == 312
    })
    .await;
    let took = peer_started.elapsed();
    for r in [a, b] {
        r.signals.shutdown.cancel();
        r.handle.await.unwrap();
    }
    // A gave back what it could not start: the peer ran most slow runs, and
    // all of them within about two handler times, not A's 24 s.
    let by_peer = count(
        &db.pool,
        "SELECT count(*) FROM batch_job_attempt WHERE worker_id = 'peer' AND outcome = 'succeeded'",
    )
    .await;
    let released = count(
        &db.pool,
        "SELECT count(*) FROM batch_job_attempt WHERE worker_id = 'hoarder' AND outcome = 'released'",
    )
    .await;
    assert!(
        released >= 1,
        "the hoarder released nothing it had claimed ahead"
    );
    assert!(by_peer >= 8, "the idle peer ran only {by_peer} slow runs");
    assert!(
        took < Duration::from_secs(10),
        "the slow runs took {took:?} once the peer was up"
    );
    // Nothing ran twice: one succeeded attempt per run, and a released
    // attempt never ran its handler (it has no later attempt of A's).
    assert_eq!(
        count(
            &db.pool,
            "SELECT count(*) FROM (SELECT job_key FROM batch_job_attempt WHERE outcome = 'succeeded' \
             GROUP BY job_key HAVING count(*) <> 1) x"
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &db.pool,
            "SELECT count(DISTINCT job_key) FROM batch_job_attempt WHERE outcome = 'succeeded'"
        )
        .await,
        312
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_worker_claims_nothing_ahead() {
    let db = TestDb::new(&[]).await;
    let runs: Vec<NewRun> = (0..6)
        .map(|d| run(d, serde_json::json!({ "slow_ms": 300 })))
        .collect();
    queue::enqueue(&db.pool, &runs, Clock::Db).await.unwrap();
    let job = PrefetchJob::default();
    let returned = job.returned.clone();
    let a = start_with(&db, job, "slow", 1, 64);
    // While one run is running, the others stay PENDING: a worker whose
    // handlers take longer than the window earns no queue. A run whose
    // handler has returned gives its slot back before its finish commits, so
    // it may still read RUNNING next to the run that took its slot; those
    // finishing runs (returned, not yet SUCCEEDED) are allowed, queued ones
    // are not. `returned` is read after the snapshot, so it can only allow
    // more, never fail a worker that claims nothing ahead.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (running, done): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status = 'RUNNING'), \
                    count(*) FILTER (WHERE status = 'SUCCEEDED') FROM batch_job_run",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        let finishing = returned.load(Ordering::SeqCst) as i64 - done;
        assert!(
            running <= 1 + finishing,
            "{running} runs held by a worker with one slot ({finishing} finishing)"
        );
        if done == 6 {
            break;
        }
        assert!(Instant::now() < deadline, "the runs did not finish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.signals.shutdown.cancel();
    a.handle.await.unwrap();
    assert_eq!(
        count(
            &db.pool,
            "SELECT count(*) FROM batch_job_attempt WHERE outcome <> 'succeeded'"
        )
        .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_worker_does_not_claim_in_a_loop() {
    let db = TestDb::new(&[]).await;
    let a = start(&db, "idle", 4, 64);
    let commits = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        n
    };
    // Past start-up; then two seconds of an empty queue, polled every 100 ms.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = commits().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The server publishes a session's counts within a second of idling.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let after = commits().await;
    a.signals.shutdown.cancel();
    a.handle.await.unwrap();
    // About 30 claims at the poll interval, heartbeats and recovery passes;
    // a claim loop that never waits makes thousands.
    assert!(
        after - before < 300,
        "{} transactions in about 3 s from an idle worker",
        after - before
    );
}

/// Waits for the test to open its gate (one permit a run), or for the
/// worker's cancellation.
struct GateJob {
    gate: Arc<tokio::sync::Semaphore>,
}

#[async_trait]
impl Job for GateJob {
    fn name(&self) -> JobName {
        JobName::parse("prefetch-job").unwrap()
    }

    fn default_config(&self) -> JobConfig {
        // Long enough that no lease runs out while a claim waits on the
        // test's lock.
        JobConfig {
            lease_ttl: Duration::from_secs(30),
            ..JobConfig::default()
        }
    }

    async fn run(&self, ctx: &JobContext) -> Result<Outcome, JobError> {
        tokio::select! {
            permit = self.gate.acquire() => {
                permit.unwrap().forget();
                Ok(Outcome::Succeeded)
            }
            _ = ctx.cancelled() => Err(JobError::Cancelled),
        }
    }
}

/// The worker's claim statements that wait on a lock.
async fn claims_waiting(pool: &PgPool) -> i64 {
    count(
        pool,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND wait_event_type = 'Lock' AND query LIKE '%batchonce_claim3%'",
    )
    .await
}

/// A second claim goes out while the first is on the server, and asks only
/// for room the first did not ask for: the runs a worker holds never exceed
/// its free slots plus its earned queue, whatever claims are out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_claim_in_flight_asks_only_for_room_the_first_did_not() {
    let db = TestDb::new(&[]).await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let job = GateJob { gate: gate.clone() };
    let runs: Vec<NewRun> = (0..6)
        .map(|d| {
            NewRun::new(
                JobKey::daily(&job.name(), date(d)),
                date(d),
                &job.default_config(),
            )
            .unwrap()
        })
        .collect();
    queue::enqueue(&db.pool, &runs[..1], Clock::Db)
        .await
        .unwrap();
    // Three slots, no queue: every claim asks for free slots only.
    let w = common::worker::start(&db, Registry::new().register(job), "two-claims", |opts| {
        opts.concurrency = 3;
        opts.prefetch = 0;
        opts.poll_interval = Duration::from_millis(100);
        opts.grace = Duration::from_secs(5);
    });
    let running = || {
        count(
            &db.pool,
            "SELECT count(*) FROM batch_job_run WHERE status = 'RUNNING'",
        )
    };
    wait_until("the first run started", Duration::from_secs(10), || async {
        running().await == 1
    })
    .await;
    // A claim writes attempt rows, so this lock holds every claim on the
    // server until the test commits.
    let mut lock = db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE batch_job_attempt IN SHARE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    queue::enqueue(&db.pool, &runs[1..], Clock::Db)
        .await
        .unwrap();
    wait_until(
        "a claim for the two free slots waits",
        Duration::from_secs(10),
        || async { claims_waiting(&db.pool).await == 1 },
    )
    .await;
    // No slot is freed and the queue earns nothing, so no second claim may
    // go out however often the loop wakes (every 100 ms): one that counted
    // the same two slots again would show here within a few wakes.
    let watch_until = Instant::now() + Duration::from_millis(700);
    while Instant::now() < watch_until {
        assert_eq!(
            claims_waiting(&db.pool).await,
            1,
            "a second claim asked for the same slots"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The first run's handler returns and gives its slot back: a second
    // claim goes out for that slot alone while the first still waits.
    gate.add_permits(1);
    wait_until(
        "a second claim waits beside the first",
        Duration::from_secs(10),
        || async { claims_waiting(&db.pool).await == 2 },
    )
    .await;
    lock.commit().await.unwrap();
    // The first run finishes once its finish gets past the lock too; then
    // three slots hold three runs and two wait for later. Every claim writes
    // its attempt rows, so a claim that asked for more than the free slots
    // shows as more than four attempts, even once it has given them back.
    wait_until(
        "the first run done and three running",
        Duration::from_secs(10),
        || async {
            count(
                &db.pool,
                "SELECT count(*) FROM batch_job_run WHERE status = 'SUCCEEDED'",
            )
            .await
                == 1
                && running().await == 3
        },
    )
    .await;
    assert_eq!(
        count(&db.pool, "SELECT count(*) FROM batch_job_attempt").await,
        4,
        "more runs were claimed than there were free slots"
    );
    assert_eq!(
        count(
            &db.pool,
            "SELECT count(*) FROM batch_job_run WHERE status = 'PENDING'"
        )
        .await,
        2
    );
    gate.add_permits(5);
    wait_until("every run done", Duration::from_secs(20), || async {
        count(
            &db.pool,
            "SELECT count(*) FROM batch_job_run WHERE status = 'SUCCEEDED'",
        )
        .await
            == 6
    })
    .await;
    w.signals.shutdown.cancel();
    w.handle.await.unwrap();
    assert_eq!(
        count(
            &db.pool,
            "SELECT count(*) FROM batch_job_attempt WHERE outcome IS DISTINCT FROM 'succeeded'"
        )
        .await,
        0,
        "an attempt was released or lost"
    );
}

fn date(day: u64) -> NaiveDate {
    NaiveDate::from_ymd_opt(2020, 1, 1).unwrap() + chrono::Days::new(day)
}
