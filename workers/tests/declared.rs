//! Production runs only what its configuration declares (issue 18): a
//! bundled kind is a sample until a `[jobs.<name>]` table names it. With a
//! file that declares one command job, `migrate` creates only the engine's
//! tables, `produce` schedules only that job and a worker serves only it; a
//! worker with nothing declared refuses to start; `--jobs` narrows a worker;
//! and a database that already holds the samples' tables keeps them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use batchonce::testing::{wait_until, TestDb};
use sqlx::PgPool;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");

/// The tables of the bundled kinds, none of which a database that declares
/// none of them may hold.
const SAMPLE_TABLES: &[&str] = &[
    "orders",
    "settlement_item",
    "settlement_summary",
    "notification_request",
    "notification_delivery",
    "inventory_source",
    "inventory_level",
];

fn scratch(name: &str) -> PathBuf {
    batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), name)
}

/// One command job of the user's own, scheduled daily.
fn own_job_config(dir: &Path) -> PathBuf {
    let p = dir.join("own.toml");
    std::fs::write(
        &p,
        "[jobs.nightly-report]\ncommand = [\"sh\", \"-c\", \"echo report $BATCHONCE_BUSINESS_DATE\"]\n\
         timezone = \"UTC\"\nschedule = \"0 2 * * *\"\ncovers = \"previous-day\"\ncatch_up = \"3d\"\n",
    )
    .unwrap();
    p
}

fn cmd(url: &str, dir: &Path, config: Option<&Path>, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.env("DATABASE_URL", url)
        .env_remove("BATCHONCE_CONFIG")
        // An empty folder: no batchonce.toml is found by accident.
        .current_dir(dir);
    if let Some(p) = config {
        c.arg("--config").arg(p);
    }
    c.args(args);
    c
}

/// Runs to completion within a deadline.
fn run(mut c: Command) -> Output {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{c:?} did not exit within 60s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn ok(c: Command) -> String {
    let out = run(c);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Exit 1 with one error line containing `want`.
fn refused(c: Command, want: &str) {
    let out = run(c);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(want), "want {want:?} in: {err}");
}

async fn tables(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn job_names(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT DISTINCT job_name::text FROM batch_job_run ORDER BY 1")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_declares_one_command_job_gets_nothing_else() {
    let db = TestDb::empty().await;
    let dir = scratch("declared-one");
    let cfg = own_job_config(&dir);

    ok(cmd(&db.url, &dir, Some(&cfg), &["migrate"]));
    let t = tables(&db.pool).await;
    assert!(t.contains(&"batch_job_run".to_owned()), "{t:?}");
    for sample in SAMPLE_TABLES {
        assert!(!t.contains(&sample.to_string()), "{sample} created: {t:?}");
    }

    // The producer schedules only the declared job, though the bundled
    // kinds have schedules of their own.
    ok(cmd(
        &db.url,
        &dir,
        Some(&cfg),
        &["produce", "--once", "--now", "2026-09-15T03:00:00Z"],
    ));
    assert_eq!(job_names(&db.pool).await, ["nightly-report"]);

    // Nor can a sample be enqueued by hand: it does not exist here.
    refused(
        cmd(
            &db.url,
            &dir,
            Some(&cfg),
            &["enqueue", "daily-settlement", "--date", "2026-09-15"],
        ),
        "unknown job \"daily-settlement\" (declared: nightly-report;",
    );
    // A worker without a file has nothing to serve and says so.
    refused(
        cmd(&db.url, &dir, None, &["worker"]),
        "no job to serve: no job is declared (no configuration file)",
    );
    refused(
        cmd(
            &db.url,
            &dir,
            Some(&cfg),
            &["worker", "--jobs", "daily-settlement"],
        ),
        "--jobs: unknown job \"daily-settlement\" (declared: nightly-report;",
    );

    // The worker serves the declared job, says so, and runs its periods.
    let log = dir.join("worker.log");
    let mut worker = cmd(
        &db.url,
        &dir,
        Some(&cfg),
        &[
            "--log-format",
            "json",
            "worker",
            "--jobs",
            "nightly-report",
            "--poll-interval",
            "100ms",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
    )
    .env("RUST_LOG", "info")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log).unwrap())
    .spawn()
    .unwrap();
    let pool = db.pool.clone();
    wait_until(
        "every produced run SUCCEEDED",
        Duration::from_secs(60),
        || {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FILTER (WHERE status <> 'SUCCEEDED') FROM batch_job_run",
                )
                .fetch_one(&pool)
                .await
                .unwrap()
                    == 0
            }
        },
    )
    .await;
    common::sigterm_and_wait(&mut worker);
    let text = std::fs::read_to_string(&log).unwrap();
    let started: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "worker started" || v["message"] == "worker started")
        .collect();
    assert_eq!(started.len(), 1, "{text}");
    let jobs = started[0]["fields"]["jobs"]
        .as_str()
        .or(started[0]["jobs"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert_eq!(jobs, "nightly-report", "{text}");
    assert_eq!(job_names(&db.pool).await, ["nightly-report"]);
    let t = tables(&db.pool).await;
    for sample in SAMPLE_TABLES {
        assert!(!t.contains(&sample.to_string()), "{sample} created: {t:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_holds_the_samples_keeps_them_when_they_are_not_declared() {
    // Migrated by a release that created every bundled kind's tables.
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    batchonce_workers_seed(&db.pool).await;
    let dir = scratch("declared-upgrade");
    let cfg = own_job_config(&dir);
    let before = tables(&db.pool).await;
    let out = ok(cmd(&db.url, &dir, Some(&cfg), &["migrate"]));
    assert!(out.contains("migrations applied"), "{out}");
    assert_eq!(tables(&db.pool).await, before);
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(orders, 3);
    // And a second time, with no file at all.
    ok(cmd(&db.url, &dir, None, &["migrate"]));
    assert_eq!(tables(&db.pool).await, before);
}

async fn batchonce_workers_seed(pool: &PgPool) {
    sqlx::query(
        "INSERT INTO orders (order_id, merchant_id, amount_minor, paid_at) \
         SELECT g, 1, 100, now() FROM generate_series(1, 3) g",
    )
    .execute(pool)
    .await
    .unwrap();
}
