//! Bad input, generated: job names, keys, dates, instants, reasons,
//! operators, durations and config values with SQL metacharacters, NUL
//! bytes, confusable Unicode, control, bidi and zero-width characters, huge
//! strings and out-of-range values, through every command-line argument and
//! config key. Each must get one short error line and a non-zero exit, never
//! a panic, and leave the database exactly as it was (a checksum of every
//! batchonce table and the items, before and after).

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use batchonce::testing::TestDb;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config as PropConfig, TestRunner};
use sqlx::PgPool;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");

/// Everything a command could corrupt, as one digest.
async fn checksum(pool: &PgPool) -> String {
    sqlx::query_scalar(
        r#"
        SELECT md5(coalesce(string_agg(t, '|' ORDER BY t), '')) FROM (
            SELECT 'run:' || r::text AS t FROM batch_job_run r
            UNION ALL SELECT 'attempt:' || a::text FROM batch_job_attempt a
            UNION ALL SELECT 'action:' || o::text FROM batch_operator_action o
            UNION ALL SELECT 'worker:' || w::text FROM batch_worker w
            UNION ALL SELECT 'item:' || i::text FROM settlement_item i
            UNION ALL SELECT 'delivery:' || d::text FROM notification_delivery d
            UNION ALL SELECT 'level:' || l::text FROM inventory_level l
        ) x
        "#,
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A database with some history: a finished run, a pending one, an audit row.
async fn db_with_history() -> TestDb {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    for date in ["2026-09-14", "2026-09-15"] {
        let out = run(&db, None, &["enqueue", "daily-settlement", "--date", date]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = run(
        &db,
        None,
        &[
            "runs",
            "skip",
            "daily-settlement:2026-09-14",
            "--reason",
            "holiday",
            "--operator",
            "kim",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    db
}

fn run(db: &TestDb, config: Option<&PathBuf>, args: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.env("DATABASE_URL", &db.url)
        .env_remove("BATCHONCE_CONFIG")
        .stdin(Stdio::null());
    if let Some(cfg) = config {
        c.arg("--config").arg(cfg);
    }
    c.args(args).output().unwrap()
}

/// The contract for a rejected input.
fn assert_refused(out: &Output, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{what}: accepted\n{err}");
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "{what}: panic\n{err}"
    );
    let lines: Vec<&str> = err.trim_end().lines().collect();
    assert_eq!(lines.len(), 1, "{what}: not one line:\n{err}");
    assert!(
        lines[0].starts_with("batchonce: error: "),
        "{what}: {}",
        lines[0]
    );
    assert!(
        lines[0].chars().count() <= 1100,
        "{what}: a {}-character error line",
        lines[0].chars().count()
    );
}

/// Strings that are never a valid job name, key, date or identifier.
fn nasty() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("'; DROP TABLE batch_job_run; --".to_owned()),
        Just("daily-settlement:2026-09-15' OR '1'='1".to_owned()),
        Just("daily-settlement:2026-09-15; DELETE FROM settlement_item".to_owned()),
        Just("dаily-settlement".to_owned()), // Cyrillic а
        Just("ｄａｉｌｙ-settlement".to_owned()),
        Just("daily-settlement\u{200b}".to_owned()),
        Just("daily\u{202e}tnemelttes".to_owned()),
        Just("DAILY-SETTLEMENT".to_owned()),
        Just("daily-settlement:2026-09-15\n--operator root".to_owned()),
        Just("$(rm -rf /)".to_owned()),
        Just("%s%n%x".to_owned()),
        "[\\PC]{1,40}".prop_map(|s| format!("{s}\u{1f4a5}")),
        "[a-z;:'\"\\\\ -]{1,30}".prop_map(|s| format!("{s};")),
        (1usize..120_000).prop_map(|n| "가".repeat(n / 3 + 1)),
    ]
}

/// Never a valid --reason (3-500 printable characters) nor --operator
/// (1-80 printable characters): empty, too long, or carrying a control,
/// format (bidi, zero-width, BOM), separator or private-use character
/// inside otherwise ordinary text, where trimming cannot remove it.
fn bad_text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("".to_owned()),
        Just("   ".to_owned()),
        Just("tab\there".to_owned()),
        Just("line\nbreak".to_owned()),
        Just("bell\u{7}".to_owned()),
        Just("del\u{7f}".to_owned()),
        Just("c1\u{9b}31m".to_owned()),
        Just("adm\u{202e}nimda".to_owned()),
        Just("kim\u{200b}lee".to_owned()),
        Just("\u{feff}kim".to_owned()),
        Just("k\u{2066}im\u{2069}".to_owned()),
        Just("kim\u{2028}lee".to_owned()),
        Just("soft\u{ad}hyphen".to_owned()),
        Just("private\u{e000}use".to_owned()),
        Just("unassigned\u{378}".to_owned()),
        "[a-z가-힣]{1,8}[\\p{Cf}\\p{Zl}\\p{Zp}\\p{Co}][a-z가-힣 ]{0,8}[a-z가-힣]",
        (501usize..3000).prop_map(|n| "이".repeat(n)),
    ]
}

/// Never a valid `--now`: before 1970-01-01T00:00:00Z or from
/// 2200-01-01T00:00:00Z on (the business dates' range in UTC), or no
/// RFC 3339 instant at all.
fn bad_instant() -> impl Strategy<Value = String> {
    let rfc3339 = |secs: i64| {
        chrono::DateTime::from_timestamp(secs, 0)
            .expect("within chrono's range")
            .to_rfc3339()
    };
    prop_oneof![
        Just("1969-12-31T00:00:00Z".to_owned()),
        Just("1969-12-31T23:59:59.999Z".to_owned()),
        Just("1970-01-01T08:59:59+09:00".to_owned()),
        Just("2200-01-01T00:00:00Z".to_owned()),
        Just("2199-12-31T23:00:00-01:00".to_owned()),
        Just("0001-01-01T00:00:00Z".to_owned()),
        Just("9999-12-31T23:59:59Z".to_owned()),
        // 0001-01-01 to 1969-12-31T23:59:59Z, and 2200-01-01 to 9999-12-31.
        (-62_135_596_800i64..0).prop_map(rfc3339),
        (7_258_118_400i64..253_402_300_800).prop_map(rfc3339),
        nasty(),
    ]
}

/// Never a valid count for any numeric flag (the smallest range is
/// `--processes` 2..=64, the largest `--limit` 1..=10000).
fn bad_number() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("1.5".to_owned()),
        Just("eight".to_owned()),
        Just("".to_owned()),
        Just("0x10".to_owned()),
        Just("1e3".to_owned()),
        Just("100001".to_owned()),
        Just("99999999999999999999".to_owned()),
        nasty(),
    ]
}

/// Never a valid worker id.
fn bad_id() -> impl Strategy<Value = String> {
    nasty().prop_filter("has a character a worker id cannot", |s| {
        s.bytes()
            .any(|b| !(b.is_ascii_alphanumeric() || b"-_.".contains(&b)))
    })
}

/// Strings that are never a valid date.
fn bad_date() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("2026-02-30".to_owned()),
        Just("2026-13-01".to_owned()),
        Just("0000-00-00".to_owned()),
        Just("1969-12-31".to_owned()),
        Just("2200-01-01".to_owned()),
        Just("9999-12-31".to_owned()),
        Just("+2026-09-15".to_owned()),
        Just("2026-09-15T00:00".to_owned()),
        Just("2026/09/15".to_owned()),
        Just("today".to_owned()),
        Just("2026-09-15'; --".to_owned()),
        nasty(),
    ]
}

/// Strings that are never a valid duration.
fn bad_duration() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("-1s".to_owned()),
        Just("0s".to_owned()),
        Just("99999999999999999999h".to_owned()),
        Just("1e9s".to_owned()),
        Just("1 fortnight".to_owned()),
        Just("".to_owned()),
        nasty(),
    ]
}

/// `n` generated values (a failure prints the input that caused it).
fn sample<S: Strategy>(strategy: S, n: usize) -> Vec<S::Value> {
    let mut runner = TestRunner::new(PropConfig {
        failure_persistence: None,
        ..PropConfig::default()
    });
    (0..n)
        .map(|_| {
            strategy
                .new_tree(&mut runner)
                .expect("strategy generates")
                .current()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_command_line_arguments_are_refused_and_change_nothing() {
    let db = db_with_history().await;
    let before = checksum(&db.pool).await;
    let strategy = (
        nasty(),
        bad_date(),
        bad_duration(),
        bad_text(),
        bad_id(),
        bad_number(),
        bad_instant(),
        0usize..25,
    );
    let cases = sample(strategy, 64);
    for (s, date, dur, text, id, num, instant, pick) in cases {
        let operator = text.replace("ab", "");
        let args: Vec<&str> = match pick {
            0 => vec!["enqueue", &s, "--date", "2026-09-15"],
            1 => vec!["enqueue", "daily-settlement", "--date", &date],
            2 => vec![
                "enqueue",
                "daily-settlement",
                "--from",
                &date,
                "--to",
                "2026-09-15",
            ],
            3 => vec!["runs", "show", &s],
            4 => vec![
                "runs",
                "fail",
                &s,
                "--reason",
                "a valid reason",
                "--operator",
                "kim",
            ],
            // A skip of a PENDING run, which a valid reason would apply:
            // only the reason can make it fail. (A rerun of it, tried here
            // before, is refused whatever the reason says.)
            5 => vec![
                "runs",
                "skip",
                "daily-settlement:2026-09-15",
                "--reason",
                &text,
                "--operator",
                "kim",
            ],
            6 => vec![
                "runs",
                "skip",
                "daily-settlement:2026-09-15",
                "--reason",
                "a valid reason",
                "--operator",
                &operator,
            ],
            7 => vec!["worker", "--grace", &dur],
            8 => vec!["worker", "--poll-interval", &dur],
            9 => vec!["produce", "--once", "--now", &instant],
            10 => vec!["runs", "list", "--status", &s],
            11 => vec!["worker", "--worker-id", &id],
            12 => vec!["worker", "--listen-url", &s],
            13 => vec!["exporter", "--interval", &dur],
            14 => vec!["produce", "--interval", &dur],
            15 => vec!["preflight", "--processes", &num],
            16 => vec!["runs", "list", "--limit", &num],
            17 => vec!["runs", "list", "--job", &s],
            18 => vec!["worker", "--metrics-addr", &s],
            19 => vec!["worker", "--concurrency", &num],
            20 => vec!["worker", "--max-connections", &num],
            21 => vec!["--database-url", &s, "status"],
            22 => vec!["--log-format", &s, "status"],
            23 => vec!["--config", &s, "status"],
            24 => vec!["roles", "--prefix", &s],
            _ => vec![
                "enqueue",
                "daily-settlement",
                "--date",
                "2026-09-16",
                "--to",
                &date,
            ],
        };
        let out = run(&db, None, &args);
        let what = format!(
            "{:?}",
            args.iter()
                .map(|a| batchonce::key::shown(a))
                .collect::<Vec<_>>()
        );
        assert_refused(&out, &what);
        assert_eq!(
            checksum(&db.pool).await,
            before,
            "{what} changed the database"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_and_produce_keep_to_the_same_range_of_business_dates() {
    let db = db_with_history().await;
    let before = checksum(&db.pool).await;
    // An instant outside the range: one line that says what the range is,
    // and nothing enqueued.
    for now in ["1969-12-31T00:00:00Z", "2200-01-01T00:00:00Z"] {
        let out = run(&db, None, &["produce", "--once", "--now", now]);
        assert_refused(&out, now);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("out of range")
                && err.contains("1970-01-01")
                && err.contains("2199-12-31"),
            "{err}"
        );
    }
    assert_eq!(checksum(&db.pool).await, before);
    // A window crossing 1970-01-01 (the settlement's 7 days, from 02:00 in
    // Seoul on 1970-01-03): only dates from 1970-01-01 on.
    let out = run(
        &db,
        None,
        &["produce", "--once", "--now", "1970-01-03T02:00:00+09:00"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("enqueued daily-settlement:1970-01-01\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("enqueued daily-settlement:1970-01-02\n"),
        "{stdout}"
    );
    let outside: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM batch_job_run \
         WHERE business_date NOT BETWEEN '1970-01-01' AND '2199-12-31'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(outside, 0, "{stdout}");
    // The same edge by hand: the produced date is a duplicate, the one
    // before it is refused.
    let out = run(
        &db,
        None,
        &["enqueue", "daily-settlement", "--date", "1970-01-01"],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "duplicate daily-settlement:1970-01-01\n"
    );
    let mid = checksum(&db.pool).await;
    let out = run(
        &db,
        None,
        &["enqueue", "daily-settlement", "--date", "1969-12-31"],
    );
    assert_refused(&out, "enqueue --date 1969-12-31");
    assert_eq!(checksum(&db.pool).await, mid);
}

/// One `[jobs.<job>]` table with one generated key and value.
fn bad_config() -> impl Strategy<Value = (String, Vec<u8>)> {
    let keys = prop_oneof![
        Just("timezone"),
        Just("max_attempts"),
        Just("lease_ttl"),
        Just("stale_after"),
        Just("chunk_size"),
        Just("backoff"),
        Just("chunk_pause"),
        Just("on_lease_expiry"),
        Just("schedule"),
        Just("covers"),
        Just("catch_up"),
        Just("skip_dates"),
        Just("skip_weekdays"),
        Just("enabled"),
        Just("max_item_failures"),
        Just("command"),
    ];
    let values = prop_oneof![
        nasty().prop_map(|s| toml::Value::String(s).to_string()),
        Just("-1".to_owned()),
        Just("99999999999999999999".to_owned()),
        Just("1.5".to_owned()),
        Just("[\"2026-02-30\"]".to_owned()),
        Just("{ a = 1 }".to_owned()),
        Just("\"\"".to_owned()),
        Just("[]".to_owned()),
        Just("\"Mars/Olympus_Mons\"".to_owned()),
        Just("\"61 * * * *\"".to_owned()),
        // Schedules that can never fire.
        Just("\"0 1 31 2 *\"".to_owned()),
        Just("\"0 0 31 4,6,9,11 *\"".to_owned()),
        Just("\"0 0 31 2 +1\"".to_owned()),
        Just("\"400000d\"".to_owned()),
        bad_duration().prop_map(|s| toml::Value::String(s).to_string()),
    ];
    (keys, values)
        // The only valid pairs the values can make: an empty calendar list,
        // and no pause or catch-up at all.
        .prop_filter("a valid pair", |(k, v)| {
            let empty_list = k.starts_with("skip_") && v == "[]";
            let zero = matches!(*k, "chunk_pause" | "catch_up") && v == "\"0s\"";
            !(empty_list || zero)
        })
        .prop_map(|(k, v)| {
            let text = format!("[jobs.daily-settlement]\n{k} = {v}\n");
            (
                format!("{k} = {}", batchonce::key::shown(&v)),
                text.into_bytes(),
            )
        })
}

/// A command job's or a bundled kind's own key with a bad value.
fn bad_kind_config() -> impl Strategy<Value = (String, Vec<u8>)> {
    // (table, key, whether any string is valid for it: paths are).
    let keys = prop_oneof![
        Just(("x", "timeout", false)),
        Just(("x", "kill_grace", false)),
        Just(("x", "working_dir", true)),
        Just(("x", "env", false)),
        Just(("x", "pass_env", false)),
        Just(("x", "database_url_env", false)),
        Just(("x", "skipped_exit_code", false)),
        Just(("x", "fatal_exit_codes", false)),
        Just(("notification-send", "sender", false)),
        Just(("notification-send", "outbox_dir", true)),
        Just(("notification-send", "webhook_url", false)),
        Just(("notification-send", "webhook_timeout", false)),
        Just(("notification-send", "webhook_retries", false)),
        Just(("notification-send", "webhook_token_env", false)),
        Just(("notification-send", "webhook_allow_http", false)),
        Just(("inventory-sync", "source_file", true)),
    ];
    let strings = prop_oneof![
        nasty().prop_map(|s| toml::Value::String(s).to_string()),
        bad_duration().prop_map(|s| toml::Value::String(s).to_string()),
    ];
    let others = prop_oneof![
        Just("-1".to_owned()),
        Just("1.5".to_owned()),
        Just("{ a = 1 }".to_owned()),
        Just("[\"x\", 2]".to_owned()),
        Just("[300]".to_owned()),
        Just("99999999999999999999".to_owned()),
    ];
    (keys, strings, others, any::<bool>()).prop_map(
        |((table, key, paths), string, other, use_string)| {
            let value = if use_string && !paths { string } else { other };
            let command = if table == "x" {
                "command = [\"true\"]\n"
            } else {
                ""
            };
            let text = format!("[jobs.{table}]\n{command}{key} = {value}\n");
            (
                format!("jobs.{table}.{key} = {}", batchonce::key::shown(&value)),
                text.into_bytes(),
            )
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_config_files_are_refused_and_change_nothing() {
    let db = db_with_history().await;
    let before = checksum(&db.pool).await;
    let dir = batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), "bad-config");
    let mut cases = sample(bad_config(), 64);
    cases.extend(sample(bad_kind_config(), 40));
    // Files no generator makes: NUL bytes, invalid UTF-8, a megabyte value,
    // an unknown table.
    let mut raw = b"[jobs.daily-settlement]\ntimezone = \"Asia/Seoul\0\"\n".to_vec();
    cases.push(("a NUL byte".into(), std::mem::take(&mut raw)));
    cases.push((
        "invalid UTF-8".into(),
        b"[jobs.daily-settlement]\ntimezone = \"\xff\xfe\"\n".to_vec(),
    ));
    cases.push((
        "a megabyte value".into(),
        format!(
            "[jobs.daily-settlement]\ntimezone = \"{}\"\n",
            "가".repeat(350_000)
        )
        .into_bytes(),
    ));
    // A schedule that can never fire, which the generator pairs with the
    // `schedule` key only by chance.
    for never in ["0 1 31 2 *", "0 0 31 2 +1"] {
        cases.push((
            format!("schedule = {never:?}"),
            format!("[jobs.daily-settlement]\nschedule = {never:?}\n").into_bytes(),
        ));
    }
    cases.push((
        "an unknown table".into(),
        b"[workers]\ncount = 3\n".to_vec(),
    ));
    cases.push((
        "a megabyte key".into(),
        format!("[jobs.daily-settlement]\n{} = 1\n", "k".repeat(1 << 20)).into_bytes(),
    ));
    for (what, text) in cases {
        let path = dir.join("bad.toml");
        std::fs::write(&path, &text).unwrap();
        for args in [
            &["enqueue", "daily-settlement", "--date", "2026-09-16"][..],
            &["worker"][..],
            &["produce", "--once"][..],
        ] {
            let out = run(&db, Some(&path), args);
            assert_refused(&out, &format!("{what} with {args:?}"));
        }
        assert_eq!(
            checksum(&db.pool).await,
            before,
            "{what} changed the database"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_payload_is_refused_whole() {
    let db = db_with_history().await;
    let before = checksum(&db.pool).await;
    for size in [70_000usize, 1 << 20] {
        let run = batchonce::queue::NewRun {
            payload: serde_json::json!({ "note": "가".repeat(size / 3) }),
            ..batchonce::queue::NewRun::new(
                batchonce::JobKey::parse("daily-settlement:2026-09-20").unwrap(),
                chrono::NaiveDate::from_ymd_opt(2026, 9, 20).unwrap(),
                &batchonce::JobConfig::default(),
            )
            .unwrap()
        };
        let e = batchonce::queue::enqueue(&db.pool, &[run], batchonce::Clock::Db)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("payload") && e.chars().count() < 1100,
            "{}",
            batchonce::key::shown(&e)
        );
        assert_eq!(checksum(&db.pool).await, before);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_megabyte_error_message_is_stored_cut_on_a_char_boundary() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let dir = batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), "big-error");
    let cfg = dir.join("batchonce.toml");
    // A program that dies with a megabyte of Korean on one stderr line.
    std::fs::write(
        &cfg,
        "[jobs.loud]\ncommand = [\"sh\", \"-c\", \"i=0; while [ $i -lt 18 ]; do printf '실패한 주문 %.0s' $(seq 1 4000); i=$((i+1)); done >&2; exit 2\"]\n",
    )
    .unwrap();
    let out = run(
        &db,
        Some(&cfg),
        &["enqueue", "loud", "--date", "2026-09-15"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut worker = Command::new(BIN)
        .env("DATABASE_URL", &db.url)
        .arg("--config")
        .arg(&cfg)
        .args(["worker", "--poll-interval", "200ms"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    batchonce::testing::wait_for_status(
        &db.pool,
        None,
        &["FAILED"],
        std::time::Duration::from_secs(30),
    )
    .await;
    worker.kill().unwrap();
    worker.wait().unwrap();
    let (msg, attempt_msg): (String, String) = sqlx::query_as(
        "SELECT r.error_message, a.error_message FROM batch_job_run r JOIN batch_job_attempt a USING (job_key)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    for m in [&msg, &attempt_msg] {
        assert!(m.chars().count() <= 1000);
        assert!(
            m.starts_with("`sh` exited 2"),
            "{}",
            batchonce::key::shown(m)
        );
        assert!(m.contains("실패한 주문"));
    }
}
