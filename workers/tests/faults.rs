//! The fault suite: a settlement workload over several dates, several real
//! worker processes, and the faults production brings (SIGKILL, SIGSTOP
//! past the lease, PostgreSQL restarts, terminated sessions, racing
//! producers, a starved pool, SIGTERM under load, partitioned and scoped
//! runs). Every scenario ends with
//! the same invariant check: every run SUCCEEDED, every order settled once,
//! totals equal to the source, and every item written by an attempt that
//! held the run's lease at the time.
//!
//! `cargo test` runs each at a small size. `BATCHONCE_FAULTS_FULL=1` runs the
//! full size (20 dates × 5,000 orders, 4 workers) and prints one JSON line of
//! figures per scenario (see RELIABILITY.md):
//! `BATCHONCE_FAULTS_FULL=1 cargo test --release -p batchonce-workers --test faults -- --test-threads=1 --nocapture`

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use batchonce::testing::TestDb;
use chrono::{Days, NaiveDate};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::seq::SliceRandom;
use rand::Rng;
use sqlx::PgPool;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");

fn full() -> bool {
    std::env::var("BATCHONCE_FAULTS_FULL").is_ok_and(|v| v == "1")
}

/// The workload's size: `(dates, orders per date, worker processes)`.
fn size() -> (u64, i64, usize) {
    if full() {
        (20, 5_000, 4)
    } else {
        (4, 600, 3)
    }
}

fn first_date() -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 9, 1).unwrap()
}

fn dates(n: u64) -> Vec<NaiveDate> {
    (0..n)
        .map(|i| first_date().checked_add_days(Days::new(i)).unwrap())
        .collect()
}

fn scratch(name: &str) -> PathBuf {
    batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), name)
}

/// One scenario's setting: a database, a config, a folder for logs.
struct Rig {
    url: String,
    pool: PgPool,
    dir: PathBuf,
    config: PathBuf,
    dates: Vec<NaiveDate>,
    orders: i64,
    workers: Vec<Option<Child>>,
    faults: u64,
    started: Instant,
}

impl Rig {
    /// Seeds the orders of every date and writes a config with short
    /// leases, small paced chunks and a generous attempt budget (every
    /// fault costs an attempt).
    async fn new(name: &str, url: &str, pool: PgPool, enqueue: bool) -> Self {
        Self::with_job_keys(name, url, pool, enqueue, "").await
    }

    /// As [`Rig::new`], with `extra` keys in the settlement job's table.
    async fn with_job_keys(
        name: &str,
        url: &str,
        pool: PgPool,
        enqueue: bool,
        extra: &str,
    ) -> Self {
        let (n_dates, orders, _) = size();
        let dir = scratch(name);
        let config = dir.join("batchonce.toml");
        // Small, paced chunks, so that faults land mid-run.
        let (chunk, pause) = if full() { (50, "25ms") } else { (20, "40ms") };
        std::fs::write(
            &config,
            format!(
                "[jobs.daily-settlement]\ntimezone = \"Asia/Seoul\"\nmax_attempts = 200\nlease_ttl = \"2s\"\n\
                 stale_after = \"1m\"\nchunk_size = {chunk}\nchunk_pause = \"{pause}\"\nbackoff = \"200ms\"\nbackoff_max = \"1s\"\n\
                 {extra}[jobs.inventory-sync]\nenabled = false\n"
            ),
        )
        .unwrap();
        let dates = dates(n_dates);
        for (i, d) in dates.iter().enumerate() {
            common::seed_orders(&pool, *d, i as i64 * 1_000_000, orders).await;
        }
        let rig = Self {
            url: url.to_owned(),
            pool,
            dir,
            config,
            dates,
            orders,
            workers: Vec::new(),
            faults: 0,
            started: Instant::now(),
        };
        if enqueue {
            rig.enqueue_every_date(&[]);
        }
        rig
    }

    /// `enqueue daily-settlement --from <first date> --to <last date>`,
    /// with `extra` arguments.
    fn enqueue_every_date(&self, extra: &[&str]) {
        let first = self.dates[0].to_string();
        let last = self.dates[self.dates.len() - 1].to_string();
        let out = self
            .command(&[
                "enqueue",
                "daily-settlement",
                "--from",
                &first,
                "--to",
                &last,
            ])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.env("DATABASE_URL", &self.url)
            .env_remove("BATCHONCE_CONFIG")
            .env("RUST_LOG", "info")
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .stdin(Stdio::null());
        c
    }

    /// Worker `w{i}`; `extra` may set its own `--concurrency`.
    fn spawn_worker(&self, i: usize, extra: &[&str]) -> Child {
        let concurrency: &[&str] = if extra.contains(&"--concurrency") {
            &[]
        } else {
            &["--concurrency", "1"]
        };
        let id = format!("w{i}");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log(i))
            .unwrap();
        self.command(&["--log-format", "json", "worker", "--worker-id", &id])
            .args(concurrency)
            .args(["--poll-interval", "200ms", "--grace", "5s"])
            .args(["--metrics-addr", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    fn log(&self, i: usize) -> PathBuf {
        self.dir.join(format!("w{i}.log"))
    }

    fn start_workers(&mut self, n: usize, extra: &[&str]) {
        for i in 0..n {
            let c = self.spawn_worker(i, extra);
            self.workers.push(Some(c));
        }
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(&self.pool)
            .await
            .unwrap_or(-1)
    }

    async fn succeeded(&self) -> i64 {
        self.count("SELECT count(*) FROM batch_job_run WHERE status = 'SUCCEEDED'")
            .await
    }

    async fn items(&self) -> i64 {
        self.count("SELECT count(*) FROM settlement_item").await
    }

    fn all_done_within(&self) -> Duration {
        if full() {
            Duration::from_secs(600)
        } else {
            Duration::from_secs(40)
        }
    }

    /// Whether every run (at least one per date) SUCCEEDED.
    async fn all_succeeded(&self) -> bool {
        let total = self.count("SELECT count(*) FROM batch_job_run").await;
        total >= self.dates.len() as i64 && self.succeeded().await == total
    }

    /// Waits until every run SUCCEEDED (panics with the run states if not).
    async fn wait_all_succeeded(&self) {
        let deadline = Instant::now() + self.all_done_within();
        while !self.all_succeeded().await {
            if Instant::now() > deadline {
                let rows: Vec<(String, String, i32, Option<String>)> = sqlx::query_as(
                    "SELECT job_key, status::text, attempts, error_message FROM batch_job_run ORDER BY 1",
                )
                .fetch_all(&self.pool)
                .await
                .unwrap_or_default();
                panic!("runs did not all succeed in time: {rows:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn stop_workers(&mut self) {
        for c in self.workers.iter_mut().filter_map(Option::take) {
            let mut c = c;
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(15);
            while c.try_wait().unwrap().is_none() {
                if Instant::now() > deadline {
                    let _ = c.kill();
                    panic!("a worker did not stop within 15s of SIGTERM");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// The invariant of every scenario; prints the figures; returns the
    /// number of attempts used.
    async fn check(&mut self, scenario: &str, recover: Duration) -> i64 {
        self.stop_workers();
        // The oracle (tests/common/oracle.rs), not the production `verify`:
        // every order of every stored period settled once, under its own
        // run, by a token of that run's attempts, committed while it held
        // the lease; summaries equal to the orders.
        let o = common::oracle::settlement(&self.pool).await;
        let expected = self.orders * self.dates.len() as i64;
        assert_eq!(o.orders, expected, "{scenario}: orders in scope");
        o.assert_holds(scenario);
        let not_succeeded = self
            .count("SELECT count(*) FROM batch_job_run WHERE status <> 'SUCCEEDED' AND job_name = 'daily-settlement'")
            .await;
        assert_eq!(not_succeeded, 0, "{scenario}");
        let attempts = self
            .count("SELECT coalesce(sum(attempts), 0) FROM batch_job_run")
            .await;
        println!(
            "{}",
            serde_json::json!({
                "scenario": scenario,
                "full_size": full(),
                "runs": self.dates.len(),
                "items": o.items,
                "faults_injected": self.faults,
                "attempts": attempts,
                "twice": o.twice,
                "wrong_run": o.wrong_run,
                "foreign_token": o.foreign_token,
                "outside_lease": o.outside_lease,
                "lost": o.lost,
                "recover_s": (recover.as_secs_f64() * 10.0).round() / 10.0,
                "total_s": (self.started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
            })
        );
        attempts
    }

    /// Panics with the state of every run once the workload has taken
    /// longer than it may.
    async fn assert_progressing(&self) {
        if self.started.elapsed() > self.all_done_within() {
            let rows: Vec<(String, String, i32, i64, Option<String>)> = sqlx::query_as(
                "SELECT job_key, status::text, attempts, processed_count, lease_owner FROM batch_job_run ORDER BY 1",
            )
            .fetch_all(&self.pool)
            .await
            .unwrap_or_default();
            panic!("no progress after {} faults: {rows:?}", self.faults);
        }
    }

    /// Waits until at least `n` items are written (the workload is under way).
    async fn wait_items(&self, n: i64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.items().await < n {
            assert!(Instant::now() < deadline, "the workload did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        for c in self.workers.iter_mut().filter_map(Option::take) {
            let mut c = c;
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn rig(name: &str) -> (TestDb, Rig) {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let rig = Rig::new(name, &db.url, db.pool.clone(), true).await;
    (db, rig)
}

fn fault_every() -> Duration {
    if full() {
        Duration::from_secs(3)
    } else {
        Duration::from_millis(1000)
    }
}

/// Starts `n` workers and, once items are being written, SIGKILLs one every
/// `full` (`quick` at the small size), the first time one that holds a
/// lease, and restarts it, until every run has succeeded; returns how long
/// the workload took to finish after the last kill.
async fn sigkill_storm(rig: &mut Rig, n: usize, full_every: Duration, quick: Duration) -> Duration {
    rig.start_workers(n, &[]);
    rig.wait_items(100).await;
    let every = if full() { full_every } else { quick };
    let mut last_fault = Instant::now();
    let mut first = true;
    while !rig.all_succeeded().await {
        if !first {
            tokio::time::sleep(every).await;
            if rig.all_succeeded().await {
                break;
            }
        }
        first = false;
        // The first victim holds a lease, where a crash hurts most; later
        // ones are any worker, as in production.
        let holders: Vec<String> = sqlx::query_scalar(
            "SELECT lease_owner FROM batch_job_run WHERE status = 'RUNNING' AND lease_owner IS NOT NULL",
        )
        .fetch_all(&rig.pool)
        .await
        .unwrap();
        let i = holders
            .choose(&mut rand::thread_rng())
            .and_then(|id| id.trim_start_matches('w').parse::<usize>().ok())
            .filter(|i| *i < n && rig.faults == 0)
            .unwrap_or_else(|| rand::thread_rng().gen_range(0..n));
        if let Some(mut c) = rig.workers[i].take() {
            c.kill().unwrap();
            c.wait().unwrap();
            rig.faults += 1;
            last_fault = Instant::now();
        }
        rig.workers[i] = Some(rig.spawn_worker(i, &[]));
        rig.assert_progressing().await;
    }
    rig.wait_all_succeeded().await;
    assert!(rig.faults >= 1, "no worker was killed");
    last_fault.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_random_workers_and_restart_them() {
    let (_db, mut rig) = rig("fault-sigkill").await;
    let (_, _, n) = size();
    // Longer apart than a takeover takes (lease ttl 2s plus the rescuer's
    // interval), or no long run could ever finish: the point is recovery.
    let recover = sigkill_storm(&mut rig, n, Duration::from_secs(5), Duration::from_secs(3)).await;
    let expired = rig
        .count("SELECT count(*) FROM batch_job_attempt WHERE outcome = 'lease_expired'")
        .await;
    assert!(expired >= 1, "no lease holder was killed");
    rig.check("sigkill", recover).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigstopped_lease_holder_is_taken_over_and_its_writes_refused() {
    let (_db, mut rig) = rig("fault-sigstop").await;
    rig.start_workers(2, &[]);
    rig.wait_items(100).await;
    // The run w0 holds now, with its token.
    let (key, token): (String, i64) = loop {
        let held: Option<(String, i64)> = sqlx::query_as(
            "SELECT job_key, lease_token FROM batch_job_run WHERE status = 'RUNNING' AND lease_owner = 'w0' LIMIT 1",
        )
        .fetch_optional(&rig.pool)
        .await
        .unwrap();
        if let Some(h) = held {
            break h;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let stopped = Pid::from_raw(rig.workers[0].as_ref().unwrap().id() as i32);
    kill(stopped, Signal::SIGSTOP).unwrap();
    rig.faults += 1;
    let stopped_at = Instant::now();
    // Another worker takes the run over once the lease (2s) expires.
    // A worker stopped inside a chunk's transaction keeps the run row
    // locked until idle_in_transaction_session_timeout (2 × lease_ttl, at
    // least 10s) ends its session; then the run is recovered and queued.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let now_token: Option<i64> =
            sqlx::query_scalar("SELECT lease_token FROM batch_job_run WHERE job_key = $1")
                .bind(&key)
                .fetch_one(&rig.pool)
                .await
                .unwrap();
        if now_token != Some(token) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stopped worker's run was not taken over"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let taken_over = stopped_at.elapsed();
    // Keep it stopped past the takeover, then let it go on.
    tokio::time::sleep(Duration::from_secs(1)).await;
    kill(stopped, Signal::SIGCONT).unwrap();
    rig.wait_all_succeeded().await;
    // The old holder stopped itself: it logged the lost lease, and the
    // process is still alive and serving.
    let log = std::fs::read_to_string(rig.log(0)).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("lease_lost") && l.contains(&key)),
        "w0 did not report the lost lease of {key}:\n{log}"
    );
    assert!(
        rig.workers[0]
            .as_mut()
            .unwrap()
            .try_wait()
            .unwrap()
            .is_none(),
        "w0 exited after SIGCONT"
    );
    // Nothing under the old token committed after the takeover committed:
    // judged by commit times, since a transaction that began before the
    // takeover and committed after it would pass a check of its start.
    let late: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM settlement_item i JOIN batch_job_attempt a \
           ON a.job_key = i.job_key AND a.attempt = i.attempt \
         WHERE a.lease_token = $1 \
           AND pg_xact_commit_timestamp(i.xmin) > pg_xact_commit_timestamp(a.xmin)",
    )
    .bind(token)
    .fetch_one(&rig.pool)
    .await
    .unwrap();
    assert_eq!(
        late, 0,
        "items under the old token committed after the takeover"
    );
    let outcome: String = sqlx::query_scalar(
        "SELECT outcome FROM batch_job_attempt WHERE job_key = $1 AND lease_token = $2",
    )
    .bind(&key)
    .bind(token)
    .fetch_one(&rig.pool)
    .await
    .unwrap();
    assert_eq!(outcome, "lease_expired");
    rig.check("sigstop", taken_over).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_restarts_fast_and_immediate_mid_workload() {
    let dir = scratch("fault-pg-restart");
    let opts = batchonce::ops::embedded::ClusterOptions {
        dir: dir.join("pg"),
        durable: true,
        max_connections: 60,
    };
    let start = |o: batchonce::ops::embedded::ClusterOptions| async move {
        tokio::task::spawn_blocking(move || batchonce::ops::embedded::Cluster::start(&o))
            .await
            .unwrap()
            .unwrap()
    };
    let mut cluster = Some(start(opts.clone()).await);
    let url = cluster.as_ref().unwrap().url("postgres");
    let pool = batchonce::db::connect(&url, "fault-test", 2).await.unwrap();
    batchonce::db::migrate(&pool, &batchonce_workers::migrations())
        .await
        .unwrap();
    let mut rig = Rig::new("fault-pg-restart", &url, pool, true).await;
    let (_, _, n) = size();
    rig.start_workers(n, &[]);
    let mut last = Instant::now();
    for immediate in [false, true] {
        let before = rig.items().await;
        rig.wait_items(before + 100).await;
        rig.pool.close().await;
        let c = cluster.take().unwrap();
        tokio::task::spawn_blocking(move || c.stop_with(immediate))
            .await
            .unwrap()
            .unwrap();
        rig.faults += 1;
        // Down for longer than the lease ttl: every lease expires.
        tokio::time::sleep(Duration::from_secs(3)).await;
        for (i, w) in rig.workers.iter_mut().enumerate() {
            assert!(
                w.as_mut().unwrap().try_wait().unwrap().is_none(),
                "worker w{i} exited while the database was down"
            );
        }
        cluster = Some(start(opts.clone()).await);
        last = Instant::now();
        rig.pool = batchonce::db::connect(&url, "fault-test", 2).await.unwrap();
    }
    rig.wait_all_succeeded().await;
    let recover = last.elapsed();
    rig.check("postgres-restart", recover).await;
    rig.pool.close().await;
    if let Some(c) = cluster {
        let _ = tokio::task::spawn_blocking(move || c.stop()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_worker_sessions_are_survived() {
    let (_db, mut rig) = rig("fault-terminate").await;
    let (_, _, n) = size();
    rig.start_workers(n, &[]);
    rig.wait_items(100).await;
    let mut last = Instant::now();
    while !rig.all_succeeded().await {
        tokio::time::sleep(fault_every() / 5).await;
        let pids: Vec<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
             AND application_name ~ '^w[0-9]+$'",
        )
        .fetch_all(&rig.pool)
        .await
        .unwrap();
        if let Some(pid) = pids.choose(&mut rand::thread_rng()) {
            let done: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .fetch_one(&rig.pool)
                .await
                .unwrap();
            if done {
                rig.faults += 1;
                last = Instant::now();
            }
        }
        rig.assert_progressing().await;
    }
    rig.wait_all_succeeded().await;
    for (i, w) in rig.workers.iter_mut().enumerate() {
        assert!(
            w.as_mut().unwrap().try_wait().unwrap().is_none(),
            "worker w{i} exited after its sessions were terminated"
        );
    }
    assert!(
        rig.faults >= 3,
        "too few sessions terminated: {}",
        rig.faults
    );
    rig.check("pg-terminate-backend", last.elapsed()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_producers_and_enqueues_create_each_run_once() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let mut rig = Rig::new("fault-race", &db.url, db.pool.clone(), false).await;
    let first = rig.dates[0].to_string();
    let last = rig.dates[rig.dates.len() - 1].to_string();
    // 02:00 Seoul on the day after the last date: the schedule's catch-up
    // window (7 days) covers the last dates; the backfills cover all.
    let now = format!(
        "{}T02:00:00+09:00",
        rig.dates[rig.dates.len() - 1] + Days::new(1)
    );
    let racers = if full() { 16 } else { 6 };
    let children: Vec<Child> = (0..racers)
        .map(|i| {
            let mut c = if i % 2 == 0 {
                rig.command(&["--json", "produce", "--once", "--now", &now])
            } else {
                rig.command(&[
                    "--json",
                    "enqueue",
                    "daily-settlement",
                    "--from",
                    &first,
                    "--to",
                    &last,
                ])
            };
            c.stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut enqueued = 0usize;
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // `produce` prints one report per job; `enqueue` one line per run.
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            match &v {
                serde_json::Value::Array(reports) => {
                    for r in reports {
                        enqueued += r["enqueued"].as_array().map_or(0, Vec::len);
                    }
                }
                line => enqueued += usize::from(line["result"] == "enqueued"),
            }
        }
        rig.faults += 1;
    }
    // The backfilled dates, and the schedule's window of 7 previous days.
    let window: std::collections::BTreeSet<NaiveDate> = rig
        .dates
        .iter()
        .copied()
        .chain((1..=7).map(|d| rig.dates[rig.dates.len() - 1] + Days::new(1) - Days::new(d)))
        .collect();
    let runs = rig.count("SELECT count(*) FROM batch_job_run").await;
    let distinct = rig
        .count("SELECT count(DISTINCT business_date) FROM batch_job_run")
        .await;
    assert_eq!(runs, window.len() as i64);
    assert_eq!(distinct, runs);
    assert_eq!(
        enqueued as i64, runs,
        "each run reported enqueued by exactly one racer"
    );
    let (_, _, n) = size();
    rig.start_workers(n, &[]);
    let t = Instant::now();
    rig.wait_all_succeeded().await;
    rig.check("racing-producers", t.elapsed()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_smaller_than_the_concurrency_keeps_every_lease() {
    let (_db, mut rig) = rig("fault-small-pool").await;
    // Eight handlers share two connections; heartbeats have their own.
    let c = rig.spawn_worker(0, &["--concurrency", "8", "--max-connections", "2"]);
    rig.workers.push(Some(c));
    let t = Instant::now();
    rig.wait_all_succeeded().await;
    let lost = rig
        .count("SELECT count(*) FROM batch_job_attempt WHERE outcome IN ('lease_lost', 'lease_expired')")
        .await;
    assert_eq!(lost, 0, "a lease was lost although the worker was alive");
    let log = std::fs::read_to_string(rig.log(0)).unwrap();
    assert!(!log.contains("\"outcome\":\"lease_lost\""), "{log}");
    rig.check("small-pool", t.elapsed()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_every_worker_under_load_then_restart() {
    let (_db, mut rig) = rig("fault-sigterm").await;
    let (_, _, n) = size();
    rig.start_workers(n, &[]);
    rig.wait_items(100).await;
    for (i, w) in rig.workers.iter_mut().enumerate() {
        let mut c = w.take().unwrap();
        kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        let status = loop {
            if let Some(s) = c.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "w{i} did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "w{i} exited with {status}");
    }
    rig.faults += n as u64;
    // Every lease was handed back: nothing is RUNNING, no lease must expire.
    let running = rig
        .count("SELECT count(*) FROM batch_job_run WHERE status = 'RUNNING'")
        .await;
    assert_eq!(running, 0, "a stopped worker kept its lease");
    let t = Instant::now();
    rig.workers.clear();
    rig.start_workers(n, &[]);
    rig.wait_all_succeeded().await;
    let expired = rig
        .count("SELECT count(*) FROM batch_job_attempt WHERE outcome = 'lease_expired'")
        .await;
    assert_eq!(expired, 0, "graceful shutdown left a lease to expire");
    rig.check("sigterm-restart", t.elapsed()).await;
}

/// Partitioned runs under faults (issue 23): every date in 4 partitions
/// over 3 workers; a partition holder is SIGKILLed mid-run and the holder
/// of another partition of the same date SIGSTOPped past its lease. The
/// other partitions carry on, both are taken over, the final step succeeds
/// once per date, the oracle holds (each item by the partition its order
/// belongs to, under a token of that partition), and nothing under the
/// stopped holder's token commits after the takeover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_holders_killed_and_stopped_are_taken_over_alone() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let mut rig = Rig::with_job_keys(
        "fault-partitions",
        &db.url,
        db.pool.clone(),
        true,
        "partitions = 4\n",
    )
    .await;
    rig.start_workers(3, &[]);
    rig.wait_items(100).await;
    // Two partitions of one date, held by w0 and w1, each mid-way.
    let held = |owner: &'static str| {
        let pool = rig.pool.clone();
        async move {
            sqlx::query_as::<_, (String, i64, String)>(
                "SELECT r.job_key, r.lease_token, r.partition_of FROM batch_job_run r \
                 WHERE r.status = 'RUNNING' AND r.lease_owner = $1 AND r.partition_of IS NOT NULL \
                   AND EXISTS (SELECT 1 FROM settlement_item i WHERE i.job_key = r.job_key AND i.attempt = r.attempts) \
                 ORDER BY r.job_key LIMIT 1",
            )
            .bind(owner)
            .fetch_optional(&pool)
            .await
            .unwrap()
        }
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let (killed, stopped) = loop {
        if let (Some(a), Some(b)) = (held("w0").await, held("w1").await) {
            break (a, b);
        }
        assert!(
            Instant::now() < deadline,
            "w0 and w1 never both held a partition mid-run"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let others_before = rig
        .count(&format!(
            "SELECT count(*) FROM settlement_item WHERE job_key NOT IN ('{}', '{}')",
            killed.0, stopped.0
        ))
        .await;
    let mut w0 = rig.workers[0].take().unwrap();
    w0.kill().unwrap();
    w0.wait().unwrap();
    let stopped_pid = Pid::from_raw(rig.workers[1].as_ref().unwrap().id() as i32);
    kill(stopped_pid, Signal::SIGSTOP).unwrap();
    rig.faults += 2;
    let faulted_at = Instant::now();
    // Both partitions are taken over (new tokens) by w2, the worker left.
    let deadline = Instant::now() + Duration::from_secs(90);
    for (key, token, _) in [&killed, &stopped] {
        loop {
            let now: Option<i64> =
                sqlx::query_scalar("SELECT lease_token FROM batch_job_run WHERE job_key = $1")
                    .bind(key)
                    .fetch_one(&rig.pool)
                    .await
                    .unwrap();
            if now != Some(*token) {
                break;
            }
            assert!(Instant::now() < deadline, "{key} was not taken over");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let taken_over = faulted_at.elapsed();
    // Meanwhile the other partitions went on.
    let others_after = rig
        .count(&format!(
            "SELECT count(*) FROM settlement_item WHERE job_key NOT IN ('{}', '{}')",
            killed.0, stopped.0
        ))
        .await;
    assert!(
        others_after > others_before,
        "the other partitions stood still"
    );
    kill(stopped_pid, Signal::SIGCONT).unwrap();
    rig.workers[0] = Some(rig.spawn_worker(0, &[]));
    rig.wait_all_succeeded().await;
    let late: i64 = rig
        .count(&format!(
            "SELECT count(*) FROM settlement_item i JOIN batch_job_attempt a \
               ON a.job_key = i.job_key AND a.attempt = i.attempt \
             WHERE a.lease_token = {} \
               AND pg_xact_commit_timestamp(i.xmin) > pg_xact_commit_timestamp(a.xmin)",
            stopped.1
        ))
        .await;
    assert_eq!(
        late, 0,
        "items under the stopped holder's token committed after the takeover"
    );
    // One successful final step per date, and it ran after its partitions.
    let finals: Vec<(String, i64)> = sqlx::query_as(
        "SELECT r.job_key, count(a.*) FILTER (WHERE a.outcome = 'succeeded') \
         FROM batch_job_run r LEFT JOIN batch_job_attempt a USING (job_key) \
         WHERE r.partition_count IS NOT NULL AND r.partition_of IS NULL GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&rig.pool)
    .await
    .unwrap();
    assert_eq!(finals.len(), rig.dates.len());
    assert!(finals.iter().all(|(_, n)| *n == 1), "{finals:?}");
    let early: i64 = rig
        .count(
            "SELECT count(*) FROM batch_job_attempt f JOIN batch_job_run p ON p.job_key = f.job_key \
             JOIN batch_job_run c ON c.partition_of = p.job_key \
             WHERE p.partition_count IS NOT NULL AND p.partition_of IS NULL \
               AND f.started_at < c.finished_at",
        )
        .await;
    assert_eq!(
        early, 0,
        "a final step started before a partition of its run finished"
    );
    rig.check("partitions", taken_over).await;
}

/// Scenario 9: scoped runs, one per merchant and date (13 scopes from a
/// list, enqueued with `--all-scopes`), under the SIGKILL storm of the first
/// scenario. Every scope's run succeeds once, and the oracle holds with each
/// item written by the run whose scope names its merchant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_storms_over_scoped_runs() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    // seed_orders spreads each date's orders over merchants 1 to 13.
    let scopes: Vec<String> = (1..=13).map(|m| format!("\"seller-{m}\"")).collect();
    let mut rig = Rig::with_job_keys(
        "fault-scopes",
        &db.url,
        db.pool.clone(),
        false,
        &format!("scopes = [{}]\n", scopes.join(", ")),
    )
    .await;
    rig.enqueue_every_date(&["--all-scopes"]);
    let runs = rig
        .count("SELECT count(*) FROM batch_job_run WHERE scope IS NOT NULL")
        .await;
    assert_eq!(runs, 13 * rig.dates.len() as i64);
    let (_, _, n) = size();
    // A scope's run is short (one merchant's orders), so the storm is
    // denser than the first scenario's: several kills land mid-run.
    let recover = sigkill_storm(
        &mut rig,
        n,
        Duration::from_secs(2),
        Duration::from_millis(700),
    )
    .await;
    assert!(
        rig.faults >= 2,
        "the storm ended after {} kill(s)",
        rig.faults
    );
    let succeeded_twice = rig
        .count(
            "SELECT count(*) FROM (SELECT job_key FROM batch_job_attempt \
             WHERE outcome = 'succeeded' GROUP BY 1 HAVING count(*) > 1) x",
        )
        .await;
    assert_eq!(succeeded_twice, 0, "a scope's run succeeded twice");
    rig.check("scopes", recover).await;
}
