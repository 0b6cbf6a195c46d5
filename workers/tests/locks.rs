//! Locks held by other sessions (issue 15, item 4), with real processes and
//! a real PostgreSQL. Another session (an operator's `psql`, here the test)
//! holds the day's `settlement_summary` rows `FOR UPDATE`, so the worker's
//! summary statement waits inside its fenced transaction, which keeps the
//! run row locked `FOR KEY SHARE`:
//!
//! - SIGTERM with `--grace 2s`: the worker ends its own blocked session after
//!   the grace period, releases the run and exits within grace + 5 s; a
//!   second signal exits at once, and the lease then expires and is
//!   recovered;
//! - `runs stale` concludes `blocked` and names the session that holds the
//!   worker;
//! - `runs fail --force` gives up after `--lock-timeout` with one line naming
//!   the session that holds the run, and `--terminate-blocker` writes an
//!   audit row, terminates that session and fails the run.
//!
//! Each test prints one JSON line of figures (RELIABILITY.md):
//! `cargo test -p batchonce-workers --test locks -- --nocapture`

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use batchonce::testing::{wait_until, TestDb};
use chrono::NaiveDate;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, PgPool};

mod common;

use common::{ok, wait_exit};

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");
const KEY: &str = "daily-settlement:2026-09-15";
const ORDERS: i64 = 300;
/// The worker's `--grace`.
const GRACE: Duration = Duration::from_secs(2);
/// What the worker promises after the grace period (worker::ABORT_BOUND).
const AFTER_GRACE: Duration = Duration::from_secs(5);
/// The application_name of the session that holds the summary rows.
const HOLDER: &str = "psql-alice";

fn date() -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 9, 15).unwrap()
}

struct Rig {
    db: TestDb,
    dir: PathBuf,
    config: PathBuf,
}

impl Rig {
    /// The day's orders, its summary rows already there (an earlier run
    /// wrote them), and its run enqueued.
    async fn new(name: &str) -> Self {
        let db = TestDb::new(&batchonce_workers::migrations()).await;
        let dir = batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), name);
        let config = dir.join("batchonce.toml");
        std::fs::write(
            &config,
            "[jobs.daily-settlement]\ntimezone = \"Asia/Seoul\"\nmax_attempts = 5\nlease_ttl = \"2s\"\n\
             stale_after = \"2s\"\nchunk_size = 50\nchunk_pause = \"10ms\"\nbackoff = \"200ms\"\n\
             [jobs.inventory-sync]\nenabled = false\n",
        )
        .unwrap();
        common::seed_orders(&db.pool, date(), 0, ORDERS).await;
        // Written by the owner outside a fence, on purpose.
        let mut tx = db.pool.begin().await.unwrap();
        sqlx::query("SET LOCAL batchonce.unfenced = on")
            .execute(&mut *tx)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO settlement_summary SELECT $1, m, 0, 0 FROM generate_series(1, 13) m",
        )
        .bind(date())
        .execute(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
        let rig = Self { db, dir, config };
        ok(&rig.run(&["enqueue", "daily-settlement", "--date", "2026-09-15"]));
        rig
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        // Each command logs at its default level, as an operator sees it.
        c.env("DATABASE_URL", &self.db.url)
            .env_remove("BATCHONCE_CONFIG")
            .env_remove("RUST_LOG")
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .stdin(Stdio::null());
        c
    }

    /// Runs a short command, killing it if it has not ended within `limit`.
    fn run_within(&self, args: &[&str], limit: Duration) -> (Output, Duration) {
        let t = Instant::now();
        let mut child = self
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_exit(&mut child, limit);
        (child.wait_with_output().unwrap(), t.elapsed())
    }

    fn run(&self, args: &[&str]) -> Output {
        self.run_within(args, Duration::from_secs(60)).0
    }

    fn log(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.log"))
    }

    fn worker(&self, id: &str) -> Child {
        let log = std::fs::File::create(self.log(id)).unwrap();
        self.command(&["--log-format", "json", "worker", "--worker-id", id])
            .args(["--concurrency", "1", "--poll-interval", "200ms"])
            .args(["--grace", "2s", "--metrics-addr", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    /// An open transaction holding the day's summary rows, as an operator's
    /// `psql` would: `SELECT … FOR UPDATE`, then nothing.
    async fn hold_summary(&self) -> (PgConnection, i32) {
        let opts = PgConnectOptions::from_str(&self.db.url)
            .unwrap()
            .application_name(HOLDER);
        let mut c = PgConnection::connect_with(&opts).await.unwrap();
        sqlx::query("BEGIN").execute(&mut c).await.unwrap();
        sqlx::query("SELECT * FROM settlement_summary WHERE business_date = $1 FOR UPDATE")
            .bind(date())
            .execute(&mut c)
            .await
            .unwrap();
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut c)
            .await
            .unwrap();
        (c, pid)
    }

    /// Waits until worker `id` has a session waiting on a lock (its summary
    /// statement, behind the holder) and returns that session's pid.
    async fn wait_blocked(&self, id: &str) -> i32 {
        wait_until(
            "the worker waits on the summary rows",
            Duration::from_secs(30),
            || async { lock_waiter(&self.db.pool, id).await.is_some() },
        )
        .await;
        lock_waiter(&self.db.pool, id).await.unwrap()
    }

    async fn run_row(&self) -> (String, Option<i64>, i32) {
        sqlx::query_as("SELECT status, lease_token, attempts FROM batch_job_run WHERE job_key = $1")
            .bind(KEY)
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }

    fn log_text(&self, id: &str) -> String {
        std::fs::read_to_string(self.log(id)).unwrap_or_default()
    }
}

async fn lock_waiter(pool: &PgPool, app: &str) -> Option<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 \
         AND datname = current_database() AND wait_event_type = 'Lock' LIMIT 1",
    )
    .bind(app)
    .fetch_optional(pool)
    .await
    .unwrap()
}

async fn session_alive(pool: &PgPool, pid: i32) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
        .bind(pid)
        .fetch_one(pool)
        .await
        .unwrap()
}

fn signal(child: &Child, sig: Signal) {
    kill(Pid::from_raw(child.id() as i32), sig).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_grace_period_a_blocked_worker_ends_its_own_session_and_exits() {
    let rig = Rig::new("locks-grace").await;
    let (holder, holder_pid) = rig.hold_summary().await;
    let mut w = rig.worker("blocked-a");
    let fenced = rig.wait_blocked("blocked-a").await;
    let (_, token, _) = rig.run_row().await;

    let t = Instant::now();
    signal(&w, Signal::SIGTERM);
    let st = wait_exit(&mut w, GRACE + AFTER_GRACE + Duration::from_secs(10));
    let took = t.elapsed();
    println!(
        "{}",
        serde_json::json!({"scenario": "grace-blocked", "exit_after_sigterm_s": took.as_secs_f64(),
                           "bound_s": (GRACE + AFTER_GRACE).as_secs_f64()})
    );
    assert_eq!(st.code(), Some(0), "{}", rig.log_text("blocked-a"));
    assert!(
        took <= GRACE + AFTER_GRACE,
        "exited {took:?} after SIGTERM; the bound is grace + {AFTER_GRACE:?}"
    );
    assert!(took >= GRACE, "it waited out the grace period first");
    // Released with a new token, not left to expire.
    let (status, new_token, _) = rig.run_row().await;
    assert_eq!(status, "PENDING");
    assert_ne!(new_token, token);
    let outcome: String =
        sqlx::query_scalar("SELECT outcome FROM batch_job_attempt WHERE job_key = $1")
            .bind(KEY)
            .fetch_one(&rig.db.pool)
            .await
            .unwrap();
    assert_eq!(outcome, "released");
    // Its own session is gone, the holder's is untouched.
    assert!(!session_alive(&rig.db.pool, fenced).await);
    assert!(session_alive(&rig.db.pool, holder_pid).await);
    let log = rig.log_text("blocked-a");
    assert!(
        log.contains("ended its own blocked database session"),
        "{log}"
    );
    // Nothing of the abandoned chunk committed.
    assert_eq!(
        common::items_outside_their_lease(&rig.db.pool, Some(KEY)).await,
        0
    );
    holder.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once_and_the_lease_is_recovered() {
    let rig = Rig::new("locks-second").await;
    let (holder, _) = rig.hold_summary().await;
    let mut w = rig.worker("blocked-b");
    rig.wait_blocked("blocked-b").await;
    signal(&w, Signal::SIGTERM);
    wait_until(
        "the worker starts its graceful shutdown",
        Duration::from_secs(10),
        || async { rig.log_text("blocked-b").contains("shutting down") },
    )
    .await;
    let t = Instant::now();
    signal(&w, Signal::SIGTERM);
    let st = wait_exit(&mut w, Duration::from_secs(10));
    let took = t.elapsed();
    println!(
        "{}",
        serde_json::json!({"scenario": "second-signal", "exit_after_second_signal_s": took.as_secs_f64()})
    );
    assert!(
        took < Duration::from_secs(1),
        "exited {took:?} after the second signal"
    );
    assert_eq!(st.code(), Some(128 + 15), "exit status 128 + SIGTERM");
    let log = rig.log_text("blocked-b");
    assert!(log.contains("second signal: exiting now"), "{log}");
    // Nothing was released: the lease expires and another worker recovers
    // the run once the holder lets the summary rows go.
    assert_eq!(rig.run_row().await.0, "RUNNING");
    holder.close().await.unwrap();
    let mut rescuer = rig.worker("rescuer");
    wait_until(
        "the run is recovered and settled",
        Duration::from_secs(60),
        || async { rig.run_row().await.0 == "SUCCEEDED" },
    )
    .await;
    let outcomes: Vec<String> = sqlx::query_scalar(
        "SELECT outcome FROM batch_job_attempt WHERE job_key = $1 ORDER BY attempt",
    )
    .bind(KEY)
    .fetch_all(&rig.db.pool)
    .await
    .unwrap();
    assert_eq!(outcomes, ["lease_expired", "succeeded"]);
    let o = common::oracle::settlement(&rig.db.pool).await;
    o.assert_holds("after the takeover");
    assert_eq!(o.items, ORDERS);
    signal(&rescuer, Signal::SIGTERM);
    assert!(wait_exit(&mut rescuer, Duration::from_secs(15)).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_names_the_blocker_and_fail_waits_bounded_then_terminates_it_audited() {
    let rig = Rig::new("locks-operator").await;
    let (holder, holder_pid) = rig.hold_summary().await;
    let mut w = rig.worker("blocked-c");
    let fenced = rig.wait_blocked("blocked-c").await;

    // runs stale: past stale_after (2 s), the worker's session waits on the
    // holder: `blocked`, naming the holder.
    wait_until("the run is stale", Duration::from_secs(20), || async {
        rig.count(
            "SELECT count(*) FROM batch_job_run WHERE started_at < now() - interval '2.5 seconds'",
        )
        .await
            == 1
    })
    .await;
    let out = ok(&rig.run(&["--json", "runs", "stale"]));
    let stale: serde_json::Value = serde_json::from_str(&out).unwrap();
    let s = &stale[0];
    assert_eq!(s["conclusion"], "blocked", "{s}");
    assert_eq!(s["lock_wait"]["pid"], fenced, "{s}");
    assert_eq!(s["lock_wait"]["for_this_run"], true, "{s}");
    let b = &s["lock_wait"]["blockers"][0];
    assert_eq!(b["pid"], holder_pid, "{s}");
    assert_eq!(b["application_name"], HOLDER, "{s}");
    assert_eq!(b["state"], "idle in transaction", "{s}");
    assert!(b["xact_age_seconds"].as_f64().unwrap() > 0.0, "{s}");
    assert!(b["query_start"].is_string(), "{s}");
    let text = ok(&rig.run(&["runs", "stale"]));
    assert!(text.contains(&format!("{KEY}  blocked")), "{text}");
    assert!(
        text.contains(&format!("session {holder_pid} ({HOLDER}")),
        "{text}"
    );

    // runs fail --force: the worker's open fenced transaction holds the run
    // row. The default --lock-timeout is 5 s.
    let (_, token, _) = rig.run_row().await;
    let fail = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = ["runs", "fail", KEY, "--force", "--operator", "alice"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(["--reason".into(), "settlement stuck behind psql".into()]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let args = fail(&[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (out, took) = rig.run_within(&args, Duration::from_secs(30));
    println!(
        "{}",
        serde_json::json!({"scenario": "operator-fail-blocked", "time_to_error_s": took.as_secs_f64(),
                           "lock_timeout_s": 5})
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(8),
        "gave up after {took:?}"
    );
    let first = err.lines().next().unwrap_or_default();
    assert!(first.starts_with("batchonce: error: fail "), "{err}");
    assert!(
        first.contains(&format!("session {fenced} (blocked-c)")),
        "{err}"
    );
    assert!(first.contains("--terminate-blocker"), "{err}");
    // The detail block names what the blocker itself waits for.
    assert!(
        err.contains(&format!("session {holder_pid} ({HOLDER})")),
        "{err}"
    );
    assert_eq!(rig.run_row().await, ("RUNNING".into(), token, 1));
    assert_eq!(
        rig.count("SELECT count(*) FROM batch_operator_action")
            .await,
        0
    );

    // --json: a structured error.
    let args = fail(&["--lock-timeout", "500ms"]);
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.insert(0, "--json");
    let (out, took) = rig.run_within(&args, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1));
    assert!(took < Duration::from_secs(3), "gave up after {took:?}");
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["error"], "blocked", "{e}");
    assert_eq!(e["job_key"], KEY, "{e}");
    assert_eq!(e["blockers"][0]["pid"], fenced, "{e}");
    assert_eq!(e["blockers"][0]["application_name"], "blocked-c", "{e}");
    assert_eq!(e["blockers"][0]["wait_event_type"], "Lock", "{e}");
    assert_eq!(e["blockers"][0]["blocked_by"][0]["pid"], holder_pid, "{e}");
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);

    // --terminate-blocker: audited, the worker's session terminated, the run
    // failed; the holder, the items and the worker process untouched.
    let items = rig.count("SELECT count(*) FROM settlement_item").await;
    let summary = rig
        .count("SELECT sum(order_count)::int8 FROM settlement_summary")
        .await;
    let args = fail(&["--terminate-blocker"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (out, took) = rig.run_within(&args, Duration::from_secs(30));
    println!(
        "{}",
        serde_json::json!({"scenario": "operator-terminate-blocker", "took_s": took.as_secs_f64()})
    );
    let stdout = ok(&out);
    assert!(
        stdout.contains(&format!("terminated session {fenced} (blocked-c)")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("fail {KEY}: RUNNING -> FAILED (audited)")),
        "{stdout}"
    );
    assert_eq!(rig.run_row().await.0, "FAILED");
    let audit: Vec<(String, String, String, Option<String>)> = sqlx::query_as(
        "SELECT action, before_status, after_status, detail FROM batch_operator_action ORDER BY id",
    )
    .fetch_all(&rig.db.pool)
    .await
    .unwrap();
    assert_eq!(audit.len(), 2, "{audit:?}");
    assert_eq!(
        (
            audit[0].0.as_str(),
            audit[0].1.as_str(),
            audit[0].2.as_str()
        ),
        ("terminate-blocker", "RUNNING", "RUNNING")
    );
    let detail = audit[0].3.clone().unwrap_or_default();
    assert!(
        detail.contains(&format!("session {fenced} (blocked-c)")),
        "{detail}"
    );
    assert_eq!(
        (
            audit[1].0.as_str(),
            audit[1].1.as_str(),
            audit[1].2.as_str()
        ),
        ("fail", "RUNNING", "FAILED")
    );
    let shown = ok(&rig.run(&["runs", "show", KEY]));
    assert!(shown.contains("terminate-blocker by alice"), "{shown}");
    assert!(!session_alive(&rig.db.pool, fenced).await);
    assert!(session_alive(&rig.db.pool, holder_pid).await);
    assert!(
        w.try_wait().unwrap().is_none(),
        "the worker process runs on"
    );
    assert_eq!(
        rig.count("SELECT count(*) FROM settlement_item").await,
        items
    );
    assert_eq!(
        rig.count("SELECT sum(order_count)::int8 FROM settlement_summary")
            .await,
        summary
    );
    let outcome: String =
        sqlx::query_scalar("SELECT outcome FROM batch_job_attempt WHERE job_key = $1")
            .bind(KEY)
            .fetch_one(&rig.db.pool)
            .await
            .unwrap();
    assert_eq!(outcome, "operator_failed");
    assert_eq!(
        common::items_outside_their_lease(&rig.db.pool, Some(KEY)).await,
        0
    );
    holder.close().await.unwrap();
    signal(&w, Signal::SIGTERM);
    assert!(wait_exit(&mut w, GRACE + AFTER_GRACE).success());
}
