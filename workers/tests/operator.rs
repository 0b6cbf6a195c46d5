//! The operator flow with real processes: stale runs with evidence (alive-slow
//! vs dead), policy hold, audited fail / rerun / skip, racing operators, and
//! bad input.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use batchonce::testing::{wait_until, TestDb};
use batchonce_workers::settlement;
use chrono::NaiveDate;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sqlx::PgPool;

mod common;

use common::stop;

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

/// The same policies as [`hold_config`] but `retry`: the control run that
/// shows a recovery pass happened is enqueued under it.
fn retry_config(dir: &std::path::Path) -> PathBuf {
    let p = dir.join("retry.toml");
    std::fs::write(
        &p,
        "[jobs.daily-settlement]\nlease_ttl = \"2s\"\nstale_after = \"3s\"\nchunk_size = 20\n\
         chunk_pause = \"100ms\"\non_lease_expiry = \"retry\"\nmax_attempts = 3\n",
    )
    .unwrap();
    p
}

fn cmd(db: &TestDb, cfg: Option<&PathBuf>, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.env("DATABASE_URL", &db.url)
        .env_remove("BATCHONCE_CONFIG");
    // Without a file of its own, the bundled kinds the test exercises, by
    // the environment, so that a `--config` among `args` still wins.
    c.env("BATCHONCE_CONFIG", common::samples_config());
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

/// Checks the command line's refusal contract: exit code 1 and one line on
/// stderr that names the reason.
fn refused(out: &Output, want: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "expected a refusal: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains(want), "expected {want:?} in {err}");
}

/// A run's status, lease owner and lease token.
async fn lease(pool: &PgPool, key: &str) -> (String, Option<String>, Option<i64>) {
    sqlx::query_as("SELECT status, lease_owner, lease_token FROM batch_job_run WHERE job_key = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Polls `runs stale` until it lists something, and returns that listing.
async fn wait_for_stale(db: &TestDb, cfg: &PathBuf, what: &str) -> Vec<serde_json::Value> {
    let mut listed = Vec::new();
    wait_until(what, Duration::from_secs(20), || {
        listed = stale(db, cfg);
        std::future::ready(!listed.is_empty())
    })
    .await;
    listed
}

/// The control run of [`held_past_expiry_while_a_retry_run_is_recovered`],
/// enqueued under policy `retry` while no worker runs, and not due for a
/// day, so that no worker claims it before the test gives it a lease.
const CONTROL: &str = "daily-settlement:2026-09-16";

async fn enqueue_control(db: &TestDb, dir: &std::path::Path) {
    let out = run(
        db,
        Some(&retry_config(dir)),
        &["enqueue", "daily-settlement", "--date", "2026-09-16"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    sqlx::query(
        "UPDATE batch_job_run SET next_run_at = now() + interval '1 day' WHERE job_key = $1",
    )
    .bind(CONTROL)
    .execute(&db.pool)
    .await
    .unwrap();
}

/// Proves that policy `hold` kept the run whose holder died, rather than
/// merely that nothing happened yet: once the held lease has expired and
/// the dead holder's sessions are gone, a control run under policy `retry`
/// is given a lease that is expired too. Recovery takes every expired run of
/// its policy in one statement, so the pass that recovers the control also
/// saw the held run past its expiry and unlocked; only then is the held run
/// checked, still RUNNING under its old owner and token.
async fn held_past_expiry_while_a_retry_run_is_recovered(
    db: &TestDb,
    held: &(String, Option<String>, Option<i64>),
) {
    wait_until(
        "the held run's lease to expire",
        Duration::from_secs(20),
        || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT lease_expires_at <= now() FROM batch_job_run WHERE job_key = $1",
            )
            .bind(KEY)
            .fetch_one(&db.pool)
            .await
            .unwrap()
        },
    )
    .await;
    // Recovery skips locked rows, so the killed holder's sessions must be
    // gone: otherwise a pass could skip the held run for its lock alone.
    wait_until(
        "the killed worker's database sessions to end",
        Duration::from_secs(20),
        || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'slowpoke'",
            )
            .fetch_one(&db.pool)
            .await
            .unwrap()
                == 0
        },
    )
    .await;
    // The control's lease expires now, which is no earlier than the held
    // run's expiry: whatever pass recovers it saw both expired. Its attempt
    // row is written in the same statement, so that recovery, and only
    // recovery, closes it as `lease_expired`.
    let control_token: i64 = sqlx::query_scalar(
        "WITH r AS ( \
           UPDATE batch_job_run SET status = 'RUNNING', attempts = 1, lease_owner = 'vanished', \
             lease_token = batchonce_new_token(), lease_expires_at = now(), heartbeat_at = now(), \
             started_at = now() \
           WHERE job_key = $1 AND on_lease_expiry = 'retry' \
           RETURNING job_key, lease_token, started_at) \
         INSERT INTO batch_job_attempt (job_key, attempt, lease_token, worker_id, started_at) \
         SELECT job_key, 1, lease_token, 'vanished', started_at FROM r RETURNING lease_token",
    )
    .bind(CONTROL)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    wait_until(
        "the bystander to recover the expired control run under policy retry",
        Duration::from_secs(20),
        || async {
            sqlx::query_scalar::<_, Option<String>>(
                "SELECT outcome FROM batch_job_attempt WHERE job_key = $1 AND lease_token = $2",
            )
            .bind(CONTROL)
            .bind(control_token)
            .fetch_one(&db.pool)
            .await
            .unwrap()
            .as_deref()
                == Some("lease_expired")
        },
    )
    .await;
    assert_eq!(
        &lease(&db.pool, KEY).await,
        held,
        "policy hold: recovery must leave the expired run with its holder and token"
    );
    // The control run is then claimed like any other and must finish, so
    // that it is not listed by `runs stale` later.
    wait_until(
        "the recovered control run to succeed",
        Duration::from_secs(30),
        || async { lease(&db.pool, CONTROL).await.0 == "SUCCEEDED" },
    )
    .await;
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
    refused(
        &out,
        "fail refused for daily-settlement:2026-09-15: it is RUNNING with a live lease and not past stale_after",
    );

    // Past stale_after (3s) while heartbeating: alive-slow. `runs stale`
    // lists nothing before then, so the first listing that shows the run
    // is the one to judge.
    let s = wait_for_stale(&db, &cfg, "the run to be listed by `runs stale`").await;
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!(s[0]["conclusion"], "alive-slow", "{s:?}");
    assert_eq!(s[0]["session_alive"], true);
    assert_eq!(s[0]["worker_id"], "slowpoke");
    assert!(s[0]["processed_count"].as_i64().unwrap() > 0);

    let held = lease(&db.pool, KEY).await;
    // The worker's sessions carry its id as application name, which the
    // check below that they have ended relies on.
    let sessions: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'slowpoke'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(sessions > 0, "no database session named after slowpoke");
    kill(Pid::from_raw(a.id() as i32), Signal::SIGKILL).unwrap();
    let _ = a.wait();
    // Policy hold: another worker does not take the expired run over.
    enqueue_control(&db, &dir).await;
    let b = worker(&db, &cfg, &dir, "bystander");
    held_past_expiry_while_a_retry_run_is_recovered(&db, &held).await;
    let s = stale(&db, &cfg);
    assert_eq!(s.len(), 1, "{s:?}");
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
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("would change RUNNING -> FAILED"));
    assert_eq!(
        lease(&db.pool, KEY).await,
        held,
        "a dry run changed the run"
    );
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
    refused(
        &out,
        "rerun refused for daily-settlement:2026-09-15: it is SUCCEEDED (allowed from FAILED); re-running it is a correction: add --force",
    );
    assert_eq!(audit_rows(&db.pool).await, 2, "a refused rerun was audited");
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
            refused(
                &out,
                "rerun refused for daily-settlement:2026-09-15: it is PENDING",
            );
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
        refused(&run(&db, None, args), expect);
    }
    // A missing flag is a usage error: exit code 2, and the line names it.
    for (args, expect) in [
        (vec!["runs", "skip", KEY, "--operator", "a"], "--reason"),
        (
            vec!["runs", "skip", KEY, "--reason", "ok then"],
            "--operator",
        ),
    ] {
        let out = run(&db, None, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
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
    refused(
        &out,
        "rerun refused for daily-settlement:2026-09-15: it is SKIPPED (allowed from FAILED); re-running it is a correction: add --force",
    );
    let out = run(
        &db,
        None,
        &["runs", "skip", KEY, "--reason", "again", "--operator", "a"],
    );
    refused(
        &out,
        "skip refused for daily-settlement:2026-09-15: it is SKIPPED (allowed from PENDING or FAILED)",
    );
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
