//! The settlement oracle (tests/common/oracle.rs) must be able to fail: a
//! run settled by a real worker process satisfies it, and each fault the
//! fault suite guards against, written into that database by hand, moves
//! exactly the count that names it.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use batchonce::testing::{wait_until, TestDb};
use chrono::NaiveDate;
use sqlx::PgPool;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");
const ORDERS: i64 = 300;

fn date() -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 9, 15).unwrap()
}

fn cmd(db: &TestDb, cfg: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.env("DATABASE_URL", &db.url)
        .env_remove("BATCHONCE_CONFIG")
        .arg("--config")
        .arg(cfg);
    c
}

/// Runs one statement as the schema's owner outside any fence, on purpose
/// (`batchonce.unfenced`): the faults are written by hand.
async fn exec(pool: &PgPool, sql: &str) {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SET LOCAL batchonce.unfenced = on")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(sql).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
}

/// One date settled by a real worker, then stopped: what the oracle sees
/// after a clean run.
async fn settled_run() -> TestDb {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let dir = batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), "oracle");
    let cfg = dir.join("batchonce.toml");
    std::fs::write(
        &cfg,
        "[jobs.daily-settlement]\ntimezone = \"Asia/Seoul\"\nchunk_size = 50\n",
    )
    .unwrap();
    common::seed_orders(&db.pool, date(), 0, ORDERS).await;
    let out = cmd(&db, &cfg)
        .args(["enqueue", "daily-settlement", "--date", "2026-09-15"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut worker = cmd(&db, &cfg)
        .args([
            "worker",
            "--poll-interval",
            "100ms",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pool = db.pool.clone();
    wait_until("the run SUCCEEDED", Duration::from_secs(60), || {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT status::text FROM batch_job_run")
                .fetch_one(&pool)
                .await
                .unwrap()
                == "SUCCEEDED"
        }
    })
    .await;
    common::sigterm_and_wait(&mut worker);
    db
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fault_written_by_hand_moves_its_own_count() {
    let db = settled_run().await;
    let pool = &db.pool;
    let clean = common::oracle::settlement(pool).await;
    clean.assert_holds("a clean run");
    assert_eq!((clean.orders, clean.items), (ORDERS, ORDERS));
    let moved = |o: common::oracle::Settled, want: common::oracle::Settled| {
        assert_eq!(o, want);
        assert!(!o.holds(), "{o:?}");
    };

    // A zombie's write: an item rewritten after its attempt ended has a
    // commit time after the finish, though its attempt and created_at are
    // those of the attempt.
    exec(
        pool,
        "UPDATE settlement_item SET amount_minor = amount_minor WHERE order_id = 1",
    )
    .await;
    let o = common::oracle::settlement(pool).await;
    moved(
        o,
        common::oracle::Settled {
            outside_lease: 1,
            ..clean
        },
    );
    assert_eq!(common::items_outside_their_lease(pool, None).await, 1);

    // An attempt that this run never made.
    exec(
        pool,
        "UPDATE settlement_item SET attempt = attempt + 1 WHERE order_id = 2",
    )
    .await;
    let o = common::oracle::settlement(pool).await;
    moved(
        o,
        common::oracle::Settled {
            outside_lease: 1,
            foreign_token: 1,
            ..clean
        },
    );

    // An order settled under another date (and so outside its run).
    exec(
        pool,
        "UPDATE settlement_item SET business_date = business_date + 1 WHERE order_id = 3",
    )
    .await;
    let o = common::oracle::settlement(pool).await;
    assert_eq!((o.wrong_run, o.twice, o.lost), (1, 0, 0), "{o:?}");

    // An order settled twice: the schema forbids it today, so the oracle
    // sees it only once the keys are gone, which is the point of an oracle
    // that does not lean on them.
    exec(
        pool,
        "ALTER TABLE settlement_item DROP CONSTRAINT settlement_item_order_key, \
         DROP CONSTRAINT settlement_item_business_date_order_id_key",
    )
    .await;
    exec(
        pool,
        "INSERT INTO settlement_item SELECT * FROM settlement_item WHERE order_id = 4",
    )
    .await;
    let o = common::oracle::settlement(pool).await;
    assert_eq!((o.twice, o.items), (1, ORDERS + 1), "{o:?}");

    // A lost order, and a summary that no longer adds up.
    exec(pool, "DELETE FROM settlement_item WHERE order_id = 5").await;
    exec(
        pool,
        "UPDATE settlement_summary SET total_minor = total_minor + 1 \
         WHERE merchant_id = (SELECT min(merchant_id) FROM settlement_summary)",
    )
    .await;
    let o = common::oracle::settlement(pool).await;
    assert_eq!((o.lost, o.wrong_summaries), (1, 1), "{o:?}");

    // A run whose period was never stored cannot be judged.
    exec(
        pool,
        "INSERT INTO batch_job_run (job_key, job_name, business_date, max_attempts) \
         VALUES ('daily-settlement:2026-09-16', 'daily-settlement', '2026-09-16', 3)",
    )
    .await;
    let o = common::oracle::settlement(pool).await;
    assert_eq!(o.runs_without_period, 1, "{o:?}");
}
