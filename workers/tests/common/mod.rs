//! Helpers shared by the process tests of several files.

use std::path::Path;
use std::process::Command;

/// Runs `bin --config <a file holding text> args` against a database that
/// cannot be reached (the config must be refused before any connection)
/// and checks the contract: exit 1, one error line, naming `want`. Returns
/// the error text for further checks.
pub fn config_refused(bin: &str, dir: &Path, text: &str, args: &[&str], want: &str) -> String {
    let cfg = dir.join("bad.toml");
    std::fs::write(&cfg, text).unwrap();
    let out = Command::new(bin)
        .env("DATABASE_URL", "postgres://127.0.0.1:1/none")
        .arg("--config")
        .arg(&cfg)
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{text}: {err}");
    assert!(err.contains(want), "{text}: {err}");
    err
}
