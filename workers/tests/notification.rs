//! notification-send against real PostgreSQL: a crash between send and mark
//! resends with the same key (never a second key), transient failures retry
//! to exact results, rejections count against `max_item_failures`, the
//! webhook sender speaks HTTP to a real server, and a SIGKILLed worker
//! process is taken over with every customer notified once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use batchonce::config::Config;
use batchonce::queue::{self, NewRun};
use batchonce::runtime::worker::{self, Shutdown, WorkerOptions};
use batchonce::testing::{wait_for_count, wait_for_status, TestDb};
use batchonce::{Clock, Job, JobKey, JobName, Registry};
use batchonce_workers::notification::{
    self, outbox_report, Message, NotificationSend, OutboxSender, Receipt, SendError, Sender,
};
use chrono::NaiveDate;
use sqlx::PgPool;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");

fn date() -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 9, 15).unwrap()
}

fn key() -> JobKey {
    JobKey::parse("notification-send:2026-09-15").unwrap()
}

fn scratch(name: &str) -> PathBuf {
    batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), name)
}

async fn db() -> TestDb {
    TestDb::new(&batchonce_workers::migrations()).await
}

/// `n` email requests for the date; the customers in `bad` have an
/// undeliverable address. Customer 1 is requested twice.
async fn seed(pool: &PgPool, n: i64, bad: &[i64]) {
    sqlx::query(
        "INSERT INTO notification_request (business_date, campaign, customer_id, channel, address, body) \
         SELECT $1, 'autumn-sale', g, 'email', \
                CASE WHEN g = ANY($3) THEN 'nobody' ELSE 'c' || g || '@example.com' END, 'Hello ' || g \
         FROM generate_series(1, $2) g",
    )
    .bind(date())
    .bind(n)
    .bind(bad)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO notification_request (business_date, campaign, customer_id, channel, address, body) \
         VALUES ($1, 'autumn-sale', 1, 'email', 'c1@example.com', 'Hello 1')",
    )
    .bind(date())
    .execute(pool)
    .await
    .unwrap();
}

/// Enqueues the run as the producer would, under the policies of
/// [`config`] with `extra` (the run keeps them, whatever the worker's file).
async fn enqueue_with(pool: &PgPool, max_attempts: u32, extra: &str) {
    let cfg = config(&NotificationSend::new(), extra);
    let job = cfg.jobs[&JobName::parse(notification::NAME).unwrap()].clone();
    enqueue_job(
        pool,
        &batchonce::JobConfig {
            max_attempts,
            ..job
        },
    )
    .await;
}

async fn enqueue_job(pool: &PgPool, job: &batchonce::JobConfig) {
    queue::enqueue(pool, &[NewRun::new(key(), date(), job).unwrap()], Clock::Db)
        .await
        .unwrap();
}

async fn enqueue(pool: &PgPool, max_attempts: u32) {
    enqueue_with(pool, max_attempts, "").await;
}

/// The job's defaults with fast retries and small chunks, plus `extra` TOML.
fn config(job: &NotificationSend, extra: &str) -> Config {
    let kinds = Registry::new().register(job.clone()).default_configs();
    let text = format!(
        "[jobs.notification-send]\nchunk_size = 7\nbackoff = \"100ms\"\nbackoff_max = \"200ms\"\nlease_ttl = \"3s\"\n{extra}"
    );
    Config::parse(&text, "test.toml", &kinds).unwrap()
}

/// Runs one in-process worker until the run is terminal; returns its row.
async fn run_to_end(
    db: &TestDb,
    job: NotificationSend,
    config: Config,
) -> (String, i32, i64, i64, Option<String>) {
    let signals = Shutdown::default();
    let mut opts = WorkerOptions::new("notify-test");
    opts.poll_interval = Duration::from_millis(100);
    let handle = tokio::spawn(worker::run(
        Registry::new().register(job),
        config,
        db.pool.clone(),
        db.pool.clone(),
        opts,
        signals.clone(),
    ));
    wait_for_status(
        &db.pool,
        None,
        &["SUCCEEDED", "FAILED", "SKIPPED"],
        Duration::from_secs(60),
    )
    .await;
    signals.shutdown.cancel();
    handle.await.unwrap();
    sqlx::query_as(
        "SELECT status, attempts, processed_count, failed_count, error_message FROM batch_job_run",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

async fn delivery_states(pool: &PgPool) -> BTreeMap<String, i64> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM notification_delivery GROUP BY state")
            .fetch_all(pool)
            .await
            .unwrap();
    rows.into_iter().collect()
}

/// An outbox that records every call, and can fail: `crash_after` sends
/// panic the handler once right after the send (before it is marked), and
/// every `flaky`-th call fails transiently before sending.
#[derive(Debug)]
struct TestSender {
    outbox: OutboxSender,
    calls: AtomicUsize,
    crash_after: Option<usize>,
    crashed: AtomicUsize,
    flaky: Option<usize>,
    keys: Mutex<BTreeMap<i64, BTreeSet<String>>>,
}

impl TestSender {
    fn new(dir: &Path) -> Self {
        Self {
            outbox: OutboxSender::new(dir),
            calls: AtomicUsize::new(0),
            crash_after: None,
            crashed: AtomicUsize::new(0),
            flaky: None,
            keys: Mutex::new(BTreeMap::new()),
        }
    }
}

#[async_trait]
impl Sender for TestSender {
    async fn send(&self, m: &Message<'_>) -> Result<Receipt, SendError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        self.keys
            .lock()
            .unwrap()
            .entry(m.customer_id)
            .or_default()
            .insert(m.idempotency_key.to_owned());
        if self.flaky.is_some_and(|k| n.is_multiple_of(k)) {
            return Err(SendError::Transient("provider timed out".into()));
        }
        let r = self.outbox.send(m).await;
        if self.crash_after == Some(n) && self.crashed.fetch_add(1, Ordering::SeqCst) == 0 {
            // The message is out, the mark is not written: the worst moment.
            panic!("worker crashed between send and mark");
        }
        r
    }
}

fn assert_one_key_per_customer(sender: &TestSender) {
    let keys = sender.keys.lock().unwrap();
    for (customer, k) in keys.iter() {
        assert_eq!(k.len(), 1, "customer {customer} was sent under keys {k:?}");
    }
}

#[tokio::test]
async fn a_crash_between_send_and_mark_resends_with_the_same_key() {
    let db = db().await;
    seed(&db.pool, 40, &[]).await;
    enqueue(&db.pool, 3).await;
    let dir = scratch("crash-outbox");
    let sender = Arc::new(TestSender {
        crash_after: Some(18),
        ..TestSender::new(&dir)
    });
    let job = NotificationSend::with_sender(sender.clone());
    let (status, attempts, processed, failed, _) =
        run_to_end(&db, job.clone(), config(&job, "")).await;
    assert_eq!((status.as_str(), attempts), ("SUCCEEDED", 2));
    assert_eq!(
        delivery_states(&db.pool).await,
        BTreeMap::from([("sent".into(), 40)])
    );
    assert_eq!((processed, failed), (40, 0));
    let report = outbox_report(&dir, date(), &[]);
    // The crashed chunk's sends went out again, with the same keys.
    assert!(report.calls > 40, "calls {}", report.calls);
    assert_eq!(report.delivered, 40);
    assert_eq!(report.second_keys, 0);
    assert_one_key_per_customer(&sender);
    // Every sent row names the provider's id of the first delivery.
    let mismatched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM notification_delivery WHERE provider_message_id NOT LIKE 'outbox-%'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(mismatched, 0);
}

/// An outbox that takes 20 ms a send and records how many sends were in
/// flight at once.
#[derive(Debug)]
struct SlowSender {
    outbox: OutboxSender,
    now: AtomicUsize,
    most: AtomicUsize,
}

#[async_trait]
impl Sender for SlowSender {
    async fn send(&self, m: &Message<'_>) -> Result<Receipt, SendError> {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let r = self.outbox.send(m).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        r
    }
}

#[tokio::test]
async fn sends_run_concurrently_up_to_send_concurrency_and_each_message_once() {
    for (limit, want) in [(5, 5), (1, 1)] {
        let db = db().await;
        seed(&db.pool, 60, &[]).await;
        enqueue(&db.pool, 3).await;
        let dir = scratch(&format!("concurrent-outbox-{limit}"));
        let sender = Arc::new(SlowSender {
            outbox: OutboxSender::new(&dir),
            now: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
        });
        let job = NotificationSend::with_sender(sender.clone());
        let cfg = config(&job, &format!("send_concurrency = {limit}"));
        let (status, attempts, processed, _, _) = run_to_end(&db, job, cfg).await;
        assert_eq!((status.as_str(), attempts, processed), ("SUCCEEDED", 1, 60));
        // Chunks of 7: the bound, never more, and reached.
        assert_eq!(sender.most.load(Ordering::SeqCst), want, "limit {limit}");
        let report = outbox_report(&dir, date(), &[]);
        assert_eq!(
            (report.calls, report.delivered, report.second_keys),
            (60, 60, 0)
        );
    }
}

/// A provider that answers whatever id it likes (an embedding
/// application's sender: the check is at the storage, not in a sender).
#[derive(Debug)]
struct IdSender;

#[async_trait]
impl Sender for IdSender {
    async fn send(&self, m: &Message<'_>) -> Result<Receipt, SendError> {
        let id = match m.customer_id {
            1 => "x".repeat(10_000),
            2 => "\u{1b}]0;pwned\u{7}\u{1b}[2J".to_owned(),
            3 => "id\u{202e}di".to_owned(),
            c => format!("ok-{c}"),
        };
        Ok(Receipt {
            provider_message_id: id,
            duplicate: false,
        })
    }
}

#[tokio::test]
async fn a_message_id_that_is_not_a_short_printable_token_is_not_stored() {
    let db = db().await;
    seed(&db.pool, 4, &[]).await;
    enqueue(&db.pool, 1).await;
    let job = NotificationSend::with_sender(Arc::new(IdSender));
    let (status, _, processed, _, error) = run_to_end(&db, job.clone(), config(&job, "")).await;
    assert_eq!((status.as_str(), processed), ("SUCCEEDED", 4), "{error:?}");
    // The bad ones are replaced by the delivery's idempotency key.
    let ids: Vec<(i64, String, String)> = sqlx::query_as(
        "SELECT customer_id, state, CASE WHEN provider_message_id = idempotency_key THEN 'key' \
         ELSE provider_message_id END FROM notification_delivery ORDER BY customer_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let want = [(1, "key"), (2, "key"), (3, "key"), (4, "ok-4")];
    for ((customer, state, id), (c, want_id)) in ids.into_iter().zip(want) {
        assert_eq!(
            (customer, state.as_str(), id.as_str()),
            (c, "sent", want_id)
        );
    }
}

#[tokio::test]
async fn transient_failures_retry_until_every_delivery_is_sent_once() {
    let db = db().await;
    seed(&db.pool, 50, &[]).await;
    enqueue(&db.pool, 10).await;
    let dir = scratch("flaky-outbox");
    let sender = Arc::new(TestSender {
        flaky: Some(4),
        ..TestSender::new(&dir)
    });
    let job = NotificationSend::with_sender(sender.clone());
    let (status, attempts, processed, _, _) = run_to_end(&db, job.clone(), config(&job, "")).await;
    assert_eq!(status, "SUCCEEDED");
    assert!(attempts >= 2, "attempts {attempts}");
    assert_eq!(processed, 50);
    assert_eq!(
        delivery_states(&db.pool).await,
        BTreeMap::from([("sent".into(), 50)])
    );
    let report = outbox_report(&dir, date(), &[]);
    assert_eq!((report.delivered, report.second_keys), (50, 0));
    assert_one_key_per_customer(&sender);
    let retried: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM notification_delivery WHERE attempts > 1 AND last_error IS NULL",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(retried > 0, "some deliveries needed a second try");
}

#[tokio::test]
async fn rejections_count_and_fail_the_run_only_beyond_the_threshold() {
    for (threshold, want) in [(5, "SUCCEEDED"), (1, "FAILED")] {
        let db = db().await;
        seed(&db.pool, 30, &[4, 9]).await;
        let policy = format!("max_item_failures = {threshold}\n");
        enqueue_with(&db.pool, 3, &policy).await;
        let dir = scratch("reject-outbox");
        let job = NotificationSend::with_sender(Arc::new(TestSender::new(&dir)));
        let cfg = config(&job, &policy);
        let (status, attempts, processed, failed, error) = run_to_end(&db, job, cfg).await;
        assert_eq!(status, want, "threshold {threshold}: {error:?}");
        assert_eq!((attempts, processed, failed), (1, 28, 2));
        assert_eq!(
            delivery_states(&db.pool).await,
            BTreeMap::from([("failed".into(), 2), ("sent".into(), 28)])
        );
        let reasons: Vec<String> = sqlx::query_scalar(
            "SELECT last_error FROM notification_delivery WHERE state = 'failed' ORDER BY customer_id",
        )
        .fetch_all(&db.pool)
        .await
        .unwrap();
        assert!(
            reasons.iter().all(|r| r.contains("invalid email address")),
            "{reasons:?}"
        );
        if want == "FAILED" {
            let e = error.unwrap();
            assert!(
                e.contains("2 of 30 deliveries") && e.contains("max_item_failures = 1"),
                "{e}"
            );
            // The operator corrects the addresses and re-runs: the rejected
            // deliveries go out (under their same keys), nothing else twice.
            sqlx::query(
                "UPDATE notification_request SET address = 'fixed' || customer_id || '@example.com' \
                 WHERE address = 'nobody'",
            )
            .execute(&db.pool)
            .await
            .unwrap();
            let out = Command::new(BIN)
                .env("DATABASE_URL", &db.url)
                .args([
                    "runs",
                    "rerun",
                    key().as_str(),
                    "--reason",
                    "addresses fixed",
                    "--operator",
                    "kim",
                ])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let job = NotificationSend::with_sender(Arc::new(TestSender::new(&dir)));
            let cfg = config(&job, &format!("max_item_failures = {threshold}\n"));
            let (status, _, processed, _, error) = run_to_end(&db, job, cfg).await;
            assert_eq!(status, "SUCCEEDED", "{error:?}");
            assert_eq!(processed, 30, "28 before the re-run and the 2 corrected");
            assert_eq!(
                delivery_states(&db.pool).await,
                BTreeMap::from([("sent".into(), 30)])
            );
            let report = outbox_report(&dir, date(), &[]);
            assert_eq!((report.delivered, report.second_keys), (30, 0));
        }
    }
}

#[tokio::test]
async fn a_date_without_requests_is_skipped() {
    let db = db().await;
    enqueue(&db.pool, 3).await;
    let job = NotificationSend::with_sender(Arc::new(TestSender::new(&scratch("empty"))));
    let (status, _, _, _, reason) = run_to_end(&db, job.clone(), config(&job, "")).await;
    assert_eq!(status, "SKIPPED");
    assert!(reason
        .unwrap()
        .contains("no notification requests for 2026-09-15"));
}

/// A provider: remembers keys, answers a repeated key with the first id and
/// `Idempotent-Replayed: true`, fails the first call of every 5th customer
/// with 503, rejects addresses without '@' with 422, and wants a bearer token.
#[derive(Default)]
struct Provider {
    by_key: Mutex<BTreeMap<String, String>>,
    calls: Mutex<Vec<(String, i64)>>,
    unauthorized: AtomicUsize,
}

async fn provider(
    axum::extract::State(p): axum::extract::State<Arc<Provider>>,
    headers: axum::http::HeaderMap,
    body: String,
) -> (axum::http::StatusCode, axum::http::HeaderMap, String) {
    use axum::http::StatusCode;
    let body: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let mut out = axum::http::HeaderMap::new();
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some("Bearer s3cret") {
        p.unauthorized.fetch_add(1, Ordering::SeqCst);
        return (StatusCode::UNAUTHORIZED, out, "no token".into());
    }
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let customer = body["customer_id"].as_i64().unwrap_or_default();
    let first_call = {
        let mut calls = p.calls.lock().unwrap();
        let first = !calls.iter().any(|(k, _)| *k == key);
        calls.push((key.clone(), customer));
        first
    };
    if !body["address"].as_str().unwrap_or_default().contains('@') {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            out,
            "{\"error\":\"bad address\"}".into(),
        );
    }
    if customer % 5 == 0 && first_call {
        return (StatusCode::SERVICE_UNAVAILABLE, out, "busy".into());
    }
    let mut by_key = p.by_key.lock().unwrap();
    let replayed = by_key.contains_key(&key);
    let id = by_key
        .entry(key)
        .or_insert_with(|| format!("msg-{customer}"))
        .clone();
    if replayed {
        out.insert("idempotent-replayed", "true".parse().unwrap());
    }
    (StatusCode::OK, out, format!("{{\"message_id\":\"{id}\"}}"))
}

#[tokio::test]
async fn the_webhook_sender_posts_with_the_idempotency_key_and_retries() {
    let db = db().await;
    seed(&db.pool, 20, &[7]).await;
    enqueue(&db.pool, 3).await;
    let state = Arc::new(Provider::default());
    let app = axum::Router::new()
        .route("/notify", axum::routing::post(provider))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    // Only this test reads the variable.
    std::env::set_var("BO_TEST_WEBHOOK_TOKEN", "s3cret");
    let job = NotificationSend::new();
    let cfg = config(
        &job,
        &format!(
            "sender = \"webhook\"\nwebhook_url = \"http://{addr}/notify\"\nwebhook_allow_http = true\nwebhook_timeout = \"2s\"\nwebhook_retries = 2\nwebhook_token_env = \"BO_TEST_WEBHOOK_TOKEN\"\n"
        ),
    );
    let (status, attempts, processed, failed, error) = run_to_end(&db, job, cfg).await;
    assert_eq!((status.as_str(), attempts), ("SUCCEEDED", 1), "{error:?}");
    assert_eq!((processed, failed), (19, 1));
    assert_eq!(state.unauthorized.load(Ordering::SeqCst), 0);
    let by_key = state.by_key.lock().unwrap().clone();
    assert_eq!(by_key.len(), 19, "each deliverable message accepted once");
    // Customers 5, 10, 15, 20 got a 503 first and were retried with the same key.
    let calls = state.calls.lock().unwrap().clone();
    let mut keys: BTreeMap<i64, BTreeSet<String>> = BTreeMap::new();
    for (k, c) in &calls {
        keys.entry(*c).or_default().insert(k.clone());
    }
    assert!(keys.values().all(|k| k.len() == 1), "{keys:?}");
    assert_eq!(calls.len(), 20 + 4);
    let ids: Vec<(i64, String)> = sqlx::query_as(
        "SELECT customer_id, provider_message_id FROM notification_delivery WHERE state = 'sent' ORDER BY customer_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(ids.iter().all(|(c, id)| *id == format!("msg-{c}")));
    let rejected: String =
        sqlx::query_scalar("SELECT last_error FROM notification_delivery WHERE state = 'failed'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(rejected.contains("422"), "{rejected}");
}

#[tokio::test]
async fn a_slow_webhook_times_out_and_the_delivery_stays_pending() {
    let db = db().await;
    seed(&db.pool, 2, &[]).await;
    enqueue(&db.pool, 1).await;
    let app = axum::Router::new().route(
        "/slow",
        axum::routing::post(|| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            "{}"
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let job = NotificationSend::new();
    let cfg = config(
        &job,
        &format!(
            "sender = \"webhook\"\nwebhook_url = \"http://{addr}/slow\"\nwebhook_allow_http = true\nwebhook_timeout = \"300ms\"\nwebhook_retries = 1\n"
        ),
    );
    let started = std::time::Instant::now();
    let (status, attempts, _, _, error) = run_to_end(&db, job, cfg).await;
    assert_eq!((status.as_str(), attempts), ("FAILED", 1));
    let e = error.unwrap();
    assert!(
        e.contains("timed out") && e.contains("after 2 tries"),
        "{e}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the timeout was not enforced"
    );
    assert_eq!(
        delivery_states(&db.pool).await,
        BTreeMap::from([("pending".into(), 2)])
    );
}

#[tokio::test]
async fn an_unreachable_webhook_leaves_deliveries_pending_and_retries_the_run() {
    let db = db().await;
    seed(&db.pool, 5, &[]).await;
    enqueue(&db.pool, 2).await;
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let job = NotificationSend::new();
    let cfg = config(
        &job,
        &format!(
            "sender = \"webhook\"\nwebhook_url = \"http://127.0.0.1:{port}/n\"\nwebhook_allow_http = true\nwebhook_timeout = \"1s\"\nwebhook_retries = 0\n"
        ),
    );
    let (status, attempts, processed, _, error) = run_to_end(&db, job, cfg).await;
    assert_eq!((status.as_str(), attempts, processed), ("FAILED", 2, 0));
    let e = error.unwrap();
    assert!(
        e.contains("could not be sent yet") && e.contains("cannot connect"),
        "{e}"
    );
    assert_eq!(
        delivery_states(&db.pool).await,
        BTreeMap::from([("pending".into(), 5)])
    );
}

#[tokio::test]
async fn a_sigkilled_worker_process_is_taken_over_and_nobody_is_notified_twice() {
    let db = db().await;
    seed(&db.pool, 300, &[13]).await;
    // The policies of the workers' file below, as the producer stores them.
    enqueue_job(
        &db.pool,
        &batchonce::JobConfig {
            max_attempts: 3,
            chunk_size: 10,
            lease_ttl: Duration::from_secs(2),
            backoff: Duration::from_secs(1),
            ..NotificationSend::new().default_config()
        },
    )
    .await;
    let dir = scratch("notify-kill");
    let outbox = dir.join("outbox");
    let cfg = dir.join("batchonce.toml");
    std::fs::write(
        &cfg,
        format!(
            "[jobs.notification-send]\nsender = \"outbox\"\noutbox_dir = \"{}\"\nchunk_size = 10\nchunk_pause = \"40ms\"\nlease_ttl = \"2s\"\nbackoff = \"1s\"\n",
            outbox.display()
        ),
    )
    .unwrap();
    let mut first = common::spawn_worker(common::batchonce(&db, Some(&cfg)), &dir, "n1", &[]);
    wait_for_count(
        &db.pool,
        "the run to be under way",
        "SELECT processed_count FROM batch_job_run",
        60,
        Duration::from_secs(30),
    )
    .await;
    first.kill().unwrap();
    first.wait().unwrap();
    let mut second = common::spawn_worker(common::batchonce(&db, Some(&cfg)), &dir, "n2", &[]);
    wait_for_status(&db.pool, None, &["SUCCEEDED"], Duration::from_secs(60)).await;
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(second.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    second.wait().unwrap();
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM batch_job_run")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(attempts, 2);
    let v = notification::verify(&db.pool, date(), Some(&outbox))
        .await
        .unwrap();
    assert!(v.ok, "{}", v.detail);
    assert_eq!(v.items, 300);
    let report = outbox_report(&outbox, date(), &[]);
    assert_eq!((report.delivered, report.second_keys), (299, 0));
}

#[test]
fn bad_sender_options_stop_the_worker_at_start_with_one_line() {
    let dir = scratch("notify-bad-config");
    for (text, want) in [
        (
            "sender = \"pigeon\"",
            "`jobs.notification-send.sender`: unknown sender",
        ),
        (
            "sender = \"webhook\"",
            "`jobs.notification-send.webhook_url`: is required",
        ),
        (
            "sender = \"webhook\"\nwebhook_url = \"http://user:pw@\"",
            "`jobs.notification-send.webhook_url`",
        ),
        ("webhook_retries = \"3\"", "expected an integer"),
        (
            "send_concurrency = 0",
            "`jobs.notification-send.send_concurrency`: 0 is out of range 1..=256",
        ),
        ("send_concurrency = \"8\"", "expected an integer"),
        (
            "sender = \"webhook\"\nwebhook_url = \"http://notify.internal/n\"",
            "`jobs.notification-send.webhook_url`: is http://",
        ),
        (
            "sender = \"webhook\"\nwebhook_url = \"http://user:pw@notify.internal/n\"\n\
             webhook_allow_http = true\nwebhook_token_env = \"NOTIFY_API_TOKEN\"",
            "would send the bearer token in clear",
        ),
        (
            "max_item_failures = \"many\"",
            "`jobs.notification-send.max_item_failures`",
        ),
    ] {
        let text = format!("[jobs.notification-send]\n{text}\n");
        let err = common::config_refused(BIN, &dir, &text, &["worker"], want);
        assert!(!err.contains("pw@"), "{err}");
    }
}

#[test]
fn the_job_kind_is_registered() {
    let r = batchonce_workers::registry();
    assert!(r
        .get(&JobName::parse(notification::NAME).unwrap())
        .is_some());
    let _ = NotificationSend::new().name();
}
