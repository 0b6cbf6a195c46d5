//! Observability: the alert rules pass `promtool test rules`, every dashboard
//! query parses and names only metrics the code exports, every metric is
//! documented, and a real Prometheus scraping a worker and the exporter sees
//! an injected failure and fires the FAILED-run alert.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use batchonce::telemetry;
use batchonce::testing::{wait_until, TestDb};
use batchonce_workers::settlement;
use chrono::NaiveDate;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// promtool and prometheus come from Debian's `prometheus` package, which
/// `.ci/run` installs. Without them a local run says so and skips; in CI
/// their absence is a failure.
fn tool(name: &str) -> Option<PathBuf> {
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

fn scratch(name: &str) -> PathBuf {
    batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), name)
}

/// Metric names in a PromQL expression (`batchonce_` identifiers).
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(pos) = expr[i..].find("batchonce_") {
        let start = i + pos;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        out.push(expr[start..end].to_owned());
        i = end;
    }
    out
}

fn exported(name: &str) -> bool {
    telemetry::ALL.contains(&name)
        || ["_bucket", "_sum", "_count"].iter().any(|s| {
            name.strip_suffix(s)
                .is_some_and(|base| base == telemetry::RUN_DURATION)
        })
}

#[test]
fn alert_rules_pass_promtool() {
    let Some(promtool) = tool("promtool") else {
        return;
    };
    let dir = root().join("dashboards/prometheus");
    for args in [
        vec!["check", "rules", "alerts.yml"],
        vec!["test", "rules", "alerts_test.yml"],
        vec!["check", "config", "prometheus.yml"],
    ] {
        let out = Command::new(&promtool)
            .args(&args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Every alert has a test and a runbook line naming a batchonce command.
    let rules = std::fs::read_to_string(dir.join("alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(dir.join("alerts_test.yml")).unwrap();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 7);
    for a in &alerts {
        assert!(
            tests.contains(&format!("alertname: {a}")),
            "{a} has no promtool test"
        );
    }
    assert_eq!(rules.matches("runbook: \"").count(), alerts.len());
    assert!(rules.matches("runbook: \"").count() <= rules.matches("batchonce ").count());
    for name in metric_names(&rules) {
        assert!(
            exported(&name),
            "alerts.yml uses {name}, which the code does not export"
        );
    }
}

#[test]
fn dashboard_queries_parse_and_name_exported_metrics() {
    let path = root().join("dashboards/grafana/batchonce-overview.json");
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut exprs = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            exprs.push(t["expr"].as_str().unwrap().to_owned());
        }
    }
    assert!(exprs.len() >= 10);
    for e in &exprs {
        let names = metric_names(e);
        assert!(!names.is_empty(), "{e} names no batchonce metric");
        for n in names {
            assert!(
                exported(&n),
                "dashboard uses {n}, which the code does not export"
            );
        }
    }
    let Some(promtool) = tool("promtool") else {
        return;
    };
    // promtool parses PromQL in rule files: wrap each query as a recording
    // rule, with Grafana's variables replaced by values.
    let dir = scratch("dashboard-queries");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        let e = e.replace("$job", ".*").replace('\'', "''");
        rules.push_str(&format!(
            "      - record: dashboard_query_{i}\n        expr: '{e}'\n"
        ));
    }
    std::fs::write(dir.join("q.yml"), rules).unwrap();
    let out = Command::new(promtool)
        .args(["check", "rules", "q.yml"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "a dashboard query does not parse:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn every_metric_is_documented_once() {
    let doc = std::fs::read_to_string(root().join("docs/metrics.md")).unwrap();
    for name in telemetry::ALL {
        assert_eq!(
            doc.matches(&format!("| `{name}` |")).count(),
            1,
            "{name} must have one row in docs/metrics.md"
        );
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A minimal HTTP/1.0 GET on loopback (test code only).
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some((code, body))
}

fn spawn(args: &[&str], url: &str, log: &Path) -> Child {
    Command::new(BIN)
        .args(args)
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

fn stop(mut c: Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(c.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while c.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = c.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_sees_the_failure_and_fires_the_alert() {
    let Some(prometheus) = tool("prometheus") else {
        return;
    };
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let dir = scratch("scrape");
    // Two dates: one settles, one has a negative amount and fails fatally.
    let good = NaiveDate::from_ymd_opt(2026, 9, 14).unwrap();
    let bad = NaiveDate::from_ymd_opt(2026, 9, 15).unwrap();
    for (i, d) in [good, bad].iter().enumerate() {
        let (start, _) = settlement::day_bounds(*d, chrono_tz::Asia::Seoul);
        sqlx::query("INSERT INTO orders SELECT $1 + g, 1, CASE WHEN $3 AND g = 7 THEN -5 ELSE 100 END, $2 + g * interval '1 minute' FROM generate_series(1, 200) g")
            .bind(i as i64 * 1000)
            .bind(start)
            .bind(*d == bad)
            .execute(&db.pool)
            .await
            .unwrap();
    }
    let (wport, eport, pport) = (free_port(), free_port(), free_port());
    let worker = spawn(
        &[
            "--log-format",
            "json",
            "worker",
            "--worker-id",
            "scraped",
            "--poll-interval",
            "200ms",
            "--metrics-addr",
            &format!("127.0.0.1:{wport}"),
        ],
        &db.url,
        &dir.join("worker.log"),
    );
    let exporter = spawn(
        &[
            "--log-format",
            "json",
            "exporter",
            "--interval",
            "1s",
            "--metrics-addr",
            &format!("127.0.0.1:{eport}"),
        ],
        &db.url,
        &dir.join("exporter.log"),
    );
    let rules = root().join("dashboards/prometheus/alerts.yml");
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: batchonce\n    honor_labels: true\n    static_configs:\n      - targets: ['127.0.0.1:{wport}', '127.0.0.1:{eport}']\n",
            rules.display()
        ),
    )
    .unwrap();
    let prom = Command::new(prometheus)
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{pport}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
        .spawn()
        .unwrap();

    wait_until("the worker's /readyz", Duration::from_secs(20), || async {
        get(wport, "/readyz").is_some_and(|(c, _)| c == 200)
    })
    .await;
    assert_eq!(get(wport, "/healthz").map(|r| r.0), Some(200));
    for d in ["2026-09-14", "2026-09-15"] {
        let out = Command::new(BIN)
            .args(["enqueue", "daily-settlement", "--date", d])
            .env("DATABASE_URL", &db.url)
            .output()
            .unwrap();
        assert!(out.status.success());
    }
    let query = |q: &str| {
        let path = format!(
            "/api/v1/query?query={}",
            q.replace(' ', "%20")
                .replace('"', "%22")
                .replace('{', "%7B")
                .replace('}', "%7D")
                .replace('=', "%3D")
        );
        get(pport, &path).map(|(_, b)| b).unwrap_or_default()
    };
    wait_until(
        "Prometheus sees the fatal attempt",
        Duration::from_secs(60),
        || async {
            query(r#"batchonce_attempts_total{outcome="fatal"}"#).contains(r#""result":[{"#)
                && query(r#"batchonce_attempts_total{outcome="succeeded"}"#)
                    .contains(r#""result":[{"#)
        },
    )
    .await;
    wait_until(
        "the FAILED-run alert fires",
        Duration::from_secs(60),
        || async {
            let alerts = get(pport, "/api/v1/alerts")
                .map(|(_, b)| b)
                .unwrap_or_default();
            alerts.contains(r#""alertname":"BatchonceRunFailed""#)
                && alerts.contains(r#""state":"firing""#)
        },
    )
    .await;
    let failed = query(r#"batchonce_runs{status="FAILED"}"#);
    assert!(failed.contains(r#""job":"daily-settlement""#), "{failed}");
    // Labels never carry a job key or a date.
    let metrics = get(wport, "/metrics").unwrap().1;
    assert!(!metrics.contains("2026-09-1"), "a date leaked into a label");
    stop(worker);
    stop(exporter);
    stop(prom);
}

#[test]
fn database_passwords_never_reach_logs() {
    let dir = scratch("password");
    let log = dir.join("worker.log");
    let port = free_port();
    let url = format!("postgres://app:hunter2-secret@127.0.0.1:{port}/x");
    let worker = spawn(
        &[
            "--log-format",
            "json",
            "worker",
            "--metrics-addr",
            &format!("127.0.0.1:{}", free_port()),
        ],
        &url,
        &log,
    );
    std::thread::sleep(Duration::from_secs(3));
    stop(worker);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("database not reachable yet"), "{text}");
    assert!(!text.contains("hunter2"), "the password leaked: {text}");
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("every log line is JSON");
        assert!(v["timestamp"].is_string() && v["level"].is_string());
    }
}
