//! The command line as an operator reads it at 3 a.m. (issue 18), with the
//! built binary as a real process: help text for every argument, the
//! allowed states and an example in `runs fail|rerun|skip --help`, usage
//! errors that name the subcommand's help, aligned `runs list` columns, an
//! expired lease in `runs show`, the date hint, `runs stale --fail-if-dead`,
//! `runs watch` on a pipe and on a terminal, logs without colour codes or
//! Rust debug text, and `status` on an unmigrated database.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use batchonce::queue::{self, ClaimSpec, Finish, NewRun};
use batchonce::testing::{wait_until, TestDb};
use batchonce::{Clock, JobConfig, JobKey, JobName};
use chrono::NaiveDate;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

mod common;

use common::wait_exit;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");
const KEY: &str = "daily-settlement:2026-09-15";
const HOUR: Duration = Duration::from_secs(3600);

fn date() -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 9, 15).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), name)
}

async fn db() -> TestDb {
    TestDb::new(&batchonce_workers::migrations()).await
}

fn cmd(url: Option<&str>, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    // The bundled kinds the tests exercise, declared by the environment so
    // that a `--config` among `args` still wins.
    c.env("BATCHONCE_CONFIG", common::samples_config())
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null())
        .args(args);
    if let Some(u) = url {
        c.env("DATABASE_URL", u);
    }
    c
}

fn run(url: Option<&str>, args: &[&str]) -> Output {
    cmd(url, args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Everything `from` writes, collected by a thread until it closes.
fn collect(mut from: impl Read + Send + 'static) -> Arc<Mutex<Vec<u8>>> {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let out = buf.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        // A pty's master reads EIO once the last slave is closed: the end.
        while let Ok(n) = from.read(&mut chunk) {
            if n == 0 {
                break;
            }
            out.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
    });
    buf
}

fn text_of(buf: &Arc<Mutex<Vec<u8>>>) -> String {
    String::from_utf8_lossy(&buf.lock().unwrap()).into_owned()
}

async fn wait_for_text(buf: &Arc<Mutex<Vec<u8>>>, what: &str) {
    wait_until(
        &format!("output containing {what:?}"),
        Duration::from_secs(30),
        || async { text_of(buf).contains(what) },
    )
    .await;
}

fn job(name: &str) -> JobName {
    JobName::parse(name).unwrap()
}

/// Enqueues `key` with the default configuration but a lease of `ttl`
/// (a run's claims use the lease it was enqueued with).
async fn enqueue(db: &TestDb, key: &str, ttl: Duration) {
    let key = JobKey::parse(key).unwrap();
    let cfg = JobConfig {
        lease_ttl: ttl,
        ..JobConfig::default()
    };
    let run = NewRun::new(key, date(), &cfg).unwrap();
    queue::enqueue(&db.pool, &[run], Clock::Db).await.unwrap();
}

/// Claims the due run of `job` as `worker`.
async fn claim(db: &TestDb, name: &str, worker: &str, ttl: Duration) -> queue::Lease {
    let spec = ClaimSpec {
        job: job(name),
        lease_ttl: ttl,
    };
    let mut leases = queue::claim(&db.pool, worker, &[spec], 1, Clock::Db)
        .await
        .unwrap();
    assert_eq!(leases.len(), 1, "one {name} run to claim");
    leases.remove(0)
}

// ---------------------------------------------------------------------------
// Help

/// Every argument and option of every command, hidden ones included, has
/// help text, and so has every subcommand.
#[test]
fn every_argument_has_help_text() {
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        let path = format!("{path} {}", cmd.get_name()).trim().to_owned();
        for a in cmd.get_arguments() {
            let help = a.get_help().or(a.get_long_help()).map(|h| h.to_string());
            if help.is_none_or(|h| h.trim().is_empty()) {
                missing.push(format!("{path} {}", a.get_id()));
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.get_about().is_none() {
                missing.push(format!("{path} {} (the command)", sub.get_name()));
            }
            walk(sub, &path, missing);
        }
    }
    let mut cmd = batchonce::cli::command();
    // Building adds --help and --version and propagates the global options.
    cmd.build();
    let mut missing = Vec::new();
    walk(&cmd, "", &mut missing);
    assert_eq!(missing, Vec::<String>::new(), "arguments without help text");
}

/// The words of a shell command line: double quotes group, a backslash
/// before a newline continues the line.
fn shell_words(s: &str) -> Vec<String> {
    let s = s.replace("\\\n", " ");
    let mut words = Vec::new();
    let mut word = String::new();
    let (mut quoted, mut any) = (false, false);
    for c in s.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    words.push(std::mem::take(&mut word));
                    any = false;
                }
            }
            c => {
                word.push(c);
                any = true;
            }
        }
    }
    if any {
        words.push(word);
    }
    words
}

/// `runs fail|rerun|skip --help` name the states each allows, with and
/// without --force, and show an example that the command line accepts.
#[test]
fn action_help_names_the_allowed_states_and_an_example() {
    for (action, states) in [
        ("fail", &["RUNNING", "PENDING"][..]),
        ("rerun", &["FAILED", "SUCCEEDED", "SKIPPED"]),
        ("skip", &["PENDING", "FAILED"]),
    ] {
        let out = run(None, &["runs", action, "--help"]);
        assert!(out.status.success());
        let help = stdout(&out);
        let allowed = help
            .lines()
            .find(|l| l.starts_with("Allowed from:"))
            .unwrap_or_else(|| panic!("runs {action} --help: no 'Allowed from:'\n{help}"));
        let with_force = help
            .lines()
            .skip_while(|l| !l.starts_with("Allowed from:"))
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");
        for s in states {
            assert!(
                with_force.contains(s),
                "runs {action} --help lacks {s}: {allowed}\n{help}"
            );
        }
        assert!(help.contains("--force"), "{help}");
        let example = help
            .split("Example:\n")
            .nth(1)
            .unwrap_or_else(|| panic!("runs {action} --help: no example\n{help}"));
        let argv = shell_words(example);
        assert_eq!(argv[..3], ["batchonce", "runs", action], "{example}");
        if let Err(e) = batchonce::cli::command().try_get_matches_from(&argv) {
            panic!("the example of runs {action} does not parse: {e}\n{example}");
        }
    }
    let stale = stdout(&run(None, &["runs", "stale", "--help"]));
    assert!(
        stale.contains("--fail-if-dead") && stale.contains('3'),
        "{stale}"
    );
    let watch = stdout(&run(None, &["runs", "watch", "--help"]));
    assert!(
        watch.contains("--interval") && watch.contains("FAILED"),
        "{watch}"
    );
}

/// A usage error is one line that ends by naming the help of the deepest
/// subcommand given (options and their values stepped over), and exits 2.
#[test]
fn usage_errors_name_the_subcommands_help() {
    for (args, help) in [
        (
            &["runs", "fail", "k", "--operator", "a"][..],
            "batchonce runs fail --help",
        ),
        (
            &["runs", "list", "--limit", "0"],
            "batchonce runs list --help",
        ),
        (&["runs", "watch"], "batchonce runs watch --help"),
        (
            &["runs", "stale", "--fail-if-gone"],
            "batchonce runs stale --help",
        ),
        (
            &["--config", "runs", "worker", "--bogus"],
            "batchonce worker --help",
        ),
        (
            &["--log-format=text", "enqueue", "daily-settlement"],
            "batchonce enqueue --help",
        ),
        (&["frobnicate"], "batchonce --help"),
    ] {
        let out = run(None, args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.trim_end().ends_with(&format!("(see {help})")),
            "{args:?}: {err}"
        );
    }
}

// ---------------------------------------------------------------------------
// runs list, runs show, the date hint

/// Where each cell starts and ends, in terminal columns, for a line whose
/// cells are two or more spaces apart (no cell here holds two spaces).
fn cells(line: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut col = 0;
    let mut start: Option<usize> = None;
    let mut spaces = 0;
    let mut last_end = 0;
    for c in line.chars() {
        let w = unicode_width::UnicodeWidthChar::width(c).unwrap_or(0);
        if c == ' ' {
            spaces += 1;
            if spaces == 2 {
                if let Some(s) = start.take() {
                    out.push((s, last_end));
                }
            }
        } else {
            if start.is_none() {
                start = Some(col);
            }
            spaces = 0;
            last_end = col + w;
        }
        col += w;
    }
    if let Some(s) = start {
        out.push((s, last_end));
    }
    out
}

/// `runs list`: with a 71-character key and a worker named in CJK and
/// accented letters, every left-aligned column starts, and every
/// right-aligned one ends, at the same terminal column on every line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_list_columns_line_up() {
    let db = db().await;
    let long_job = "x".repeat(60);
    let long_key = format!("{long_job}:2026-09-15");
    enqueue(&db, &long_key, HOUR).await;
    enqueue(&db, KEY, HOUR).await;
    enqueue(&db, "notification-send:2026-09-15", HOUR).await;
    enqueue(&db, "inventory-sync:2026-09-15", HOUR).await;
    claim(
        &db,
        "daily-settlement",
        "東京-wörker-ñ",
        Duration::from_secs(3600),
    )
    .await;
    let done = claim(&db, "notification-send", "w1", Duration::from_secs(3600)).await;
    queue::finish(&db.pool, &done.fence(), &Finish::Succeeded, Clock::Db)
        .await
        .unwrap();

    let out = run(Some(&db.url), &["runs", "list"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert!(
        text.contains(&long_key) && text.contains("東京-wörker-ñ"),
        "{text}"
    );
    let header = cells(lines[0]);
    let names: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        names,
        [
            "KEY",
            "STATUS",
            "ATTEMPTS",
            "PROCESSED",
            "FAILED",
            "WORKER",
            "STARTED",
            "FINISHED"
        ]
    );
    let right = ["ATTEMPTS", "PROCESSED", "FAILED"];
    for line in &lines[1..] {
        let c = cells(line);
        assert_eq!(c.len(), header.len(), "{line:?}\n{text}");
        for (i, name) in names.iter().enumerate() {
            if right.contains(name) {
                assert_eq!(
                    c[i].1, header[i].1,
                    "{name} ends elsewhere in {line:?}\n{text}"
                );
            } else {
                assert_eq!(
                    c[i].0, header[i].0,
                    "{name} starts elsewhere in {line:?}\n{text}"
                );
            }
        }
    }
}

/// `runs show`: every label ends with a colon and every value starts in
/// the same column; a RUNNING run whose lease has expired (by the database
/// clock) says so, and one with a live lease says when it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_show_says_when_the_lease_expired() {
    let db = db().await;
    enqueue(&db, KEY, Duration::from_secs(1)).await;
    enqueue(&db, "notification-send:2026-09-15", HOUR).await;
    claim(
        &db,
        "daily-settlement",
        "gone-worker",
        Duration::from_secs(1),
    )
    .await;
    claim(
        &db,
        "notification-send",
        "live-worker",
        Duration::from_secs(3600),
    )
    .await;
    wait_until(
        "the 1 s lease to expire",
        Duration::from_secs(30),
        || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT lease_expires_at <= now() FROM batch_job_run WHERE job_key = $1",
            )
            .bind(KEY)
            .fetch_one(&db.pool)
            .await
            .unwrap()
        },
    )
    .await;

    let out = run(Some(&db.url), &["runs", "show", KEY]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lease = text
        .lines()
        .find(|l| l.starts_with("lease:"))
        .unwrap_or_default();
    assert!(lease.contains("EXPIRED") && lease.contains("ago"), "{text}");
    assert!(
        lease.contains("gone-worker") && lease.contains("runs stale"),
        "{text}"
    );
    let fields: Vec<&str> = text.lines().take_while(|l| !l.is_empty()).collect();
    assert!(fields.len() >= 10, "{text}");
    for l in &fields {
        let (label, value) = l.split_at(16);
        assert!(
            label.trim_end().ends_with(':')
                && !label.trim_end()[..label.trim_end().len() - 1].contains(':'),
            "label of {l:?}\n{text}"
        );
        assert!(
            !value.starts_with(' ') && !value.is_empty(),
            "value of {l:?}\n{text}"
        );
    }
    assert!(text.contains("\nattempt history:\n"), "{text}");

    let live = stdout(&run(
        Some(&db.url),
        &["runs", "show", "notification-send:2026-09-15"],
    ));
    let lease = live
        .lines()
        .find(|l| l.starts_with("lease:"))
        .unwrap_or_default();
    assert!(
        lease.contains("expires") && lease.contains("(in "),
        "{live}"
    );
    assert!(!lease.contains("EXPIRED"), "{live}");
}

/// A key that names no run but whose date is written another way gets the
/// stored spelling; a well-written key without a run gets no hint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_date_written_another_way_gets_a_hint() {
    let db = db().await;
    enqueue(&db, KEY, HOUR).await;
    let want = "business dates are written YYYY-MM-DD, e.g. daily-settlement:2026-09-15";
    for args in [
        &["runs", "show", "daily-settlement:2026-9-15"][..],
        &["runs", "show", "daily-settlement:15/09/2026"],
        &["runs", "watch", "daily-settlement:20260915"],
        &[
            "runs",
            "skip",
            "daily-settlement:2026-9-15",
            "--operator",
            "ops",
            "--reason",
            "not today",
        ],
    ] {
        let out = run(Some(&db.url), args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains(&format!("no run with key {}", args[2])),
            "{err}"
        );
        assert!(err.trim_end().ends_with(want), "{args:?}: {err}");
    }
    let out = run(
        Some(&db.url),
        &["runs", "show", "daily-settlement:2026-09-16"],
    );
    assert_eq!(
        stderr(&out).trim_end(),
        "batchonce: error: no run with key daily-settlement:2026-09-16"
    );
    // The run with the well-written key is untouched by the skip above.
    let status: String = sqlx::query_scalar("SELECT status FROM batch_job_run")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(status, "PENDING");
}

// ---------------------------------------------------------------------------
// runs stale --fail-if-dead

/// Exit 0 without a dead run, 3 with one (text and --json), and 0 with a
/// dead run but without the option.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_stale_exits_3_on_a_dead_run_when_asked() {
    let db = db().await;
    let code = |args: &[&str]| {
        let out = run(Some(&db.url), args);
        assert!(out.stderr.is_empty(), "{args:?}: {}", stderr(&out));
        out.status.code()
    };
    assert_eq!(code(&["runs", "stale", "--fail-if-dead"]), Some(0));

    // Claimed by a worker that never heartbeats, has no session of that
    // name and no registry row: dead once the 1 s lease is over.
    let cfg = JobConfig {
        lease_ttl: Duration::from_secs(1),
        stale_after: Duration::from_secs(1),
        ..JobConfig::default()
    };
    let key = JobKey::parse("daily-settlement:2026-09-16").unwrap();
    let run16 = NewRun::new(key, date().succ_opt().unwrap(), &cfg).unwrap();
    queue::enqueue(&db.pool, &[run16], Clock::Db).await.unwrap();
    claim(&db, "daily-settlement", "vanished", Duration::from_secs(1)).await;
    wait_until(
        "the run to be concluded dead",
        Duration::from_secs(30),
        || async {
            let out = run(Some(&db.url), &["--json", "runs", "stale"]);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            v.as_array()
                .unwrap()
                .iter()
                .any(|r| r["conclusion"] == "dead")
        },
    )
    .await;
    assert_eq!(code(&["runs", "stale", "--fail-if-dead"]), Some(3));
    assert_eq!(
        code(&["--json", "runs", "stale", "--fail-if-dead"]),
        Some(3)
    );
    assert_eq!(code(&["runs", "stale"]), Some(0));
}

// ---------------------------------------------------------------------------
// runs watch

/// A settlement configuration with small paced chunks, so a run takes a
/// few seconds.
fn paced_config(dir: &Path) -> PathBuf {
    let path = dir.join("batchonce.toml");
    std::fs::write(
        &path,
        r#"
[jobs.daily-settlement]
timezone = "Asia/Seoul"
max_attempts = 3
lease_ttl = "5s"
stale_after = "1m"
chunk_size = 20
chunk_pause = "30ms"
"#,
    )
    .unwrap();
    path
}

/// Without a terminal, `runs watch` prints one plain line per look (no
/// carriage return, no escape code), from PENDING through RUNNING with
/// items, rate, attempt and lease left, to SUCCEEDED, and exits 0. The
/// worker's JSON log of that run holds no Rust debug text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_watch_without_a_terminal_prints_plain_lines_until_succeeded() {
    let db = db().await;
    let dir = scratch("watch-plain");
    let cfg = paced_config(&dir);
    let cfg_s = cfg.to_str().unwrap();
    common::seed_orders(&db.pool, date(), 0, 2000).await;
    let out = run(
        Some(&db.url),
        &[
            "--config",
            cfg_s,
            "enqueue",
            "daily-settlement",
            "--date",
            "2026-09-15",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));

    let mut watch = cmd(
        Some(&db.url),
        &[
            "--config",
            cfg_s,
            "runs",
            "watch",
            KEY,
            "--interval",
            "200ms",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let seen = collect(watch.stdout.take().unwrap());
    let seen_err = collect(watch.stderr.take().unwrap());
    wait_for_text(&seen, "PENDING").await;

    let log_path = dir.join("worker.log");
    let mut worker = cmd(
        Some(&db.url),
        &[
            "--config",
            cfg_s,
            "--log-format",
            "json",
            "worker",
            "--worker-id",
            "watched",
            "--poll-interval",
            "200ms",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
    )
    .env("RUST_LOG", "info")
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log_path).unwrap())
    .spawn()
    .unwrap();

    let status = wait_exit(&mut watch, Duration::from_secs(90));
    kill(Pid::from_raw(worker.id() as i32), Signal::SIGTERM).unwrap();
    assert!(wait_exit(&mut worker, Duration::from_secs(30)).success());
    let text = text_of(&seen);
    assert_eq!(status.code(), Some(0), "{text}\n{}", text_of(&seen_err));
    assert!(!text.contains('\r') && !text.contains('\x1b'), "{text:?}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 3, "{text}");
    for l in &lines {
        let stamp = l.split_whitespace().next().unwrap_or_default();
        assert!(
            chrono::DateTime::parse_from_rfc3339(stamp).is_ok(),
            "no timestamp: {l:?}"
        );
    }
    let running = lines
        .iter()
        .find(|l| l.contains(" RUNNING "))
        .unwrap_or_else(|| panic!("no RUNNING line:\n{text}"));
    for part in [
        "items ",
        "rate ",
        "/s",
        "attempt 1/3",
        "lease left ",
        "worker watched",
    ] {
        assert!(running.contains(part), "{part:?} not in {running:?}");
    }
    let last = lines.last().unwrap();
    assert!(
        last.contains(" SUCCEEDED ") && last.contains("items 2000"),
        "{last}"
    );

    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("worker started"), "{log}");
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v.is_object(), "{line}");
        assert!(
            !line.contains("Some("),
            "Rust debug text in the log: {line}"
        );
    }
}

/// A run failed by an operator ends the watch with exit 3 and a last line
/// that says FAILED and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_watch_exits_3_when_the_run_fails() {
    let db = db().await;
    enqueue(&db, KEY, HOUR).await;
    claim(
        &db,
        "daily-settlement",
        "held-worker",
        Duration::from_secs(3600),
    )
    .await;
    let mut watch = cmd(
        Some(&db.url),
        &["runs", "watch", KEY, "--interval", "200ms"],
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let seen = collect(watch.stdout.take().unwrap());
    wait_for_text(&seen, "\n").await;
    let first = text_of(&seen);
    assert!(
        first.contains(" RUNNING ") && first.contains("worker held-worker"),
        "{first}"
    );

    let out = run(
        Some(&db.url),
        &[
            "runs",
            "fail",
            KEY,
            "--force",
            "--operator",
            "ops",
            "--reason",
            "stop it now",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let status = wait_exit(&mut watch, Duration::from_secs(30));
    wait_for_text(&seen, " FAILED ").await;
    let text = text_of(&seen);
    assert_eq!(status.code(), Some(3), "{text}");
    let last = text.lines().last().unwrap();
    assert!(
        last.contains(" FAILED ") && last.contains("message: failed by operator ops: stop it now"),
        "{last}"
    );
}

/// On a terminal, the watch redraws one line in place (`\r` and erase,
/// never a newline until the end), showing items, a rate, the attempt and
/// the lease left; it ends with one whole line and exit 3 for FAILED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_watch_on_a_terminal_redraws_one_progress_line() {
    let db = db().await;
    enqueue(&db, KEY, HOUR).await;
    let lease = claim(
        &db,
        "daily-settlement",
        "tty-worker",
        Duration::from_secs(3600),
    )
    .await;
    let mut tx = queue::begin_fenced(
        &db.pool,
        &lease.fence(),
        Duration::from_secs(3600),
        Clock::Db,
    )
    .await
    .unwrap();
    tx.add_progress(40, 2);
    tx.commit().await.unwrap();

    let size = nix::pty::Winsize {
        ws_row: 24,
        ws_col: 200,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&size), None).unwrap();
    let mut watch = cmd(
        Some(&db.url),
        &["runs", "watch", KEY, "--interval", "200ms"],
    )
    .stdout(Stdio::from(pty.slave.try_clone().unwrap()))
    .stderr(Stdio::from(pty.slave))
    .spawn()
    .unwrap();
    // The child holds the only slave descriptors now: once it exits, the
    // master reads the end.
    let seen = collect(std::fs::File::from(pty.master));
    wait_for_text(&seen, "lease left").await;
    // A second look, so that the line has been redrawn at least once.
    let first_len = text_of(&seen).len();
    wait_until("a second look", Duration::from_secs(30), || async {
        text_of(&seen).len() > first_len
    })
    .await;

    let out = run(
        Some(&db.url),
        &[
            "runs",
            "fail",
            KEY,
            "--force",
            "--operator",
            "ops",
            "--reason",
            "tty test",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let status = wait_exit(&mut watch, Duration::from_secs(30));
    wait_for_text(&seen, "FAILED").await;
    let text = text_of(&seen);
    assert_eq!(status.code(), Some(3), "{text:?}");

    let redraw = "\r\x1b[2K";
    let (progress, last) = text.rsplit_once(redraw).unwrap();
    assert!(progress.matches(redraw).count() >= 2, "{text:?}");
    assert!(
        !progress.contains('\n'),
        "a newline before the end: {text:?}"
    );
    let line = progress.rsplit(redraw).next().unwrap();
    for part in [
        "RUNNING",
        "items 40 (2 failed)",
        "attempt 1/",
        "lease left ",
        "worker tty-worker",
    ] {
        assert!(line.contains(part), "{part:?} not in {line:?}");
    }
    let rate = line.split("rate ").nth(1).unwrap_or_default();
    let figure = rate.split("/s").next().unwrap_or_default();
    assert!(
        figure.parse::<f64>().is_ok_and(|r| r > 0.0),
        "rate in {line:?}"
    );
    assert!(last.contains("FAILED") && last.ends_with('\n'), "{last:?}");
}

// ---------------------------------------------------------------------------
// Logs and an unmigrated database

/// `--log-format text` with standard error in a file writes no escape
/// code at all (colour is for terminals).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_to_a_file_have_no_colour_codes() {
    let db = db().await;
    let dir = scratch("text-log");
    let log_path = dir.join("worker.log");
    let mut worker = cmd(
        Some(&db.url),
        &[
            "--log-format",
            "text",
            "worker",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
    )
    .env("RUST_LOG", "info")
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log_path).unwrap())
    .spawn()
    .unwrap();
    wait_until("the worker to start", Duration::from_secs(30), || async {
        std::fs::read_to_string(&log_path).is_ok_and(|l| l.contains("worker started"))
    })
    .await;
    kill(Pid::from_raw(worker.id() as i32), Signal::SIGTERM).unwrap();
    assert!(wait_exit(&mut worker, Duration::from_secs(30)).success());
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(!log.contains('\x1b'), "escape codes in a file: {log:?}");
    assert!(log.contains(" INFO "), "{log}");
}

/// JSON logs hold no Rust debug text: the producer's tick, whose window
/// start is optional, logs it as a plain timestamp (the worker's log is
/// checked by the plain watch test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_hold_no_rust_debug_text() {
    let db = db().await;
    let out = cmd(
        Some(&db.url),
        &[
            "--log-format",
            "json",
            "produce",
            "--once",
            "--now",
            "2026-09-15T02:00:00+09:00",
        ],
    )
    .env("RUST_LOG", "info")
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let log = stderr(&out);
    assert!(log.contains("producer tick"), "{log}");
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            !line.contains("Some("),
            "Rust debug text in the log: {line}"
        );
        if v["message"] == "producer tick" {
            let start = v["window_start"].as_str().unwrap_or_default();
            assert!(
                chrono::DateTime::parse_from_rfc3339(start).is_ok(),
                "{line}"
            );
        }
    }
}

/// `status` (and `runs list`) on a database nobody migrated: one line that
/// says to run `batchonce migrate`, exit 1, as the worker says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_on_an_unmigrated_database_says_to_migrate() {
    let db = TestDb::empty().await;
    for args in [&["status"][..], &["runs", "list"], &["runs", "show", KEY]] {
        let out = run(Some(&db.url), args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("batchonce: error: the database is not migrated (")
                && err.trim_end().ends_with("run `batchonce migrate`"),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: {}", stdout(&out));
    }
}

/// `--version` names the release and the commit the binary was built from,
/// the same commit `batchonce_build_info` exports, so a bug report that
/// quotes it identifies the build.
#[test]
fn version_names_release_and_commit() {
    let out = run(None, &["--version"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let expected = format!(
        "batchonce {} (commit {})\n",
        env!("CARGO_PKG_VERSION"),
        batchonce::telemetry::GIT_COMMIT
    );
    assert_eq!(stdout(&out), expected);
    // A clone builds with git at hand: the commit is known, not `unknown`.
    if std::env::var_os("CI").is_some() {
        assert_ne!(batchonce::telemetry::GIT_COMMIT, "unknown");
    }
}
