//! `batchonce-bench`: throughput and latency of the engine, each scenario
//! measured next to a bare-SQL baseline doing the same work in the same run,
//! so results read as ratios on a noisy machine. Prints one JSON line per
//! scenario and a human summary on stderr.
//!
//! `cargo run --release --bin batchonce-bench -- <drain|pickup|enqueue|settle|send|scopes|ceiling|ledger|all> [--size tiny|full]`
//! against `DATABASE_URL`, or a private cluster in `.batchonce/bench-pg`.
//!
//! the benchmark binary (`drain`, `pickup`, `enqueue`, `settle`, `send`, `scopes`, `ceiling`, `ledger`, `all`; `--size
//! tiny|full`; `--runs N` and `--concurrency 8,32` for `drain`; `--ledger-runs N` for `ledger`). The drain baseline's queue table has a partial index
//! on its pending rows, as any real queue would; without it the baseline's own claims scanned past
//! every finished row and the ratio flattered the engine. Each scenario runs the engine and, in the
//! same run, a bare-SQL baseline doing the same work, and prints one JSON line (see BENCHMARKS.md).
//! It registers a no-op job kind of its own, `bench-noop`, for the framework's per-run cost, and
//! starts the real `batchonce` binary as the worker for `settle`, so that the worker's peak RSS is
//! its own. `scopes` (the producer with 10,000 scopes, issue 24) lives in `bench/scopes.rs`, `ceiling`
//! (what any drain keeping the run ledger could reach, issue 25) in `bench/ceiling.rs`, `ledger`
//! (every view with 10,000 finished runs against the same view with 2,000,000, issue 43) in
//! `bench/ledger.rs`. At full size `all` leaves `ledger` out: building its 2,000,000 runs takes
//! minutes, so it is run by name; at tiny size (10,000 against 60,000) `all` includes it.
//! `workers/tests/bench.rs` runs every scenario once at tiny size.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use async_trait::async_trait;
use batchonce::config::Config;
use batchonce::queue::{self, NewRun, RunStatus};
use batchonce::runtime::worker::{self, Shutdown, WorkerOptions};
use batchonce::{Clock, Job, JobConfig, JobContext, JobError, JobKey, JobName, Outcome, Registry};
use batchonce_workers::settlement;
use chrono::NaiveDate;
use serde_json::json;
use sqlx::PgPool;

// In a folder without a `main.rs`, so that Cargo does not take it for a
// binary of its own.
#[path = "bench/ceiling.rs"]
mod ceiling;
#[path = "bench/ledger.rs"]
mod ledger;
#[path = "bench/scopes.rs"]
mod scopes;

/// A job that does nothing: the framework's own cost per run.
struct Noop;

/// Handler calls of [`Noop`] in this process, so `drain` can wait for the
/// last handler without querying the database it measures.
static NOOP_RAN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[async_trait]
impl Job for Noop {
    fn name(&self) -> JobName {
        // Invariant: a constant, valid job name.
        JobName::parse("bench-noop").expect("valid job name")
    }

    fn default_config(&self) -> JobConfig {
        JobConfig {
            lease_ttl: Duration::from_secs(30),
            ..JobConfig::default()
        }
    }

    async fn run(&self, _ctx: &JobContext) -> Result<Outcome, JobError> {
        NOOP_RAN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Outcome::Succeeded)
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Size {
    Tiny,
    Full,
}

fn registry() -> Registry {
    Registry::new()
        .register(Noop)
        .register(settlement::DailySettlement)
}

fn noop_runs(n: usize, offset: usize) -> Vec<NewRun> {
    let cfg = Noop.default_config();
    (0..n)
        .map(|i| {
            // Invariant: digits form a valid period.
            let key = JobKey::parse(&format!("bench-noop:{:09}", offset + i)).expect("valid key");
            let date = NaiveDate::from_ymd_opt(2026, 1, 1).unwrap_or_default();
            // Invariant: a whole day of 2026 has bounds in every zone.
            NewRun::new(key, date, &cfg).expect("valid period")
        })
        .collect()
}

async fn count(pool: &PgPool, sql: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(sql).fetch_one(pool).await?)
}

/// Starts an in-process worker; returns its stop signal and task.
fn start_worker(
    pool: &PgPool,
    concurrency: u32,
    listen: bool,
    poll: Duration,
) -> (Shutdown, tokio::task::JoinHandle<()>) {
    let reg = registry();
    let config = Config::defaults(&reg.default_configs());
    let mut opts = WorkerOptions::new(format!("bench-{concurrency}"));
    opts.concurrency = concurrency;
    opts.listen = listen;
    opts.poll_interval = poll;
    spawn_worker(pool, reg, config, opts)
}

/// Runs `worker::run` in this process; returns its stop signal and task.
fn spawn_worker(
    pool: &PgPool,
    reg: Registry,
    config: Config,
    opts: WorkerOptions,
) -> (Shutdown, tokio::task::JoinHandle<()>) {
    let signals = Shutdown::default();
    let handle = tokio::spawn(worker::run(
        reg,
        config,
        pool.clone(),
        pool.clone(),
        opts,
        signals.clone(),
    ));
    (signals, handle)
}

/// Waits until no bench run is left PENDING or RUNNING, then checks that all
/// `n` succeeded. The probe reads only the unfinished runs, through their
/// lists (`batch_job_due`, `batch_job_running`), and runs every 20 ms:
/// counting every finished row each time took a quarter of a core from the
/// database it measures. A run missing from its list would end the wait
/// early and fail the check that follows.
async fn wait_done(pool: &PgPool, n: i64, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while count(
        pool,
        "SELECT count(*) FROM (SELECT job_key FROM batch_job_due WHERE job_name = 'bench-noop' \
         UNION ALL SELECT job_key FROM batch_job_running WHERE job_name = 'bench-noop') o \
         JOIN batch_job_run r ON r.job_key = o.job_key WHERE r.status IN ('PENDING', 'RUNNING')",
    )
    .await?
        > 0
    {
        if Instant::now() > deadline {
            bail!("runs did not finish within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let done = count(
        pool,
        "SELECT count(*) FROM batch_job_run WHERE job_name = 'bench-noop' AND status = 'SUCCEEDED'",
    )
    .await?;
    if done < n {
        bail!("{done} of {n} runs succeeded");
    }
    Ok(())
}

async fn reset(pool: &PgPool) -> anyhow::Result<()> {
    sqlx::query("DELETE FROM batch_job_attempt WHERE job_key LIKE 'bench-noop:%'")
        .execute(pool)
        .await?;
    sqlx::query("DELETE FROM batch_job_run WHERE job_name = 'bench-noop'")
        .execute(pool)
        .await?;
    Ok(())
}

/// The bare-SQL queue: claims of `batch` with SKIP LOCKED and a token, then
/// one batched update fenced by the token, from `concurrency` tasks. With
/// `history`, each claim also inserts an attempt row and each finish closes
/// it, in the same statements: the part of the engine's work that the
/// minimal queue leaves out, measured the same way.
async fn baseline_drain(
    pool: &PgPool,
    n: usize,
    concurrency: u32,
    batch: i64,
    history: bool,
) -> anyhow::Result<f64> {
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS bench_h; DROP TABLE IF EXISTS bench_q; \
         CREATE TABLE bench_q (id bigint PRIMARY KEY, state text NOT NULL, token bigint); \
         CREATE INDEX bench_q_pending ON bench_q (id) WHERE state = 'pending'; \
         CREATE TABLE bench_h (id bigint NOT NULL REFERENCES bench_q (id), token bigint NOT NULL, \
             started_at timestamptz NOT NULL, finished_at timestamptz, outcome text, \
             PRIMARY KEY (id, token)); \
         CREATE SEQUENCE IF NOT EXISTS bench_q_token;",
    )
    .execute(pool)
    .await?;
    sqlx::query("INSERT INTO bench_q SELECT g, 'pending', NULL FROM generate_series(1, $1) g")
        .bind(n as i64)
        .execute(pool)
        .await?;
    sqlx::query("ANALYZE bench_q").execute(pool).await?;
    let (claim_sql, finish_sql) = if history {
        (
            "WITH c AS (SELECT id FROM bench_q WHERE state = 'pending' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED), \
             u AS (UPDATE bench_q q SET state = 'running', token = nextval('bench_q_token') FROM c WHERE q.id = c.id \
                   RETURNING q.id, q.token), \
             h AS (INSERT INTO bench_h (id, token, started_at) SELECT id, token, now() FROM u) \
             SELECT id, token FROM u",
            "WITH f AS (UPDATE bench_q q SET state = 'done' FROM unnest($1::bigint[], $2::bigint[]) AS u(id, token) \
                        WHERE q.id = u.id AND q.token = u.token AND q.state = 'running' RETURNING q.id, q.token) \
             UPDATE bench_h h SET finished_at = now(), outcome = 'succeeded' FROM f \
             WHERE h.id = f.id AND h.token = f.token",
        )
    } else {
        (
            "WITH c AS (SELECT id FROM bench_q WHERE state = 'pending' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) \
             UPDATE bench_q q SET state = 'running', token = nextval('bench_q_token') FROM c WHERE q.id = c.id \
             RETURNING q.id, q.token",
            "UPDATE bench_q q SET state = 'done' FROM unnest($1::bigint[], $2::bigint[]) AS u(id, token) \
             WHERE q.id = u.id AND q.token = u.token AND q.state = 'running'",
        )
    };
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let pool = pool.clone();
        tasks.spawn(async move {
            loop {
                let rows: Vec<(i64, i64)> = sqlx::query_as(claim_sql)
                    .bind(batch)
                    .fetch_all(&pool)
                    .await?;
                if rows.is_empty() {
                    return Ok::<_, sqlx::Error>(());
                }
                let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
                let tokens: Vec<i64> = rows.iter().map(|r| r.1).collect();
                sqlx::query(finish_sql)
                    .bind(&ids)
                    .bind(&tokens)
                    .execute(&pool)
                    .await?;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let secs = started.elapsed().as_secs_f64();
    let done = count(pool, "SELECT count(*) FROM bench_q WHERE state = 'done'").await?;
    if done != n as i64 {
        bail!("baseline drained {done} of {n}");
    }
    if history {
        let closed = count(
            pool,
            "SELECT count(*) FROM bench_h WHERE outcome = 'succeeded'",
        )
        .await?;
        if closed != n as i64 {
            bail!("baseline closed {closed} of {n} attempt rows");
        }
    }
    Ok(n as f64 / secs)
}

async fn drain(
    pool: &PgPool,
    n: usize,
    concurrencies: &[u32],
) -> anyhow::Result<serde_json::Value> {
    let mut results = Vec::new();
    for &concurrency in concurrencies {
        reset(pool).await?;
        queue::enqueue(pool, &noop_runs(n, 0), Clock::Db).await?;
        let ran_before = NOOP_RAN.load(std::sync::atomic::Ordering::Relaxed);
        let started = Instant::now();
        let (signals, handle) = start_worker(pool, concurrency, true, Duration::from_millis(100));
        // The handlers' own count first (no query), then the database for the
        // last finishes: the probe runs only once the queue is nearly done.
        let deadline = Instant::now() + Duration::from_secs(600);
        while NOOP_RAN.load(std::sync::atomic::Ordering::Relaxed) - ran_before < n as u64
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        wait_done(pool, n as i64, Duration::from_secs(600)).await?;
        let framework = n as f64 / started.elapsed().as_secs_f64();
        signals.shutdown.cancel();
        let _ = handle.await;
        let attempts = count(
            pool,
            "SELECT count(*) FROM batch_job_attempt WHERE job_key LIKE 'bench-noop:%'",
        )
        .await?;
        let batch = i64::from(concurrency.min(32));
        let baseline = baseline_drain(pool, n, concurrency, batch, false).await?;
        let with_history = baseline_drain(pool, n, concurrency, batch, true).await?;
        results.push(json!({
            "concurrency": concurrency,
            "runs": n,
            "attempt_rows": attempts,
            "runs_per_s": framework.round(),
            "baseline_runs_per_s": baseline.round(),
            "ratio": (framework / baseline * 100.0).round() / 100.0,
            "baseline_with_history_runs_per_s": with_history.round(),
            "ratio_to_baseline_with_history": (framework / with_history * 100.0).round() / 100.0,
        }));
        eprintln!(
            "drain c={concurrency}: {framework:.0} runs/s, bare SQL {baseline:.0} runs/s, ratio {:.2}; \
             bare SQL with attempt rows {with_history:.0} runs/s, ratio {:.2}",
            framework / baseline,
            framework / with_history
        );
    }
    reset(pool).await?;
    Ok(json!({ "scenario": "drain", "results": results }))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn pickup(pool: &PgPool, size: Size) -> anyhow::Result<serde_json::Value> {
    let n = if size == Size::Full { 200 } else { 10 };
    let mut results = Vec::new();
    for listen in [true, false] {
        reset(pool).await?;
        let (signals, handle) = start_worker(pool, 4, listen, Duration::from_millis(500));
        tokio::time::sleep(Duration::from_millis(500)).await;
        for i in 0..n {
            queue::enqueue(pool, &noop_runs(1, i), Clock::Db).await?;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        wait_done(pool, n as i64, Duration::from_secs(60)).await?;
        signals.shutdown.cancel();
        let _ = handle.await;
        // Both instants come from the database clock.
        let mut ms: Vec<f64> = sqlx::query_scalar(
            "SELECT extract(epoch FROM (a.started_at - r.enqueued_at))::float8 * 1000 \
             FROM batch_job_run r JOIN batch_job_attempt a USING (job_key) WHERE r.job_name = 'bench-noop'",
        )
        .fetch_all(pool)
        .await?;
        ms.sort_by(f64::total_cmp);
        let (p50, p99) = (percentile(&ms, 0.5), percentile(&ms, 0.99));
        let path = if listen { "notify" } else { "poll-500ms" };
        eprintln!("pickup {path}: p50 {p50:.1} ms, p99 {p99:.1} ms over {n} runs at ~50/s");
        results.push(json!({ "path": path, "runs": n, "p50_ms": (p50 * 10.0).round() / 10.0, "p99_ms": (p99 * 10.0).round() / 10.0 }));
    }
    reset(pool).await?;
    Ok(json!({ "scenario": "pickup", "results": results }))
}

async fn enqueue(pool: &PgPool, size: Size) -> anyhow::Result<serde_json::Value> {
    let n = if size == Size::Full { 10_000 } else { 500 };
    reset(pool).await?;
    let runs = noop_runs(n, 0);
    let t = Instant::now();
    let first = queue::enqueue(pool, &runs, Clock::Db).await?;
    let first_ms = t.elapsed().as_secs_f64() * 1000.0;
    let t = Instant::now();
    let again = queue::enqueue(pool, &runs, Clock::Db).await?;
    let again_ms = t.elapsed().as_secs_f64() * 1000.0;
    if first.enqueued.len() != n || again.duplicates.len() != n {
        bail!(
            "enqueue reported {} new and {} duplicates",
            first.enqueued.len(),
            again.duplicates.len()
        );
    }
    // Baseline: one bare INSERT … ON CONFLICT DO NOTHING of the same rows.
    sqlx::raw_sql("DROP TABLE IF EXISTS bench_keys; CREATE TABLE bench_keys (k text PRIMARY KEY)")
        .execute(pool)
        .await?;
    let keys: Vec<String> = runs.iter().map(|r| r.key.to_string()).collect();
    let t = Instant::now();
    sqlx::query("INSERT INTO bench_keys SELECT unnest($1::text[]) ON CONFLICT DO NOTHING")
        .bind(&keys)
        .execute(pool)
        .await?;
    let base_ms = t.elapsed().as_secs_f64() * 1000.0;
    eprintln!(
        "enqueue {n}: first {first_ms:.1} ms, again (all duplicates) {again_ms:.1} ms; bare INSERT {base_ms:.1} ms"
    );
    reset(pool).await?;
    Ok(json!({
        "scenario": "enqueue", "keys": n,
        "first_ms": (first_ms * 10.0).round() / 10.0,
        "duplicates_ms": (again_ms * 10.0).round() / 10.0,
        "baseline_ms": (base_ms * 10.0).round() / 10.0,
        "ratio_first": (base_ms / first_ms * 100.0).round() / 100.0,
    }))
}

/// Peak resident memory of a process, from /proc (kB).
fn peak_rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// How long the bench's webhook takes to answer a message.
const PROVIDER_LATENCY: Duration = Duration::from_millis(50);

/// `notification-send` against a local webhook that answers every message
/// in [`PROVIDER_LATENCY`]: messages per second at `send_concurrency` 1 and
/// 32, each next to what the provider's latency allows at that concurrency
/// (concurrency / latency), the baseline of this scenario; then one date in
/// 4 partitions over 1, 2 and 4 worker processes, next to what the
/// provider allows for that many partitions in flight.
async fn send(pool: &PgPool, url: &str, size: Size) -> anyhow::Result<serde_json::Value> {
    let app = axum::Router::new().route(
        "/notify",
        axum::routing::post(|| async {
            tokio::time::sleep(PROVIDER_LATENCY).await;
            (
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                r#"{"message_id":"bench"}"#,
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let rounds: &[(u32, i64)] = if size == Size::Full {
        &[(1, 400), (32, 20_000)]
    } else {
        &[(1, 10), (32, 200)]
    };
    let name = JobName::parse(batchonce_workers::notification::NAME)?;
    let mut results = Vec::new();
    for (i, &(concurrency, n)) in rounds.iter().enumerate() {
        // A date of its own per round, so no reset is needed.
        let date = NaiveDate::from_ymd_opt(2026, 10, 1 + i as u32).unwrap_or_default();
        sqlx::query(
            "INSERT INTO notification_request (business_date, campaign, customer_id, channel, address, body) \
             SELECT $1, 'bench', g, 'email', 'c' || g || '@example.com', 'Hello ' || g \
             FROM generate_series(1, $2) g",
        )
        .bind(date)
        .bind(n)
        .execute(pool)
        .await?;
        let text = format!(
            "[jobs.notification-send]\nsender = \"webhook\"\nwebhook_url = \"http://{addr}/notify\"\n\
             webhook_allow_http = true\nchunk_size = 500\nsend_concurrency = {concurrency}\nlease_ttl = \"30s\"\n"
        );
        let reg = batchonce_workers::registry();
        let config = Config::parse(&text, "bench.toml", &reg.default_configs())?;
        let reg = reg.only(config.jobs.keys());
        let cfg = config.job(&name).cloned().unwrap_or_default();
        let key = JobKey::daily(&name, date);
        queue::enqueue(pool, &[NewRun::new(key.clone(), date, &cfg)?], Clock::Db).await?;
        let started = Instant::now();
        let mut opts = WorkerOptions::new(format!("bench-send-{concurrency}"));
        opts.poll_interval = Duration::from_millis(20);
        let (signals, handle) = spawn_worker(pool, reg, config, opts);
        let deadline = Instant::now() + Duration::from_secs(1200);
        let status = loop {
            let status: RunStatus =
                sqlx::query_scalar("SELECT status FROM batch_job_run WHERE job_key = $1")
                    .bind(key.as_str())
                    .fetch_one(pool)
                    .await?;
            if status.is_terminal() || Instant::now() > deadline {
                break status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let elapsed = started.elapsed().as_secs_f64();
        signals.shutdown.cancel();
        let _ = handle.await;
        if status != RunStatus::Succeeded {
            bail!("send: {key} ended {status}");
        }
        let rate = n as f64 / elapsed;
        let allowed = f64::from(concurrency) / PROVIDER_LATENCY.as_secs_f64();
        results.push(json!({
            "send_concurrency": concurrency,
            "messages": n,
            "messages_per_s": (rate * 10.0).round() / 10.0,
            "provider_allows_per_s": allowed.round(),
            "ratio": (rate / allowed * 100.0).round() / 100.0,
        }));
    }
    // One date in 4 partitions, over 1, 2 and 4 worker processes that each
    // run one partition at a time with `send_concurrency` calls in flight.
    let (n, concurrency) = if size == Size::Full {
        (20_000i64, 32u32)
    } else {
        (200, 8)
    };
    let mut partitioned = Vec::new();
    for (i, procs) in [1usize, 2, 4].into_iter().enumerate() {
        let date = NaiveDate::from_ymd_opt(2026, 10, 10 + i as u32).unwrap_or_default();
        sqlx::query(
            "INSERT INTO notification_request (business_date, campaign, customer_id, channel, address, body) \
             SELECT $1, 'bench', g, 'email', 'c' || g || '@example.com', 'Hello ' || g \
             FROM generate_series(1, $2) g",
        )
        .bind(date)
        .bind(n)
        .execute(pool)
        .await?;
        let text = format!(
            "[jobs.notification-send]\nsender = \"webhook\"\nwebhook_url = \"http://{addr}/notify\"\n\
             webhook_allow_http = true\nchunk_size = 500\nsend_concurrency = {concurrency}\nlease_ttl = \"30s\"\n\
             partitions = 4\n[jobs.inventory-sync]\nenabled = false\n"
        );
        let kinds = batchonce_workers::registry().default_configs();
        let cfg = Config::parse(&text, "bench.toml", &kinds)?
            .job(&name)
            .cloned()
            .unwrap_or_default();
        let key = JobKey::daily(&name, date);
        queue::enqueue(pool, &[NewRun::new(key.clone(), date, &cfg)?], Clock::Db).await?;
        let started = Instant::now();
        let workers = WorkerProcesses::start(url, &text, "bench-send", procs)?;
        workers
            .wait_status(pool, key.as_str(), Duration::from_secs(1200))
            .await?;
        let elapsed = started.elapsed().as_secs_f64();
        workers.stop().await;
        let rate = n as f64 / elapsed;
        let allowed = (procs as f64) * f64::from(concurrency) / PROVIDER_LATENCY.as_secs_f64();
        eprintln!(
            "send {n} in 4 partitions over {procs} process(es) at send_concurrency {concurrency}: \
             {rate:.0}/s, the provider allows {allowed:.0}/s, ratio {:.2}",
            rate / allowed
        );
        partitioned.push(json!({
            "worker_processes": procs,
            "partitions": 4,
            "send_concurrency": concurrency,
            "messages": n,
            "messages_per_s": (rate * 10.0).round() / 10.0,
            "provider_allows_per_s": allowed.round(),
            "ratio": (rate / allowed * 100.0).round() / 100.0,
        }));
    }
    server.abort();
    Ok(json!({
        "scenario": "send",
        "partitioned": partitioned,
        "provider_latency_ms": PROVIDER_LATENCY.as_millis() as u64,
        "results": results,
    }))
}

async fn settle(pool: &PgPool, url: &str, size: Size) -> anyhow::Result<serde_json::Value> {
    let n: i64 = if size == Size::Full {
        1_000_000
    } else {
        10_000
    };
    let date = NaiveDate::from_ymd_opt(2026, 9, 15).unwrap_or_default();
    let tz = chrono_tz::Asia::Seoul;
    let (start, end) = settlement::day_bounds(date, tz);
    sqlx::raw_sql("TRUNCATE orders, settlement_item, settlement_summary")
        .execute(pool)
        .await?;
    sqlx::query(
        "INSERT INTO orders (order_id, merchant_id, amount_minor, paid_at) \
         SELECT g, 1 + g % 97, 100 + g % 100000, $1 + ($2 - $1) * ((g - 1)::float8 / $3) FROM generate_series(1, $3) g",
    )
    .bind(start)
    .bind(end)
    .bind(n)
    .execute(pool)
    .await?;
    sqlx::query("ANALYZE orders").execute(pool).await?;
    // Baseline: the whole day in one set-based statement. It holds no
    // lease, so it writes as the schema's owner outside a fence (the
    // fence's trigger still runs for every row, as for the framework).
    let t = Instant::now();
    let mut tx = pool.begin().await?;
    sqlx::query("SET LOCAL batchonce.unfenced = on")
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO settlement_item (business_date, order_id, merchant_id, amount_minor, job_key, attempt) \
         SELECT $3, order_id, merchant_id, amount_minor, 'baseline', 0 FROM orders WHERE paid_at >= $1 AND paid_at < $2 \
         ON CONFLICT ON CONSTRAINT settlement_item_business_date_order_id_key DO NOTHING",
    )
    .bind(start)
    .bind(end)
    .bind(date)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    let base = n as f64 / t.elapsed().as_secs_f64();
    sqlx::raw_sql("TRUNCATE settlement_item, settlement_summary")
        .execute(pool)
        .await?;
    // The framework: real worker processes, chunked and fenced; the whole
    // run in one process, then the run in 4 partitions over 1, 2 and 4
    // processes of one run each (`--concurrency 1`).
    let rounds: &[(u16, usize)] = &[(1, 1), (4, 1), (4, 2), (4, 4)];
    let mut results = Vec::new();
    for &(partitions, procs) in rounds {
        sqlx::raw_sql(
            "TRUNCATE settlement_item, settlement_summary; \
             DELETE FROM batch_job_attempt WHERE job_key LIKE 'daily-settlement:%'; \
             DELETE FROM batch_job_run WHERE job_name = 'daily-settlement' AND partition_of IS NOT NULL; \
             DELETE FROM batch_job_run WHERE job_name = 'daily-settlement'",
        )
        .execute(pool)
        .await?;
        let text = format!(
            "[jobs.daily-settlement]\nchunk_size = 5000\nlease_ttl = \"60s\"\npartitions = {partitions}\n\
             [jobs.inventory-sync]\nenabled = false\n"
        );
        let kinds = batchonce_workers::registry().default_configs();
        let job = Config::parse(&text, "bench.toml", &kinds)?
            .job(&settlement::DailySettlement.name())
            .cloned()
            .unwrap_or_default();
        let key = format!("daily-settlement:{date}");
        queue::enqueue(
            pool,
            &[NewRun::new(JobKey::parse(&key)?, date, &job)?],
            Clock::Db,
        )
        .await?;
        let t = Instant::now();
        let workers = WorkerProcesses::start(url, &text, "bench-settle", procs)?;
        workers
            .wait_status(pool, &key, Duration::from_secs(1800))
            .await?;
        let secs = t.elapsed().as_secs_f64();
        let rss_kb = workers.peak_rss_kb();
        workers.stop().await;
        let v = settlement::verify(pool, tz, date).await?;
        if !v.ok {
            bail!("settlement is wrong: {}", v.detail);
        }
        let rate = n as f64 / secs;
        eprintln!(
            "settle {n} in {partitions} partition(s) over {procs} process(es): {rate:.0} items/s (worker start included), \
             set-based INSERT {base:.0} items/s, ratio {:.2}, worker peak RSS {:.1} MiB",
            rate / base,
            rss_kb as f64 / 1024.0
        );
        results.push(json!({
            "partitions": partitions, "worker_processes": procs,
            "items_per_s": rate.round(), "ratio": (rate / base * 100.0).round() / 100.0,
            "worker_peak_rss_mib": (rss_kb as f64 / 1024.0 * 10.0).round() / 10.0,
        }));
    }
    Ok(json!({
        "scenario": "settle", "orders": n, "baseline_items_per_s": base.round(),
        "results": results,
    }))
}

/// `batchonce worker` processes of the binary next to this one, each with
/// `--concurrency 1` and a configuration file of its own text.
struct WorkerProcesses {
    children: Vec<tokio::process::Child>,
    cfg: std::path::PathBuf,
}

impl WorkerProcesses {
    fn start(url: &str, config: &str, id: &str, n: usize) -> anyhow::Result<Self> {
        let exe = std::env::current_exe()?.with_file_name("batchonce");
        let cfg = std::env::temp_dir().join(format!("{id}-{}-{n}.toml", std::process::id()));
        std::fs::write(&cfg, config)?;
        let children = (0..n)
            .map(|i| {
                tokio::process::Command::new(&exe)
                    .env("DATABASE_URL", url)
                    .arg("--config")
                    .arg(&cfg)
                    .args(["worker", "--concurrency", "1", "--poll-interval", "50ms"])
                    .args([
                        "--metrics-addr",
                        "127.0.0.1:0",
                        "--worker-id",
                        &format!("{id}-{i}"),
                    ])
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .kill_on_drop(true)
                    .spawn()
                    .with_context(|| format!("cannot start {}", exe.display()))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self { children, cfg })
    }

    /// Waits until run `key` SUCCEEDED; fails if it FAILED or took too long.
    async fn wait_status(&self, pool: &PgPool, key: &str, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let s: RunStatus =
                sqlx::query_scalar("SELECT status FROM batch_job_run WHERE job_key = $1")
                    .bind(key)
                    .fetch_one(pool)
                    .await?;
            if s == RunStatus::Succeeded {
                return Ok(());
            }
            if s.is_terminal() || Instant::now() > deadline {
                bail!("{key} ended {s}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The largest peak RSS among the processes.
    fn peak_rss_kb(&self) -> u64 {
        self.children
            .iter()
            .filter_map(|c| c.id().and_then(peak_rss_kb))
            .max()
            .unwrap_or(0)
    }

    async fn stop(mut self) {
        for c in &self.children {
            if let Some(id) = c.id() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(id as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
        for c in &mut self.children {
            let _ = c.wait().await;
        }
        let _ = std::fs::remove_file(&self.cfg);
    }
}

async fn database() -> anyhow::Result<(String, Option<batchonce::ops::embedded::Cluster>)> {
    let server = match std::env::var("DATABASE_URL") {
        Ok(u) if !u.trim().is_empty() => (u, None),
        _ => {
            let opts = batchonce::ops::embedded::ClusterOptions {
                dir: std::path::PathBuf::from(".batchonce/bench-pg"),
                durable: true,
                max_connections: 100,
            };
            let c = tokio::task::spawn_blocking(move || {
                batchonce::ops::embedded::Cluster::start(&opts)
            })
            .await??;
            (c.url("postgres"), Some(c))
        }
    };
    Ok(server)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "batchonce-bench: error: {}",
                format!("{e:#}").replace('\n', " ")
            );
            std::process::ExitCode::FAILURE
        }
    }
}

/// What to measure.
#[derive(clap::Parser, Debug)]
#[command(
    name = "batchonce-bench",
    about = "Throughput and latency of batchonce next to bare-SQL baselines of the same run"
)]
struct Args {
    /// The scenario to run.
    #[arg(value_enum, default_value_t = Scenario::All)]
    scenario: Scenario,
    /// Full size (the figures in BENCHMARKS.md) or tiny (proves it works).
    #[arg(long, value_enum, default_value_t = Size::Full)]
    size: Size,
    /// drain: runs per measured concurrency (default 20,000; 200 at tiny size).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    runs: Option<u32>,
    /// drain: the worker concurrencies to measure, comma-separated (default 8,32).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=1000))]
    concurrency: Vec<u32>,
    /// ledger: finished runs in the big ledger (default 2,000,000; 60,000 at
    /// tiny size), compared with a ledger of 10,000.
    #[arg(long, value_parser = clap::value_parser!(u32).range(10_000..=10_000_000))]
    ledger_runs: Option<u32>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    Drain,
    Pickup,
    Enqueue,
    Settle,
    Send,
    Scopes,
    Ceiling,
    /// Every view with 10,000 finished runs and with `--ledger-runs`; not
    /// part of `all` at full size (its build takes minutes).
    Ledger,
    All,
}

async fn run() -> anyhow::Result<()> {
    let args = match <Args as clap::Parser>::try_parse() {
        Ok(a) => a,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            print!("{e}");
            return Ok(());
        }
        // clap's first line names the argument and the rejected value.
        Err(e) => bail!(
            "{}",
            e.to_string()
                .lines()
                .next()
                .unwrap_or("invalid arguments")
                .trim_start_matches("error: ")
        ),
    };
    let (scenario, size) = (args.scenario, args.size);
    let drain_runs = args
        .runs
        .map(|n| n as usize)
        .unwrap_or(if size == Size::Full { 20_000 } else { 200 });
    let concurrencies = if args.concurrency.is_empty() {
        vec![8, 32]
    } else {
        args.concurrency.clone()
    };
    let (server, cluster) = database().await?;
    let admin = batchonce::db::connect(&server, "batchonce-bench", 2).await?;
    let name = format!("batchonce_bench_{}", std::process::id());
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await?;
    let url = batchonce::db::with_database(&server, &name)?;
    let result = async {
        let pool = batchonce::db::connect(&url, "batchonce-bench", 40).await?;
        batchonce::db::migrate(&pool, &batchonce_workers::migrations()).await?;
        let pool = Arc::new(pool);
        let all = scenario == Scenario::All;
        if all || scenario == Scenario::Enqueue {
            println!("{}", enqueue(&pool, size).await?);
        }
        if all || scenario == Scenario::Drain {
            println!("{}", drain(&pool, drain_runs, &concurrencies).await?);
        }
        if all || scenario == Scenario::Pickup {
            println!("{}", pickup(&pool, size).await?);
        }
        if all || scenario == Scenario::Settle {
            println!("{}", settle(&pool, &url, size).await?);
        }
        if all || scenario == Scenario::Send {
            println!("{}", send(&pool, &url, size).await?);
        }
        if all || scenario == Scenario::Scopes {
            println!("{}", scopes::scopes(&pool, &url, size).await?);
        }
        if all || scenario == Scenario::Ceiling {
            println!("{}", ceiling::ceiling(&pool, size).await?);
        }
        if scenario == Scenario::Ledger || (all && size == Size::Tiny) {
            println!(
                "{}",
                ledger::ledger(&admin, &server, &name, size, args.ledger_runs).await?
            );
        }
        pool.close().await;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&admin)
        .await;
    if let Some(c) = cluster.filter(|c| c.started_here) {
        let _ = tokio::task::spawn_blocking(move || c.stop()).await;
    }
    result
}
