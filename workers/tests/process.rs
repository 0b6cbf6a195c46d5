//! End-to-end tests with the built `batchonce` binary as real processes against
//! real PostgreSQL (a database per test): racing enqueues, two workers on one
//! run, SIGKILL of the lease holder, SIGTERM, and bad input for every argument.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use batchonce::testing::{wait_until, OwnCluster, TestDb};
use batchonce_workers::settlement;
use chrono::NaiveDate;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sqlx::PgPool;

mod common;

use common::wait_exit;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");
const KEY: &str = "daily-settlement:2026-09-15";

fn date() -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 9, 15).unwrap()
}

async fn db() -> TestDb {
    TestDb::new(&batchonce_workers::migrations()).await
}

fn scratch(name: &str) -> PathBuf {
    batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), name)
}

/// Small paced chunks and a short lease, so tests can act mid-run.
fn write_config(dir: &std::path::Path) -> PathBuf {
    let path = dir.join("batchonce.toml");
    std::fs::write(
        &path,
        r#"
[jobs.daily-settlement]
timezone = "Asia/Seoul"
max_attempts = 3
lease_ttl = "2s"
stale_after = "1m"
chunk_size = 20
chunk_pause = "30ms"
backoff = "1s"
"#,
    )
    .unwrap();
    path
}

/// Orders paid on 2026-09-15 in Seoul, plus one just before and one just
/// after the day, which must not be settled.
async fn seed(pool: &PgPool, n: i64) {
    let (start, end) = settlement::day_bounds(date(), chrono_tz::Asia::Seoul);
    sqlx::query(
        "INSERT INTO orders (order_id, merchant_id, amount_minor, paid_at) \
         SELECT g, 1 + g % 7, 100 + g % 1000, $1 + ($2 - $1) * ((g - 1)::float8 / $3) \
         FROM generate_series(1, $3) g",
    )
    .bind(start)
    .bind(end)
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO orders VALUES ($3 + 1, 1, 999, $1 - interval '1 microsecond'), ($3 + 2, 1, 999, $2)",
    )
    .bind(start)
    .bind(end)
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

/// The workers' flags here: two runs at once.
const CONCURRENCY: &[&str] = &["--concurrency", "2"];

/// The binary with `config` and `args`.
fn bin(db: &TestDb, config: Option<&PathBuf>, args: &[&str]) -> Command {
    let mut c = common::batchonce(db, None);
    // Without a file of its own, the bundled kinds the test exercises, by
    // the environment, so that a `--config` among `args` still wins.
    c.env("BATCHONCE_CONFIG", common::samples_config());
    if let Some(cfg) = config {
        c.arg("--config").arg(cfg);
    }
    c.args(args);
    c
}

fn signal(child: &Child, sig: Signal) {
    kill(Pid::from_raw(child.id() as i32), sig).unwrap();
}

async fn run_row(pool: &PgPool) -> (String, i32, i64, Option<String>) {
    sqlx::query_as("SELECT status, attempts, processed_count, lease_owner FROM batch_job_run WHERE job_key = $1")
        .bind(KEY)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A test database with `n` orders for the business date and its run
/// enqueued, plus a scratch folder and the paced config.
async fn settlement_run(name: &str, n: i64) -> (TestDb, PathBuf, PathBuf) {
    let db = db().await;
    let dir = scratch(name);
    let cfg = write_config(&dir);
    seed(&db.pool, n).await;
    assert!(enqueue_output(&db).status.success());
    (db, dir, cfg)
}

/// Waits until the run is RUNNING with at least `processed` items.
async fn wait_mid_run(pool: &PgPool, processed: i64) {
    wait_until("the run is mid-way", Duration::from_secs(30), || async {
        let (status, _, done, _) = run_row(pool).await;
        status == "RUNNING" && done >= processed
    })
    .await;
}

/// Waits until the run has `status`.
async fn wait_for_status(pool: &PgPool, status: &str) {
    wait_until(
        &format!("the run is {status}"),
        Duration::from_secs(60),
        || async { run_row(pool).await.0 == status },
    )
    .await;
}

async fn assert_settled_exactly(pool: &PgPool, n: i64) {
    let o = common::oracle::settlement(pool).await;
    o.assert_holds("the settlement");
    assert_eq!(o.items, n);
}

fn enqueue_output(db: &TestDb) -> Output {
    bin(
        db,
        None,
        &["enqueue", "daily-settlement", "--date", "2026-09-15"],
    )
    .output()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_enqueue_processes_make_one_run() {
    let db = db().await;
    let children: Vec<Child> = (0..8)
        .map(|_| {
            bin(
                &db,
                None,
                &["enqueue", "daily-settlement", "--date", "2026-09-15"],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    let mut enqueued = 0;
    let mut duplicate = 0;
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        match String::from_utf8_lossy(&out.stdout).trim() {
            s if s == format!("enqueued {KEY}") => enqueued += 1,
            s if s == format!("duplicate {KEY}") => duplicate += 1,
            other => panic!("unexpected output {other:?}"),
        }
    }
    assert_eq!((enqueued, duplicate), (1, 7));
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM batch_job_run")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
    let out = bin(
        &db,
        None,
        &[
            "--json",
            "enqueue",
            "daily-settlement",
            "--date",
            "2026-09-15",
        ],
    )
    .output()
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["result"], "duplicate");
    assert_eq!(v["job_key"], KEY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_write_one_set_of_items() {
    let (db, dir, cfg) = settlement_run("two-workers", 1500).await;
    let mut a = common::spawn_worker(bin(&db, Some(&cfg), &[]), &dir, "wa", CONCURRENCY);
    let mut b = common::spawn_worker(bin(&db, Some(&cfg), &[]), &dir, "wb", CONCURRENCY);
    wait_for_status(&db.pool, "SUCCEEDED").await;
    assert_settled_exactly(&db.pool, 1500).await;
    let (_, attempts, processed, _) = run_row(&db.pool).await;
    assert_eq!((attempts, processed), (1, 1500));
    for c in [&a, &b] {
        signal(c, Signal::SIGTERM);
    }
    assert!(wait_exit(&mut a, Duration::from_secs(15)).success());
    assert!(wait_exit(&mut b, Duration::from_secs(15)).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_lease_holder_then_another_worker_resumes_exactly() {
    let (db, dir, cfg) = settlement_run("sigkill", 1500).await;
    let mut a = common::spawn_worker(bin(&db, Some(&cfg), &[]), &dir, "victim", CONCURRENCY);
    wait_mid_run(&db.pool, 100).await;
    signal(&a, Signal::SIGKILL);
    let _ = wait_exit(&mut a, Duration::from_secs(5));
    let (_, _, at_kill, owner) = run_row(&db.pool).await;
    assert_eq!(owner.as_deref(), Some("victim"));
    assert!(at_kill < 1500, "the run was not mid-way when killed");

    let mut b = common::spawn_worker(bin(&db, Some(&cfg), &[]), &dir, "rescuer", CONCURRENCY);
    wait_for_status(&db.pool, "SUCCEEDED").await;
    assert_settled_exactly(&db.pool, 1500).await;
    let (_, attempts, processed, _) = run_row(&db.pool).await;
    assert_eq!(attempts, 2);
    assert_eq!(
        processed, 1500,
        "processed_count counts each item once across attempts"
    );
    let history: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT worker_id, outcome, processed_count FROM batch_job_attempt WHERE job_key = $1 ORDER BY attempt",
    )
    .bind(KEY)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(history[0].0, "victim");
    assert_eq!(history[0].1, "lease_expired");
    assert_eq!(history[1].0, "rescuer");
    assert_eq!(history[1].1, "succeeded");
    assert_eq!(history[0].2 + history[1].2, 1500);
    signal(&b, Signal::SIGTERM);
    assert!(wait_exit(&mut b, Duration::from_secs(15)).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_0_and_releases_the_lease() {
    let (db, dir, cfg) = settlement_run("sigterm", 3000).await;
    let mut a = common::spawn_worker(bin(&db, Some(&cfg), &[]), &dir, "leaver", CONCURRENCY);
    wait_mid_run(&db.pool, 60).await;
    signal(&a, Signal::SIGTERM);
    let st = wait_exit(&mut a, Duration::from_secs(10));
    assert_eq!(st.code(), Some(0));
    let (status, attempts, processed, _) = run_row(&db.pool).await;
    assert_eq!(status, "PENDING");
    assert!(processed < 3000);
    let expires: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT lease_expires_at FROM batch_job_run")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(expires.is_none(), "the lease was released");
    let outcome: String =
        sqlx::query_scalar("SELECT outcome FROM batch_job_attempt WHERE attempt = $1")
            .bind(attempts)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(outcome, "released");

    // Another worker picks it up at once (no lease to wait out) and finishes.
    let mut b = common::spawn_worker(bin(&db, Some(&cfg), &[]), &dir, "finisher", CONCURRENCY);
    wait_for_status(&db.pool, "SUCCEEDED").await;
    assert_settled_exactly(&db.pool, 3000).await;
    signal(&b, Signal::SIGTERM);
    assert!(wait_exit(&mut b, Duration::from_secs(15)).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspection_commands_and_migrate() {
    let db = db().await;
    // migrate is idempotent on a migrated database.
    for _ in 0..2 {
        let out = bin(&db, None, &["migrate"]).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(enqueue_output(&db).status.success());
    let out = bin(&db, None, &["--json", "runs", "list"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["job_key"], KEY);
    assert_eq!(v[0]["status"], "PENDING");
    let out = bin(&db, None, &["--json", "runs", "show", KEY])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["run"]["attempts"], 0);
    let out = bin(&db, None, &["--json", "status"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["counts"][0]["runs"], 1);
    let out = bin(
        &db,
        None,
        &[
            "runs",
            "list",
            "--status",
            "pending",
            "--job",
            "daily-settlement",
        ],
    )
    .output()
    .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(KEY));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_one_error_line_and_changes_nothing() {
    let db = db().await;
    let dir = scratch("bad-input");
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let unknown_key = write("a.toml", "[jobs.daily-settlement]\ncolour = \"red\"\n");
    let bad_tz = write(
        "b.toml",
        "[jobs.daily-settlement]\ntimezone = \"Asia/Atlantis\"\n",
    );
    let bad_dur = write(
        "c.toml",
        "[jobs.daily-settlement]\nlease_ttl = \"forever\"\n",
    );
    let bad_job = write("d.toml", "[jobs.nightly-report]\n");
    let bad_toml = write("e.toml", "[jobs.daily-settlement\n");
    let bad_int = write("f.toml", "[jobs.daily-settlement]\nmax_attempts = -1\n");
    let bad_policy = write(
        "g.toml",
        "[jobs.daily-settlement]\non_lease_expiry = \"later\"\n",
    );
    let missing = dir.join("missing.toml").display().to_string();
    let long_key = format!("daily-settlement:{}", "1".repeat(120));
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["enqueue", "nightly", "--date", "2026-09-15"],
            "unknown job \"nightly\"",
        ),
        (
            vec!["enqueue", "Daily_Settlement", "--date", "2026-09-15"],
            "unknown job",
        ),
        (
            vec!["enqueue", "daily-settlement", "--date", "2026-02-30"],
            "invalid date",
        ),
        (
            vec!["enqueue", "daily-settlement", "--date", "15/09/2026"],
            "invalid date",
        ),
        (vec!["enqueue", "daily-settlement"], "--date"),
        (vec!["worker", "--concurrency", "0"], "--concurrency"),
        (vec!["worker", "--concurrency", "many"], "--concurrency"),
        (
            vec!["worker", "--worker-id", "has space"],
            "invalid worker id",
        ),
        (vec!["worker", "--grace", "soon"], "invalid duration"),
        (vec!["worker", "--poll-interval", "0s"], "greater than zero"),
        (vec!["runs", "show", "not-a-key"], "invalid job key"),
        (vec!["runs", "show", &long_key], "invalid job key"),
        (
            vec!["runs", "show", "daily-settlement:2020-01-01"],
            "no run with key",
        ),
        (vec!["runs", "list", "--status", "DONE"], "unknown status"),
        (vec!["runs", "list", "--job", "nope"], "unknown job"),
        (vec!["runs", "list", "--limit", "0"], "--limit"),
        (vec!["frobnicate"], "unrecognized subcommand"),
        (
            vec!["--config", &unknown_key, "status"],
            "`jobs.daily-settlement.colour`: unknown key",
        ),
        (
            vec!["--config", &bad_tz, "status"],
            "`jobs.daily-settlement.timezone`: unknown time zone",
        ),
        (
            vec!["--config", &bad_dur, "status"],
            "`jobs.daily-settlement.lease_ttl`: invalid duration",
        ),
        (
            vec!["--config", &bad_job, "status"],
            "`jobs.nightly-report`: unknown job",
        ),
        (vec!["--config", &bad_toml, "status"], "line 1"),
        (
            vec!["--config", &bad_int, "status"],
            "`jobs.daily-settlement.max_attempts`",
        ),
        (vec!["--config", &bad_policy, "status"], "unknown policy"),
        (
            vec!["--config", &missing, "status"],
            "cannot read config file",
        ),
    ];
    for (args, expect) in &cases {
        let out = bin(&db, None, args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: not one line: {err}"
        );
        assert!(err.starts_with("batchonce: error: "), "{args:?}: {err}");
        assert!(
            err.contains(expect),
            "{args:?}: expected {expect:?} in {err}"
        );
    }
    // Commands other than demo require a URL; a bad URL is one clean line
    // without the password.
    for args in [
        vec!["worker"],
        vec!["enqueue", "daily-settlement", "--date", "2026-09-15"],
        vec!["status"],
    ] {
        let out = Command::new(BIN)
            .args(&args)
            .env_remove("DATABASE_URL")
            .env("BATCHONCE_CONFIG", common::samples_config())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains("set DATABASE_URL"), "{args:?}: {err}");
    }
    let out = Command::new(BIN)
        .args(["status"])
        .env("DATABASE_URL", "postgres://app:hunter2@127.0.0.1:1/x")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(!err.contains("hunter2"), "password leaked: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM batch_job_run")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "bad input wrote a row");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_survives_a_database_restart() {
    let dir = scratch("restart");
    let (mut own, pool) = OwnCluster::start(&dir, 50, &batchonce_workers::migrations()).await;
    let url = own.url.clone();
    seed(&pool, 2000).await;
    let cfg = write_config(&dir);
    let run = |args: &[&str]| {
        Command::new(BIN)
            .env("DATABASE_URL", &url)
            .arg("--config")
            .arg(&cfg)
            .args(args)
            .output()
            .unwrap()
    };
    assert!(
        run(&["enqueue", "daily-settlement", "--date", "2026-09-15"])
            .status
            .success()
    );
    let log = std::fs::File::create(dir.join("survivor.log")).unwrap();
    let mut worker = Command::new(BIN)
        .env("DATABASE_URL", &url)
        .env("RUST_LOG", "info")
        .arg("--config")
        .arg(&cfg)
        .args([
            "--log-format",
            "json",
            "worker",
            "--worker-id",
            "survivor",
            "--poll-interval",
            "200ms",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    wait_until("the worker is mid-run", Duration::from_secs(30), || async {
        let (status, _, processed, _) = run_row(&pool).await;
        status == "RUNNING" && processed >= 100
    })
    .await;
    pool.close().await;
    own.stop().await;
    // Down for longer than the lease ttl (2s): the worker must keep trying.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        worker.try_wait().unwrap().is_none(),
        "the worker exited while the database was down"
    );
    let pool = own.start_again().await;
    wait_until(
        "the run succeeded after the restart",
        Duration::from_secs(60),
        || async { run_row(&pool).await.0 == "SUCCEEDED" },
    )
    .await;
    assert_settled_exactly(&pool, 2000).await;
    assert!(
        worker.try_wait().unwrap().is_none(),
        "the worker is still serving"
    );
    signal(&worker, Signal::SIGTERM);
    assert!(wait_exit(&mut worker, Duration::from_secs(15)).success());
    pool.close().await;
    own.stop().await;
}

#[test]
fn demo_runs_the_whole_system_on_its_private_cluster() {
    let home = scratch("demo");
    let out = Command::new(BIN)
        .arg("demo")
        .env_remove("DATABASE_URL")
        .env("BATCHONCE_HOME", &home)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("duplicate daily-settlement:"), "{stdout}");
    assert!(stdout.contains("SIGKILLed demo-worker-"), "{stdout}");
    assert!(stdout.contains("demo passed"), "{stdout}");
    // Three periods of each bundled job kind.
    assert_eq!(stdout.matches(" SUCCEEDED ").count(), 9, "{stdout}");
    for kind in ["daily-settlement:", "notification-send:", "inventory-sync:"] {
        assert!(stdout.contains(&format!("duplicate {kind}")), "{stdout}");
    }
    // The demo stops the cluster it started, and a second run reuses its data.
    let again = Command::new(BIN)
        .arg("demo")
        .env_remove("DATABASE_URL")
        .env("BATCHONCE_HOME", &home)
        .output()
        .unwrap();
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stdout)
    );
}

/// The words of a line the demo printed for a shell: `'quoted'` words
/// (no quote inside, as in the scratch paths here) and bare ones.
fn shell_words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line.trim();
    while !rest.is_empty() {
        let (word, after) = match rest.find(['\'', ' ']) {
            Some(i) if rest.as_bytes()[i] == b'\'' => {
                let close = rest[i + 1..].find('\'').expect("a closing quote") + i + 1;
                (
                    format!("{}{}", &rest[..i], &rest[i + 1..close]),
                    &rest[close + 1..],
                )
            }
            Some(i) => (rest[..i].to_owned(), &rest[i..]),
            None => (rest.to_owned(), ""),
        };
        out.push(word);
        rest = after.trim_start();
    }
    out
}

/// A process this test started, stopped with SIGINT (as Ctrl-C would, so a
/// demo stops the cluster it started) if the test ends before it does.
struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            signal(&self.0, Signal::SIGINT);
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.0.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_console_prints_how_to_reach_its_database_and_its_login_works_once() {
    use std::io::BufRead as _;
    let home = scratch("demo-console");
    // A free port for the console (the demo prints the address it is given).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut demo = Stopped(
        Command::new(BIN)
            .args(["demo", "--console", &format!("127.0.0.1:{port}")])
            .env_remove("DATABASE_URL")
            .env("BATCHONCE_HOME", &home)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stdout = demo.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut printed = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(180);
    while !printed
        .iter()
        .any(|l: &String| l.contains("Ctrl-C stops it"))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => printed.push(line),
            Err(_) => {
                panic!(
                    "the demo printed no console within 180 s:\n{}",
                    printed.join("\n")
                );
            }
        }
    }
    let all = printed.join("\n");
    assert!(all.contains("demo passed"), "{all}");
    // The one-time password, from the console's line.
    let console = printed
        .iter()
        .find(|l| l.starts_with("console: http://"))
        .unwrap();
    let password = console
        .split("password ")
        .nth(1)
        .and_then(|p| p.split(',').next())
        .unwrap()
        .to_owned();
    // How another terminal reaches the database, with no password printed.
    let at = printed
        .iter()
        .position(|l| l.contains("from another terminal"))
        .unwrap();
    let export = shell_words(&printed[at + 1]);
    let worker = shell_words(&printed[at + 3]);
    assert_eq!(export[0], "export", "{all}");
    let env: Vec<(String, String)> = export[1..]
        .iter()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_owned(), v.to_owned())
        })
        .collect();
    let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["PGPASSFILE", "DATABASE_URL"], "{all}");
    let pgpass = std::fs::read_to_string(&env[0].1).unwrap();
    let secret = pgpass.trim().rsplit(':').next().unwrap().to_owned();
    assert!(secret.len() >= 16);
    assert!(
        !all.contains(&secret),
        "the demo printed the database password"
    );
    assert!(!env[1].1.contains(&secret));
    // The recipe works: a command and a worker reach the demo's database.
    let with_env = |cmd: &mut Command| {
        cmd.env_remove("DATABASE_URL")
            .env_remove("BATCHONCE_CONFIG")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    };
    let mut status = Command::new(BIN);
    status.arg("status");
    with_env(&mut status);
    let out = status.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("daily-settlement"));
    assert_eq!(worker[1..3], ["worker", "--config"], "{all}");
    assert!(worker[3].ends_with("demo.toml"), "{all}");
    let log = home.join("pasted-worker.log");
    let mut pasted = Command::new(&worker[0]);
    pasted
        .args(&worker[1..])
        .args(["--worker-id", "pasted", "--metrics-addr", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    with_env(&mut pasted);
    let mut pasted = Stopped(pasted.spawn().unwrap());
    wait_until(
        "the pasted worker to start",
        Duration::from_secs(30),
        || {
            let log = log.clone();
            async move {
                std::fs::read_to_string(&log)
                    .unwrap_or_default()
                    .contains("worker started")
            }
        },
    )
    .await;
    signal(&pasted.0, Signal::SIGTERM);
    assert!(wait_exit(&mut pasted.0, Duration::from_secs(15)).success());

    // The printed login signs in once; the second time it is spent.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let sign_in = || async {
        let form = http.get(format!("{base}/login")).send().await.unwrap();
        let token = form
            .headers()
            .get_all(reqwest::header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(|c| {
                c.split(';')
                    .next()?
                    .strip_prefix("batchonce_login=")
                    .map(str::to_owned)
            })
            .unwrap();
        http.post(format!("{base}/login"))
            .header(reqwest::header::COOKIE, format!("batchonce_login={token}"))
            .form(&[
                ("csrf", token.as_str()),
                ("user", "demo"),
                ("password", &password),
                ("next", "/"),
            ])
            .send()
            .await
            .unwrap()
    };
    let first = sign_in().await;
    assert_eq!(first.status(), reqwest::StatusCode::SEE_OTHER);
    assert!(first
        .headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .any(|c| c.to_str().unwrap().starts_with("batchonce_session=")));
    let second = sign_in().await;
    let spent = second
        .headers()
        .get(reqwest::header::LOCATION)
        .map(|l| l.to_str().unwrap().to_owned())
        .unwrap_or_default();
    assert!(
        !second
            .headers()
            .get_all(reqwest::header::SET_COOKIE)
            .iter()
            .any(|c| c.to_str().unwrap().starts_with("batchonce_session=")),
        "a second sign-in with the one-time password got a session"
    );
    assert!(spent.contains("error=spent"), "{spent}");

    // Ctrl-C stops the console, and the demo with it.
    signal(&demo.0, Signal::SIGINT);
    assert!(wait_exit(&mut demo.0, Duration::from_secs(30)).success());
}

#[test]
fn demo_without_postgresql_says_how_to_fix_it() {
    let home = scratch("no-pg");
    let out = Command::new(BIN)
        .arg("demo")
        .env_remove("DATABASE_URL")
        .env("BATCHONCE_HOME", &home)
        .env("BATCHONCE_PG_BINDIR", home.join("nothing-here"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("apt-get install -y postgresql"), "{err}");
    assert!(err.contains("DATABASE_URL"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refuses_an_unmigrated_database() {
    // Engine tables only: the settlement migrations are pending.
    let db = TestDb::new(&[]).await;
    let out = bin(&db, None, &["worker"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let last = err.trim_end().lines().last().unwrap_or("");
    assert!(
        last.starts_with("batchonce: error: the database is not migrated"),
        "{err}"
    );
    assert!(last.contains("batchonce migrate"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_producer_processes_enqueue_each_key_once() {
    let db = db().await;
    let children: Vec<Child> = (0..8)
        .map(|_| {
            bin(
                &db,
                None,
                &[
                    "--json",
                    "produce",
                    "--once",
                    "--now",
                    "2026-09-15T02:00:00+09:00",
                ],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    let mut enqueued = 0;
    let mut duplicates = 0;
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        enqueued += v[0]["enqueued"].as_array().unwrap().len();
        duplicates += v[0]["duplicates"].as_u64().unwrap();
    }
    // The default settlement schedule: 01:00 Seoul, previous day, 7 days back.
    assert_eq!((enqueued, duplicates), (7, 7 * 7));
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT min(job_key), count(*) FROM batch_job_run GROUP BY job_key ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(rows.iter().all(|(_, n)| *n == 1));
    let keys: Vec<&str> = rows.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys.len(), 9, "{keys:?}");
    assert_eq!(keys[0], "daily-settlement:2026-09-08");
    // inventory-sync every 15 minutes (UTC), catching up half an hour:
    // 02:00 Seoul is 17:00 UTC the day before.
    assert_eq!(
        keys[7..],
        [
            "inventory-sync:2026-09-14T16:45",
            "inventory-sync:2026-09-14T17:00"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_backfills_a_range_and_reports_skips() {
    let db = db().await;
    let dir = scratch("backfill");
    let cfg = dir.join("cal.toml");
    std::fs::write(&cfg, "[jobs.daily-settlement]\nskip_weekdays = [\"sun\"]\n").unwrap();
    let out = bin(
        &db,
        Some(&cfg),
        &[
            "enqueue",
            "daily-settlement",
            "--from",
            "2026-09-12",
            "--to",
            "2026-09-14",
        ],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "enqueued daily-settlement:2026-09-12");
    assert!(
        lines[1].starts_with("skipped daily-settlement:2026-09-13 (business calendar"),
        "{text}"
    );
    assert_eq!(lines[2], "enqueued daily-settlement:2026-09-14");
    for (args, expect) in [
        (
            vec!["--from", "2026-09-14", "--to", "2026-09-12"],
            "before --from",
        ),
        (
            vec!["--from", "2020-01-01", "--to", "2026-09-12"],
            "the limit is 366",
        ),
        (vec!["--from", "2026-09-14"], "--to"),
        (
            vec![
                "--date",
                "2026-09-14",
                "--from",
                "2026-09-12",
                "--to",
                "2026-09-13",
            ],
            "cannot be used with",
        ),
    ] {
        let mut a = vec!["enqueue", "daily-settlement"];
        a.extend(args.iter().copied());
        let out = bin(&db, None, &a).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(expect), "{a:?}: {err}");
    }
    let bad_now = bin(&db, None, &["produce", "--once", "--now", "tomorrow"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&bad_now.stderr).contains("invalid instant"));
    let bad_cron = dir.join("cron.toml");
    std::fs::write(
        &bad_cron,
        "[jobs.daily-settlement]\nschedule = \"0 1 * *\"\n",
    )
    .unwrap();
    let out = bin(&db, Some(&bad_cron), &["produce", "--once"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`jobs.daily-settlement.schedule`: invalid cron expression"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflight_passes_and_cleans_up() {
    let db = db().await;
    let out = bin(&db, None, &["preflight", "--processes", "6"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("ok    migrations current"), "{text}");
    assert!(text.contains("ok    database clock sane"), "{text}");
    assert!(
        text.contains("6 processes raced for batchonce-preflight:"),
        "{text}"
    );
    assert!(
        text.contains("1 enqueued (5 duplicates), 1 claimed"),
        "{text}"
    );
    assert!(text.trim_end().ends_with("preflight passed"), "{text}");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM batch_job_run")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "preflight left its scratch run behind");
    // Against an unmigrated schema it fails and says why.
    let bare = TestDb::new(&[]).await;
    let out = bin(&bare, None, &["preflight"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout)
        .contains("migrations pending: run `batchonce migrate`"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_survives_a_database_restart() {
    let dir = scratch("producer-restart");
    let (mut own, pool) = OwnCluster::start(&dir, 20, &batchonce_workers::migrations()).await;
    let url = own.url.clone();
    let cfg = dir.join("sync.toml");
    // A job every minute in UTC; simulated time starts 12s before a minute.
    std::fs::write(
        &cfg,
        "[jobs.daily-settlement]\ntimezone = \"UTC\"\nschedule = \"* * * * *\"\ncovers = \"firing\"\ncatch_up = \"5m\"\n",
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("producer.log")).unwrap();
    let mut producer = Command::new(BIN)
        .env("DATABASE_URL", &url)
        .arg("--config")
        .arg(&cfg)
        .args([
            "--log-format",
            "json",
            "produce",
            "--interval",
            "500ms",
            "--now",
            "2026-09-15T10:00:48Z",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let count = |pool: PgPool| async move {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM batch_job_run WHERE job_key LIKE 'daily-settlement:%'",
        )
        .fetch_one(&pool)
        .await
        .unwrap_or(0)
    };
    wait_until("the first tick", Duration::from_secs(10), || {
        let p = pool.clone();
        async move { count(p).await == 5 }
    })
    .await;
    pool.close().await;
    own.stop().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        producer.try_wait().unwrap().is_none(),
        "the producer exited while the database was down"
    );
    let pool = own.start_again().await;
    // 10:01 comes 12s after the start in simulated time.
    wait_until("the 10:01 key after the restart", Duration::from_secs(30), || {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM batch_job_run WHERE job_key = 'daily-settlement:2026-09-15T10:01'",
            )
            .fetch_one(&pool)
            .await
            .unwrap_or(0)
                == 1
        }
    })
    .await;
    signal(&producer, Signal::SIGTERM);
    assert!(wait_exit(&mut producer, Duration::from_secs(10)).success());
    pool.close().await;
    own.stop().await;
}
