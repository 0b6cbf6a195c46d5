//! The operator flow with real processes: stale runs with evidence (alive-slow
//! vs dead), policy hold, audited fail / rerun / skip, racing operators, and
//! bad input.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use batchonce::testing::{wait_until, TestDb};
use batchonce_workers::settlement;
use chrono::NaiveDate;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sqlx::PgPool;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");
const KEY: &str = "daily-settlement:2026-09-15";

fn scratch(name: &str) -> PathBuf {
    batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), name)
}

fn hold_config(dir: &std::path::Path) -> PathBuf {
    let p = dir.join("batchonce.toml");
    std::fs::write(
        &p,
        "[jobs.daily-settlement]\nlease_ttl = \"2s\"\nstale_after = \"3s\"\nchunk_size = 20\n\
         chunk_pause = \"100ms\"\non_lease_expiry = \"hold\"\nmax_attempts = 3\n",
    )
    .unwrap();
    p
}

fn cmd(db: &TestDb, cfg: Option<&PathBuf>, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.env("DATABASE_URL", &db.url)
        .env_remove("BATCHONCE_CONFIG");
    if let Some(cfg) = cfg {
        c.arg("--config").arg(cfg);
    }
    c.args(args);
    c
}

fn run(db: &TestDb, cfg: Option<&PathBuf>, args: &[&str]) -> Output {
    cmd(db, cfg, args).output().unwrap()
}

fn worker(db: &TestDb, cfg: &PathBuf, dir: &std::path::Path, id: &str) -> Child {
    let log = std::fs::File::create(dir.join(format!("{id}.log"))).unwrap();
    cmd(
        db,
        Some(cfg),
        &[
            "--log-format",
            "json",
            "worker",
            "--worker-id",
            id,
            "--poll-interval",
            "200ms",
        ],
    )
    .env("RUST_LOG", "info")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(log)
    .spawn()
    .unwrap()
}

async fn seed(pool: &PgPool, n: i64) {
    let d = NaiveDate::from_ymd_opt(2026, 9, 15).unwrap();
    let (start, end) = settlement::day_bounds(d, chrono_tz::Asia::Seoul);
    sqlx::query(
        "INSERT INTO orders SELECT g, 1 + g % 5, 100 + g, $1 + ($2 - $1) * ((g - 1)::float8 / $3) \
         FROM generate_series(1, $3) g",
    )
    .bind(start)
    .bind(end)
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

async fn status(pool: &PgPool) -> (String, Option<String>) {
    sqlx::query_as("SELECT status, lease_owner FROM batch_job_run WHERE job_key = $1")
        .bind(KEY)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn audit_rows(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM batch_operator_action")
        .fetch_one(pool)
        .await
        .unwrap()
}

fn stale(db: &TestDb, cfg: &PathBuf) -> Vec<serde_json::Value> {
    let out = run(db, Some(cfg), &["--json", "runs", "stale"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout).unwrap()
}

fn stop(mut child: Child) {
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "worker did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_evidence_hold_then_audited_fail_and_rerun_settle_exactly() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let dir = scratch("operator");
    let cfg = hold_config(&dir);
    seed(&db.pool, 1200).await;
    // Enqueued under the file the workers use: the run keeps its policies
    // (hold, stale_after 3s), whatever file an operator or worker has later.
    assert!(run(
        &db,
        Some(&cfg),
        &["enqueue", "daily-settlement", "--date", "2026-09-15"]
    )
    .status
    .success());
    let mut a = worker(&db, &cfg, &dir, "slowpoke");
    wait_until("the run is leased", Duration::from_secs(20), || async {
        status(&db.pool).await.0 == "RUNNING"
    })
    .await;
    // A live run cannot be failed without --force.
    let out = run(
        &db,
        Some(&cfg),
        &[
            "runs",
            "fail",
            KEY,
            "--reason",
            "looks slow",
            "--operator",
            "bob",
        ],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("with a live lease and not past stale_after")
    );

    // Past stale_after (3s) while heartbeating: alive-slow.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let s = stale(&db, &cfg);
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!(s[0]["conclusion"], "alive-slow", "{s:?}");
    assert_eq!(s[0]["session_alive"], true);
    assert_eq!(s[0]["worker_id"], "slowpoke");
    assert!(s[0]["processed_count"].as_i64().unwrap() > 0);

    kill(Pid::from_raw(a.id() as i32), Signal::SIGKILL).unwrap();
    let _ = a.wait();
    // Policy hold: another worker does not take the expired run over.
    let b = worker(&db, &cfg, &dir, "bystander");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        status(&db.pool).await,
        ("RUNNING".into(), Some("slowpoke".into()))
    );
    let s = stale(&db, &cfg);
    assert_eq!(s[0]["conclusion"], "dead", "{s:?}");
    assert_eq!(s[0]["session_alive"], false);
    assert_eq!(s[0]["lease_expired"], true);
    assert!(
        s[0]["heartbeat_age_seconds"].as_f64().unwrap() >= 2.0,
        "{s:?}"
    );
    assert!(
        s[0]["worker_last_seen_age_seconds"].as_f64().unwrap() >= 2.0,
        "{s:?}"
    );

    // Dry run first: nothing changes.
    let out = run(
        &db,
        Some(&cfg),
        &[
            "runs",
            "fail",
            KEY,
            "--reason",
            "host died",
            "--operator",
            "alice",
            "--dry-run",
        ],
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("would change RUNNING -> FAILED"));
    assert_eq!(status(&db.pool).await.0, "RUNNING");
    assert_eq!(audit_rows(&db.pool).await, 0);

    let out = run(
        &db,
        Some(&cfg),
        &[
            "runs",
            "fail",
            KEY,
            "--reason",
            "host died",
            "--operator",
            "alice",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(status(&db.pool).await.0, "FAILED");
    let out = run(
        &db,
        Some(&cfg),
        &[
            "runs",
            "rerun",
            KEY,
            "--reason",
            "host replaced",
            "--operator",
            "alice",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until("the re-run succeeded", Duration::from_secs(60), || async {
        status(&db.pool).await.0 == "SUCCEEDED"
    })
    .await;
    let v = settlement::verify(
        &db.pool,
        chrono_tz::Asia::Seoul,
        NaiveDate::from_ymd_opt(2026, 9, 15).unwrap(),
    )
    .await
    .unwrap();
    assert!(v.ok, "{}", v.detail);
    assert_eq!((v.items, v.duplicates), (1200, 0));

    let out = run(&db, Some(&cfg), &["--json", "runs", "show", KEY]);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let actions = shown["operator_actions"].as_array().unwrap();
    assert_eq!(actions.len(), 2);
    assert_eq!(actions[0]["action"], "fail");
    assert_eq!(actions[0]["before_status"], "RUNNING");
    assert_eq!(actions[0]["operator"], "alice");
    assert_eq!(actions[0]["session_user"], "postgres");
    assert_eq!(actions[1]["action"], "rerun");
    assert_eq!(actions[1]["after_status"], "PENDING");
    let attempts = shown["attempts"].as_array().unwrap();
    assert_eq!(attempts[0]["outcome"], "operator_failed");
    assert_eq!(attempts.last().unwrap()["outcome"], "succeeded");
    // A correction: re-running a SUCCEEDED run needs --force and rewrites nothing.
    let out = run(
        &db,
        Some(&cfg),
        &[
            "runs",
            "rerun",
            KEY,
            "--reason",
            "recheck totals",
            "--operator",
            "carol",
        ],
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("add --force"));
    let out = run(
        &db,
        Some(&cfg),
        &[
            "runs",
            "rerun",
            KEY,
            "--reason",
            "recheck totals",
            "--operator",
            "carol",
            "--force",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(
        "the correction succeeded",
        Duration::from_secs(60),
        || async { status(&db.pool).await.0 == "SUCCEEDED" },
    )
    .await;
    let v = settlement::verify(
        &db.pool,
        chrono_tz::Asia::Seoul,
        NaiveDate::from_ymd_opt(2026, 9, 15).unwrap(),
    )
    .await
    .unwrap();
    assert!(v.ok && v.items == 1200 && v.duplicates == 0, "{}", v.detail);
    assert_eq!(audit_rows(&db.pool).await, 3);
    // The worker registry: the killed worker's row stayed, the live one is there.
    let workers: Vec<String> = sqlx::query_scalar("SELECT worker_id FROM batch_worker ORDER BY 1")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(workers, vec!["bystander", "slowpoke"]);
    stop(b);
    let workers: Vec<String> = sqlx::query_scalar("SELECT worker_id FROM batch_worker")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(workers, vec!["slowpoke"], "a stopped worker deregisters");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_racing_reruns_one_succeeds() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    assert!(run(
        &db,
        None,
        &["enqueue", "daily-settlement", "--date", "2026-09-15"]
    )
    .status
    .success());
    let out = run(
        &db,
        None,
        &[
            "runs",
            "fail",
            KEY,
            "--reason",
            "bad source file",
            "--operator",
            "ops",
            "--force",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let children: Vec<Child> = (0..10)
        .map(|i| {
            cmd(
                &db,
                None,
                &[
                    "runs",
                    "rerun",
                    KEY,
                    "--reason",
                    "source fixed",
                    "--operator",
                    &format!("op{i}"),
                ],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    let mut won = 0;
    for c in children {
        let out = c.wait_with_output().unwrap();
        if out.status.success() {
            won += 1;
            assert!(String::from_utf8_lossy(&out.stdout).contains("FAILED -> PENDING"));
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("rerun refused for daily-settlement:2026-09-15: it is PENDING"),
                "{err}"
            );
            assert_eq!(err.trim_end().lines().count(), 1);
        }
    }
    assert_eq!(won, 1);
    assert_eq!(audit_rows(&db.pool).await, 2);
    let (max, attempts): (i32, i32) =
        sqlx::query_as("SELECT max_attempts, attempts FROM batch_job_run")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((attempts, max), (0, 5), "the budget is renewed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_operator_input_is_refused_and_changes_nothing() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    assert!(run(
        &db,
        None,
        &["enqueue", "daily-settlement", "--date", "2026-09-15"]
    )
    .status
    .success());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "runs",
                "fail",
                "nope",
                "--reason",
                "why not",
                "--operator",
                "a",
            ],
            "invalid job key",
        ),
        (
            vec![
                "runs",
                "rerun",
                "daily-settlement:2020-01-01",
                "--reason",
                "why not",
                "--operator",
                "a",
            ],
            "no run with key",
        ),
        (vec!["runs", "skip", KEY, "--operator", "a"], "--reason"),
        (
            vec!["runs", "skip", KEY, "--reason", "ok then"],
            "--operator",
        ),
        (
            vec!["runs", "skip", KEY, "--reason", "", "--operator", "a"],
            "invalid --reason",
        ),
        (
            vec![
                "runs",
                "skip",
                KEY,
                "--reason",
                "line\u{7}bell",
                "--operator",
                "a",
            ],
            "invalid --reason",
        ),
        (
            vec![
                "runs",
                "skip",
                KEY,
                "--reason",
                "fine reason",
                "--operator",
                "bad\nname",
            ],
            "invalid --operator",
        ),
        (
            vec![
                "runs",
                "rerun",
                KEY,
                "--reason",
                "try again",
                "--operator",
                "a",
            ],
            "rerun refused for daily-settlement:2026-09-15: it is PENDING",
        ),
        (
            vec![
                "runs",
                "fail",
                KEY,
                "--reason",
                "not started",
                "--operator",
                "a",
            ],
            "add --force",
        ),
    ];
    // Text that would disguise the audit row: refused by name, never stored.
    let mut cases = cases;
    cases.extend([
        (
            vec![
                "runs",
                "fail",
                KEY,
                "--reason",
                "not started",
                "--operator",
                "adm\u{202E}in",
                "--force",
            ],
            "invalid --operator: contains U+202E (RIGHT-TO-LEFT OVERRIDE), a formatting character that can disguise text; use printable characters",
        ),
        (
            vec![
                "runs",
                "skip",
                KEY,
                "--reason",
                "holiday\u{200B}",
                "--operator",
                "kim",
            ],
            "invalid --reason: contains U+200B (ZERO WIDTH SPACE)",
        ),
        (
            vec![
                "runs",
                "skip",
                KEY,
                "--reason",
                "holiday",
                "--operator",
                "kim ",
            ],
            "invalid --operator: ends with whitespace, U+0020 (SPACE)",
        ),
    ]);
    let long = "x".repeat(501);
    cases.push((
        vec!["runs", "skip", KEY, "--reason", &long, "--operator", "a"],
        "invalid --reason",
    ));
    for (args, expect) in &cases {
        let out = run(&db, None, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains(expect),
            "{args:?}: expected {expect:?} in {err}"
        );
    }
    assert_eq!(status(&db.pool).await.0, "PENDING");
    assert_eq!(audit_rows(&db.pool).await, 0);
    // A valid skip, then a skip of a SKIPPED run and a rerun without --force.
    assert!(run(
        &db,
        None,
        &[
            "runs",
            "skip",
            KEY,
            "--reason",
            "holiday",
            "--operator",
            "a"
        ]
    )
    .status
    .success());
    let out = run(
        &db,
        None,
        &[
            "runs",
            "rerun",
            KEY,
            "--reason",
            "not a holiday",
            "--operator",
            "a",
        ],
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("add --force"));
    let out = run(
        &db,
        None,
        &["runs", "skip", KEY, "--reason", "again", "--operator", "a"],
    );
    assert!(!out.status.success());
    assert_eq!(audit_rows(&db.pool).await, 1);
    // The audit trail cannot be rewritten.
    for sql in [
        "UPDATE batch_operator_action SET reason = 'x'",
        "DELETE FROM batch_operator_action",
        "TRUNCATE batch_operator_action",
    ] {
        assert!(sqlx::query(sql).execute(&db.pool).await.is_err(), "{sql}");
    }
}
