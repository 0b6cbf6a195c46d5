//! A change of configuration between workers (issue 15, item 1), with real
//! processes: a rolling deploy that changes `timezone` for
//! `daily-settlement` must not settle any order twice or under another
//! business date, because a run is defined by what it was enqueued with;
//! and while processes disagree, `status`, `runs stale` and the exporter's
//! gauge say so, naming the processes and the keys.

mod common;

use common::free_port;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use batchonce::testing::{wait_until, TestDb};
use batchonce_workers::settlement;
use chrono::NaiveDate;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sqlx::PgPool;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");
const DATES: [&str; 2] = ["2026-09-15", "2026-09-16"];
const ORDERS_PER_DAY: i64 = 1500;

fn scratch(name: &str) -> PathBuf {
    batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), name)
}

/// The job's file on one side of the deploy: only the time zone differs.
fn config(dir: &Path, name: &str, timezone: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(
        &p,
        format!(
            "[jobs.daily-settlement]\ntimezone = \"{timezone}\"\nlease_ttl = \"2s\"\n\
             chunk_size = 25\nchunk_pause = \"30ms\"\nbackoff = \"200ms\"\nbackoff_max = \"400ms\"\n"
        ),
    )
    .unwrap();
    p
}

fn cmd(db: &TestDb, cfg: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.env("DATABASE_URL", &db.url)
        .env_remove("BATCHONCE_CONFIG")
        .arg("--config")
        .arg(cfg)
        .args(args);
    c
}

fn run(db: &TestDb, cfg: &Path, args: &[&str]) -> Output {
    let out = cmd(db, cfg, args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn worker(db: &TestDb, cfg: &Path, dir: &Path, id: &str) -> Child {
    let log = std::fs::File::create(dir.join(format!("{id}.log"))).unwrap();
    cmd(
        db,
        cfg,
        &[
            "--log-format",
            "json",
            "worker",
            "--worker-id",
            id,
            "--concurrency",
            "1",
            "--poll-interval",
            "200ms",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
    )
    .env("RUST_LOG", "info")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(log)
    .spawn()
    .unwrap()
}

async fn scalar(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Orders around the two Seoul business dates, paid at every hour of
/// 2026-09-14T12:00Z .. 2026-09-17T00:00Z, so the Seoul and UTC windows of
/// each date overlap by nine hours and differ by fifteen.
async fn seed(pool: &PgPool) {
    for (i, d) in DATES.iter().enumerate() {
        let date = NaiveDate::parse_from_str(d, "%Y-%m-%d").unwrap();
        common::seed_orders(pool, date, i as i64 * ORDERS_PER_DAY, ORDERS_PER_DAY).await;
    }
    // And some on the days around, in UTC terms, which no run may settle.
    sqlx::query(
        "INSERT INTO orders (order_id, merchant_id, amount_minor, paid_at) \
         SELECT 100000 + g, 1, 100, timestamptz '2026-09-16T15:00:00Z' + g * interval '1 minute' \
         FROM generate_series(0, 539) g",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// The oracle, written apart from the production `verify`: every order paid
/// in a Seoul business date's window is settled exactly once, under that
/// date; nothing else is settled; no order appears twice anywhere.
async fn check_settled_once_in_seoul(pool: &PgPool) {
    assert_eq!(
        scalar(
            pool,
            "SELECT count(*) FROM (SELECT order_id FROM settlement_item \
             GROUP BY order_id HAVING count(*) > 1) d"
        )
        .await,
        0,
        "an order settled twice"
    );
    for d in DATES {
        let date = NaiveDate::parse_from_str(d, "%Y-%m-%d").unwrap();
        let (start, end) = settlement::day_bounds(date, chrono_tz::Asia::Seoul);
        let row: (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM orders WHERE paid_at >= $2 AND paid_at < $3), \
                    (SELECT count(*) FROM settlement_item i JOIN orders o USING (order_id) \
                     WHERE i.business_date = $1 AND o.paid_at >= $2 AND o.paid_at < $3), \
                    (SELECT count(*) FROM settlement_item i JOIN orders o USING (order_id) \
                     WHERE i.business_date = $1 AND NOT (o.paid_at >= $2 AND o.paid_at < $3))",
        )
        .bind(date)
        .bind(start)
        .bind(end)
        .fetch_one(pool)
        .await
        .unwrap();
        assert_eq!(row.0, ORDERS_PER_DAY, "seed of {d}");
        assert_eq!(
            row.1, row.0,
            "{d}: orders of its Seoul window settled under it"
        );
        assert_eq!(row.2, 0, "{d}: orders of another window settled under it");
    }
    assert_eq!(
        scalar(pool, "SELECT count(*) FROM settlement_item").await,
        2 * ORDERS_PER_DAY,
        "orders outside both windows were settled"
    );
}

/// The producer's file says Seoul; the deploy moves workers to UTC while a
/// run is half done. The run keeps its Seoul window: the UTC worker that
/// takes it over, and runs the next date, settles Seoul's orders, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_by_a_worker_with_another_time_zone_settles_each_order_once() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let dir = scratch("drift-takeover");
    let seoul = config(&dir, "seoul.toml", "Asia/Seoul");
    let utc = config(&dir, "utc.toml", "UTC");
    seed(&db.pool).await;
    run(
        &db,
        &seoul,
        &[
            "enqueue",
            "daily-settlement",
            "--from",
            DATES[0],
            "--to",
            DATES[1],
        ],
    );
    let mut old = worker(&db, &seoul, &dir, "old-seoul");
    wait_until(
        "the first run half done",
        Duration::from_secs(60),
        || async {
            scalar(&db.pool, "SELECT count(*) FROM settlement_item").await > ORDERS_PER_DAY / 3
        },
    )
    .await;
    common::signal_and_wait(&mut old, Signal::SIGKILL, Duration::from_secs(30));
    let mut new = worker(&db, &utc, &dir, "new-utc");
    wait_until("every run succeeded", Duration::from_secs(120), || async {
        scalar(
            &db.pool,
            "SELECT count(*) FROM batch_job_run WHERE status = 'SUCCEEDED'",
        )
        .await
            == 2
    })
    .await;
    common::signal_and_wait(&mut new, Signal::SIGTERM, Duration::from_secs(30));
    // The first run really was taken over by the UTC worker.
    assert_eq!(
        scalar(
            &db.pool,
            "SELECT count(DISTINCT worker_id) FROM batch_job_attempt \
             WHERE job_key = 'daily-settlement:2026-09-15'"
        )
        .await,
        2
    );
    check_settled_once_in_seoul(&db.pool).await;
    // And the shared oracle, which judges each item by its run's stored
    // period and its commit time.
    let o = common::oracle::settlement(&db.pool).await;
    o.assert_holds("after the takeover across the deploy");
    assert_eq!(o.items, 2 * ORDERS_PER_DAY);
}

/// Two live workers with different files: `status`, `runs stale` and the
/// exporter's gauge name the disagreement; once one stops, it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disagreeing_processes_are_shown_by_status_runs_stale_and_the_gauge() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let dir = scratch("drift-shown");
    let seoul = config(&dir, "seoul.toml", "Asia/Seoul");
    let utc = config(&dir, "utc.toml", "UTC");
    let mut a = worker(&db, &seoul, &dir, "w-seoul");
    let mut b = worker(&db, &utc, &dir, "w-utc");
    wait_until(
        "both workers registered",
        Duration::from_secs(30),
        || async {
            scalar(
                &db.pool,
                "SELECT count(DISTINCT process_id) FROM batch_process_config \
             WHERE job_name = 'daily-settlement'",
            )
            .await
                == 2
        },
    )
    .await;

    let out = run(&db, &seoul, &["--json", "status"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let drift = v["config_drift"].as_array().unwrap();
    assert_eq!(drift.len(), 1, "{v}");
    assert_eq!(drift[0]["job_name"], "daily-settlement");
    assert_eq!(drift[0]["keys"], serde_json::json!(["timezone"]));
    let ids: Vec<&str> = drift[0]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["process_id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"w-seoul") && ids.contains(&"w-utc"),
        "{ids:?}"
    );
    let text = String::from_utf8_lossy(&run(&db, &seoul, &["status"]).stdout).into_owned();
    assert!(
        text.contains("configuration drift: daily-settlement")
            && text.contains("timezone")
            && text.contains("w-utc"),
        "{text}"
    );
    // `runs stale`: the list on stdout stays machine-readable; the warning
    // goes to stderr, and into the text output.
    let out = run(&db, &seoul, &["--json", "runs", "stale"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("daily-settlement") && err.contains("timezone"),
        "{err}"
    );
    let text = String::from_utf8_lossy(&run(&db, &seoul, &["runs", "stale"]).stdout).into_owned();
    assert!(
        text.contains("configuration drift: daily-settlement"),
        "{text}"
    );

    // The exporter's gauge: two configurations among live processes.
    let port = free_port();
    let mut exporter = cmd(
        &db,
        &seoul,
        &[
            "exporter",
            "--interval",
            "200ms",
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let gauge = |want: &'static str| async move {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let body = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
                .await
                .ok();
            let text = match body {
                Some(r) => r.text().await.unwrap_or_default(),
                None => String::new(),
            };
            if text.lines().any(|l| {
                l.starts_with("batchonce_config_fingerprints{job=\"daily-settlement\"}")
                    && l.ends_with(want)
            }) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "gauge never reached {want}: {text}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    gauge(" 2").await;
    // The UTC worker stops and deregisters: they agree again.
    common::signal_and_wait(&mut b, Signal::SIGTERM, Duration::from_secs(30));
    gauge(" 1").await;
    let out = run(&db, &seoul, &["--json", "status"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["config_drift"], serde_json::json!([]), "{v}");
    common::signal_and_wait(&mut a, Signal::SIGTERM, Duration::from_secs(30));
    let _ = kill(Pid::from_raw(exporter.id() as i32), Signal::SIGTERM);
    let _ = exporter.wait();
}

/// An order of a run's window that another business date already settled
/// (a window that moved with a changed time zone) is reported by the run,
/// naming the order and the run that settled it, and is not settled again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_settled_under_another_date_is_reported_and_not_settled_again() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let dir = scratch("drift-elsewhere");
    let seoul = config(&dir, "seoul.toml", "Asia/Seoul");
    let date = NaiveDate::parse_from_str(DATES[1], "%Y-%m-%d").unwrap();
    common::seed_orders(&db.pool, date, 0, 300).await;
    // Order 123 of the 16th is already settled under the 15th (written
    // here by the owner, outside a fence, on purpose).
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SET LOCAL batchonce.unfenced = on")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO settlement_item (business_date, order_id, merchant_id, amount_minor, job_key, attempt) \
         SELECT '2026-09-15', order_id, merchant_id, amount_minor, 'daily-settlement:2026-09-15', 1 \
         FROM orders WHERE order_id = 123",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    run(
        &db,
        &seoul,
        &["enqueue", "daily-settlement", "--date", DATES[1]],
    );
    let mut w = worker(&db, &seoul, &dir, "w-elsewhere");
    wait_until("the run to succeed", Duration::from_secs(60), || async {
        scalar(
            &db.pool,
            "SELECT count(*) FROM batch_job_run WHERE status = 'SUCCEEDED'",
        )
        .await
            == 1
    })
    .await;
    common::signal_and_wait(&mut w, Signal::SIGTERM, Duration::from_secs(30));
    assert_eq!(
        scalar(
            &db.pool,
            "SELECT count(*) FROM settlement_item WHERE order_id = 123"
        )
        .await,
        1
    );
    assert_eq!(
        scalar(
            &db.pool,
            "SELECT count(*) FROM settlement_item WHERE business_date = '2026-09-16'"
        )
        .await,
        299
    );
    let log = std::fs::read_to_string(dir.join("w-elsewhere.log")).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("already settled by another run"))
        .unwrap_or_else(|| panic!("no warning:\n{log}"));
    assert!(
        line.contains("\"orders\":1")
            && line.contains("\"example_order\":123")
            && line.contains("daily-settlement:2026-09-15"),
        "{line}"
    );
}
