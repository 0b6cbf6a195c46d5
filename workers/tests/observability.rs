//! Observability: the alert rules pass `promtool test rules`, every dashboard
//! query parses and names only metrics the code exports, every metric is
//! documented, and a real Prometheus scraping a worker and the exporter sees
//! an injected failure and fires the FAILED-run alert.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use batchonce::telemetry;
use batchonce::testing::{wait_until, TestDb};
use batchonce_workers::settlement;
use chrono::NaiveDate;
use yaml_rust2::{Yaml, YamlLoader};

mod common;

use common::{free_port, http_get, stop};

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

use common::prometheus::tool;

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

/// The YAML files under `dashboards/`, recursively, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(yaml_files(&p));
        } else if p.extension().is_some_and(|x| x == "yml" || x == "yaml") {
            out.push(p);
        }
    }
    out.sort();
    out
}

fn load_yaml(path: &Path) -> Yaml {
    let text = std::fs::read_to_string(path).unwrap();
    YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .next()
        .unwrap_or(Yaml::Null)
}

/// What the promtool tests of one test file expect of one alert: whether
/// some case expects it to fire and some case expects it quiet.
#[derive(Debug, Default, Clone, Copy)]
struct Exercised {
    fires: bool,
    quiet: bool,
}

/// The alert rule files under `dashboards/` (files with `groups`), with
/// their alert names in order, and the promtool test files (files with
/// `tests`), with what they expect of each alert and the rule files they
/// load.
#[allow(clippy::type_complexity)]
fn rule_and_test_files() -> (
    Vec<(PathBuf, Vec<String>)>,
    Vec<(PathBuf, BTreeMap<String, Exercised>, BTreeSet<PathBuf>)>,
) {
    let mut rules = Vec::new();
    let mut tests = Vec::new();
    for path in yaml_files(&root().join("dashboards")) {
        let doc = load_yaml(&path);
        if let Some(groups) = doc["groups"].as_vec() {
            let mut alerts = Vec::new();
            for g in groups {
                for r in g["rules"].as_vec().into_iter().flatten() {
                    if let Some(a) = r["alert"].as_str() {
                        alerts.push(a.to_owned());
                    }
                }
            }
            rules.push((path.canonicalize().unwrap(), alerts));
        } else if let Some(cases) = doc["tests"].as_vec() {
            let mut seen: BTreeMap<String, Exercised> = BTreeMap::new();
            for case in cases {
                for t in case["alert_rule_test"].as_vec().into_iter().flatten() {
                    let name = t["alertname"]
                        .as_str()
                        .unwrap_or_else(|| panic!("{}: a case without alertname", path.display()));
                    let fires = t["exp_alerts"].as_vec().is_some_and(|v| !v.is_empty());
                    let e = seen.entry(name.to_owned()).or_default();
                    e.fires |= fires;
                    e.quiet |= !fires;
                }
            }
            let base = path.parent().unwrap();
            let loads = doc["rule_files"]
                .as_vec()
                .into_iter()
                .flatten()
                .map(|f| {
                    let f = base.join(f.as_str().expect("a rule file name"));
                    f.canonicalize()
                        .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
                })
                .collect();
            tests.push((path, seen, loads));
        }
    }
    (rules, tests)
}

#[test]
fn alert_rules_pass_promtool() {
    // Every alert rule under dashboards/ has a promtool test that expects it
    // to fire and one that expects it quiet, and every tested alert is a
    // rule: a rule added without a test, or a test left behind by a removed
    // rule, fails here.
    let (rule_files, test_files) = rule_and_test_files();
    assert!(
        !rule_files.is_empty(),
        "no alert rule file under dashboards/"
    );
    assert!(
        !test_files.is_empty(),
        "no promtool test file under dashboards/"
    );
    let mut defined: BTreeSet<String> = BTreeSet::new();
    for (path, alerts) in &rule_files {
        for a in alerts {
            assert!(
                defined.insert(a.clone()),
                "{}: alert {a} is defined twice",
                path.display()
            );
        }
    }
    let mut exercised: BTreeMap<String, Exercised> = BTreeMap::new();
    for (path, seen, loads) in &test_files {
        for (rules, _) in &rule_files {
            assert!(
                loads.contains(rules),
                "{} does not load {}",
                path.display(),
                rules.display()
            );
        }
        for (a, e) in seen {
            let all = exercised.entry(a.clone()).or_default();
            all.fires |= e.fires;
            all.quiet |= e.quiet;
        }
    }
    let tested: BTreeSet<String> = exercised.keys().cloned().collect();
    assert_eq!(
        defined,
        tested,
        "alerts without a test: {:?}; tests of no alert: {:?}",
        defined.difference(&tested).collect::<Vec<_>>(),
        tested.difference(&defined).collect::<Vec<_>>()
    );
    for (a, e) in &exercised {
        assert!(e.fires, "no promtool case expects {a} to fire");
        assert!(e.quiet, "no promtool case expects {a} to stay quiet");
    }

    // Every alert has a runbook line naming a batchonce command, and names
    // only metrics the code exports.
    for (path, alerts) in &rule_files {
        let rules = std::fs::read_to_string(path).unwrap();
        assert_eq!(
            rules.matches("runbook: \"").count(),
            alerts.len(),
            "{}",
            path.display()
        );
        assert!(rules.matches("runbook: \"").count() <= rules.matches("batchonce ").count());
        for name in metric_names(&rules) {
            assert!(
                exported(&name),
                "{} uses {name}, which the code does not export",
                path.display()
            );
        }
    }
    let Some(promtool) = tool("promtool") else {
        return;
    };
    let dir = root().join("dashboards/prometheus");
    let mut runs: Vec<Vec<String>> = Vec::new();
    for (path, _) in &rule_files {
        runs.push(vec![
            "check".into(),
            "rules".into(),
            path.display().to_string(),
        ]);
    }
    for (path, _, _) in &test_files {
        runs.push(vec![
            "test".into(),
            "rules".into(),
            path.display().to_string(),
        ]);
    }
    runs.push(vec![
        "check".into(),
        "config".into(),
        "prometheus.yml".into(),
    ]);
    for args in &runs {
        let out = Command::new(&promtool)
            .args(args)
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

fn spawn(args: &[&str], url: &str, log: &Path) -> Child {
    Command::new(BIN)
        .args(args)
        .env("DATABASE_URL", url)
        .env("BATCHONCE_CONFIG", common::samples_config())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
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
    let prom = common::prometheus::start(&prometheus, &dir, &[wport, eport], pport);

    wait_until("the worker's /readyz", Duration::from_secs(20), || async {
        http_get(wport, "/readyz").is_some_and(|(c, _)| c == 200)
    })
    .await;
    assert_eq!(http_get(wport, "/healthz").map(|r| r.0), Some(200));
    for d in ["2026-09-14", "2026-09-15"] {
        let out = Command::new(BIN)
            .args(["enqueue", "daily-settlement", "--date", d])
            .env("DATABASE_URL", &db.url)
            .env("BATCHONCE_CONFIG", common::samples_config())
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
        http_get(pport, &path).map(|(_, b)| b).unwrap_or_default()
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
            let alerts = http_get(pport, "/api/v1/alerts")
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
    let metrics = http_get(wport, "/metrics").unwrap().1;
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
    let mport = free_port();
    let url = format!("postgres://app:hunter2-secret@127.0.0.1:{port}/x");
    let mut worker = spawn(
        &[
            "--log-format",
            "json",
            "worker",
            "--metrics-addr",
            &format!("127.0.0.1:{mport}"),
        ],
        &url,
        &log,
    );
    // The worker retries the unreachable database with a growing delay
    // (200 ms, then 400 ms): two failed attempts logged are the paths that
    // could print the URL, and the check waits for them, not for a time.
    let retries = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("database not reachable yet")
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while retries() < 2 {
        assert!(
            worker.try_wait().unwrap().is_none(),
            "the worker exited instead of retrying: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(
            Instant::now() < deadline,
            "the worker did not log two failed connection attempts in 20s: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Its state agrees: up, but not ready, and its metrics do not carry the
    // password either.
    assert_eq!(http_get(mport, "/healthz").map(|r| r.0), Some(200));
    assert_eq!(http_get(mport, "/readyz").map(|r| r.0), Some(503));
    let metrics = http_get(mport, "/metrics")
        .expect("the worker serves /metrics")
        .1;
    assert!(
        !metrics.contains("hunter2"),
        "the password leaked: {metrics}"
    );
    stop(worker);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("hunter2"), "the password leaked: {text}");
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("every log line is JSON");
        assert!(v["timestamp"].is_string() && v["level"].is_string());
    }
}
