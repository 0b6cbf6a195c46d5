//! inventory-sync against real PostgreSQL: levels never move back to an
//! older source version (late runs, repeated runs, overlapping runs while the
//! source changes), the same version never overwrites a stored level, a
//! missing snapshot file retries and a bad one fails, and
//! a SIGKILLed worker process is taken over with exact results.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use batchonce::config::Config;
use batchonce::queue::{self, NewRun};
use batchonce::runtime::worker::{self, Shutdown, WorkerOptions};
use batchonce::testing::{wait_for_count, wait_until, TestDb};
use batchonce::{Clock, JobKey, Registry};
use batchonce_workers::inventory::{self, InventorySync};
use chrono::NaiveDate;
use rand::Rng;
use sqlx::PgPool;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");

fn scratch(name: &str) -> PathBuf {
    batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), name)
}

async fn db() -> TestDb {
    TestDb::new(&batchonce_workers::migrations()).await
}

/// The run of the quarter-hour `hh:mm` on 2026-09-15, keyed as the producer keys it.
fn period(hm: &str) -> NewRun {
    period_with(hm, "")
}

/// The run of `hh:mm` enqueued under [`config`] with `extra`: the run keeps
/// those policies, as one the producer enqueues does.
fn period_with(hm: &str, extra: &str) -> NewRun {
    let job = config(extra).jobs[&batchonce::JobName::parse(inventory::NAME).unwrap()].clone();
    let cfg = batchonce::JobConfig {
        max_attempts: 4,
        ..job
    };
    NewRun::new(
        JobKey::parse(&format!("inventory-sync:2026-09-15T{hm}")).unwrap(),
        NaiveDate::from_ymd_opt(2026, 9, 15).unwrap(),
        &cfg,
    )
    .unwrap()
}

fn config(extra: &str) -> Config {
    let kinds = Registry::new().register(InventorySync).default_configs();
    let chunk = if extra.contains("chunk_size") {
        ""
    } else {
        "chunk_size = 50\n"
    };
    let text = format!(
        "[jobs.inventory-sync]\n{chunk}backoff = \"100ms\"\nbackoff_max = \"300ms\"\nlease_ttl = \"3s\"\n{extra}"
    );
    Config::parse(&text, "test.toml", &kinds).unwrap()
}

struct Worker {
    signals: Shutdown,
    handle: tokio::task::JoinHandle<()>,
}

fn start(db: &TestDb, config: Config, concurrency: u32) -> Worker {
    let signals = Shutdown::default();
    let mut opts = WorkerOptions::new(format!("inv-{}", rand::random::<u16>()));
    opts.poll_interval = Duration::from_millis(100);
    opts.concurrency = concurrency;
    let handle = tokio::spawn(worker::run(
        Registry::new().register(InventorySync),
        config,
        db.pool.clone(),
        db.pool.clone(),
        opts,
        signals.clone(),
    ));
    Worker { signals, handle }
}

impl Worker {
    async fn stop(self) {
        self.signals.shutdown.cancel();
        self.handle.await.unwrap();
    }
}

async fn enqueue(pool: &PgPool, runs: &[NewRun]) {
    queue::enqueue(pool, runs, Clock::Db).await.unwrap();
}

/// Waits until `n` runs have ended (SUCCEEDED, FAILED or SKIPPED) and
/// returns every run's status by key, so that each caller states which
/// outcome it expects rather than accepting any end.
async fn wait_all_terminal(pool: &PgPool, n: i64) -> BTreeMap<String, String> {
    let pool = pool.clone();
    wait_until("every run to end", Duration::from_secs(60), || {
        let pool = pool.clone();
        async move {
            let done: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM batch_job_run WHERE status IN ('SUCCEEDED', 'FAILED', 'SKIPPED')",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            done == n
        }
    })
    .await;
    let rows: Vec<(String, String)> = sqlx::query_as("SELECT job_key, status FROM batch_job_run")
        .fetch_all(&pool)
        .await
        .unwrap();
    rows.into_iter().collect()
}

/// Waits until `n` runs have ended and checks that every one SUCCEEDED.
async fn wait_all_succeeded(pool: &PgPool, n: i64) {
    let ended = wait_all_terminal(pool, n).await;
    let errors: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT job_key, status, error_message FROM batch_job_run WHERE status <> 'SUCCEEDED'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(
        ended.values().all(|s| s == "SUCCEEDED"),
        "a run did not succeed: {errors:?}"
    );
}

/// The levels a run changed, as its fenced upserts counted them.
async fn processed(pool: &PgPool, hm: &str) -> i64 {
    sqlx::query_scalar("SELECT processed_count FROM batch_job_run WHERE job_key = $1")
        .bind(format!("inventory-sync:2026-09-15T{hm}"))
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn levels(pool: &PgPool) -> BTreeMap<String, (i64, i64)> {
    let rows: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT sku, quantity, source_version FROM inventory_level")
            .fetch_all(pool)
            .await
            .unwrap();
    rows.into_iter().map(|(s, q, v)| (s, (q, v))).collect()
}

async fn set_source(pool: &PgPool, skus: i64, quantity_base: i64, version: i64) {
    sqlx::query(
        "INSERT INTO inventory_source (sku, quantity, source_version) \
         SELECT 'S' || lpad(g::text, 4, '0'), $2 + g, $3 FROM generate_series(1, $1) g \
         ON CONFLICT (sku) DO UPDATE SET quantity = EXCLUDED.quantity, source_version = EXCLUDED.source_version",
    )
    .bind(skus)
    .bind(quantity_base)
    .bind(version)
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn a_late_or_repeated_run_never_moves_a_level_back() {
    let db = db().await;
    set_source(&db.pool, 120, 100, 5).await;
    let w = start(&db, config(""), 1);
    enqueue(&db.pool, &[period("10:00")]).await;
    wait_all_succeeded(&db.pool, 1).await;
    let after_v5 = levels(&db.pool).await;
    assert_eq!(after_v5.len(), 120);
    assert!(after_v5.values().all(|(q, v)| *v == 5 && *q > 100));
    assert_eq!(processed(&db.pool, "10:00").await, 120);
    // The source replica lags and shows an older version: nothing changes.
    set_source(&db.pool, 120, 900, 3).await;
    enqueue(&db.pool, &[period("10:15")]).await;
    wait_all_succeeded(&db.pool, 2).await;
    assert_eq!(levels(&db.pool).await, after_v5);
    assert_eq!(
        processed(&db.pool, "10:15").await,
        0,
        "an older snapshot changes no level"
    );
    // The same version again, with other quantities (a repeated delivery
    // of version 5 that disagrees): a level is replaced only by a strictly
    // newer version, so the stored one stays, quantity included.
    set_source(&db.pool, 120, 500, 5).await;
    enqueue(&db.pool, &[period("10:30")]).await;
    wait_all_succeeded(&db.pool, 3).await;
    assert_eq!(
        levels(&db.pool).await,
        after_v5,
        "the same version overwrote a level"
    );
    assert_eq!(
        processed(&db.pool, "10:30").await,
        0,
        "the same version changes no level"
    );
    // A newer one wins, for the SKUs it covers only.
    set_source(&db.pool, 60, 7000, 9).await;
    enqueue(&db.pool, &[period("10:45")]).await;
    wait_all_succeeded(&db.pool, 4).await;
    assert_eq!(processed(&db.pool, "10:45").await, 60);
    let now = levels(&db.pool).await;
    assert_eq!(now.len(), 120);
    for (sku, (q, v)) in &now {
        let n: i64 = sku[1..].parse().unwrap();
        if n <= 60 {
            assert_eq!((*q, *v), (7000 + n, 9), "{sku}");
        } else {
            assert_eq!((*q, *v), after_v5[sku], "{sku}");
        }
    }
    w.stop().await;
}

#[tokio::test]
async fn overlapping_runs_while_the_source_changes_never_regress() {
    let db = db().await;
    set_source(&db.pool, 200, 0, 1).await;
    let w = start(&db, config("chunk_size = 20\n"), 4);
    // The upstream keeps publishing newer versions of random SKUs while
    // several runs overlap; a sampler checks that no level ever goes back.
    let pool = db.pool.clone();
    let writer = tokio::spawn(async move {
        for version in 2..=40i64 {
            let skus: Vec<String> = {
                let mut rng = rand::thread_rng();
                (0..30)
                    .map(|_| format!("S{:04}", rng.gen_range(1..=200)))
                    .collect()
            };
            sqlx::query(
                "UPDATE inventory_source SET source_version = $2, quantity = $2 * 10 WHERE sku = ANY($1)",
            )
            .bind(&skus)
            .bind(version)
            .execute(&pool)
            .await
            .unwrap();
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    });
    let runs: Vec<NewRun> = ["10:00", "10:15", "10:30", "10:45", "11:00", "11:15"]
        .iter()
        .map(|hm| period_with(hm, "chunk_size = 20\n"))
        .collect();
    enqueue(&db.pool, &runs).await;
    let mut seen: BTreeMap<String, i64> = BTreeMap::new();
    let mut samples = 0;
    loop {
        for (sku, (_, v)) in levels(&db.pool).await {
            let before = seen.insert(sku.clone(), v).unwrap_or(i64::MIN);
            assert!(v >= before, "{sku} went back from version {before} to {v}");
        }
        samples += 1;
        let done: i64 =
            sqlx::query_scalar("SELECT count(*) FROM batch_job_run WHERE status = 'SUCCEEDED'")
                .fetch_one(&db.pool)
                .await
                .unwrap();
        if done == 6 && writer.is_finished() {
            break;
        }
        assert!(samples < 2000, "runs did not finish");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    writer.await.unwrap();
    // One more run after the source settled: levels equal the source.
    enqueue(&db.pool, &[period("11:30")]).await;
    wait_all_succeeded(&db.pool, 7).await;
    w.stop().await;
    let v = inventory::verify(&db.pool).await.unwrap();
    assert!(v.ok, "{}", v.detail);
    assert_eq!(v.items, 200);
}

fn write_snapshot(path: &Path, levels: &[(&str, i64, i64)]) {
    let json: Vec<serde_json::Value> = levels
        .iter()
        .map(|(s, q, v)| serde_json::json!({"sku": s, "quantity": q, "version": v}))
        .collect();
    std::fs::write(path, serde_json::to_vec(&json).unwrap()).unwrap();
}

#[tokio::test]
async fn a_snapshot_file_that_is_missing_retries_and_a_bad_one_fails() {
    let db = db().await;
    let dir = scratch("inv-file");
    let file = dir.join("snapshot.json");
    let w = start(
        &db,
        config(&format!("source_file = \"{}\"\n", file.display())),
        1,
    );
    enqueue(&db.pool, &[period("10:00")]).await;
    // Attempt 1 finds no file and retries with backoff.
    let pool = db.pool.clone();
    wait_until(
        "a retry after the missing file",
        Duration::from_secs(20),
        || {
            let pool = pool.clone();
            async move {
                let e: Option<String> =
                    sqlx::query_scalar("SELECT error_message FROM batch_job_run")
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                e.is_some_and(|e| e.contains("cannot read"))
            }
        },
    )
    .await;
    write_snapshot(&file, &[("A", 5, 2), ("B", 7, 3), ("A", 1, 1)]);
    wait_all_succeeded(&db.pool, 1).await;
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM batch_job_run")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(attempts >= 2);
    assert_eq!(
        levels(&db.pool).await,
        BTreeMap::from([("A".into(), (5, 2)), ("B".into(), (7, 3))])
    );
    // A file that repeats A's version with another quantity and brings a
    // newer B: A stays as stored, B moves on.
    write_snapshot(&file, &[("A", 99, 2), ("B", 8, 4)]);
    enqueue(&db.pool, &[period("10:15")]).await;
    wait_all_succeeded(&db.pool, 2).await;
    assert_eq!(
        levels(&db.pool).await,
        BTreeMap::from([("A".into(), (5, 2)), ("B".into(), (8, 4))])
    );
    assert_eq!(processed(&db.pool, "10:15").await, 1);
    // A snapshot with a negative quantity fails the run at once and
    // changes nothing.
    write_snapshot(&file, &[("A", 50, 9), ("B", -1, 9)]);
    enqueue(&db.pool, &[period("10:30")]).await;
    let ended = wait_all_terminal(&db.pool, 3).await;
    assert_eq!(
        ended.values().filter(|s| *s == "SUCCEEDED").count(),
        2,
        "{ended:?}"
    );
    let (status, attempts, error): (String, i32, String) = sqlx::query_as(
        "SELECT status, attempts, error_message FROM batch_job_run WHERE job_key LIKE '%10:30'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((status.as_str(), attempts), ("FAILED", 1));
    assert!(
        error.contains("entry 1 (B): quantity and version must not be negative"),
        "{error}"
    );
    assert_eq!(levels(&db.pool).await["A"], (5, 2));
    w.stop().await;
}

#[tokio::test]
async fn a_sigkilled_worker_process_is_taken_over_with_exact_levels() {
    let db = db().await;
    set_source(&db.pool, 3000, 10, 4).await;
    let dir = scratch("inv-kill");
    let cfg = dir.join("batchonce.toml");
    std::fs::write(
        &cfg,
        "[jobs.inventory-sync]\nchunk_size = 50\nchunk_pause = \"30ms\"\nlease_ttl = \"2s\"\nbackoff = \"1s\"\n",
    )
    .unwrap();
    enqueue(&db.pool, &[period("10:00")]).await;
    let spawn = |id: &str| {
        let log = std::fs::File::create(dir.join(format!("{id}.log"))).unwrap();
        Command::new(BIN)
            .env("DATABASE_URL", &db.url)
            .arg("--config")
            .arg(&cfg)
            .args(["--log-format", "json", "worker", "--worker-id", id])
            .args(["--poll-interval", "200ms"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    };
    let mut first = spawn("i1");
    wait_for_count(
        &db.pool,
        "the run to be under way",
        "SELECT processed_count FROM batch_job_run",
        500,
        Duration::from_secs(30),
    )
    .await;
    first.kill().unwrap();
    first.wait().unwrap();
    let mut second = spawn("i2");
    wait_all_succeeded(&db.pool, 1).await;
    second.kill().unwrap();
    second.wait().unwrap();
    let (status, attempts, processed): (String, i32, i64) =
        sqlx::query_as("SELECT status, attempts, processed_count FROM batch_job_run")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((status.as_str(), attempts), ("SUCCEEDED", 2));
    // Each SKU written once: the second attempt skipped what the first committed.
    assert_eq!(processed, 3000);
    let v = inventory::verify(&db.pool).await.unwrap();
    assert!(v.ok, "{}", v.detail);
    let tokens: i64 =
        sqlx::query_scalar("SELECT count(DISTINCT (job_key, attempt)) FROM inventory_level")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(tokens, 2, "both attempts wrote, each its own share");
}
