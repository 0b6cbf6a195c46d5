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
            "examples/{example} has an older package: repack it and update the example's lock (`(cd clients/node && npm pack) && (cd examples/{example} && npm install ../../clients/node/batchonce-0.1.0.tgz)`)"
        );
    }
}
