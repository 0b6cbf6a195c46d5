//! A command job that follows the documented rule (every write inside a
//! transaction that first calls `batchonce_fence`, each shorter than the
//! lease) keeps its lease however much of the lease each transaction takes
//! (issue 15, item 3). The script runs `psql` back to back, so its fence is
//! held almost all the time; the worker's heartbeat must still extend the
//! lease, or the supervisor kills the program and another attempt starts.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use batchonce::testing::{wait_for_status, TestDb};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");
const KEY: &str = "fenced-script:2026-09-15";
const TRANSACTIONS: i64 = 4;

fn scratch(name: &str) -> PathBuf {
    batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), name)
}

fn psql() -> String {
    let found = ["/usr/bin/psql", "/usr/local/bin/psql"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    match found {
        Some(p) => p.to_owned(),
        // PostgreSQL's client comes with the server packages the tests
        // need anyway; without it this test cannot say anything.
        None => panic!("psql is not installed (apt-get install -y postgresql-client)"),
    }
}

/// How the script is written: `psql` with hand-written `batchonce_fence`
/// calls, or Node.js with the `batchonce` package's `fenced`.
#[derive(Clone, Copy, PartialEq)]
enum Script {
    Psql,
    NodePackage,
}

/// The Node.js script: the same transactions through `fenced`, each also
/// reporting its row with `tx.progress`.
fn write_node_script(dir: &Path, hold: f64) -> PathBuf {
    let script = dir.join("fenced.js");
    std::fs::write(
        &script,
        format!(
            r#"'use strict';
const b = require(process.env.NODE_PKG);
const {{ Client }} = require(process.env.NODE_PKG + '/node_modules/pg');
b.run(async (ctx) => {{
  const db = new Client({{ connectionString: ctx.databaseUrl }});
  await db.connect();
  try {{
    for (let i = 1; i <= {TRANSACTIONS}; i++) {{
      await b.fenced(db, ctx, async (tx) => {{
        await tx.query('SELECT pg_sleep($1)', [{hold}]);
        await tx.query('INSERT INTO lease_probe (job_key, n, token) VALUES ($1, $2, $3)', [ctx.key, i, ctx.leaseToken]);
        tx.progress(1);
      }});
    }}
  }} finally {{
    await db.end();
  }}
}});
"#
        ),
    )
    .unwrap();
    script
}

/// A script whose transactions each hold the fence for `hold` seconds.
fn write_script(dir: &Path, hold: f64) -> PathBuf {
    let script = dir.join("fenced.sh");
    std::fs::write(
        &script,
        format!(
            r#"#!/bin/sh
set -eu
{{
for i in $(seq 1 {TRANSACTIONS}); do
  cat <<SQL
BEGIN;
SELECT batchonce_fence('$BATCHONCE_JOB_KEY', $BATCHONCE_LEASE_TOKEN);
SELECT pg_sleep({hold});
INSERT INTO lease_probe (job_key, n, token) VALUES ('$BATCHONCE_JOB_KEY', $i, $BATCHONCE_LEASE_TOKEN);
COMMIT;
SQL
done
}} | {psql} "$DATABASE_URL" -X -q -v ON_ERROR_STOP=1 >/dev/null
"#,
            psql = psql()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    script
}

async fn hold_for(fraction: f64) {
    hold_with(fraction, Script::Psql).await;
}

async fn hold_with(fraction: f64, kind: Script) {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    sqlx::query(
        "CREATE TABLE lease_probe (job_key text NOT NULL, n int NOT NULL, token bigint NOT NULL, \
         PRIMARY KEY (job_key, n))",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let dir = scratch(&format!("command-lease-{}", (fraction * 100.0) as u32));
    let ttl = 2.0;
    let command = match kind {
        Script::Psql => format!("\"{}\"", write_script(&dir, ttl * fraction).display()),
        Script::NodePackage => format!(
            "\"node\", \"{}\"]\nenv = {{ NODE_PKG = \"{}\" }}\n#",
            write_node_script(&dir, ttl * fraction).display(),
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../clients/node")
                .display()
        ),
    };
    let cfg = dir.join("batchonce.toml");
    std::fs::write(
        &cfg,
        format!(
            "[jobs.fenced-script]\ncommand = [{command}]\nlease_ttl = \"{ttl}s\"\nmax_attempts = 3\n\
             database_url_env = \"FENCED_DATABASE_URL\"\n\
             backoff = \"200ms\"\nbackoff_max = \"400ms\"\n"
        ),
    )
    .unwrap();
    let base = || {
        let mut c = Command::new(BIN);
        // The script's URL comes from database_url_env, never from the
        // worker's own DATABASE_URL.
        c.env("DATABASE_URL", &db.url)
            .env("FENCED_DATABASE_URL", &db.url)
            .env_remove("BATCHONCE_CONFIG")
            .arg("--config")
            .arg(&cfg);
        c
    };
    let out = base()
        .args(["enqueue", "fenced-script", "--date", "2026-09-15"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = dir.join("worker.log");
    let mut worker = base()
        .env("RUST_LOG", "info")
        .args([
            "--log-format",
            "json",
            "worker",
            "--worker-id",
            "fenced",
            "--poll-interval",
            "200ms",
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    wait_for_status(
        &db.pool,
        Some(KEY),
        &["SUCCEEDED", "FAILED"],
        Duration::from_secs(60),
    )
    .await;
    let took = started.elapsed();
    if kind == Script::NodePackage {
        // The items the program reported reach the worker's counters.
        let url = format!("http://127.0.0.1:{port}/metrics");
        let text = reqwest::get(&url).await.unwrap().text().await.unwrap();
        let items = text
            .lines()
            .find(|l| l.starts_with("batchonce_items_processed_total{job=\"fenced-script\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok());
        assert_eq!(items, Some(TRANSACTIONS as f64), "{text}");
    }
    let _ = kill(Pid::from_raw(worker.id() as i32), Signal::SIGTERM);
    let _ = worker.wait();
    let logs = std::fs::read_to_string(&log).unwrap();
    let attempts: Vec<(i32, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT attempt, outcome, error_message FROM batch_job_attempt ORDER BY attempt",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        attempts,
        vec![(1, Some("succeeded".to_owned()), None)],
        "fence held {:.0}% of the lease per transaction lost the lease; log:\n{logs}",
        fraction * 100.0
    );
    assert!(!logs.contains("lease_lost"), "{logs}");
    // Every transaction committed, under the one attempt's token.
    let (rows, tokens): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT token) FROM lease_probe")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((rows, tokens), (TRANSACTIONS, 1));
    if kind == Script::NodePackage {
        // The package reported each row with its transaction.
        let processed: i64 = sqlx::query_scalar("SELECT processed_count FROM batch_job_run")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(processed, TRANSACTIONS);
    }
    eprintln!(
        "fence held {:.0}% of a {ttl}s lease in {TRANSACTIONS} transactions: SUCCEEDED in one attempt, {:.1}s",
        fraction * 100.0,
        took.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_holding_its_fence_half_the_lease_keeps_it() {
    hold_for(0.5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_holding_its_fence_nine_tenths_of_the_lease_keeps_it() {
    hold_for(0.9).await;
}

/// The same rule, followed by a script written with the Node.js package.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_script_with_the_package_holding_nine_tenths_of_the_lease_keeps_it() {
    let node = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let deps = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../clients/node/node_modules/pg")
        .exists();
    if !(node && deps) {
        assert!(
            std::env::var_os("CI").is_none(),
            "node or clients/node/node_modules is missing (npm ci --prefix clients/node)"
        );
        eprintln!("skipped: node or clients/node/node_modules is missing");
        return;
    }
    hold_with(0.9, Script::NodePackage).await;
}

/// A worker stopped past its lease: its supervisor kills the program, and
/// when the worker resumes it counts the lost lease in
/// `batchonce_leases_lost_total`, though nobody took the run over and the
/// database may still show the lease as its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_while_the_worker_was_stopped_is_counted() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let dir = scratch("command-lease-counted");
    let pid_file = dir.join("program.pid");
    let script = dir.join("slow.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nif [ \"$BATCHONCE_ATTEMPT\" = 1 ]; then echo $$ > {}; exec sleep 60; fi\nexit 0\n",
            pid_file.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cfg = dir.join("batchonce.toml");
    std::fs::write(
        &cfg,
        format!(
            "[jobs.slow-script]\ncommand = [\"{}\"]\nlease_ttl = \"2s\"\nmax_attempts = 3\n\
             backoff = \"200ms\"\nbackoff_max = \"400ms\"\n",
            script.display()
        ),
    )
    .unwrap();
    let base = || {
        let mut c = Command::new(BIN);
        c.env("DATABASE_URL", &db.url)
            .env_remove("BATCHONCE_CONFIG")
            .arg("--config")
            .arg(&cfg);
        c
    };
    let out = base()
        .args(["enqueue", "slow-script", "--date", "2026-09-15"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut worker = base()
        .args([
            "--log-format",
            "json",
            "worker",
            "--worker-id",
            "stopped",
            "--poll-interval",
            "200ms",
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("worker.log")).unwrap())
        .spawn()
        .unwrap();
    let wpid = Pid::from_raw(worker.id() as i32);
    let pf = pid_file.clone();
    batchonce::testing::wait_until("the program started", Duration::from_secs(30), || {
        let pf = pf.clone();
        async move { std::fs::read_to_string(&pf).is_ok_and(|s| s.trim().parse::<i32>().is_ok()) }
    })
    .await;
    let program: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    kill(wpid, Signal::SIGSTOP).unwrap();
    // The supervisor kills the program within the lease, on its own.
    batchonce::testing::wait_until(
        "the program was killed",
        Duration::from_secs(10),
        || async move { kill(Pid::from_raw(program), None).is_err() },
    )
    .await;
    kill(wpid, Signal::SIGCONT).unwrap();
    wait_for_status(
        &db.pool,
        Some("slow-script:2026-09-15"),
        &["SUCCEEDED"],
        Duration::from_secs(60),
    )
    .await;
    let url = format!("http://127.0.0.1:{port}/metrics");
    let text = reqwest::get(&url).await.unwrap().text().await.unwrap();
    let lost: f64 = text
        .lines()
        .find(|l| l.starts_with("batchonce_leases_lost_total{job=\"slow-script\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(lost >= 1.0, "no lost lease counted:\n{text}");
    let _ = kill(wpid, Signal::SIGTERM);
    let _ = worker.wait();
}
