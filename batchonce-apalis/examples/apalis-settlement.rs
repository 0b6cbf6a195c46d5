//! An apalis worker that settles a business date exactly once, through
//! batchonce's fence: run two of these with the same `--worker-name`, stop
//! one mid-run, and every order is still settled once.
//!
//! ```text
//! cargo run -p batchonce-apalis --example apalis-settlement -- \
//!     --database-url postgres://… --worker-name settle --enqueue 2026-09-15
//! ```
//!
//! It creates its two tables if they are missing (a real application keeps
//! them in its migrations) and the engine's with `batchonce::db::migrate`.
//! The handler settles the date's orders in chunks, each chunk one fenced
//! transaction; the item key is the order, so a retry after a crash resumes
//! where the last committed chunk ended. A tower timeout layer bounds the
//! whole attempt; its timeout becomes a retry after the job's backoff.

use std::time::Duration;

use anyhow::Context as _;
use apalis::prelude::WorkerBuilderExt;
use apalis_core::error::{AbortError, BoxDynError};
use apalis_core::worker::builder::WorkerBuilder;
use batchonce::{JobConfig, JobError, JobName};
use batchonce_apalis::{BatchonceBackend, RunLease};
use clap::Parser;
use serde::{Deserialize, Serialize};

#[derive(Parser)]
struct Args {
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// The apalis worker's name; two processes may share one.
    #[arg(long, default_value = "apalis-settlement")]
    worker_name: String,
    /// Enqueue this business date (YYYY-MM-DD) first; a date already
    /// enqueued is reported as a duplicate.
    #[arg(long)]
    enqueue: Option<chrono::NaiveDate>,
    /// Orders per fenced chunk.
    #[arg(long, default_value_t = 100)]
    chunk: i64,
    /// Pause between chunks, in milliseconds (to watch a run in progress).
    #[arg(long, default_value_t = 0)]
    chunk_pause_ms: u64,
    /// Time spent inside each chunk's transaction before it commits, in
    /// milliseconds (slow item work, or a test stopping a worker mid-write).
    #[arg(long, default_value_t = 0)]
    hold_ms: u64,
    /// The lease; a stopped worker loses its run this long after its last
    /// heartbeat.
    #[arg(long, default_value = "30s", value_parser = humantime_duration)]
    lease_ttl: Duration,
    /// Only enqueue, do not run a worker.
    #[arg(long)]
    enqueue_only: bool,
}

fn humantime_duration(s: &str) -> Result<Duration, String> {
    batchonce::config::parse_duration(s)
}

/// What a run of `apalis-settlement` carries; `{}` (the producer's payload)
/// decodes too.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Settle {
    #[serde(default)]
    note: Option<String>,
}

#[derive(Debug, Clone)]
struct Tuning {
    chunk: i64,
    pause: Duration,
    hold: Duration,
}

async fn settle(
    _args: Settle,
    run: RunLease,
    tuning: apalis_core::task::data::Data<Tuning>,
) -> Result<(), BoxDynError> {
    let negative: Option<i64> = sqlx::query_scalar(
        "SELECT id FROM apalis_order WHERE business_date = $1 AND amount_minor < 0 LIMIT 1",
    )
    .bind(run.business_date)
    .fetch_optional(run.pool())
    .await?;
    if let Some(id) = negative {
        // Bad source data: another attempt would fail the same way.
        return Err(Box::new(AbortError::new(format!(
            "order {id} has a negative amount"
        ))));
    }
    loop {
        if run.is_cancelled() {
            return Err(Box::new(JobError::Cancelled));
        }
        let mut tx = run.fenced().await?;
        let n = sqlx::query(
            "INSERT INTO apalis_settlement_item (order_id, business_date, amount_minor, lease_token) \
             SELECT o.id, o.business_date, o.amount_minor, $2 FROM apalis_order o \
             WHERE o.business_date = $1 \
               AND NOT EXISTS (SELECT 1 FROM apalis_settlement_item i WHERE i.order_id = o.id) \
             ORDER BY o.id LIMIT $3 \
             ON CONFLICT (order_id) DO NOTHING",
        )
        .bind(run.business_date)
        .bind(run.lease_token)
        .bind(tuning.chunk)
        .execute(tx.conn())
        .await?
        .rows_affected();
        if !tuning.hold.is_zero() {
            tokio::time::sleep(tuning.hold).await;
        }
        tx.add_progress(n as i64, 0);
        run.commit(tx).await?;
        if n == 0 {
            return Ok(());
        }
        if !tuning.pause.is_zero() {
            run.pause(tuning.pause).await?;
        }
    }
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS apalis_order (
    id bigint PRIMARY KEY,
    business_date date NOT NULL,
    amount_minor bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS apalis_settlement_item (
    order_id bigint CONSTRAINT apalis_settlement_item_order_key PRIMARY KEY,
    business_date date NOT NULL,
    amount_minor bigint NOT NULL,
    lease_token bigint NOT NULL
);";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let pool = batchonce::db::connect(&args.database_url, "apalis-settlement-setup", 2).await?;
    batchonce::db::migrate(&pool, &[]).await?;
    sqlx::raw_sql(SCHEMA).execute(&pool).await?;

    let job = JobName::parse("apalis-settlement").context("job name")?;
    let cfg = JobConfig {
        lease_ttl: args.lease_ttl,
        backoff: Duration::from_secs(1),
        ..JobConfig::default()
    };
    let backend = BatchonceBackend::<Settle>::new(&args.database_url, job, cfg)?
        .concurrency(2)
        .poll_interval(Duration::from_millis(500))
        .grace(Duration::from_secs(5));
    if let Some(date) = args.enqueue {
        let report = backend
            .enqueuer()?
            .enqueue(date, &Settle::default())
            .await?;
        for k in &report.enqueued {
            println!("enqueued {k}");
        }
        for k in &report.duplicates {
            println!("duplicate {k}: already enqueued");
        }
    }
    if args.enqueue_only {
        return Ok(());
    }
    let worker = WorkerBuilder::new(args.worker_name.as_str())
        .backend(backend)
        .data(Tuning {
            chunk: args.chunk,
            pause: Duration::from_millis(args.chunk_pause_ms),
            hold: Duration::from_millis(args.hold_ms),
        })
        .enable_tracing()
        .timeout(Duration::from_secs(600))
        .build(settle);
    worker
        .run_until(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                _ = term.recv() => {},
                r = tokio::signal::ctrl_c() => r?,
            }
            Ok::<(), std::io::Error>(())
        })
        .await?;
    Ok(())
}
