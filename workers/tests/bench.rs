//! The benchmark binary runs every scenario once at its tiny size: not a
//! timing (benchmarks are not timed tests) but proof that each scenario works
//! end to end and reports its figures and its baseline.

use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_batchonce-bench");

#[test]
fn every_scenario_runs_at_tiny_size_and_reports_a_baseline() {
    let out = Command::new(BENCH)
        .args(["all", "--size", "tiny"])
        .env("DATABASE_URL", batchonce::testing::server())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["scenario"].as_str())
        .collect();
    assert_eq!(
        names,
        ["enqueue", "drain", "pickup", "settle", "send", "scopes", "ceiling", "ledger"],
        "{stderr}"
    );
    assert!(lines[0]["baseline_ms"].as_f64().unwrap() > 0.0);
    for r in lines[1]["results"].as_array().unwrap() {
        assert!(r["runs_per_s"].as_f64().unwrap() > 0.0);
        assert!(r["baseline_runs_per_s"].as_f64().unwrap() > 0.0);
        assert!(r["baseline_with_history_runs_per_s"].as_f64().unwrap() > 0.0);
        assert_eq!(r["attempt_rows"], r["runs"], "one attempt row per run");
    }
    let paths: Vec<&str> = lines[2]["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["path"].as_str())
        .collect();
    assert_eq!(paths, ["notify", "poll-500ms"]);
    assert!(lines[3]["baseline_items_per_s"].as_f64().unwrap() > 0.0);
    // The whole run, then 4 partitions over 1, 2 and 4 worker processes.
    let settles = lines[3]["results"].as_array().unwrap();
    let shapes: Vec<(u64, u64)> = settles
        .iter()
        .map(|r| {
            assert!(r["items_per_s"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["worker_peak_rss_mib"].as_f64().unwrap() > 0.0, "{r}");
            (
                r["partitions"].as_u64().unwrap(),
                r["worker_processes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(shapes, [(1, 1), (4, 1), (4, 2), (4, 4)]);
    let sends = lines[4]["results"].as_array().unwrap();
    assert_eq!(sends.len(), 2);
    let partitioned = lines[4]["partitioned"].as_array().unwrap();
    assert_eq!(partitioned.len(), 3);
    for r in sends.iter().chain(partitioned) {
        assert!(r["messages_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["provider_allows_per_s"].as_f64().unwrap() > 0.0, "{r}");
    }
    // The producer with scopes (issue 24): per source, a first tick that
    // enqueues every scope and a second that finds them all, each in one
    // enqueue statement; then its two baselines.
    let scopes = &lines[5];
    let n = scopes["scopes"].as_u64().unwrap();
    assert!(n > 0, "{scopes}");
    let ticks: Vec<(&str, &str, u64, u64, u64)> = scopes["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert!(r["tick_ms"].as_f64().unwrap() > 0.0, "{r}");
            (
                r["source"].as_str().unwrap(),
                r["tick"].as_str().unwrap(),
                r["enqueued"].as_u64().unwrap(),
                r["duplicates"].as_u64().unwrap(),
                r["statements"]["enqueue"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ticks,
        [
            ("query", "first", n, 0, 1),
            ("query", "second", 0, n, 1),
            ("list", "first", n, 0, 1),
            ("list", "second", 0, n, 1),
        ],
        "{scopes}"
    );
    assert!(scopes["statements_counted_by"].as_str().is_some());
    assert!(scopes["baseline_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(scopes["per_key"]["statements"]["enqueue"].as_u64(), Some(n));
    // The ceiling of a drain that keeps the ledger (issue 25): every variant
    // drained all its runs (the scenario fails otherwise) and is reported
    // with its ratio to the bare queue of the same round.
    let ceiling = lines[6]["results"].as_array().unwrap();
    assert!(!ceiling.is_empty(), "{}", lines[6]);
    for r in ceiling {
        let variants = r["variants"].as_object().unwrap();
        let names: Vec<&str> = variants.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "bare",
                "bare-history",
                "engine",
                "ledger-once",
                "ledger-once-without-ledger"
            ],
            "{r}"
        );
        assert_eq!(variants["bare"]["ratio"].as_f64(), Some(1.0), "{r}");
        for v in variants.values() {
            assert!(v["runs_per_s"].as_f64().unwrap() > 0.0, "{r}");
        }
    }
    // The ledger of years (issue 43): every view timed on both ledgers,
    // with its ratio; whether all are within 3x is reported, not asserted.
    let ledger = &lines[7];
    assert_eq!(ledger["small_runs"].as_u64(), Some(10_000), "{ledger}");
    assert_eq!(ledger["runs"].as_u64(), Some(60_000), "{ledger}");
    assert!(ledger["all_within_3x"].is_boolean(), "{ledger}");
    let views = ledger["views"].as_array().unwrap();
    for want in [
        "batchonce status",
        "batchonce exporter: start to first full /metrics",
        "batchonce produce --once",
        "console GET /",
    ] {
        assert!(views.iter().any(|v| v["view"] == want), "{want}: {ledger}");
    }
    for v in views {
        assert!(v["ms_small"].as_f64().unwrap() > 0.0, "{v}");
        assert!(v["ms_big"].as_f64().unwrap() > 0.0, "{v}");
        assert!(v["ratio"].as_f64().unwrap() > 0.0, "{v}");
    }
}

#[test]
fn bad_arguments_are_one_error_line() {
    let cases: [(&[&str], &str); 4] = [
        (&["warp"], "invalid value 'warp' for '[SCENARIO]'"),
        (&["drain", "--concurrency", "0"], "0 is not in 1..=1000"),
        (
            &["drain", "--runs", "lots"],
            "invalid value 'lots' for '--runs <RUNS>'",
        ),
        (
            &["all", "--size", "huge"],
            "invalid value 'huge' for '--size <SIZE>'",
        ),
    ];
    for (args, want) in cases {
        let out = Command::new(BENCH).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("batchonce-bench: error: "), "{err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
