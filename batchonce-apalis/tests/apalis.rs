//! The apalis backend against a real PostgreSQL: duplicates through the
//! sink, `RetryAfterError` and `max_attempts`, a database restart, a
//! shutdown that releases, and a lost lease that cancels the handler. The
//! two-process test with a stopped worker is `tests/processes.rs`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use apalis_core::error::{BoxDynError, RetryAfterError};
use apalis_core::task::data::Data;
use apalis_core::worker::builder::WorkerBuilder;
use batchonce::queue::{self, Action, OperatorRequest};
use batchonce::testing::{scratch_dir, wait_until, OwnCluster, TestDb};
use batchonce::{Clock, JobConfig, JobError, JobKey, JobName};
use batchonce_apalis::{BatchonceBackend, RunLease};
use chrono::NaiveDate;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::sync::oneshot;

const DATE: &str = "2026-09-15";

fn date() -> NaiveDate {
    DATE.parse().unwrap()
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Args {
    #[serde(default)]
    tag: String,
}

fn job() -> JobName {
    JobName::parse("apalis-test").unwrap()
}

fn key() -> JobKey {
    JobKey::parse(&format!("apalis-test:{DATE}")).unwrap()
}

fn cfg(lease_ttl: Duration, max_attempts: u32) -> JobConfig {
    JobConfig {
        lease_ttl,
        max_attempts,
        backoff: Duration::from_millis(200),
        backoff_max: Duration::from_millis(400),
        ..JobConfig::default()
    }
}

/// What the handlers saw, shared with the test through apalis's `Data`.
#[derive(Debug, Clone, Default)]
struct Seen {
    calls: Arc<AtomicU32>,
    cancelled_at: Arc<Mutex<Option<Instant>>>,
    lease_lost: Arc<Mutex<Option<bool>>>,
}

/// A running apalis worker and the way to stop it.
struct Running {
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Asks apalis to shut down and waits for the worker to return.
    async fn stop(mut self, within: Duration) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        tokio::time::timeout(within, &mut self.done)
            .await
            .expect("the apalis worker returned after its shutdown")
            .expect("the apalis worker task did not panic");
    }
}

fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

async fn start<F, Fut>(backend: BatchonceBackend<Args>, seen: Seen, handler: F) -> Running
where
    F: Fn(Args, RunLease, Data<Seen>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), BoxDynError>> + Send + 'static,
{
    logs();
    let worker = WorkerBuilder::new("apalis-test")
        .backend(backend)
        .data(seen)
        .build(handler);
    let (tx, rx) = oneshot::channel::<()>();
    let done = tokio::spawn(async move {
        worker
            .run_until(async move {
                let _ = rx.await;
                Ok::<(), std::io::Error>(())
            })
            .await
            .expect("the apalis worker ended without an error");
    });
    Running {
        stop: Some(tx),
        done,
    }
}

async fn status(pool: &PgPool) -> (String, i32, i32) {
    sqlx::query_as("SELECT status, attempts, max_attempts FROM batch_job_run WHERE job_key = $1")
        .bind(key().as_str())
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn enqueue(url: &str, c: &JobConfig) {
    let backend = BatchonceBackend::<Args>::new(url, job(), c.clone()).unwrap();
    let report = backend
        .enqueuer()
        .unwrap()
        .enqueue(date(), &Args::default())
        .await
        .unwrap();
    assert_eq!(report.enqueued, vec![key()]);
}

/// A fresh database with the test's run enqueued, and a backend for it
/// that polls every 100 ms.
async fn setup(ttl: Duration, max_attempts: u32) -> (TestDb, BatchonceBackend<Args>) {
    let db = TestDb::new(&[]).await;
    let c = cfg(ttl, max_attempts);
    enqueue(&db.url, &c).await;
    let backend = BatchonceBackend::<Args>::new(&db.url, job(), c)
        .unwrap()
        .poll_interval(Duration::from_millis(100));
    (db, backend)
}

/// The outcome recorded for the run's only attempt.
async fn only_outcome(pool: &PgPool) -> Option<String> {
    sqlx::query_scalar("SELECT outcome FROM batch_job_attempt WHERE job_key = $1")
        .bind(key().as_str())
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_pushed_twice_is_one_run_and_a_reported_duplicate() {
    let db = TestDb::new(&[]).await;
    let c = cfg(Duration::from_secs(30), 3);
    let backend = BatchonceBackend::<Args>::new(&db.url, job(), c).unwrap();
    let sink = backend.enqueuer().unwrap();
    let first = sink
        .enqueue(date(), &Args { tag: "a".into() })
        .await
        .unwrap();
    let second = sink
        .enqueue(date(), &Args { tag: "b".into() })
        .await
        .unwrap();
    assert_eq!(first.enqueued, vec![key()]);
    assert!(first.duplicates.is_empty());
    assert!(second.enqueued.is_empty());
    assert_eq!(second.duplicates, vec![key()]);
    let (runs, payload): (i64, serde_json::Value) = sqlx::query_as(
        "SELECT count(*), max(payload::text)::jsonb FROM batch_job_run WHERE job_name = $1",
    )
    .bind(job().as_str())
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(runs, 1);
    assert_eq!(payload["tag"], "a", "the duplicate left the first payload");
    // A date outside the key's range is one clear error, and writes nothing.
    let bad = sink
        .enqueue(
            NaiveDate::from_ymd_opt(2300, 1, 1).unwrap(),
            &Args::default(),
        )
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("2300"), "{bad}");
}

async fn always_retry_after(_a: Args, _run: RunLease, seen: Data<Seen>) -> Result<(), BoxDynError> {
    seen.calls.fetch_add(1, Ordering::SeqCst);
    Err(Box::new(RetryAfterError::new(
        "provider busy",
        Duration::from_millis(1500),
    )))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_waits_its_delay_and_max_attempts_holds() {
    let (db, backend) = setup(Duration::from_secs(30), 3).await;
    let seen = Seen::default();
    let running = start(backend, seen.clone(), always_retry_after).await;
    wait_until("the run is FAILED", Duration::from_secs(30), || async {
        status(&db.pool).await.0 == "FAILED"
    })
    .await;
    running.stop(Duration::from_secs(10)).await;
    let starts: Vec<(i32, chrono::DateTime<chrono::Utc>, Option<String>)> = sqlx::query_as(
        "SELECT attempt, started_at, outcome FROM batch_job_attempt WHERE job_key = $1 ORDER BY attempt",
    )
    .bind(key().as_str())
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(starts.len(), 3, "exactly max_attempts attempts: {starts:?}");
    assert_eq!(seen.calls.load(Ordering::SeqCst), 3);
    for w in starts.windows(2) {
        let gap = (w[1].1 - w[0].1).to_std().unwrap();
        assert!(
            gap >= Duration::from_millis(1500),
            "attempt {} started {gap:?} after the one before, sooner than its RetryAfterError",
            w[1].0
        );
    }
    let (st, attempts, max) = status(&db.pool).await;
    assert_eq!((st.as_str(), attempts, max), ("FAILED", 3, 3));
}

/// Records when the handler stopped, whether it returned or was dropped.
struct Stopped(Seen, RunLease);

impl Drop for Stopped {
    fn drop(&mut self) {
        *self.0.cancelled_at.lock().unwrap() = Some(Instant::now());
        *self.0.lease_lost.lock().unwrap() = Some(self.1.is_lease_lost());
    }
}

async fn until_cancelled(_a: Args, run: RunLease, seen: Data<Seen>) -> Result<(), BoxDynError> {
    seen.calls.fetch_add(1, Ordering::SeqCst);
    let _stopped = Stopped((*seen).clone(), run.clone());
    run.cancelled().await;
    // A fenced transaction is refused once the lease is gone.
    if run.is_lease_lost() {
        assert!(matches!(run.fenced().await, Err(JobError::LeaseLost)));
    }
    Err(Box::new(JobError::Cancelled))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_the_run_without_using_an_attempt() {
    let (db, backend) = setup(Duration::from_secs(30), 3).await;
    let backend = backend.grace(Duration::from_secs(5));
    let seen = Seen::default();
    let running = start(backend, seen.clone(), until_cancelled).await;
    wait_until("the handler runs", Duration::from_secs(20), || async {
        seen.calls.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(status(&db.pool).await.0, "RUNNING");
    // Well within the grace: the handler stops when asked.
    running.stop(Duration::from_secs(5)).await;
    assert_eq!(*seen.lease_lost.lock().unwrap(), Some(false));
    let (st, attempts, max) = status(&db.pool).await;
    assert_eq!(
        (st.as_str(), attempts, max),
        ("PENDING", 1, 4),
        "released: one attempt made, and the budget raised by one so it is not used up"
    );
    assert_eq!(only_outcome(&db.pool).await.as_deref(), Some("released"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_cancels_the_handler_within_the_lease() {
    let ttl = Duration::from_secs(3);
    let (db, backend) = setup(ttl, 3).await;
    let seen = Seen::default();
    let running = start(backend, seen.clone(), until_cancelled).await;
    wait_until("the handler runs", Duration::from_secs(20), || async {
        seen.calls.load(Ordering::SeqCst) == 1
    })
    .await;
    // An operator fails the live run: its token changes under the holder.
    let taken = Instant::now();
    let req = OperatorRequest {
        key: key(),
        action: Action::Fail,
        operator: "oncall".into(),
        reason: "test takes the lease over".into(),
        force: true,
        stale_after: Duration::from_secs(3600),
        max_attempts: 3,
    };
    let out = queue::apply_action(&db.pool, &req, Clock::Db)
        .await
        .unwrap();
    assert!(out.is_ok(), "{out:?}");
    wait_until("the handler is cancelled", ttl, || async {
        seen.cancelled_at.lock().unwrap().is_some()
    })
    .await;
    let after = seen.cancelled_at.lock().unwrap().unwrap() - taken;
    assert!(after < ttl, "cancelled {after:?} after the takeover");
    assert_eq!(*seen.lease_lost.lock().unwrap(), Some(true));
    running.stop(Duration::from_secs(10)).await;
    // Nothing was written after the takeover: the run is as the operator left it.
    let (st, attempts, _) = status(&db.pool).await;
    assert_eq!((st.as_str(), attempts), ("FAILED", 1));
    assert_eq!(
        only_outcome(&db.pool).await.as_deref(),
        Some("operator_failed")
    );
}

/// Writes one row per call in a fenced transaction, slowly, and succeeds
/// after `rows` rows.
async fn slow_fenced_rows(_a: Args, run: RunLease, seen: Data<Seen>) -> Result<(), BoxDynError> {
    seen.calls.fetch_add(1, Ordering::SeqCst);
    loop {
        let mut tx = run.fenced().await?;
        let n: i64 = sqlx::query_scalar(
            "WITH i AS (INSERT INTO apalis_item (n, lease_token) \
             SELECT coalesce(max(n), 0) + 1, $1 FROM apalis_item RETURNING n) SELECT n FROM i",
        )
        .bind(run.lease_token)
        .fetch_one(tx.conn())
        .await?;
        tx.add_progress(1, 0);
        run.commit(tx).await?;
        if n >= 30 {
            return Ok(());
        }
        run.pause(Duration::from_millis(100)).await?;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_does_not_end_the_apalis_worker() {
    let dir = scratch_dir(env!("CARGO_TARGET_TMPDIR"), "apalis-restart");
    let (mut own, pool) = OwnCluster::start(&dir, 40, &[]).await;
    sqlx::query("CREATE TABLE apalis_item (n bigint PRIMARY KEY, lease_token bigint NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let c = cfg(Duration::from_secs(5), 10);
    enqueue(&own.url, &c).await;
    let seen = Seen::default();
    let backend = BatchonceBackend::<Args>::new(&own.url, job(), c)
        .unwrap()
        .poll_interval(Duration::from_millis(200));
    let running = start(backend, seen.clone(), slow_fenced_rows).await;
    let count = |p: PgPool| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM apalis_item")
            .fetch_one(&p)
            .await
            .unwrap_or(0)
    };
    wait_until("rows are being written", Duration::from_secs(20), || {
        let p = pool.clone();
        async move { count(p).await > 3 }
    })
    .await;
    pool.close().await;
    own.stop().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !running.done.is_finished(),
        "the apalis worker ended while the database was down"
    );
    let pool = own.start_again().await;
    wait_until(
        "the run SUCCEEDED after the restart",
        Duration::from_secs(60),
        || {
            let p = pool.clone();
            async move {
                sqlx::query_scalar::<_, String>("SELECT status FROM batch_job_run")
                    .fetch_one(&p)
                    .await
                    .map(|s| s == "SUCCEEDED")
                    .unwrap_or(false)
            }
        },
    )
    .await;
    let (rows, distinct): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT n) FROM apalis_item")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((rows, distinct), (30, 30), "every row once");
    running.stop(Duration::from_secs(15)).await;
    pool.close().await;
    own.stop().await;
}
