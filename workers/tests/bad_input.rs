//! Bad input, generated: job names, keys, dates, instants, reasons,
//! operators, durations and config values with SQL metacharacters, NUL
//! bytes, confusable Unicode, control, bidi and zero-width characters, huge
//! strings and out-of-range values, through every command-line argument and
//! config key. Each must get one short error line that says what was
//! refused and the exit status of its refusal (2 from the argument parser, 1
//! from the command), never a panic, and leave the database exactly as it
//! was (a checksum of every batchonce table and the items, before and
//! after).
//!
//! Every argument slot gets a bad value on every run, and random cases come
//! on top. The values are drawn from one seed, printed in every failure
//! message; `BATCHONCE_BAD_INPUT_SEED=<seed>` draws the same values again.
//! Every process gets [`PROCESS_LIMIT`] to exit: an argument wrongly
//! accepted by a long-running command (`worker`, `produce`, `exporter`)
//! fails the test instead of hanging it.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use batchonce::testing::TestDb;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config as PropConfig, RngAlgorithm, TestRng, TestRunner};
use sqlx::PgPool;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");

/// How long any command may take: a refusal takes well under a second.
const PROCESS_LIMIT: Duration = Duration::from_secs(20);

/// The seed every generated value of this process is drawn from:
/// `BATCHONCE_BAD_INPUT_SEED` when set, a random one otherwise.
fn seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| match std::env::var("BATCHONCE_BAD_INPUT_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("BATCHONCE_BAD_INPUT_SEED={s:?} is not a u64")),
        Err(_) => rand::random(),
    })
}

/// Appended to every failure message, so that the run can be repeated.
fn reproduce() -> String {
    format!("(reproduce with BATCHONCE_BAD_INPUT_SEED={})", seed())
}

/// A proptest runner drawing from [`seed`]; `salt` gives each test its own
/// stream.
fn runner(salt: u8) -> TestRunner {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed().to_le_bytes());
    bytes[8] = salt;
    eprintln!("bad input: seed {} {}", seed(), reproduce());
    TestRunner::new_with_rng(
        PropConfig {
            failure_persistence: None,
            ..PropConfig::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    )
}

/// Runs `c` to its end, or kills it and fails naming `what` once it has
/// run for [`PROCESS_LIMIT`].
fn output_within(mut c: Command, what: &str) -> Output {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start {BIN}: {e}"));
    // Each pipe is drained on a thread of its own: a child blocked on a
    // full pipe would look hung.
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = pipe.read_to_end(&mut v);
            v
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + PROCESS_LIMIT;
    let status = loop {
        match child.try_wait().unwrap() {
            Some(status) => break status,
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{what}: still running after {PROCESS_LIMIT:?}, killed: a bad argument was accepted {}",
                    reproduce()
                );
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// The arguments as a failure message shows them.
fn shown(args: &[&str]) -> String {
    format!(
        "{:?}",
        args.iter()
            .map(|a| batchonce::key::shown(a))
            .collect::<Vec<_>>()
    )
}

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
    // Without a file of its own, the bundled kinds the test exercises, by
    // the environment, so that a `--config` among `args` still wins.
    c.env("DATABASE_URL", &db.url)
        .env("BATCHONCE_CONFIG", common::samples_config());
    if let Some(cfg) = config {
        c.arg("--config").arg(cfg);
    }
    c.args(args);
    output_within(c, &shown(args))
}

/// What a refusal must be: its exit status (2 for what the argument parser
/// refuses, 1 for what the command refuses once parsed) and fragments of its
/// error line that say what was refused, one of which it must contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Refusal {
    code: i32,
    says: &'static [&'static str],
}

/// Refused by the argument parser, saying one of `says` (the option's
/// name).
const fn parser(says: &'static [&'static str]) -> Refusal {
    Refusal { code: 2, says }
}

/// Refused by the command once parsed, saying one of `says`.
const fn command(says: &'static [&'static str]) -> Refusal {
    Refusal { code: 1, says }
}

/// How every date is refused: not a date, or outside the business dates.
const BAD_DATE: Refusal = command(&[
    "invalid date",
    "is out of range: business dates run from 1970-01-01 to 2199-12-31",
]);

/// The contract for a rejected input: the exit status and the message
/// `want` names, on one short line, and no panic.
fn assert_refused(out: &Output, what: &str, want: Refusal) {
    let err = String::from_utf8_lossy(&out.stderr);
    let why = reproduce();
    assert!(!out.status.success(), "{what}: accepted {why}\n{err}");
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "{what}: panic {why}\n{err}"
    );
    let lines: Vec<&str> = err.trim_end().lines().collect();
    assert_eq!(lines.len(), 1, "{what}: not one line {why}:\n{err}");
    let line = lines[0];
    assert!(
        line.starts_with("batchonce: error: "),
        "{what}: {line} {why}"
    );
    assert!(
        line.chars().count() <= 1100,
        "{what}: a {}-character error line {why}",
        line.chars().count()
    );
    assert_eq!(
        out.status.code(),
        Some(want.code),
        "{what}: exit status {:?}, not {} {why}\n{line}",
        out.status,
        want.code
    );
    // Messages are cut at MAX_ERROR_CHARS, and the parser quotes a value
    // before it names the option: a huge value's line may end before the
    // name.
    let body = line.trim_start_matches("batchonce: error: ");
    // The parser's refusals end by naming the help of the subcommand typed,
    // `(see batchonce --help)` or `(see batchonce runs fail --help)`.
    let help = body
        .rfind(" (see batchonce")
        .filter(|i| body[*i..].ends_with(" --help)"));
    let body = help.map_or(body, |i| &body[..i]);
    let cut = body.chars().count() >= batchonce::text::MAX_ERROR_CHARS;
    assert!(
        cut || want.says.iter().any(|s| line.contains(s)),
        "{what}: the error line says none of {:?} {why}\n{line}",
        want.says
    );
    // The parser's refusals point at the help; the commands' say it all.
    assert_eq!(help.is_some(), want.code == 2, "{what}: {line} {why}");
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

/// One generated value.
fn draw<S: Strategy>(strategy: &S, runner: &mut TestRunner) -> S::Value {
    strategy
        .new_tree(runner)
        .expect("strategy generates")
        .current()
}

/// `n` generated values (a failure prints the input that caused it).
fn sample<S: Strategy>(strategy: S, n: usize, runner: &mut TestRunner) -> Vec<S::Value> {
    (0..n).map(|_| draw(&strategy, runner)).collect()
}

/// One bad value of every kind; each slot puts one of them in its place.
#[derive(Debug, Clone)]
struct Bad {
    s: String,
    date: String,
    dur: String,
    text: String,
    id: String,
    num: String,
    instant: String,
}

fn bad() -> impl Strategy<Value = Bad> {
    (
        nasty(),
        bad_date(),
        bad_duration(),
        bad_text(),
        bad_id(),
        bad_number(),
        bad_instant(),
    )
        .prop_map(|(s, date, dur, text, id, num, instant)| Bad {
            s,
            date,
            dur,
            text,
            id,
            num,
            instant,
        })
}

/// A place on the command line for a bad value.
struct Slot {
    /// The command line with `value` in its place.
    args: fn(&str) -> Vec<&str>,
    /// Which of the bad values goes there.
    value: fn(&Bad) -> &str,
    /// How it must be refused.
    refusal: Refusal,
}

/// Every argument and option that takes a value, each with a command line
/// on which only that value can be wrong.
const SLOTS: &[Slot] = &[
    Slot {
        args: |v| vec!["enqueue", v, "--date", "2026-09-15"],
        value: |b| &b.s,
        refusal: command(&["unknown job"]),
    },
    Slot {
        args: |v| vec!["enqueue", "daily-settlement", "--date", v],
        value: |b| &b.date,
        refusal: BAD_DATE,
    },
    Slot {
        args: |v| {
            vec![
                "enqueue",
                "daily-settlement",
                "--from",
                v,
                "--to",
                "2026-09-15",
            ]
        },
        value: |b| &b.date,
        refusal: BAD_DATE,
    },
    Slot {
        args: |v| {
            vec![
                "enqueue",
                "daily-settlement",
                "--from",
                "2026-09-16",
                "--to",
                v,
            ]
        },
        value: |b| &b.date,
        refusal: BAD_DATE,
    },
    Slot {
        args: |v| vec!["runs", "show", v],
        value: |b| &b.s,
        refusal: command(&["invalid job key"]),
    },
    Slot {
        args: |v| {
            vec![
                "runs",
                "fail",
                v,
                "--reason",
                "a valid reason",
                "--operator",
                "kim",
            ]
        },
        value: |b| &b.s,
        refusal: command(&["invalid job key"]),
    },
    // A skip of a PENDING run, which a valid reason would apply: only the
    // reason can make it fail. (A rerun of it, tried here before, is
    // refused whatever the reason says.)
    Slot {
        args: |v| {
            vec![
                "runs",
                "skip",
                "daily-settlement:2026-09-15",
                "--reason",
                v,
                "--operator",
                "kim",
            ]
        },
        value: |b| &b.text,
        refusal: command(&["invalid --reason"]),
    },
    Slot {
        args: |v| {
            vec![
                "runs",
                "skip",
                "daily-settlement:2026-09-15",
                "--reason",
                "a valid reason",
                "--operator",
                v,
            ]
        },
        value: |b| &b.text,
        refusal: command(&["invalid --operator"]),
    },
    Slot {
        args: |v| vec!["worker", "--grace", v],
        value: |b| &b.dur,
        refusal: parser(&["--grace"]),
    },
    Slot {
        args: |v| vec!["worker", "--poll-interval", v],
        value: |b| &b.dur,
        refusal: parser(&["--poll-interval"]),
    },
    Slot {
        args: |v| vec!["produce", "--once", "--now", v],
        value: |b| &b.instant,
        refusal: parser(&["--now"]),
    },
    Slot {
        args: |v| vec!["runs", "list", "--status", v],
        value: |b| &b.s,
        refusal: command(&["unknown status"]),
    },
    Slot {
        args: |v| vec!["worker", "--worker-id", v],
        value: |b| &b.id,
        refusal: command(&["invalid worker id"]),
    },
    Slot {
        args: |v| vec!["worker", "--listen-url", v],
        value: |b| &b.s,
        refusal: command(&["invalid database URL"]),
    },
    Slot {
        args: |v| vec!["exporter", "--interval", v],
        value: |b| &b.dur,
        refusal: parser(&["--interval"]),
    },
    Slot {
        args: |v| vec!["produce", "--interval", v],
        value: |b| &b.dur,
        refusal: parser(&["--interval"]),
    },
    Slot {
        args: |v| vec!["preflight", "--processes", v],
        value: |b| &b.num,
        refusal: parser(&["--processes"]),
    },
    Slot {
        args: |v| vec!["runs", "list", "--limit", v],
        value: |b| &b.num,
        refusal: parser(&["--limit"]),
    },
    Slot {
        args: |v| vec!["runs", "list", "--job", v],
        value: |b| &b.s,
        refusal: command(&["unknown job", "invalid job name"]),
    },
    Slot {
        args: |v| vec!["runs", "list", "--scope", v],
        value: |b| &b.s,
        refusal: command(&["invalid scope"]),
    },
    Slot {
        args: |v| vec!["worker", "--metrics-addr", v],
        value: |b| &b.s,
        refusal: parser(&["--metrics-addr"]),
    },
    Slot {
        args: |v| vec!["worker", "--concurrency", v],
        value: |b| &b.num,
        refusal: parser(&["--concurrency"]),
    },
    Slot {
        args: |v| vec!["worker", "--max-connections", v],
        value: |b| &b.num,
        refusal: parser(&["--max-connections"]),
    },
    Slot {
        args: |v| vec!["--database-url", v, "status"],
        value: |b| &b.s,
        refusal: command(&["invalid database URL"]),
    },
    Slot {
        args: |v| vec!["--log-format", v, "status"],
        value: |b| &b.s,
        refusal: parser(&["--log-format"]),
    },
    Slot {
        args: |v| vec!["--config", v, "status"],
        value: |b| &b.s,
        refusal: command(&["cannot read config file"]),
    },
    Slot {
        args: |v| vec!["roles", "--prefix", v],
        value: |b| &b.s,
        refusal: command(&["invalid role prefix"]),
    },
];

/// How `slot` must refuse `value`. A value that starts with `-` is taken
/// for an option by the argument parser, which refuses it first.
fn refusal_of(slot: &Slot, value: &str) -> Refusal {
    if value.starts_with('-') && value != "-" {
        parser(&["unexpected argument '-"])
    } else {
        slot.refusal
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_command_line_arguments_are_refused_and_change_nothing() {
    let db = db_with_history().await;
    let before = checksum(&db.pool).await;
    let mut runner = runner(1);
    // Every slot on every run, then random slots on top.
    let mut cases: Vec<(usize, Bad)> = (0..SLOTS.len())
        .map(|i| (i, draw(&bad(), &mut runner)))
        .collect();
    for _ in 0..40 {
        let i = draw(&(0..SLOTS.len()), &mut runner);
        cases.push((i, draw(&bad(), &mut runner)));
    }
    for (i, b) in cases {
        let slot = &SLOTS[i];
        let value = (slot.value)(&b);
        let args = (slot.args)(value);
        let what = format!("slot {i}: {}", shown(&args));
        let out = run(&db, None, &args);
        assert_refused(&out, &what, refusal_of(slot, value));
        assert_eq!(
            checksum(&db.pool).await,
            before,
            "{what} changed the database {}",
            reproduce()
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
        assert_refused(&out, now, parser(&["--now"]));
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
    assert_refused(&out, "enqueue --date 1969-12-31", BAD_DATE);
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
    let mut runner = runner(2);
    let mut cases = sample(bad_config(), 64, &mut runner);
    cases.extend(sample(bad_kind_config(), 40, &mut runner));
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
            let case = format!("{what} with {args:?}");
            // A configuration is refused once parsed, naming its file and,
            // for a generated key, that key (or, for a value TOML itself
            // cannot read, the key's line).
            assert_refused(&out, &case, command(&["bad.toml"]));
            if let Some((key, _)) = what.split_once(" = ") {
                let bare = key.rsplit('.').next().unwrap_or(key);
                let err = String::from_utf8_lossy(&out.stderr);
                assert!(
                    err.contains(bare) || err.contains("bad.toml: line "),
                    "{case}: the error does not name {bare:?} {}\n{err}",
                    reproduce()
                );
            }
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
    let worker = KillOnDrop(
        Command::new(BIN)
            .env("DATABASE_URL", &db.url)
            .arg("--config")
            .arg(&cfg)
            .args(["worker", "--poll-interval", "200ms"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    batchonce::testing::wait_for_status(&db.pool, None, &["FAILED"], Duration::from_secs(30)).await;
    drop(worker);
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

/// A long-running process that is killed when the test is done with it,
/// or fails.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
