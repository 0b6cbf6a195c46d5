//! Prometheus for the tests that check alerts end to end: the tools come
//! from Debian's `prometheus` package, which `.ci/run` installs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// `promtool` or `prometheus` on PATH. Without it a local run says so and
/// skips; under CI its absence is a failure.
pub fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{name} is missing in CI: .ci/run must install Debian's prometheus package"
        );
        eprintln!("skipped: {name} not installed (apt-get install -y prometheus)");
    }
    found
}

/// Starts `prometheus` on `127.0.0.1:port`, scraping `targets` every second
/// and evaluating the shipped alert rules every second, with its files and
/// log in `dir`.
pub fn start(prometheus: &Path, dir: &Path, targets: &[u16], port: u16) -> Child {
    let rules =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../dashboards/prometheus/alerts.yml");
    let targets: Vec<String> = targets.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: batchonce\n    honor_labels: true\n    static_configs:\n\
             \x20     - targets: [{}]\n",
            rules.display(),
            targets.join(", ")
        ),
    )
    .unwrap();
    Command::new(prometheus)
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
        .spawn()
        .unwrap()
}
