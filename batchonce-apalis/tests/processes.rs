//! Two processes of `examples/apalis-settlement` with the same worker name
//! settle one business date. The one holding the run is stopped (SIGSTOP)
//! inside an open fenced transaction, past its lease; the other takes the
//! run over (once the server has ended the stopped one's transaction) and
//! finishes it; and the stopped one is resumed: nothing it wrote commits
//! after the takeover, its finish is never written, and every order is
//! settled exactly once.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use batchonce::testing::{wait_until, TestDb};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sqlx::PgPool;

const DATE: &str = "2026-09-15";
const KEY: &str = "apalis-settlement:2026-09-15";
const ORDERS: i64 = 400;

/// `cargo test` builds the package's examples next to its test binaries.
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin = dir.join("examples").join("apalis-settlement");
    assert!(
        bin.exists(),
        "{} is missing: run the tests with `cargo test`, which builds the examples",
        bin.display()
    );
    bin
}

fn spawn(url: &str, extra: &[&str]) -> Child {
    Command::new(example())
        .args([
            "--database-url",
            url,
            "--worker-name",
            "settle",
            "--chunk",
            "20",
            "--chunk-pause-ms",
            "20",
            "--hold-ms",
            "300",
            "--lease-ttl",
            "2s",
        ])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

async fn scalar(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap_or(-1)
}

fn sigterm_and_wait(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the worker did not exit within {within:?} of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_holder_resumed_after_a_takeover_commits_nothing() {
    let db = TestDb::new(&[]).await;
    // The example creates its tables; seed the orders once they exist. The
    // run keeps the 2 s lease it is enqueued with, whatever a worker's own
    // flag says later.
    let status = Command::new(example())
        .args([
            "--database-url",
            &db.url,
            "--lease-ttl",
            "2s",
            "--enqueue",
            DATE,
            "--enqueue-only",
        ])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(status.status.success(), "{status:?}");
    assert!(String::from_utf8_lossy(&status.stdout).contains(&format!("enqueued {KEY}")));
    sqlx::query(
        "INSERT INTO apalis_order (id, business_date, amount_minor) \
         SELECT g, DATE '2026-09-15', g * 10 FROM generate_series(1, $1) g",
    )
    .bind(ORDERS)
    .execute(&db.pool)
    .await
    .unwrap();

    let mut a = spawn(&db.url, &[]);
    wait_until(
        "the first worker is settling",
        Duration::from_secs(30),
        || async { scalar(&db.pool, "SELECT count(*) FROM apalis_settlement_item").await >= 40 },
    )
    .await;
    let a_token = scalar(&db.pool, "SELECT lease_token FROM batch_job_run").await;
    // Stop A while a chunk's fenced transaction is open (its rows written,
    // not committed): try again when the stop lands between two chunks.
    let a_pid = Pid::from_raw(a.id() as i32);
    let mut open_pid = None;
    for _ in 0..40 {
        kill(a_pid, Signal::SIGSTOP).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        open_pid = sqlx::query_scalar::<_, i32>(
            "SELECT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid \
             WHERE a.application_name LIKE 'settle-%' AND a.state = 'idle in transaction' \
               AND l.relation = 'apalis_settlement_item'::regclass AND l.mode = 'RowExclusiveLock'",
        )
        .fetch_optional(&db.pool)
        .await
        .unwrap();
        if open_pid.is_some() {
            break;
        }
        kill(a_pid, Signal::SIGCONT).unwrap();
        tokio::time::sleep(Duration::from_millis(37)).await;
    }
    let open_pid = open_pid.expect("could not stop the worker inside a chunk's transaction");

    let mut b = spawn(&db.url, &[]);
    // The server ends the stopped transaction after its idle timeout; until
    // then the run must stay A's, because the open fence holds its row.
    let gone_sql = format!(
        "SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {open_pid}) \
         THEN 0 ELSE (extract(epoch FROM now()) * 1e6)::bigint END"
    );
    let started = std::time::Instant::now();
    let gone_us = loop {
        let v = scalar(&db.pool, &gone_sql).await;
        if v > 0 {
            break v;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the server never ended the stopped worker's transaction"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    wait_until(
        "the second worker took the run over and finished it",
        Duration::from_secs(60),
        || async {
            scalar(
                &db.pool,
                "SELECT count(*) FROM batch_job_run WHERE status = 'SUCCEEDED'",
            )
            .await
                == 1
        },
    )
    .await;
    // The takeover's claim, from the database: A's commits must all be older.
    let taken_over = scalar(
        &db.pool,
        "SELECT (extract(epoch FROM started_at) * 1e6)::bigint FROM batch_job_attempt \
         WHERE job_key = 'apalis-settlement:2026-09-15' AND attempt = 2",
    )
    .await;
    assert!(taken_over > 0, "a second attempt exists");
    assert!(
        taken_over >= gone_us - 300_000,
        "the run was taken over {} ms before the stopped holder's fenced transaction ended",
        (gone_us - taken_over) / 1000
    );

    kill(a_pid, Signal::SIGCONT).unwrap();
    // A notices on its next heartbeat or write; give it room to try, and
    // then it must still be alive and exit cleanly on SIGTERM.
    wait_until(
        "the resumed worker noticed its lost lease",
        Duration::from_secs(20),
        || async {
            scalar(
                &db.pool,
                "SELECT count(*) FROM batch_worker WHERE worker_id LIKE 'settle-%' \
                 AND last_seen > now() - interval '2 seconds'",
            )
            .await
                == 2
        },
    )
    .await;
    assert!(
        a.try_wait().unwrap().is_none(),
        "the resumed worker is alive"
    );
    assert!(sigterm_and_wait(&mut a, Duration::from_secs(15)).success());
    assert!(sigterm_and_wait(&mut b, Duration::from_secs(15)).success());

    let items = scalar(&db.pool, "SELECT count(*) FROM apalis_settlement_item").await;
    let distinct = scalar(
        &db.pool,
        "SELECT count(DISTINCT order_id) FROM apalis_settlement_item",
    )
    .await;
    assert_eq!((items, distinct), (ORDERS, ORDERS), "every order once");
    let late = scalar(
        &db.pool,
        &format!(
            "SELECT count(*) FROM apalis_settlement_item WHERE lease_token = {a_token} \
             AND (extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1e6)::bigint > {taken_over}"
        ),
    )
    .await;
    assert_eq!(late, 0, "the stopped holder committed after the takeover");
    let (status, attempts, a_succeeded): (String, i32, i64) = sqlx::query_as(
        "SELECT r.status, r.attempts, \
           (SELECT count(*) FROM batch_job_attempt t WHERE t.job_key = r.job_key \
              AND t.lease_token = $1 AND t.outcome = 'succeeded') \
         FROM batch_job_run r",
    )
    .bind(a_token)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((status.as_str(), attempts), ("SUCCEEDED", 2));
    assert_eq!(a_succeeded, 0, "the stopped holder's finish was written");
}
