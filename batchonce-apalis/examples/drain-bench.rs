//! Drain through the apalis backend next to the native worker, in one run
//! on one database, as ratios (BENCHMARKS.md, "apalis backend"):
//!
//! ```text
//! cargo run --release -p batchonce-apalis --example drain-bench -- --runs 20000 --concurrency 8,32
//! ```
//!
//! For each concurrency it drains `--runs` no-op runs with the engine's
//! worker and with an apalis worker on [`BatchonceBackend`], alternating
//! them for `--rounds` rounds, and prints the medians and their ratio. The
//! database is `DATABASE_URL`'s server or the tests' private cluster (no
//! fsync there, so absolute figures are higher than on a durable server;
//! the ratio is the claim).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use apalis_core::error::BoxDynError;
use apalis_core::worker::builder::WorkerBuilder;
use async_trait::async_trait;
use batchonce::queue::{self, NewRun};
use batchonce::runtime::worker::{self, Shutdown, WorkerOptions};
use batchonce::testing::TestDb;
use batchonce::{
    Clock, Config, Job, JobConfig, JobContext, JobError, JobKey, JobName, Outcome, Registry,
};
use batchonce_apalis::{BatchonceBackend, RunLease};
use chrono::NaiveDate;
use clap::Parser;
use sqlx::PgPool;

#[derive(Parser)]
struct Args {
    /// Runs per drain.
    #[arg(long, default_value_t = 20_000)]
    runs: usize,
    /// Worker concurrencies to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [8u32, 32])]
    concurrency: Vec<u32>,
    /// Alternating rounds per concurrency (the median is reported).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

static RAN: AtomicU64 = AtomicU64::new(0);

struct Noop(JobName);

#[async_trait]
impl Job for Noop {
    fn name(&self) -> JobName {
        self.0.clone()
    }
    async fn run(&self, _ctx: &JobContext) -> Result<Outcome, JobError> {
        RAN.fetch_add(1, Ordering::Relaxed);
        Ok(Outcome::Succeeded)
    }
}

async fn noop(_args: serde_json::Value, _run: RunLease) -> Result<(), BoxDynError> {
    RAN.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

fn job(name: &str) -> JobName {
    JobName::parse(name).expect("a valid job name")
}

async fn enqueue(pool: &PgPool, name: &JobName, n: usize) -> anyhow::Result<()> {
    sqlx::query("DELETE FROM batch_job_attempt")
        .execute(pool)
        .await?;
    sqlx::query("DELETE FROM batch_job_run")
        .execute(pool)
        .await?;
    let cfg = JobConfig::default();
    let date = NaiveDate::from_ymd_opt(2026, 1, 1).unwrap_or_default();
    let runs: Vec<NewRun> = (0..n)
        .map(|i| {
            let key = JobKey::parse(&format!("{name}:{i:09}"))?;
            Ok(NewRun::new(key, date, &cfg)?)
        })
        .collect::<anyhow::Result<_>>()?;
    for chunk in runs.chunks(5_000) {
        queue::enqueue(pool, chunk, Clock::Db).await?;
    }
    sqlx::query("VACUUM ANALYZE batch_job_run")
        .execute(pool)
        .await?;
    Ok(())
}

async fn wait_drained(n: usize, since: u64, pool: &PgPool) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(900);
    while RAN.load(Ordering::Relaxed) - since < n as u64 {
        if Instant::now() > deadline {
            bail!("the drain did not finish");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    loop {
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM batch_job_run WHERE status IN ('PENDING', 'RUNNING')",
        )
        .fetch_one(pool)
        .await?;
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{left} runs left unfinished");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn native(db: &TestDb, n: usize, c: u32) -> anyhow::Result<f64> {
    let name = job("bench-native");
    enqueue(&db.pool, &name, n).await?;
    let registry = Registry::new().register(Noop(name.clone()));
    let config = Config::defaults(&registry.default_configs());
    let pool =
        batchonce::db::connect_worker(&db.url, "bench-native", c + 3, Duration::from_secs(60))?;
    let hb = batchonce::db::connect_worker(&db.url, "bench-native", 1, Duration::from_secs(60))?;
    let mut opts = WorkerOptions::new("bench-native");
    opts.concurrency = c;
    opts.poll_interval = Duration::from_millis(100);
    let signals = Shutdown::default();
    let since = RAN.load(Ordering::Relaxed);
    let started = Instant::now();
    let handle = tokio::spawn(worker::run(
        registry,
        config,
        pool,
        hb,
        opts,
        signals.clone(),
    ));
    wait_drained(n, since, &db.pool).await?;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    signals.shutdown.cancel();
    let _ = handle.await;
    Ok(rate)
}

async fn apalis(db: &TestDb, n: usize, c: u32) -> anyhow::Result<f64> {
    let name = job("bench-apalis");
    enqueue(&db.pool, &name, n).await?;
    let backend = BatchonceBackend::<serde_json::Value>::new(&db.url, name, JobConfig::default())?
        .concurrency(c)
        .poll_interval(Duration::from_millis(100));
    let worker = WorkerBuilder::new("bench-apalis")
        .backend(backend)
        .build(noop);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let since = RAN.load(Ordering::Relaxed);
    let started = Instant::now();
    let handle = tokio::spawn(worker.run_until(async move {
        let _ = stopped.await;
        Ok::<(), std::io::Error>(())
    }));
    wait_drained(n, since, &db.pool).await?;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    let _ = stop.send(());
    let _ = handle.await;
    Ok(rate)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let db = TestDb::new(&[]).await;
    for &c in &args.concurrency {
        let (mut nat, mut apa) = (Vec::new(), Vec::new());
        for _ in 0..args.rounds.max(1) {
            nat.push(native(&db, args.runs, c).await?);
            apa.push(apalis(&db, args.runs, c).await?);
        }
        let (n, a) = (median(nat.clone()), median(apa.clone()));
        println!(
            "{}",
            serde_json::json!({
                "scenario": "apalis-drain",
                "concurrency": c,
                "runs": args.runs,
                "native_runs_per_s": n.round(),
                "apalis_runs_per_s": a.round(),
                "ratio_apalis_to_native": (a / n * 100.0).round() / 100.0,
                "native_rounds": nat.iter().map(|x| x.round()).collect::<Vec<_>>(),
                "apalis_rounds": apa.iter().map(|x| x.round()).collect::<Vec<_>>(),
            })
        );
    }
    Ok(())
}
