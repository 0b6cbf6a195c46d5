//! One truth for operators: `status`, `runs stale`, `runs list` and the
//! exporter's /metrics, all run from an empty folder with no configuration
//! file, agree about a dead run (its worker SIGKILLed while it held the
//! lease) and a FAILED run of a command job, both enqueued with a file
//! those views never see. Each judges the runs by what the database holds.
//! The worker, before it dies, serves its counters at zero.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use batchonce::testing::{wait_until, TestDb};
use serde_json::Value;

mod common;

use common::{batchonce, free_port, http_get, stop};

const STUCK: &str = "stuck-export:2026-09-15";
const BROKEN: &str = "broken-import:2026-09-15";

/// The stuck job's lease and stale_after are far below the engine's
/// defaults (30s, 20m): a view that judged it by anything but what the run
/// stores would not call it stale.
const CONFIG: &str = r#"
[jobs.stuck-export]
command = ["sh", "-c", "echo exporting; sleep 600"]
lease_ttl = "1s"
stale_after = "2s"
on_lease_expiry = "hold"
max_attempts = 1

[jobs.broken-import]
command = ["sh", "-c", "echo the input file is corrupt >&2; exit 2"]
max_attempts = 1
"#;

fn scratch(name: &str) -> PathBuf {
    batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), name)
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn view(db: &TestDb, dir: &Path, config: Option<&Path>, args: &[&str]) -> String {
    ok(
        batchonce(db, config)
            .current_dir(dir)
            .args(args)
            .output()
            .unwrap(),
        &args.join(" "),
    )
}

fn json(db: &TestDb, dir: &Path, config: Option<&Path>, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&view(db, dir, config, &all)).unwrap()
}

/// /metrics of a process on loopback.
fn metrics(port: u16) -> Option<String> {
    http_get(port, "/metrics").map(|(_, body)| body)
}

/// The value of the sample of `name` whose labels include all of `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            return None;
        }
        let (series, value) = rest.rsplit_once(' ')?;
        labels
            .iter()
            .all(|(k, v)| series.contains(&format!("{k}=\"{v}\"")))
            .then(|| value.parse().ok())?
    })
}

async fn scalar_bool(db: &TestDb, sql: &str) -> bool {
    sqlx::query_scalar::<_, bool>(sql)
        .fetch_one(&db.pool)
        .await
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operator_view_tells_the_same_truth_without_a_config_file() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let dir = scratch("one-truth");
    let cfg = dir.join("batchonce.toml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();

    for job in ["stuck-export", "broken-import"] {
        view(
            &db,
            &dir,
            Some(&cfg),
            &["enqueue", job, "--date", "2026-09-15"],
        );
    }
    let wport = free_port();
    let log = std::fs::File::create(dir.join("worker.log")).unwrap();
    let mut worker = batchonce(&db, Some(&cfg))
        .current_dir(&dir)
        .args(["--log-format", "json", "worker", "--worker-id", "w-truth"])
        .args(["--poll-interval", "200ms", "--metrics-addr"])
        .arg(format!("127.0.0.1:{wport}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    wait_until(
        "the import FAILED and the export RUNNING",
        Duration::from_secs(30),
        || async {
            scalar_bool(
            &db,
            "SELECT count(*) FILTER (WHERE job_name = 'broken-import' AND status = 'FAILED') = 1 \
             AND count(*) FILTER (WHERE job_name = 'stuck-export' AND status = 'RUNNING') = 1 \
             FROM batch_job_run",
        )
        .await
        },
    )
    .await;
    // The worker's counters exist at zero for each job it serves and each
    // outcome, before any lease loss or retry: the first one is an increase.
    let text = metrics(wport).expect("the worker serves /metrics");
    for job in ["stuck-export", "broken-import"] {
        assert_eq!(
            sample(&text, "batchonce_leases_lost_total", &[("job", job)]),
            Some(0.0),
            "{text}"
        );
        for outcome in ["retried", "lease_lost", "succeeded"] {
            assert_eq!(
                sample(
                    &text,
                    "batchonce_attempts_total",
                    &[("job", job), ("outcome", outcome)]
                ),
                Some(0.0),
                "{job} {outcome}: {text}"
            );
        }
    }
    assert!(
        sample(
            &text,
            "batchonce_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ) == Some(1.0),
        "{text}"
    );

    // The worker dies holding the export's lease.
    worker.kill().unwrap();
    worker.wait().unwrap();
    // Wait until the database holds what makes the run dead (by its stored
    // policies: past stale_after, lease expired, no heartbeat within the
    // lease, no session, worker not seen): from then on nothing changes it,
    // so every view below must give the same answer.
    wait_until("the export to be dead by its stored policies", Duration::from_secs(30), || async {
        scalar_bool(
            &db,
            "SELECT r.status = 'RUNNING' AND r.started_at < now() - r.stale_after \
               AND r.lease_expires_at <= now() AND r.heartbeat_at < now() - r.lease_ttl \
               AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.application_name = 'w-truth') \
               AND (SELECT last_seen FROM batch_worker WHERE worker_id = 'w-truth') < now() - r.lease_ttl \
             FROM batch_job_run r WHERE r.job_key = 'stuck-export:2026-09-15'",
        )
        .await
    })
    .await;

    // `runs stale` from the empty folder: the export, dead.
    let stale = json(&db, &empty, None, &["runs", "stale"]);
    let stale = stale.as_array().unwrap();
    assert_eq!(stale.len(), 1, "{stale:?}");
    assert_eq!(stale[0]["job_key"], STUCK);
    assert_eq!(stale[0]["conclusion"], "dead", "{stale:?}");
    let text = view(&db, &empty, None, &["runs", "stale"]);
    assert!(
        text.contains(STUCK) && text.contains("dead") && !text.contains("no stale runs"),
        "{text}"
    );

    // `status` from the empty folder: the same run, the same conclusion,
    // its expired lease, and the FAILED import.
    let st = json(&db, &empty, None, &["status"]);
    assert_eq!(
        st["stale"],
        serde_json::json!([{"job_key": STUCK, "job_name": "stuck-export", "conclusion": "dead"}]),
        "{st}"
    );
    assert_eq!(st["expired_leases"], 1, "{st}");
    let count = |job: &str, status: &str| {
        st["counts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["job_name"] == job && c["status"] == status)
            .map(|c| c["runs"].as_i64().unwrap())
    };
    assert_eq!(count("broken-import", "FAILED"), Some(1), "{st}");
    assert_eq!(count("stuck-export", "RUNNING"), Some(1), "{st}");
    let text = view(&db, &empty, None, &["status"]);
    assert!(
        text.contains(&format!("stale runs: {STUCK} (dead)")),
        "{text}"
    );
    // With the file the runs were enqueued with, the very same answers.
    assert_eq!(
        json(&db, &dir, Some(&cfg), &["status"])["stale"],
        st["stale"]
    );
    assert_eq!(
        json(&db, &dir, Some(&cfg), &["runs", "stale"])[0]["conclusion"],
        "dead"
    );

    // `runs list` from the empty folder, including by the name of a job
    // only the file declared.
    let list = json(&db, &empty, None, &["runs", "list"]);
    let status_of = |key: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|r| r["job_key"] == key)
            .map(|r| r["status"].clone())
    };
    assert_eq!(status_of(STUCK), Some("RUNNING".into()), "{list}");
    assert_eq!(status_of(BROKEN), Some("FAILED".into()), "{list}");
    let failed = json(
        &db,
        &empty,
        None,
        &[
            "runs",
            "list",
            "--job",
            "broken-import",
            "--status",
            "FAILED",
        ],
    );
    assert_eq!(failed.as_array().unwrap().len(), 1, "{failed}");

    // The exporter from the empty folder: a gauge for every job with runs,
    // the dead run stale with its lease expired, the FAILED run counted.
    let eport = free_port();
    let elog = std::fs::File::create(dir.join("exporter.log")).unwrap();
    let exporter = batchonce(&db, None)
        .current_dir(&empty)
        .args(["exporter", "--interval", "200ms", "--metrics-addr"])
        .arg(format!("127.0.0.1:{eport}"))
        .stdout(Stdio::null())
        .stderr(elog)
        .spawn()
        .unwrap();
    let mut text = String::new();
    wait_until(
        "the exporter to read the database",
        Duration::from_secs(30),
        || {
            let got = metrics(eport);
            let done = got.as_deref().is_some_and(|t| {
                sample(t, "batchonce_exporter_last_success_timestamp_seconds", &[]).is_some()
            });
            if done {
                text = got.unwrap();
            }
            async move { done }
        },
    )
    .await;
    stop(exporter);
    let jobs: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT job_name::text FROM batch_job_run ORDER BY 1")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(jobs, ["broken-import", "stuck-export"]);
    for job in &jobs {
        for status in ["PENDING", "RUNNING", "SUCCEEDED", "FAILED", "SKIPPED"] {
            assert!(
                sample(&text, "batchonce_runs", &[("job", job), ("status", status)]).is_some(),
                "no batchonce_runs for {job} {status}:\n{text}"
            );
        }
        // Neither ever succeeded: no last-success sample, rather than 0.
        assert_eq!(
            sample(
                &text,
                "batchonce_last_success_timestamp_seconds",
                &[("job", job)]
            ),
            None,
            "{text}"
        );
    }
    let g = |name: &str, job: &str| sample(&text, name, &[("job", job)]);
    assert_eq!(
        g("batchonce_stale_runs", "stuck-export"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(g("batchonce_expired_leases", "stuck-export"), Some(1.0));
    assert_eq!(g("batchonce_stale_runs", "broken-import"), Some(0.0));
    assert_eq!(
        sample(
            &text,
            "batchonce_runs",
            &[("job", "broken-import"), ("status", "FAILED")]
        ),
        Some(1.0),
        "{text}"
    );
    assert!(
        g(
            "batchonce_newest_failure_timestamp_seconds",
            "broken-import"
        )
        .unwrap()
            > 1.7e9,
        "{text}"
    );
    assert_eq!(
        g("batchonce_newest_failure_timestamp_seconds", "stuck-export"),
        Some(0.0)
    );
    // The exporter's stale count is the views' list, job by job.
    let stale_total: f64 = jobs
        .iter()
        .map(|j| g("batchonce_stale_runs", j).unwrap())
        .sum();
    assert_eq!(stale_total as usize, stale.len());
}

/// What the missed-run alert compares agrees across processes: the
/// producer's latest due period of a quarter-hourly-like `covers = "firing"`
/// job (every minute here) and the exporter's newest period done, once the
/// worker has run it, are the same instant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_producers_due_period_and_the_exporters_newest_done_period_meet() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let dir = scratch("one-truth-due");
    let cfg = dir.join("batchonce.toml");
    std::fs::write(
        &cfg,
        "[jobs.tick-sync]\ncommand = [\"true\"]\nschedule = \"* * * * *\"\ncovers = \"firing\"\n\
         catch_up = \"3m\"\ntimezone = \"UTC\"\n",
    )
    .unwrap();
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let spawn = |args: &[&str], config: Option<&Path>, cwd: &Path, name: &str| {
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
        batchonce(&db, config)
            .current_dir(cwd)
            .args(args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    };
    let (pport, eport, wport) = (free_port(), free_port(), free_port());
    let producer = spawn(
        &[
            "produce",
            "--interval",
            "200ms",
            "--metrics-addr",
            &format!("127.0.0.1:{pport}"),
        ],
        Some(&cfg),
        &dir,
        "producer",
    );
    let worker = spawn(
        &[
            "worker",
            "--poll-interval",
            "200ms",
            "--metrics-addr",
            &format!("127.0.0.1:{wport}"),
        ],
        Some(&cfg),
        &dir,
        "worker",
    );
    let exporter = spawn(
        &[
            "exporter",
            "--interval",
            "200ms",
            "--metrics-addr",
            &format!("127.0.0.1:{eport}"),
        ],
        None,
        &empty,
        "exporter",
    );
    let mut seen = (None, None);
    wait_until(
        "the producer's due period to be the exporter's newest period done",
        Duration::from_secs(60),
        || {
            let due = metrics(pport).and_then(|t| {
                sample(
                    &t,
                    "batchonce_due_period_start_timestamp_seconds",
                    &[("job", "tick-sync")],
                )
            });
            let done = metrics(eport).and_then(|t| {
                sample(
                    &t,
                    "batchonce_last_done_period_start_timestamp_seconds",
                    &[("job", "tick-sync")],
                )
            });
            seen = (due, done);
            async move { due.is_some() && due == done }
        },
    )
    .await;
    for c in [producer, worker, exporter] {
        stop(c);
    }
    // A period of this job is one minute long and starts on the minute.
    let due = seen.0.unwrap();
    assert_eq!(due % 60.0, 0.0, "{seen:?}");
    let newest: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM max(period_start))::float8 FROM batch_job_run \
         WHERE job_name = 'tick-sync' AND status = 'SUCCEEDED'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(newest >= due, "{newest} < {due}");
}

/// Issue 18's adoption path, end to end: an empty folder and an empty
/// database, one command job declared, then `migrate`, `produce`, a worker
/// that works two periods and fails the third. No sample table or run
/// exists; `status`, `runs stale`, `runs list` and the exporter (run with no
/// file) agree; and a real Prometheus fires the failure's alert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_team_declares_one_command_job_and_its_failure_pages() {
    let Some(prometheus) = common::prometheus::tool("prometheus") else {
        return;
    };
    let db = TestDb::empty().await;
    let dir = scratch("adoption");
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let cfg = dir.join("team.toml");
    std::fs::write(
        &cfg,
        "[jobs.nightly-export]\n\
         command = [\"sh\", \"-c\", \"[ \\\"$BATCHONCE_BUSINESS_DATE\\\" = 2026-09-14 ] && { echo bad input >&2; exit 2; }; echo exported\"]\n\
         timezone = \"UTC\"\nschedule = \"0 2 * * *\"\ncovers = \"previous-day\"\ncatch_up = \"3d\"\n",
    )
    .unwrap();

    view(&db, &empty, Some(&cfg), &["migrate"]);
    view(
        &db,
        &empty,
        Some(&cfg),
        &["produce", "--once", "--now", "2026-09-15T03:00:00Z"],
    );
    let (wport, eport, pport) = (free_port(), free_port(), free_port());
    let worker = batchonce(&db, Some(&cfg))
        .current_dir(&empty)
        .args(["worker", "--poll-interval", "200ms", "--metrics-addr"])
        .arg(format!("127.0.0.1:{wport}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("worker.log")).unwrap())
        .spawn()
        .unwrap();
    // The exporter has no file: it reports every job the database knows.
    let exporter = batchonce(&db, None)
        .current_dir(&empty)
        .args(["exporter", "--interval", "1s", "--metrics-addr"])
        .arg(format!("127.0.0.1:{eport}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("exporter.log")).unwrap())
        .spawn()
        .unwrap();
    let prom = common::prometheus::start(&prometheus, &dir, &[wport, eport], pport);

    wait_until(
        "two periods SUCCEEDED and one FAILED",
        Duration::from_secs(60),
        || async {
            scalar_bool(
                &db,
                "SELECT count(*) FILTER (WHERE status = 'SUCCEEDED') = 2 \
               AND count(*) FILTER (WHERE status = 'FAILED') = 1 FROM batch_job_run",
            )
            .await
        },
    )
    .await;

    // Nothing of the samples: no table, no run.
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' \
         AND tablename NOT LIKE 'batch\\_%' AND tablename <> '_sqlx_migrations' ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(tables.is_empty(), "tables beyond the engine's: {tables:?}");
    let jobs: Vec<String> = sqlx::query_scalar("SELECT DISTINCT job_name::text FROM batch_job_run")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(jobs, ["nightly-export"]);

    // The views, from the empty folder, agree on the counts and on no stale run.
    let st = json(&db, &empty, None, &["status"]);
    let count = |status: &str| {
        st["counts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["job_name"] == "nightly-export" && c["status"] == status)
            .map(|c| c["runs"].as_i64().unwrap())
    };
    assert_eq!(
        (count("SUCCEEDED"), count("FAILED")),
        (Some(2), Some(1)),
        "{st}"
    );
    assert_eq!(st["stale"], serde_json::json!([]), "{st}");
    assert_eq!(
        json(&db, &empty, None, &["runs", "stale"]),
        serde_json::json!([])
    );
    let list = json(&db, &empty, None, &["runs", "list"]);
    let failed: Vec<&Value> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["status"] == "FAILED")
        .collect();
    assert_eq!(failed.len(), 1, "{list}");
    assert_eq!(failed[0]["job_key"], "nightly-export:2026-09-14", "{list}");
    assert_eq!(list.as_array().unwrap().len(), 3, "{list}");
    let mut text = String::new();
    wait_until(
        "the exporter to count the FAILED run",
        Duration::from_secs(30),
        || {
            let got = metrics(eport).unwrap_or_default();
            let done = sample(
                &got,
                "batchonce_runs",
                &[("job", "nightly-export"), ("status", "FAILED")],
            ) == Some(1.0);
            if done {
                text = got;
            }
            async move { done }
        },
    )
    .await;
    assert_eq!(
        sample(
            &text,
            "batchonce_runs",
            &[("job", "nightly-export"), ("status", "SUCCEEDED")]
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "batchonce_stale_runs", &[("job", "nightly-export")]),
        Some(0.0),
        "{text}"
    );
    assert!(!text.contains("daily-settlement"), "{text}");

    // A real Prometheus, with the shipped rules, fires the failure's alert.
    wait_until(
        "BatchonceRunFailed firing for nightly-export",
        Duration::from_secs(60),
        || {
            let alerts = http_get(pport, "/api/v1/alerts").map(|(_, body)| body);
            let firing = alerts.as_ref().is_some_and(|b| {
                let v: Value = serde_json::from_str(b).unwrap_or(Value::Null);
                v["data"]["alerts"].as_array().is_some_and(|a| {
                    a.iter().any(|x| {
                        x["labels"]["alertname"] == "BatchonceRunFailed"
                            && x["labels"]["job"] == "nightly-export"
                            && x["state"] == "firing"
                    })
                })
            });
            async move { firing }
        },
    )
    .await;
    stop(worker);
    stop(exporter);
    stop(prom);
}
