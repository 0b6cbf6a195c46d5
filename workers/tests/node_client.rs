//! The Node.js package (`clients/node`) against a real PostgreSQL: its own
//! tests (`node --test`) on a fresh migrated database, its `npm pack`
//! contents, and the examples running the packed package. Under CI a
//! missing `node`, `npm` or `npm ci` fails; elsewhere the tests say what is
//! missing and pass.

use std::path::{Path, PathBuf};
use std::process::Command;

use batchonce::testing::TestDb;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Whether Node.js and the package's dependencies are there; under CI their
/// absence is a failure, not a skip.
fn node_ready() -> bool {
    let node = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let deps = repo().join("clients/node/node_modules/pg").exists();
    if node && deps {
        return true;
    }
    let why = if node {
        "clients/node/node_modules is missing (npm ci --prefix clients/node)"
    } else {
        "node is not installed (apt-get install -y nodejs npm)"
    };
    assert!(std::env::var_os("CI").is_none(), "{why}");
    eprintln!("skipped: {why}");
    false
}

#[tokio::test]
async fn the_packages_own_tests_pass_against_postgres() {
    if !node_ready() {
        return;
    }
    let db = TestDb::new(&[]).await;
    let out = Command::new("node")
        .args(["--test", "test/"])
        .current_dir(repo().join("clients/node"))
        .env("DATABASE_URL", &db.url)
        // The tests fail, rather than skip, without a database under CI.
        .env("CI", "true")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "node --test failed:\n{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every test ran; none was skipped for want of the database.
    assert!(report.contains("# fail 0"), "{report}");
    assert!(report.contains("# skipped 0"), "{report}");
    let passed = report
        .lines()
        .find_map(|l| l.strip_prefix("# pass "))
        .and_then(|n| n.trim().parse::<u32>().ok())
        .unwrap_or(0);
    assert!(passed >= 10, "{report}");
}

#[test]
fn the_pack_ships_the_package_and_the_examples_run_the_packed_one() {
    if !node_ready() {
        return;
    }
    let out = Command::new("npm")
        .args(["pack", "--dry-run", "--json"])
        .current_dir(repo().join("clients/node"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pack: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut files: Vec<&str> = pack[0]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["README.md", "index.d.ts", "index.js", "package.json"],
        "what the tarball ships"
    );
    // The examples install the package from the tarball (`npm pack`, then
    // `npm ci`, as .ci/run does), and so run exactly the checked-in code.
    for example in ["node-invoices", "node-report"] {
        let installed = repo().join(format!(
            "examples/{example}/node_modules/batchonce/index.js"
        ));
        let installed = std::fs::read(&installed).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; run `(cd clients/node && npm pack) && npm ci --prefix examples/{example}`",
                installed.display()
            )
        });
        let source = std::fs::read(repo().join("clients/node/index.js")).unwrap();
        assert!(
            installed == source,
            "examples/{example} has an older package: repack it and update the example's lock (`(cd clients/node && npm pack) && (cd examples/{example} && npm install ../../clients/node/batchonce-0.2.0.tgz)`)"
        );
    }
}

/// A scoped command job through a real worker: `enqueue --all-scopes` makes
/// one run per scope, and the Node program of each sees its own scope as
/// `ctx.scope` (checked against the key and `BATCHONCE_SCOPE`) and fences a
/// write under the scoped key; an unscoped job's program sees `null`.
#[tokio::test]
async fn a_scoped_runs_node_program_sees_its_scope() {
    if !node_ready() {
        return;
    }
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    sqlx::raw_sql(
        "CREATE TABLE node_scope_seen (job_key text PRIMARY KEY, scope text, env_scope text)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let dir = batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), "node-scope");
    let pkg = std::fs::canonicalize(repo().join("clients/node")).unwrap();
    std::fs::write(
        dir.join("seen.js"),
        format!(
            "const {{ Client }} = require({pg});\n\
             const batchonce = require({pkg});\n\
             batchonce.run(async (ctx) => {{\n\
               const db = new Client({{ connectionString: ctx.databaseUrl }});\n\
               await db.connect();\n\
               try {{\n\
                 await batchonce.fenced(db, ctx, (tx) => tx.query(\n\
                   'INSERT INTO node_scope_seen VALUES ($1, $2, $3)',\n\
                   [ctx.key, ctx.scope, process.env.BATCHONCE_SCOPE ?? null]));\n\
               }} finally {{\n\
                 await db.end();\n\
               }}\n\
             }});\n",
            pg = serde_json::to_string(&pkg.join("node_modules/pg")).unwrap(),
            pkg = serde_json::to_string(&pkg).unwrap(),
        ),
    )
    .unwrap();
    let job = |name: &str, extra: &str| {
        format!(
            "[jobs.{name}]\ncommand = [\"node\", \"seen.js\"]\nworking_dir = {}\n\
             database_url_env = \"PROGRAM_DATABASE_URL\"\nmax_attempts = 1\n{extra}\n",
            serde_json::to_string(&dir).unwrap()
        )
    };
    let cfg = dir.join("batchonce.toml");
    std::fs::write(
        &cfg,
        job("node-scoped", "scopes = [\"s-1\", \"s-2\"]") + &job("node-unscoped", ""),
    )
    .unwrap();
    let batchonce = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_batchonce"));
        c.env("DATABASE_URL", &db.url)
            .env("PROGRAM_DATABASE_URL", &db.url)
            .env_remove("BATCHONCE_CONFIG")
            .arg("--config")
            .arg(&cfg);
        c
    };
    for args in [&["node-scoped", "--all-scopes"][..], &["node-unscoped"][..]] {
        let out = batchonce()
            .arg("enqueue")
            .args(args)
            .args(["--date", "2026-09-15"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    let keys = [
        "node-scoped:2026-09-15@s-1",
        "node-scoped:2026-09-15@s-2",
        "node-unscoped:2026-09-15",
    ];
    let log = std::fs::File::create(dir.join("worker.log")).unwrap();
    let mut worker = batchonce()
        .args([
            "worker",
            "--worker-id",
            "node-scope",
            "--poll-interval",
            "200ms",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    for key in keys {
        batchonce::testing::wait_for_status(
            &db.pool,
            Some(key),
            &["SUCCEEDED", "FAILED"],
            std::time::Duration::from_secs(20),
        )
        .await;
    }
    // Stopped with a deadline: SIGTERM, then a SIGKILL past 10 s.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(worker.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while worker.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = worker.kill();
            panic!("the worker did not stop within 10 s of SIGTERM");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let runs: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT job_key, status, error_message FROM batch_job_run ORDER BY job_key")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert!(
        runs.iter().all(|(_, status, _)| status == "SUCCEEDED") && runs.len() == keys.len(),
        "{runs:?}\n{}",
        std::fs::read_to_string(dir.join("worker.log")).unwrap_or_default()
    );
    let seen: Vec<(String, Option<String>, Option<String>)> =
        sqlx::query_as("SELECT job_key, scope, env_scope FROM node_scope_seen ORDER BY job_key")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let some = |s: &str| Some(s.to_owned());
    assert_eq!(
        seen,
        [
            (keys[0].to_owned(), some("s-1"), some("s-1")),
            (keys[1].to_owned(), some("s-2"), some("s-2")),
            (keys[2].to_owned(), None, None),
        ]
    );
}
