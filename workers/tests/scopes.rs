//! Scoped runs (issue 24) through real workers: `daily-settlement` scoped by
//! seller settles 200 sellers of one date as 200 runs. One seller's poisoned
//! order fails that seller's run alone while the other 199 succeed; the
//! views (`status`, `runs list --scope`, the exporter's gauges) say how many
//! scopes are in each state and which; after the data is fixed, `runs rerun`
//! of that one key settles it, the items are exact for all 200 sellers and
//! nothing of the other 199 is rewritten. An order is settled once whatever
//! scope reaches it.

use std::path::PathBuf;
use std::time::Duration;

use batchonce::config::Config;
use batchonce::queue::{self, NewRun, RunStatus};
use batchonce::runtime::producer;
use batchonce::schedule::Period;
use batchonce::testing::{wait_until, TestDb};
use batchonce::{Clock, JobKey, JobName, Registry};
use batchonce_workers::settlement::{self, DailySettlement};
use chrono::NaiveDate;
use sqlx::PgPool;

mod common;

use common::Workers;

const PERIOD: &str = "daily-settlement:2026-09-15";
const SELLERS: i64 = 200;
const POISONED_SELLER: i64 = 17;

fn date() -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 9, 15).unwrap()
}

const CONFIG: &str = "[jobs.daily-settlement]\ntimezone = \"Asia/Seoul\"\nchunk_size = 50\n\
    lease_ttl = \"5s\"\nbackoff = \"100ms\"\nbackoff_max = \"200ms\"\nmax_attempts = 3\n\
    scopes = { query = \"SELECT 'seller-' || id FROM sellers ORDER BY id\" }\n";

fn config() -> Config {
    let kinds = Registry::new().register(DailySettlement).default_configs();
    Config::parse(CONFIG, "test.toml", &kinds).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("batchonce-scopes-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs the binary with `cfg`: whether it succeeded, its stdout and its
/// stderr, which holds only what the command says (no info logs, so that
/// a log line cannot pass for the error a test looks for).
fn run(db: &TestDb, cfg: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = common::batchonce(db, Some(cfg))
        .env_remove("RUST_LOG")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// (status, count) of the date's scoped runs.
async fn states(pool: &PgPool) -> Vec<(String, i64)> {
    sqlx::query_as(
        "SELECT status, count(*) FROM batch_job_run WHERE scope IS NOT NULL \
         GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Every item and summary row with the transaction that wrote it: a
/// rewrite, even of equal values, changes `xmin`.
async fn written(pool: &PgPool) -> (Vec<(i64, String, i64, String)>, Vec<(i64, String)>) {
    let items = sqlx::query_as(
        "SELECT order_id, job_key, attempt::int8, xmin::text FROM settlement_item ORDER BY order_id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let summaries = sqlx::query_as(
        "SELECT merchant_id, xmin::text FROM settlement_summary ORDER BY merchant_id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    (items, summaries)
}

/// Two in-process settlement workers, four runs each at a time.
fn settlers(db: &TestDb, config: &Config) -> Workers {
    Workers::start_with(
        db,
        || Registry::new().register(DailySettlement),
        config,
        &["w-a", "w-b"],
        4,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_poisoned_seller_fails_alone_and_a_rerun_of_its_key_settles_it_alone() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let pool = &db.pool;
    sqlx::query("CREATE TABLE sellers (id bigint PRIMARY KEY)")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO sellers SELECT generate_series(1, $1)")
        .bind(SELLERS)
        .execute(pool)
        .await
        .unwrap();
    // 2,000 orders of the date, 10 for each of the 200 merchants.
    let (start, end) = settlement::day_bounds(date(), chrono_tz::Asia::Seoul);
    sqlx::query(
        "INSERT INTO orders (order_id, merchant_id, amount_minor, paid_at) \
         SELECT g, 1 + g % $4, 100 + (g * 7919) % 100000, $1 + ($2 - $1) * ((g - 1)::float8 / $3) \
         FROM generate_series(1, $3) g",
    )
    .bind(start)
    .bind(end)
    .bind(SELLERS * 10)
    .bind(SELLERS)
    .execute(pool)
    .await
    .unwrap();
    let poisoned: i64 = sqlx::query_scalar(
        "UPDATE orders SET amount_minor = -5 WHERE order_id = \
         (SELECT min(order_id) FROM orders WHERE merchant_id = $1) RETURNING order_id",
    )
    .bind(POISONED_SELLER)
    .fetch_one(pool)
    .await
    .unwrap();

    // The producer's runs for the date: one per seller, in one statement.
    let config = config();
    let job = JobName::parse(settlement::NAME).unwrap();
    let runs = producer::runs_for_periods(&job, config.job(&job).unwrap(), &[Period::day(date())])
        .unwrap();
    let report = queue::enqueue(pool, &runs, Clock::Db).await.unwrap();
    assert_eq!(report.enqueued.len(), SELLERS as usize);

    let workers = settlers(&db, &config);
    wait_until(
        "199 sellers to succeed and one to fail",
        Duration::from_secs(120),
        || async {
            states(pool).await
                == vec![
                    ("FAILED".to_owned(), 1),
                    ("SUCCEEDED".to_owned(), SELLERS - 1),
                ]
        },
    )
    .await;
    workers.stop().await;

    let bad_key = format!("{PERIOD}@seller-{POISONED_SELLER}");
    let (status, attempts, message): (String, i32, String) = sqlx::query_as(
        "SELECT status, attempts, error_message FROM batch_job_run WHERE job_key = $1",
    )
    .bind(&bad_key)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(status, "FAILED");
    assert_eq!(attempts, 1, "a negative amount is fatal: no retry");
    assert!(
        message.contains(&format!("order {poisoned} has a negative amount")),
        "{message}"
    );
    let bad_items: i64 =
        sqlx::query_scalar("SELECT count(*) FROM settlement_item WHERE merchant_id = $1")
            .bind(POISONED_SELLER)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(bad_items, 0, "the failed seller's chunk rolled back");

    // `status` counts the period's scopes per state and names the failed one.
    let st = queue::status(pool, Clock::Db).await.unwrap();
    assert_eq!(st.scopes.len(), 1, "{:?}", st.scopes);
    let p = &st.scopes[0];
    assert_eq!((p.period_key.as_str(), p.scopes), (PERIOD, SELLERS));
    let failed = p.state(queue::RunStatus::Failed).unwrap();
    assert_eq!(
        (failed.count, failed.named.clone()),
        (1, vec![format!("seller-{POISONED_SELLER}")])
    );
    let ok = p.state(queue::RunStatus::Succeeded).unwrap();
    assert_eq!(ok.count, SELLERS - 1);
    assert_eq!(ok.named.len(), queue::NAMED_SCOPES, "names are bounded");
    let dir = scratch("rerun");
    let cfg = dir.join("batchonce.toml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let (ok_, out, err) = run(&db, &cfg, &["status"]);
    assert!(ok_, "{err}");
    assert!(
        out.contains(&format!("  {PERIOD} FAILED: seller-{POISONED_SELLER}\n")),
        "{out}"
    );
    let (ok_, out, err) = run(
        &db,
        &cfg,
        &[
            "runs",
            "list",
            "--scope",
            &format!("seller-{POISONED_SELLER}"),
        ],
    );
    assert!(ok_, "{err}");
    assert!(out.contains(&bad_key) && out.contains("FAILED"), "{out}");
    assert_eq!(out.matches(PERIOD).count(), 1, "{out}");
    let (ok_, _, err) = run(&db, &cfg, &["runs", "list", "--scope", "Seller 17"]);
    assert!(!ok_);
    assert!(err.contains("scope"), "{err}");
    // The exporter's gauges: five series per job, and the period is not
    // done while one of its scopes is FAILED.
    let gauges = queue::gauges(pool, &[], Clock::Db).await.unwrap();
    let (_, g) = gauges.iter().find(|(j, _)| *j == job).unwrap();
    let of = |s: RunStatus| g.scopes.iter().find(|(st, _)| *st == s).unwrap().1;
    assert_eq!(
        (
            of(RunStatus::Succeeded),
            of(RunStatus::Failed),
            g.scopes.len()
        ),
        (SELLERS - 1, 1, 5)
    );
    assert_eq!(g.last_done_period_start_unix, None, "{g:?}");

    // Fix the data and re-run that one key: it alone runs again.
    let before = written(pool).await;
    sqlx::query("UPDATE orders SET amount_minor = 5 WHERE order_id = $1")
        .bind(poisoned)
        .execute(pool)
        .await
        .unwrap();
    let (ok_, out, err) = run(
        &db,
        &cfg,
        &[
            "runs",
            "rerun",
            &bad_key,
            "--reason",
            "order fixed",
            "--operator",
            "alice",
        ],
    );
    assert!(ok_, "{err}");
    assert!(out.contains("FAILED -> PENDING"), "{out}");
    let workers = settlers(&db, &config);
    wait_until(
        "the re-run seller to succeed",
        Duration::from_secs(60),
        || async { states(pool).await == vec![("SUCCEEDED".to_owned(), SELLERS)] },
    )
    .await;
    workers.stop().await;

    common::oracle::settlement(pool)
        .await
        .assert_holds("200 scoped runs");
    assert!(
        settlement::verify(pool, chrono_tz::Asia::Seoul, date())
            .await
            .unwrap()
            .ok
    );
    let after = written(pool).await;
    let untouched = |rows: &[(i64, String, i64, String)]| -> Vec<(i64, String, i64, String)> {
        rows.iter()
            .filter(|r| !r.1.ends_with(&format!("@seller-{POISONED_SELLER}")))
            .cloned()
            .collect()
    };
    assert_eq!(
        untouched(&after.0),
        before.0,
        "the 199 sellers' items are not rewritten"
    );
    assert_eq!(after.0.len(), (SELLERS * 10) as usize);
    let other_summaries = |rows: &[(i64, String)]| -> Vec<(i64, String)> {
        rows.iter()
            .filter(|r| r.0 != POISONED_SELLER)
            .cloned()
            .collect()
    };
    assert_eq!(other_summaries(&after.1), other_summaries(&before.1));
    assert_eq!(after.1.len(), SELLERS as usize);
    let attempts: Vec<(String, i32)> = sqlx::query_as(
        "SELECT job_key, attempts FROM batch_job_run WHERE attempts <> 1 ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(
        attempts,
        vec![(bad_key.clone(), 2)],
        "only the re-run key ran again"
    );
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM batch_operator_action WHERE job_key = $1")
            .bind(&bad_key)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(audited, 1);
    let gauges = queue::gauges(pool, &[], Clock::Db).await.unwrap();
    let (_, g) = gauges.iter().find(|(j, _)| *j == job).unwrap();
    assert!(
        g.last_done_period_start_unix.is_some(),
        "every scope is done: {g:?}"
    );

    // Another scope that names the same merchant settles nothing again: an
    // item names its order, not the run.
    let other = JobKey::parse(&format!("{PERIOD}@region-{POISONED_SELLER}")).unwrap();
    let r = NewRun::new(other.clone(), date(), config.job(&job).unwrap()).unwrap();
    assert_eq!(
        queue::enqueue(pool, &[r], Clock::Db)
            .await
            .unwrap()
            .enqueued
            .len(),
        1
    );
    let workers = settlers(&db, &config);
    batchonce::testing::wait_for_status(
        pool,
        Some(other.as_str()),
        &["SUCCEEDED", "FAILED"],
        Duration::from_secs(60),
    )
    .await;
    workers.stop().await;
    let (status, processed): (String, i64) =
        sqlx::query_as("SELECT status, processed_count FROM batch_job_run WHERE job_key = $1")
            .bind(other.as_str())
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!((status.as_str(), processed), ("SUCCEEDED", 0));
    assert_eq!(written(pool).await.0, after.0, "no item written again");
}
