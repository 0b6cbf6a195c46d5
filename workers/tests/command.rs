//! Command jobs end to end: the built `batchonce` binary runs shell and
//! Node.js programs declared in a config file, against real PostgreSQL. The
//! environment contract, the exit-code mapping, the timeout, the process
//! group stopped on SIGTERM and killed on lease loss, the SQL fence, and
//! exact items after the worker is SIGKILLed mid-run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use batchonce::queue::{self, ClaimSpec, NewRun};
use batchonce::testing::{wait_for_count, wait_for_status, wait_until, TestDb};
use batchonce::{Clock, JobKey, JobName};
use chrono::NaiveDate;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sqlx::PgPool;

mod common;

use common::stop;

fn scratch(name: &str) -> PathBuf {
    batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), name)
}

/// The workers' flags here: six runs at once.
const CONCURRENCY: &[&str] = &["--concurrency", "6"];

/// The binary with `config`, and the programs' database URL (the jobs'
/// `database_url_env` here) set to the worker's own.
fn bin(db: &TestDb, config: &Path) -> Command {
    let mut c = common::batchonce(db, Some(config));
    c.env("PROGRAM_DATABASE_URL", &db.url);
    c
}

fn enqueue(db: &TestDb, config: &Path, job: &str) {
    let out = bin(db, config)
        .args(["enqueue", job, "--date", "2026-09-15"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn run_row(pool: &PgPool, key: &str) -> (String, i32, Option<String>) {
    sqlx::query_as("SELECT status, attempts, error_message FROM batch_job_run WHERE job_key = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn wait_status(pool: &PgPool, key: &str, want: &[&str]) {
    wait_for_status(pool, Some(key), want, Duration::from_secs(60)).await;
}

fn alive(pid: i32) -> bool {
    // A zombie is gone for our purposes: it runs nothing.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

async fn wait_pid_file(path: &Path) -> i32 {
    let p = path.to_owned();
    wait_until(
        &format!("{}", path.display()),
        Duration::from_secs(30),
        || {
            let p = p.clone();
            async move {
                std::fs::read_to_string(&p).is_ok_and(|s| s.trim().parse::<i32>().is_ok())
            }
        },
    )
    .await;
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

async fn wait_dead(pid: i32, what: &str) {
    wait_until(what, Duration::from_secs(10), || async move { !alive(pid) }).await;
}

/// A script that starts a background `sleep` in its group, writes both
/// pids, and waits; on SIGTERM it notes `TERM`, cleans up for 1.8s (longer
/// than the supervisor's deadline of a 2s lease without renewals) and notes
/// `CLEAN`.
fn long_script(out: &Path) -> String {
    format!(
        "trap 'echo TERM >> {o}/term.log; sleep 1.8; echo CLEAN >> {o}/term.log; exit 143' TERM; sleep 300 & echo $! > {o}/bg.pid; echo $$ > {o}/sh.pid; wait",
        o = out.display()
    )
}

#[tokio::test]
async fn the_environment_exit_codes_and_timeout_follow_the_contract() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let dir = scratch("cmd-contract");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let cfg = dir.join("batchonce.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[jobs.cmd-env]
command = ["sh", "-c", "env | grep -E '^(BATCHONCE_|DATABASE_URL=|EXTRA=|PGAPPNAME=)' | sort > \"$OUT/env.txt\"; pwd > \"$OUT/pwd.txt\"; echo hello from the script; echo warning on stderr >&2"]
env = {{ OUT = "{out}", EXTRA = "yes" }}
database_url_env = "PROGRAM_DATABASE_URL"
working_dir = "{dir}"
timezone = "Asia/Seoul"

[jobs.cmd-skip]
command = ["sh", "-c", "echo checking; echo no orders for $BATCHONCE_BUSINESS_DATE; exit 3"]

[jobs.cmd-fatal]
command = ["sh", "-c", "echo the input file is corrupt >&2; exit 2"]
max_attempts = 3

[jobs.cmd-retry]
command = ["sh", "-c", "echo attempt $BATCHONCE_ATTEMPT >&2; [ \"$BATCHONCE_ATTEMPT\" -ge 2 ] && exit 0; exit 1"]
max_attempts = 3
backoff = "200ms"

[jobs.cmd-missing]
command = ["./no-such-program"]

[jobs.cmd-timeout]
command = ["sh", "-c", "{long}"]
env = {{ OUT = "{out}" }}
timeout = "1s"
kill_grace = "500ms"
max_attempts = 1
"#,
            out = out.display(),
            dir = dir.display(),
            long = long_script(&out),
        ),
    )
    .unwrap();
    for job in [
        "cmd-env",
        "cmd-skip",
        "cmd-fatal",
        "cmd-retry",
        "cmd-missing",
        "cmd-timeout",
    ] {
        enqueue(&db, &cfg, job);
    }
    let worker = common::spawn_worker(bin(&db, &cfg), &dir, "w1", CONCURRENCY);
    let keys = [
        "cmd-env:2026-09-15",
        "cmd-skip:2026-09-15",
        "cmd-fatal:2026-09-15",
        "cmd-retry:2026-09-15",
        "cmd-missing:2026-09-15",
        "cmd-timeout:2026-09-15",
    ];
    for k in keys {
        wait_status(&db.pool, k, &["SUCCEEDED", "SKIPPED", "FAILED"]).await;
    }
    assert!(stop(worker).success());

    // Environment: the run's identity and lease token, the database URL of
    // database_url_env, and the configured extras; the configured working
    // directory.
    let (status, attempts, _) = run_row(&db.pool, keys[0]).await;
    assert_eq!((status.as_str(), attempts), ("SUCCEEDED", 1));
    let token: i64 =
        sqlx::query_scalar("SELECT lease_token FROM batch_job_attempt WHERE job_key = $1")
            .bind(keys[0])
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let env = std::fs::read_to_string(out.join("env.txt")).unwrap();
    for want in [
        "BATCHONCE_JOB_KEY=cmd-env:2026-09-15".to_owned(),
        "BATCHONCE_JOB_NAME=cmd-env".to_owned(),
        "BATCHONCE_BUSINESS_DATE=2026-09-15".to_owned(),
        "BATCHONCE_ATTEMPT=1".to_owned(),
        format!("BATCHONCE_LEASE_TOKEN={token}"),
        "BATCHONCE_WORKER_ID=w1".to_owned(),
        "BATCHONCE_TIMEZONE=Asia/Seoul".to_owned(),
        "BATCHONCE_PAYLOAD={}".to_owned(),
        format!("BATCHONCE_DATABASE_URL={}", db.url),
        format!("DATABASE_URL={}", db.url),
        "EXTRA=yes".to_owned(),
        // The run's lease, for the rule on fenced transactions, and the
        // worker's id as the program's sessions' application name.
        "BATCHONCE_LEASE_TTL_MS=30000".to_owned(),
        "PGAPPNAME=w1".to_owned(),
    ] {
        assert!(
            env.lines().any(|l| l == want),
            "{want} missing from:\n{env}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(out.join("pwd.txt")).unwrap().trim(),
        std::fs::canonicalize(&dir).unwrap().display().to_string()
    );
    // Output reaches the worker's log, line by line, with its stream.
    let log = std::fs::read_to_string(dir.join("w1.log")).unwrap();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let said = |stream: &str, text: &str| {
        lines.iter().any(|l| {
            l["stream"] == stream && l["line"] == text && l["job_key"] == "cmd-env:2026-09-15"
        })
    };
    assert!(said("stdout", "hello from the script"), "{log}");
    assert!(said("stderr", "warning on stderr"), "{log}");

    // `runs show` keeps the last lines of every attempt, successful ones
    // included, and of each attempt of a retried run.
    let show = |key: &str| {
        let out = bin(&db, &cfg).args(["runs", "show", key]).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let shown = show(keys[0]);
    assert!(
        shown.contains("output of attempt 1 (last lines):")
            && shown.contains("    stdout: hello from the script")
            && shown.contains("    stderr: warning on stderr"),
        "{shown}"
    );
    let shown = show(keys[3]);
    assert!(
        shown.contains("output of attempt 1 (last lines):\n    stderr: attempt 1")
            && shown.contains("output of attempt 2 (last lines):\n    stderr: attempt 2"),
        "{shown}"
    );

    // Exit 3: SKIPPED with the last line printed as the reason.
    let (status, _, reason) = run_row(&db.pool, keys[1]).await;
    assert_eq!(status, "SKIPPED");
    assert_eq!(reason.as_deref(), Some("no orders for 2026-09-15"));
    // Exit 2: FAILED at once, with the program's last words.
    let (status, attempts, error) = run_row(&db.pool, keys[2]).await;
    assert_eq!((status.as_str(), attempts), ("FAILED", 1));
    let error = error.unwrap();
    assert!(
        error.contains("exited 2") && error.contains("the input file is corrupt"),
        "{error}"
    );
    // Exit 1: retried; the second attempt succeeds.
    let (status, attempts, _) = run_row(&db.pool, keys[3]).await;
    assert_eq!((status.as_str(), attempts), ("SUCCEEDED", 2));
    // A program that does not exist fails at once with a clear reason.
    let (status, attempts, error) = run_row(&db.pool, keys[4]).await;
    assert_eq!((status.as_str(), attempts), ("FAILED", 1));
    assert!(error
        .unwrap()
        .contains("cannot start `./no-such-program`: not found"));
    // Timeout: the whole group is stopped, the attempt counts as failed.
    let (status, attempts, error) = run_row(&db.pool, keys[5]).await;
    assert_eq!((status.as_str(), attempts), ("FAILED", 1));
    assert!(error.unwrap().contains("timed out after 1s"));
    for pid in ["sh.pid", "bg.pid"] {
        let pid = wait_pid_file(&out.join(pid)).await;
        wait_dead(pid, pid_what(pid)).await;
    }
    assert!(std::fs::read_to_string(out.join("term.log"))
        .unwrap()
        .contains("TERM"));
}

fn pid_what(_pid: i32) -> &'static str {
    "the timed-out program's processes to be gone"
}

#[tokio::test]
async fn a_lost_lease_kills_the_process_group_and_shutdown_stops_it() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let dir = scratch("cmd-group");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let cfg = dir.join("batchonce.toml");
    std::fs::write(
        &cfg,
        format!(
            "[jobs.cmd-long]\ncommand = [\"sh\", \"-c\", \"{}\"]\nlease_ttl = \"2s\"\nkill_grace = \"3s\"\n",
            long_script(&out)
        ),
    )
    .unwrap();
    let key = "cmd-long:2026-09-15";
    enqueue(&db, &cfg, "cmd-long");
    let worker = common::spawn_worker(bin(&db, &cfg), &dir, "w1", CONCURRENCY);
    let sh = wait_pid_file(&out.join("sh.pid")).await;
    let bg = wait_pid_file(&out.join("bg.pid")).await;
    assert!(alive(sh) && alive(bg));
    // An operator fails the run: its token changes, the worker's next
    // heartbeat finds the lease gone, and the group is killed outright.
    let o = bin(&db, &cfg)
        .args([
            "runs",
            "fail",
            key,
            "--reason",
            "stuck report",
            "--operator",
            "kim",
            "--force",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_dead(sh, "the script to be killed").await;
    wait_dead(bg, "its background child to be killed").await;
    assert!(
        !out.join("term.log").exists(),
        "a lost lease kills at once, without SIGTERM"
    );
    assert_eq!(run_row(&db.pool, key).await.0, "FAILED");

    // The same worker carries on: a re-run starts the program again, and
    // SIGTERM to the worker stops the group with SIGTERM and releases it.
    for f in ["sh.pid", "bg.pid"] {
        std::fs::remove_file(out.join(f)).unwrap();
    }
    let o = bin(&db, &cfg)
        .args([
            "runs",
            "rerun",
            key,
            "--reason",
            "again",
            "--operator",
            "kim",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let sh = wait_pid_file(&out.join("sh.pid")).await;
    let bg = wait_pid_file(&out.join("bg.pid")).await;
    assert!(stop(worker).success());
    assert!(!alive(sh) && !alive(bg));
    // The lease was renewed through kill_grace, so the supervisor let the
    // program clean up.
    assert_eq!(
        std::fs::read_to_string(out.join("term.log")).unwrap(),
        "TERM\nCLEAN\n"
    );
    let (status, _, _) = run_row(&db.pool, key).await;
    assert_eq!(status, "PENDING", "released for another worker");
    let log = std::fs::read_to_string(dir.join("w1.log")).unwrap();
    assert!(log.contains("lease lost"), "{log}");
}

/// The parent of `pid`, from `/proc`.
fn parent_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat.rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

/// A SIGKILLed worker cannot act, but its end of the control socket closes:
/// the supervisor kills the program's whole group at once, background
/// children included, and goes.
#[tokio::test]
async fn a_sigkilled_worker_takes_its_program_with_it() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let dir = scratch("cmd-pdeathsig");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let cfg = dir.join("batchonce.toml");
    std::fs::write(
        &cfg,
        format!(
            "[jobs.cmd-sleep]\ncommand = [\"sh\", \"-c\", \"{}\"]\n",
            long_script(&out)
        ),
    )
    .unwrap();
    enqueue(&db, &cfg, "cmd-sleep");
    let mut worker = common::spawn_worker(bin(&db, &cfg), &dir, "w1", CONCURRENCY);
    let sh = wait_pid_file(&out.join("sh.pid")).await;
    let bg = wait_pid_file(&out.join("bg.pid")).await;
    let supervisor = parent_of(sh);
    assert_ne!(
        supervisor,
        worker.id() as i32,
        "the program runs under a supervisor"
    );
    assert_eq!(parent_of(supervisor), worker.id() as i32);
    assert!(alive(sh) && alive(bg));
    worker.kill().unwrap();
    worker.wait().unwrap();
    // The supervisor reaps the program: its pid is gone, not a zombie.
    wait_until(
        "the program of the SIGKILLed worker to be gone",
        Duration::from_secs(10),
        || async move { kill(Pid::from_raw(sh), None) == Err(nix::errno::Errno::ESRCH) },
    )
    .await;
    wait_dead(bg, "its background child to die").await;
    wait_dead(supervisor, "the supervisor to exit").await;
    assert!(
        !out.join("term.log").exists(),
        "a worker that is gone gets its program killed, not terminated"
    );
}

/// Enqueues and claims one `cmd-x` run of `date` whose lease lasts `ttl`.
async fn claim_cmd_x(pool: &PgPool, date: &str, ttl: Duration) -> queue::Lease {
    let date: NaiveDate = date.parse().unwrap();
    let job = JobName::parse("cmd-x").unwrap();
    let run = NewRun::new(
        JobKey::daily(&job, date),
        date,
        &batchonce::JobConfig {
            max_attempts: 3,
            lease_ttl: ttl,
            ..Default::default()
        },
    )
    .unwrap();
    queue::enqueue(pool, std::slice::from_ref(&run), Clock::Db)
        .await
        .unwrap();
    let spec = ClaimSpec {
        job,
        lease_ttl: ttl,
    };
    let lease = queue::claim(pool, "t", &[spec], 1, Clock::Db)
        .await
        .unwrap()
        .pop()
        .expect("the run just enqueued is claimed");
    assert_eq!(lease.key, run.key);
    lease
}

/// Opens a transaction and calls the fence in it first, as a command
/// program does.
async fn open_fence(
    pool: &PgPool,
    key: &JobKey,
    token: i64,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT batchonce_fence($1, $2)")
        .bind(key.as_str())
        .bind(token)
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

/// The fence's refusal: SQLSTATE BO001, naming the run and the token.
fn assert_fence_refused<T>(r: Result<T, sqlx::Error>, key: &JobKey, token: i64, why: &str) {
    let err = match r {
        Ok(_) => panic!("the fence admitted token {token} of {key}, {why}"),
        Err(e) => e,
    };
    let db_err = err
        .as_database_error()
        .unwrap_or_else(|| panic!("{why}: not a database error: {err}"));
    assert_eq!(db_err.code().as_deref(), Some("BO001"), "{why}: {err}");
    assert!(
        db_err
            .message()
            .contains(&format!("lease lost for {key} (token {token})")),
        "{why}: {err}"
    );
}

/// The items committed so far.
async fn items(pool: &PgPool) -> Vec<i32> {
    sqlx::query_scalar("SELECT n FROM t_item ORDER BY n")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// The SQL fence of command programs (`batchonce_fence`) admits the run's
/// current token only: after a takeover the old token is refused and the
/// new one admitted. While a transaction holds the fence, recovery does not
/// take the run over and an operator's takeover waits for that transaction
/// to end; what it wrote commits.
#[tokio::test]
async fn the_sql_fence_refuses_a_token_that_lost_the_lease() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    sqlx::query("CREATE TABLE t_item (n int)")
        .execute(&db.pool)
        .await
        .unwrap();
    let ttl = Duration::from_secs(30);
    let a = claim_cmd_x(&db.pool, "2026-09-15", ttl).await;
    let key = a.key.clone();
    let job = JobName::parse("cmd-x").unwrap();
    let mut tx = open_fence(&db.pool, &key, a.token)
        .await
        .expect("the fence refused the token just claimed");
    sqlx::query("INSERT INTO t_item VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    // The lease is past its end by the clock recovery is given, but the
    // fence holds the row: recovery leaves it alone.
    let db_now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let later = Clock::At(db_now + chrono::Duration::minutes(2));
    let rec = queue::recover_expired(&db.pool, std::slice::from_ref(&job), &[], later)
        .await
        .unwrap();
    assert!(rec.is_empty(), "recovered under an open fence: {rec:?}");
    tx.commit().await.unwrap();
    assert_eq!(items(&db.pool).await, vec![1], "the fenced write committed");

    // Now it is taken over: recovery, then another claim, token B.
    let rec = queue::recover_expired(&db.pool, std::slice::from_ref(&job), &[], later)
        .await
        .unwrap();
    assert_eq!(rec.len(), 1, "{rec:?}");
    let spec = ClaimSpec {
        job: job.clone(),
        lease_ttl: ttl,
    };
    let b = queue::claim(&db.pool, "t2", &[spec], 1, later)
        .await
        .unwrap()
        .pop()
        .expect("the recovered run is claimed again");
    assert_eq!((b.key.clone(), b.attempt), (key.clone(), 2));
    assert_ne!(b.token, a.token);
    // The old holder's token is refused, and what its transaction wrote
    // before the fence does not commit.
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("INSERT INTO t_item VALUES (2)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let refused = sqlx::query("SELECT batchonce_fence($1, $2)")
        .bind(key.as_str())
        .bind(a.token)
        .execute(&mut *tx)
        .await;
    assert_fence_refused(refused, &key, a.token, "after a takeover");
    // The refusal aborted the transaction: its COMMIT can only roll back.
    let _ = tx.commit().await;
    assert_fence_refused(
        open_fence(&db.pool, &key, a.token).await,
        &key,
        a.token,
        "after a takeover",
    );
    assert_eq!(
        items(&db.pool).await,
        vec![1],
        "a refused fence's write committed"
    );
    // The current token is admitted.
    let mut tx = open_fence(&db.pool, &key, b.token)
        .await
        .expect("the fence refused the current token");
    sqlx::query("INSERT INTO t_item VALUES (3)")
        .execute(&mut *tx)
        .await
        .unwrap();
    // While B's transaction holds the fence, an operator's takeover (fail,
    // which gives the run a new token) waits for it.
    let request = queue::OperatorRequest {
        action: queue::Action::Fail,
        key: key.clone(),
        operator: "kim".into(),
        reason: "the program hangs".into(),
        force: true,
        stale_after: Duration::from_secs(1200),
        max_attempts: 3,
    };
    let pool = db.pool.clone();
    let takeover =
        tokio::spawn(async move { queue::apply_action(&pool, &request, Clock::Db).await });
    wait_until(
        "the operator's takeover to wait on the fenced row",
        Duration::from_secs(10),
        || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND wait_event_type = 'Lock' AND query LIKE '%batchonce_operator_check%'",
            )
            .fetch_one(&db.pool)
            .await
            .unwrap()
                == 1
        },
    )
    .await;
    assert!(
        !takeover.is_finished(),
        "the takeover did not wait for the fence"
    );
    let (status, _, _) = run_row(&db.pool, key.as_str()).await;
    assert_eq!(status, "RUNNING");
    tx.commit().await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(10), takeover)
        .await
        .expect("the takeover did not go through within 10 s of the fence's end")
        .unwrap()
        .unwrap()
        .unwrap_or_else(|r| panic!("the takeover was refused: {r}"));
    assert_eq!(
        (outcome.before.as_str(), outcome.after.as_str()),
        ("RUNNING", "FAILED")
    );
    assert_eq!(items(&db.pool).await, vec![1, 3]);
    // And after it, B is refused too.
    assert_fence_refused(
        open_fence(&db.pool, &key, b.token).await,
        &key,
        b.token,
        "after the operator failed the run",
    );
}

/// A lease that ran out, although nobody took the run over yet (still
/// RUNNING under the same token), is refused by the fence.
#[tokio::test]
async fn the_sql_fence_refuses_an_expired_lease() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let c = claim_cmd_x(&db.pool, "2026-09-16", Duration::from_secs(1)).await;
    // The fence reads the database's clock: wait until it says the lease
    // is over.
    wait_until(
        "the 1 s lease to expire on the database clock",
        Duration::from_secs(10),
        || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT lease_expires_at <= clock_timestamp() FROM batch_job_run",
            )
            .fetch_one(&db.pool)
            .await
            .unwrap()
        },
    )
    .await;
    let (status, token): (String, Option<i64>) =
        sqlx::query_as("SELECT status, lease_token FROM batch_job_run")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((status.as_str(), token), ("RUNNING", Some(c.token)));
    assert_fence_refused(
        open_fence(&db.pool, &c.key, c.token).await,
        &c.key,
        c.token,
        "whose lease expired",
    );
}

/// The Node.js example of docs/command-jobs.md: `examples/node-invoices`, SIGKILLed
/// mid-run, retried by another worker, every invoice written once. Needs
/// `npm ci` in that folder (`.ci/run` does it); elsewhere it says so and
/// passes, except under CI, where a missing install is a failure.
#[tokio::test]
async fn the_node_example_invoices_exactly_once_across_a_sigkill() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/node-invoices");
    let example = std::fs::canonicalize(example).unwrap();
    if !example.join("node_modules/pg").is_dir() {
        let msg = format!(
            "examples/node-invoices has no node_modules: run `npm ci --prefix {}`",
            example.display()
        );
        assert!(std::env::var("CI").is_err(), "{msg}");
        eprintln!("skipped: {msg}");
        return;
    }
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    sqlx::raw_sql(&std::fs::read_to_string(example.join("schema.sql")).unwrap())
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO subscription SELECT g, 1000 + g FROM generate_series(1, 2000) g")
        .execute(&db.pool)
        .await
        .unwrap();
    let dir = scratch("cmd-node");
    let cfg = dir.join("batchonce.toml");
    std::fs::write(
        &cfg,
        format!(
            "[jobs.nightly-invoices]\ncommand = [\"node\", \"invoices.js\"]\nworking_dir = \"{}\"\n\
             env = {{ INVOICE_CHUNK = \"50\", INVOICE_PAUSE_MS = \"40\" }}\n\
             database_url_env = \"PROGRAM_DATABASE_URL\"\nlease_ttl = \"2s\"\nbackoff = \"500ms\"\n",
            example.display()
        ),
    )
    .unwrap();
    let key = "nightly-invoices:2026-09-15";
    enqueue(&db, &cfg, "nightly-invoices");
    let mut first = common::spawn_worker(bin(&db, &cfg), &dir, "n1", CONCURRENCY);
    wait_for_count(
        &db.pool,
        "invoices under way",
        "SELECT count(*) FROM invoice",
        300,
        Duration::from_secs(30),
    )
    .await;
    first.kill().unwrap();
    first.wait().unwrap();
    let second = common::spawn_worker(bin(&db, &cfg), &dir, "n2", CONCURRENCY);
    wait_status(&db.pool, key, &["SUCCEEDED", "FAILED"]).await;
    assert!(stop(second).success());
    let (status, attempts, _) = run_row(&db.pool, key).await;
    assert_eq!((status.as_str(), attempts), ("SUCCEEDED", 2));
    let (n, distinct, total): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT customer_id), sum(amount_minor)::bigint FROM invoice",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((n, distinct), (2000, 2000));
    assert_eq!(total, (1..=2000i64).map(|g| 1000 + g).sum::<i64>());
    // Every invoice names one of the run's two attempts (by number: the
    // example stores no token).
    let foreign: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM invoice i WHERE i.job_key <> $1 OR NOT EXISTS \
         (SELECT 1 FROM batch_job_attempt a WHERE a.job_key = $1 AND a.attempt = i.attempt)",
    )
    .bind(key)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(foreign, 0);
    // The package reported each chunk's new invoices with the chunk, so the
    // run's count is exact across the crash: what the killed attempt counted
    // committed with its invoices, and nothing else of it did.
    let processed: i64 =
        sqlx::query_scalar("SELECT processed_count FROM batch_job_run WHERE job_key = $1")
            .bind(key)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(processed, 2000);
    let log = std::fs::read_to_string(dir.join("n2.log")).unwrap();
    assert!(log.contains("new invoices"), "{log}");
    // With nothing to invoice, the script exits 3 and the run is SKIPPED.
    sqlx::query("DELETE FROM subscription")
        .execute(&db.pool)
        .await
        .unwrap();
    let o = bin(&db, &cfg)
        .args(["enqueue", "nightly-invoices", "--date", "2026-09-16"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let w = common::spawn_worker(bin(&db, &cfg), &dir, "n3", CONCURRENCY);
    let key2 = "nightly-invoices:2026-09-16";
    wait_status(&db.pool, key2, &["SKIPPED", "FAILED", "SUCCEEDED"]).await;
    assert!(stop(w).success());
    let (status, _, reason) = run_row(&db.pool, key2).await;
    assert_eq!(status, "SKIPPED");
    assert_eq!(
        reason.as_deref(),
        Some("no subscriptions to invoice for 2026-09-16")
    );
}

#[test]
fn a_command_job_with_bad_config_is_refused_with_one_line() {
    let dir = scratch("cmd-bad");
    for (text, want) in [
        (
            "[jobs.x]\ncommand = \"node x.js\"",
            "`jobs.x.command`: expected an array",
        ),
        (
            "[jobs.x]\ncommand = []",
            "`jobs.x.command`: must name a program",
        ),
        ("[jobs.x]\ntimeout = \"5m\"", "`jobs.x`: unknown job"),
        (
            "[jobs.x]\ncommand = [\"true\"]\ntimeout = \"never\"",
            "`jobs.x.timeout`: invalid duration",
        ),
        (
            "[jobs.daily-settlement]\ncommand = [\"true\"]",
            "built-in job kind",
        ),
    ] {
        common::config_refused(
            common::BIN,
            &dir,
            text,
            &["enqueue", "x", "--date", "2026-09-15"],
            want,
        );
    }
}

/// Kills the worker processes it holds when dropped, SIGCONT first, so a
/// failing test leaves no stopped worker behind.
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for w in &mut self.0 {
            let _ = kill(Pid::from_raw(w.id() as i32), Signal::SIGCONT);
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

fn unix_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// `(attempt, nanosecond timestamp)` of every line the overlap script wrote.
fn stamped_lines(path: &Path) -> Vec<(i32, i64)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (a, t) = l.split_once(' ')?;
            Some((a.parse().ok()?, t.parse().ok()?))
        })
        .collect()
}

/// The issue's acceptance test: the worker holding a command job's lease is
/// SIGSTOPped while its program runs. The program must be gone before the
/// lease could expire, so the copy another worker starts after the takeover
/// never overlaps it, by the programs' own clocks.
#[tokio::test]
async fn a_sigstopped_workers_program_is_gone_before_another_copy_starts() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let dir = scratch("cmd-overlap");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let cfg = dir.join("batchonce.toml");
    // About 6s of one line every 50ms, then exit 0.
    let script = "echo $$ > \\\"$OUT/pid.$BATCHONCE_ATTEMPT\\\"; i=0; \
                  while [ $i -lt 120 ]; do echo \\\"$BATCHONCE_ATTEMPT $(date +%s%N)\\\" >> \\\"$OUT/lines\\\"; \
                  i=$((i + 1)); sleep 0.05; done";
    std::fs::write(
        &cfg,
        format!(
            "[jobs.cmd-overlap]\ncommand = [\"sh\", \"-c\", \"{script}\"]\nenv = {{ OUT = \"{}\" }}\n\
             lease_ttl = \"2s\"\nbackoff = \"200ms\"\n",
            out.display()
        ),
    )
    .unwrap();
    let key = "cmd-overlap:2026-09-15";
    enqueue(&db, &cfg, "cmd-overlap");
    let mut workers = Workers(vec![
        common::spawn_worker(bin(&db, &cfg), &dir, "w1", CONCURRENCY),
        common::spawn_worker(bin(&db, &cfg), &dir, "w2", CONCURRENCY),
    ]);
    let lines = out.join("lines");
    let first_pid = wait_pid_file(&out.join("pid.1")).await;
    wait_until("the first copy to write", Duration::from_secs(30), || {
        let n = stamped_lines(&lines).len();
        async move { n >= 3 }
    })
    .await;
    let (owner, token): (String, i64) =
        sqlx::query_as("SELECT lease_owner, lease_token FROM batch_job_run WHERE job_key = $1")
            .bind(key)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let holder = if owner == "w1" { 0 } else { 1 };
    let holder_pid = Pid::from_raw(workers.0[holder].id() as i32);
    kill(holder_pid, Signal::SIGSTOP).unwrap();
    let stopped_at = unix_nanos();
    // Until the other worker holds the run and its copy has written, note
    // the old lease's expiry: its last value is when the lease ran out.
    let mut expiry_ns = 0i64;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (now_token, expires): (Option<i64>, Option<i64>) = sqlx::query_as(
            "SELECT lease_token, (extract(epoch FROM lease_expires_at) * 1e9)::bigint \
             FROM batch_job_run WHERE job_key = $1",
        )
        .bind(key)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if now_token == Some(token) {
            expiry_ns = expires.unwrap_or(0);
        } else if stamped_lines(&lines).iter().any(|(a, _)| *a == 2) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the other worker did not run its copy within 60s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Still stopped: its program must already be gone.
    let first_alive_while_stopped = alive(first_pid);
    kill(holder_pid, Signal::SIGCONT).unwrap();
    wait_status(&db.pool, key, &["SUCCEEDED", "FAILED"]).await;
    for w in workers.0.drain(..) {
        assert!(stop(w).success());
    }
    assert_eq!(run_row(&db.pool, key).await.0, "SUCCEEDED");

    let stamped = stamped_lines(&lines);
    let last_first = stamped
        .iter()
        .filter(|(a, _)| *a == 1)
        .map(|(_, t)| *t)
        .max()
        .unwrap();
    let first_second = stamped
        .iter()
        .filter(|(a, _)| *a == 2)
        .map(|(_, t)| *t)
        .min()
        .unwrap();
    let ms = |ns: i64| ns as f64 / 1e6;
    let takeover_ns: i64 = sqlx::query_scalar(
        "SELECT (extract(epoch FROM started_at) * 1e9)::bigint FROM batch_job_attempt \
         WHERE job_key = $1 AND attempt = 2",
    )
    .bind(key)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    println!(
        "{}",
        serde_json::json!({
            "scenario": "command-sigstop",
            "lease_ttl_ms": 2000,
            "first_copy_last_line_after_sigstop_ms": ms(last_first - stopped_at),
            "first_copy_last_line_before_lease_expiry_ms": ms(expiry_ns - last_first),
            "takeover_after_sigstop_ms": ms(takeover_ns - stopped_at),
            "gap_between_copies_ms": ms(first_second - last_first),
        })
    );
    assert!(
        !first_alive_while_stopped,
        "the first copy (pid {first_pid}) was still running while its worker was stopped and another copy ran"
    );
    assert!(
        last_first < first_second,
        "the two copies overlapped: the first wrote until {last_first}, the second from {first_second}"
    );
    assert!(expiry_ns > 0, "the old lease's expiry was never seen");
    assert!(
        last_first < expiry_ns,
        "the first copy wrote {:.0}ms after its lease expired",
        ms(last_first - expiry_ns)
    );
}

/// A program that reports its items with `batchonce_progress` and keeps a
/// database session of its own: while it runs, `runs stale` sees the run
/// advancing and the program's session under the worker's name; after, the
/// counts stay on the run and the attempt, next to the program's last lines.
#[tokio::test]
async fn a_programs_progress_and_session_show_in_the_operators_view() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let dir = scratch("cmd-progress");
    let cfg = dir.join("batchonce.toml");
    std::fs::write(
        &cfg,
        r#"
[jobs.cmd-progress]
command = ["sh", "-c", "for i in 1 2 3; do psql \"$DATABASE_URL\" -v ON_ERROR_STOP=1 -qAtc \"BEGIN; SELECT batchonce_fence('$BATCHONCE_JOB_KEY', $BATCHONCE_LEASE_TOKEN); SELECT batchonce_progress('$BATCHONCE_JOB_KEY', $BATCHONCE_LEASE_TOKEN, 10, 1); COMMIT;\" > /dev/null || exit 1; done; psql \"$DATABASE_URL\" -qAtc 'SELECT pg_sleep(5)' > /dev/null; echo settled 30 items"]
database_url_env = "PROGRAM_DATABASE_URL"
lease_ttl = "2s"
stale_after = "2s"
"#,
    )
    .unwrap();
    enqueue(&db, &cfg, "cmd-progress");
    let key = "cmd-progress:2026-09-15";
    let worker = common::spawn_worker(bin(&db, &cfg), &dir, "w1", CONCURRENCY);
    wait_for_count(
        &db.pool,
        "the program's own session, named after its worker",
        "SELECT count(*) FROM pg_stat_activity \
         WHERE application_name = 'w1' AND query LIKE 'SELECT pg_sleep(5)%'",
        1,
        Duration::from_secs(30),
    )
    .await;
    // Past its 2 s stale_after, while the program sleeps in its session.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let run = loop {
        let stale = queue::stale_runs(&db.pool, Clock::Db).await.unwrap();
        if let Some(r) = stale.into_iter().find(|r| r.job_key == key) {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{key} never became stale"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(run.processed_count, 30, "{run:?}");
    assert!(run.session_alive, "{run:?}");
    assert_eq!(run.conclusion, queue::Conclusion::AliveSlow, "{run:?}");
    wait_status(&db.pool, key, &["SUCCEEDED"]).await;
    assert!(stop(worker).success());
    let (run_counts, attempt_counts): ((i64, i64), (i64, i64)) = (
        sqlx::query_as(
            "SELECT processed_count, failed_count FROM batch_job_run WHERE job_key = $1",
        )
        .bind(key)
        .fetch_one(&db.pool)
        .await
        .unwrap(),
        sqlx::query_as(
            "SELECT processed_count, failed_count FROM batch_job_attempt WHERE job_key = $1",
        )
        .bind(key)
        .fetch_one(&db.pool)
        .await
        .unwrap(),
    );
    assert_eq!((run_counts, attempt_counts), ((30, 3), (30, 3)));
    let out = bin(&db, &cfg).args(["runs", "show", key]).output().unwrap();
    let shown = String::from_utf8(out.stdout).unwrap();
    assert!(shown.contains("    stdout: settled 30 items"), "{shown}");
}

/// The report example writes nothing to the database of its own: the fence
/// alone keeps it once. It sends once per date, a duplicate enqueue sends
/// nothing, and a copy whose lease was taken over never starts sending.
#[tokio::test]
async fn the_node_report_example_sends_once_and_never_after_a_lost_lease() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/node-report");
    let example = std::fs::canonicalize(example).unwrap();
    if !example.join("node_modules/batchonce").is_dir() {
        let msg = format!(
            "examples/node-report has no node_modules: run `npm ci --prefix {}`",
            example.display()
        );
        assert!(std::env::var("CI").is_err(), "{msg}");
        eprintln!("skipped: {msg}");
        return;
    }
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    sqlx::raw_sql(&std::fs::read_to_string(example.join("schema.sql")).unwrap())
        .execute(&db.pool)
        .await
        .unwrap();
    // Three orders in Seoul's 2026-09-15, one the day after.
    sqlx::query(
        "INSERT INTO report_order VALUES (1, '2026-09-15 00:10+09'), (2, '2026-09-15 12:00+09'), \
         (3, '2026-09-15 23:59+09'), (4, '2026-09-16 00:00+09')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let dir = scratch("cmd-report");
    let outbox = dir.join("outbox");
    let cfg = dir.join("batchonce.toml");
    std::fs::write(
        &cfg,
        format!(
            "[jobs.daily-report]\ncommand = [\"node\", \"report.js\"]\nworking_dir = \"{}\"\n\
             env = {{ REPORT_OUTBOX = \"{}\" }}\ntimezone = \"Asia/Seoul\"\n\
             database_url_env = \"PROGRAM_DATABASE_URL\"\nlease_ttl = \"5s\"\n",
            example.display(),
            outbox.display()
        ),
    )
    .unwrap();
    let key = "daily-report:2026-09-15";
    enqueue(&db, &cfg, "daily-report");
    let w = common::spawn_worker(bin(&db, &cfg), &dir, "r1", CONCURRENCY);
    wait_status(&db.pool, key, &["SUCCEEDED", "FAILED"]).await;
    // Enqueued again: a duplicate, so nothing runs and nothing is sent.
    let again = bin(&db, &cfg)
        .args(["enqueue", "daily-report", "--date", "2026-09-15"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&again.stdout).contains("duplicate"));
    assert!(stop(w).success());
    assert_eq!(run_row(&db.pool, key).await.0, "SUCCEEDED");
    let sent = std::fs::read_to_string(&outbox).unwrap();
    assert_eq!(sent, format!("{key}\torders on 2026-09-15: 3\n"));

    // A copy started with a token that was taken over: refused at the fence,
    // before it sends. The run is claimed here, then its token changes.
    enqueue_date(&db, &cfg, "daily-report", "2026-09-16");
    let (stale_key, token): (String, i64) = sqlx::query_as(
        "SELECT job_key, lease_token FROM batchonce_claim(ARRAY['daily-report'], \
         ARRAY[30::float8], 1, 'someone', NULL)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    sqlx::query("UPDATE batch_job_run SET lease_token = lease_token + 1 WHERE job_key = $1")
        .bind(&stale_key)
        .execute(&db.pool)
        .await
        .unwrap();
    let out = Command::new("node")
        .arg("report.js")
        .current_dir(&example)
        .env("REPORT_OUTBOX", &outbox)
        .env("DATABASE_URL", &db.url)
        .env("BATCHONCE_JOB_KEY", &stale_key)
        .env("BATCHONCE_JOB_NAME", "daily-report")
        .env("BATCHONCE_BUSINESS_DATE", "2026-09-16")
        .env("BATCHONCE_ATTEMPT", "1")
        .env("BATCHONCE_LEASE_TOKEN", token.to_string())
        .env("BATCHONCE_TIMEZONE", "Asia/Seoul")
        .env("BATCHONCE_PERIOD_START", "2026-09-15T15:00:00+00:00")
        .env("BATCHONCE_PERIOD_END", "2026-09-16T15:00:00+00:00")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("lease lost for daily-report:2026-09-16"),
        "{out:?}"
    );
    assert_eq!(
        std::fs::read_to_string(&outbox).unwrap(),
        sent,
        "the copy without a lease sent"
    );
}

fn enqueue_date(db: &TestDb, config: &Path, job: &str, date: &str) {
    let out = bin(db, config)
        .args(["enqueue", job, "--date", date])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
