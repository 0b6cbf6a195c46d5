//! Issue 43: `runs archive --before DATE` moves finished runs and their
//! attempts to the archive tables, in audited batches, and an archived key
//! still refuses a second enqueue. Each test has its own database; runs
//! are enqueued, claimed and finished through the queue layer, so their
//! attempts are real.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use batchonce::clock::Clock;
use batchonce::config::Config;
use batchonce::key::{JobKey, JobName};
use batchonce::queue::{self, ArchiveError, ArchiveRequest, ClaimSpec, Finish, NewRun};
use batchonce::testing::{assert_lists_in_step, TestDb};
use chrono::NaiveDate;
use sqlx::PgPool;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");
const JOB: &str = "daily-settlement";
const OTHER: &str = "notification-send";
const CONFIG: &str = "[jobs.daily-settlement]\n[jobs.notification-send]\n";

fn config(text: &str) -> Config {
    Config::parse(
        text,
        "test",
        &batchonce_workers::registry().default_configs(),
    )
    .unwrap()
}

fn config_file(name: &str, text: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("archive-{name}-{}.toml", std::process::id()));
    std::fs::write(&p, text).unwrap();
    p
}

fn date(s: &str) -> NaiveDate {
    NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
}

fn run_of(cfg: &Config, job: &str, day: &str) -> NewRun {
    let jc = cfg
        .job(&JobName::parse(job).unwrap())
        .cloned()
        .unwrap_or_default();
    NewRun::new(
        JobKey::parse(&format!("{job}:{day}")).unwrap(),
        date(day),
        &jc,
    )
    .unwrap()
}

fn request(before: &str, job: Option<&str>, batch: u32) -> ArchiveRequest {
    ArchiveRequest {
        before: date(before),
        job: job.map(|j| JobName::parse(j).unwrap()),
        batch,
        operator: "alice".into(),
        reason: "keep one year live".into(),
    }
}

/// Enqueues `job`'s runs of `days` and brings each to its state: claimed
/// and finished (SUCCEEDED, SKIPPED, FAILED), claimed and held (RUNNING),
/// or left PENDING. Every claimed run has one attempt.
async fn seed(pool: &PgPool, cfg: &Config, job: &str, days: &[(&str, &str)]) {
    let claimed: Vec<NewRun> = days
        .iter()
        .filter(|(_, s)| *s != "PENDING")
        .map(|(d, _)| run_of(cfg, job, d))
        .collect();
    queue::enqueue(pool, &claimed, Clock::Db).await.unwrap();
    let spec = ClaimSpec {
        job: JobName::parse(job).unwrap(),
        lease_ttl: Duration::from_secs(300),
    };
    let mut leases = Vec::new();
    loop {
        let got = queue::claim(
            pool,
            "w-archive",
            std::slice::from_ref(&spec),
            1000,
            Clock::Db,
        )
        .await
        .unwrap();
        if got.is_empty() {
            break;
        }
        leases.extend(got);
    }
    assert_eq!(leases.len(), claimed.len());
    for lease in &leases {
        let day = lease.business_date.format("%Y-%m-%d").to_string();
        let status = days.iter().find(|(d, _)| *d == day).unwrap().1;
        let finish = match status {
            "SUCCEEDED" => Finish::Succeeded,
            "SKIPPED" => Finish::Skipped {
                reason: "nothing to do".into(),
            },
            "FAILED" => Finish::Fatal {
                error: "broken".into(),
            },
            _ => continue,
        };
        queue::finish(pool, &lease.fence(), &finish, Clock::Db)
            .await
            .unwrap();
    }
    let pending: Vec<NewRun> = days
        .iter()
        .filter(|(_, s)| *s == "PENDING")
        .map(|(d, _)| run_of(cfg, job, d))
        .collect();
    queue::enqueue(pool, &pending, Clock::Db).await.unwrap();
}

async fn keys(pool: &PgPool, table: &str) -> BTreeSet<String> {
    sqlx::query_scalar(&format!("SELECT job_key::text FROM {table}"))
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Every run and attempt is in exactly one place: (runs, attempts) over
/// the ledger and the archive, after checking that no key is in both.
async fn accounted(pool: &PgPool) -> (i64, i64) {
    let both = count(
        pool,
        "SELECT count(*) FROM batch_job_run r JOIN batch_job_run_archive a USING (job_key)",
    )
    .await;
    assert_eq!(both, 0, "runs both live and archived");
    let both = count(
        pool,
        "SELECT count(*) FROM batch_job_attempt r JOIN batch_job_attempt_archive a USING (job_key, attempt)",
    )
    .await;
    assert_eq!(both, 0, "attempts both live and archived");
    (
        count(
            pool,
            "SELECT (SELECT count(*) FROM batch_job_run) + (SELECT count(*) FROM batch_job_run_archive)",
        )
        .await,
        count(
            pool,
            "SELECT (SELECT count(*) FROM batch_job_attempt) + (SELECT count(*) FROM batch_job_attempt_archive)",
        )
        .await,
    )
}

fn bin(url: &str, cfg: &PathBuf, args: &[&str]) -> Output {
    Command::new(BIN)
        .env("DATABASE_URL", url)
        .env("BATCHONCE_CONFIG", cfg)
        .current_dir(env!("CARGO_TARGET_TMPDIR"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `batchonce runs archive` of the runs before 2026-01-02, as alice, with
/// `extra` arguments.
fn archive_cli(url: &str, cfg: &PathBuf, extra: &[&str]) -> Output {
    let mut args = vec![
        "runs",
        "archive",
        "--before",
        "2026-01-02",
        "--operator",
        "alice",
        "--reason",
        "keep one year live",
    ];
    args.extend_from_slice(extra);
    bin(url, cfg, &args)
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn sql_code(e: &sqlx::Error) -> Option<String> {
    e.as_database_error()
        .and_then(|d| d.code().map(|c| c.into_owned()))
}

fn archive_code(e: &ArchiveError) -> Option<String> {
    match e {
        ArchiveError::Queue(queue::QueueError::Database(e)) => sql_code(e),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archives_exactly_the_finished_runs_before_the_date_with_their_attempts() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let cfg = config(CONFIG);
    seed(
        &db.pool,
        &cfg,
        JOB,
        &[
            ("2026-01-01", "SUCCEEDED"),
            ("2026-01-02", "SKIPPED"),
            ("2026-01-03", "FAILED"),
            ("2026-01-04", "RUNNING"),
            ("2026-01-05", "PENDING"),
            ("2026-01-06", "SUCCEEDED"),
            ("2026-01-07", "SUCCEEDED"),
        ],
    )
    .await;
    seed(&db.pool, &cfg, OTHER, &[("2026-01-01", "SUCCEEDED")]).await;
    let before = accounted(&db.pool).await;
    let attempts_before: BTreeSet<(String, i32, i64)> = sqlx::query_as(
        "SELECT job_key::text, attempt, processed_count FROM batch_job_attempt \
         WHERE job_key IN ('daily-settlement:2026-01-01', 'daily-settlement:2026-01-02', \
                           'notification-send:2026-01-01')",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(attempts_before.len(), 3);

    // The preview counts and changes nothing.
    let preview = queue::preview_archive(&db.pool, &request("2026-01-06", None, 10), Clock::Db)
        .await
        .unwrap();
    assert_eq!(
        preview
            .iter()
            .map(|j| (j.job.as_str(), j.runs, j.attempts, j.audit_id))
            .collect::<Vec<_>>(),
        [(JOB, 2, 2, None), (OTHER, 1, 1, None)]
    );
    assert_eq!(
        count(&db.pool, "SELECT count(*) FROM batch_job_run_archive").await,
        0
    );
    assert_eq!(
        count(&db.pool, "SELECT count(*) FROM batch_operator_action").await,
        0
    );

    // Batches of one run: three batches, one audit row per job and batch.
    let mut batches = 0;
    let moved = queue::archive(&db.pool, &request("2026-01-06", None, 1), Clock::Db, |_| {
        batches += 1
    })
    .await
    .unwrap();
    assert_eq!(batches, 3);
    assert_eq!(moved.iter().map(|j| j.runs).sum::<i64>(), 3);
    assert_eq!(
        keys(&db.pool, "batch_job_run_archive").await,
        BTreeSet::from([
            "daily-settlement:2026-01-01".to_owned(),
            "daily-settlement:2026-01-02".to_owned(),
            "notification-send:2026-01-01".to_owned(),
        ])
    );
    assert_eq!(
        keys(&db.pool, "batch_job_run").await,
        [
            "2026-01-03",
            "2026-01-04",
            "2026-01-05",
            "2026-01-06",
            "2026-01-07"
        ]
        .iter()
        .map(|d| format!("{JOB}:{d}"))
        .collect::<BTreeSet<_>>(),
        "FAILED, RUNNING, PENDING and on/after the date stay"
    );
    let archived_attempts: BTreeSet<(String, i32, i64)> = sqlx::query_as(
        "SELECT job_key::text, attempt, processed_count FROM batch_job_attempt_archive",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(
        archived_attempts, attempts_before,
        "the attempts moved as they were"
    );
    assert_eq!(accounted(&db.pool).await, before, "nothing lost or doubled");
    assert_lists_in_step(&db.pool).await;

    // The audit rows: one per job and batch, naming no single key.
    let audit: Vec<(i64, String, String, String, String, String, String)> = sqlx::query_as(
        "SELECT id, action, job_key::text, reason::text, before_status::text, \
         after_status::text, detail::text FROM batch_operator_action ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(audit.len(), 3, "{audit:?}");
    for row in &audit {
        assert_eq!(row.1, "archive");
        assert!(
            row.2 == format!("{JOB}:*") || row.2 == format!("{OTHER}:*"),
            "{row:?}"
        );
        assert_eq!(row.3, "keep one year live");
        assert_eq!((row.4.as_str(), row.5.as_str()), ("FINISHED", "ARCHIVED"));
        assert!(
            row.6.contains("archived 1 runs") && row.6.contains("before 2026-01-06"),
            "{row:?}"
        );
    }
    let ids: BTreeSet<i64> = audit.iter().map(|r| r.0).collect();
    let by: BTreeSet<i64> = sqlx::query_scalar(
        "SELECT archived_by FROM batch_job_run_archive UNION SELECT archived_by FROM batch_job_attempt_archive",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(by, ids, "every archived row names its audit row");
    assert_eq!(
        moved
            .iter()
            .filter_map(|j| j.audit_id)
            .collect::<BTreeSet<_>>(),
        ids
    );
    // The console's audit log finds them by job.
    let log = queue::audit_log(
        &db.pool,
        &queue::AuditFilter {
            job: Some(JobName::parse(JOB).unwrap()),
            ..Default::default()
        },
        None,
        100,
    )
    .await
    .unwrap();
    assert_eq!(log.len(), 2, "{log:?}");

    // Nothing is left to archive: a second archive moves nothing.
    let again = queue::archive(
        &db.pool,
        &request("2026-01-06", None, 10),
        Clock::Db,
        |_| {},
    )
    .await
    .unwrap();
    assert!(again.is_empty(), "{again:?}");

    // A date that is not in the past, and an unknown job, are refused.
    for (req, want) in [
        (request("2999-01-01", None, 10), "is not in the past"),
        (
            request("2026-01-06", Some("no-such-job"), 10),
            "unknown job",
        ),
    ] {
        match queue::archive(&db.pool, &req, Clock::Db, |_| {}).await {
            Err(ArchiveError::Refused(r)) => assert!(r.0.contains(want), "{r}"),
            other => panic!("{want}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_run_is_archived_only_as_a_whole() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let cfg = config("[jobs.daily-settlement]\npartitions = 2\n");
    let day = |d: &str| format!("{JOB}:{d}");
    queue::enqueue(
        &db.pool,
        &[
            run_of(&cfg, JOB, "2026-02-01"),
            run_of(&cfg, JOB, "2026-02-02"),
        ],
        Clock::Db,
    )
    .await
    .unwrap();
    let spec = ClaimSpec {
        job: JobName::parse(JOB).unwrap(),
        lease_ttl: Duration::from_secs(300),
    };
    // Every partition of the first date, then its final step, succeed; of
    // the second date only its first partition.
    let finish_keys = [
        day("2026-02-01.p1"),
        day("2026-02-01.p2"),
        day("2026-02-02.p1"),
        day("2026-02-01"),
    ];
    for _ in 0..4 {
        for lease in queue::claim(&db.pool, "w", std::slice::from_ref(&spec), 100, Clock::Db)
            .await
            .unwrap()
        {
            if finish_keys.contains(&lease.key.to_string()) {
                queue::finish(&db.pool, &lease.fence(), &Finish::Succeeded, Clock::Db)
                    .await
                    .unwrap();
            }
        }
    }
    let status: String = sqlx::query_scalar("SELECT status FROM batch_job_run WHERE job_key = $1")
        .bind(day("2026-02-01"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(status, "SUCCEEDED");
    // The second date's parent stands finished by hand while a partition
    // is not (as after a `skip` of the run while a partition ran).
    sqlx::query(
        "UPDATE batch_job_run SET status = 'SKIPPED', finished_at = now() WHERE job_key = $1",
    )
    .bind(day("2026-02-02"))
    .execute(&db.pool)
    .await
    .unwrap();
    let before = accounted(&db.pool).await;
    let moved = queue::archive(
        &db.pool,
        &request("2026-03-01", None, 10),
        Clock::Db,
        |_| {},
    )
    .await
    .unwrap();
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert_eq!(moved[0].runs, 3, "the run and its two partitions");
    assert_eq!(
        keys(&db.pool, "batch_job_run_archive").await,
        BTreeSet::from([
            day("2026-02-01"),
            day("2026-02-01.p1"),
            day("2026-02-01.p2")
        ])
    );
    assert_eq!(
        keys(&db.pool, "batch_job_run").await,
        BTreeSet::from([
            day("2026-02-02"),
            day("2026-02-02.p1"),
            day("2026-02-02.p2")
        ]),
        "a partly finished partitioned run stays whole"
    );
    assert_eq!(accounted(&db.pool).await, before);
    assert_lists_in_step(&db.pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archived_key_refuses_a_second_enqueue_and_runs_show_finds_it() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let cfg = config(CONFIG);
    seed(
        &db.pool,
        &cfg,
        JOB,
        &[("2026-01-01", "SUCCEEDED"), ("2026-01-02", "SUCCEEDED")],
    )
    .await;
    let file = config_file("show", CONFIG);
    // The command line: dry run, then the archive, printing the audit ids.
    let out = archive_cli(&db.url, &file, &["--dry-run"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("would archive 1 runs and 1 attempts"),
        "{stdout}"
    );
    assert_eq!(
        count(&db.pool, "SELECT count(*) FROM batch_job_run_archive").await,
        0
    );
    let out = archive_cli(&db.url, &file, &[]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let audit: i64 = count(&db.pool, "SELECT max(id) FROM batch_operator_action").await;
    assert!(
        stdout.contains(&format!(
            "archived 1 runs and 1 attempts of {JOB} (audit row {audit})"
        )),
        "{stdout}"
    );

    // A second enqueue of the archived key is a duplicate, as of a live one.
    let report = queue::enqueue(
        &db.pool,
        &[
            run_of(&cfg, JOB, "2026-01-01"),
            run_of(&cfg, JOB, "2026-01-02"),
            run_of(&cfg, JOB, "2026-01-03"),
        ],
        Clock::Db,
    )
    .await
    .unwrap();
    assert_eq!(
        report
            .duplicates
            .iter()
            .map(|k| k.to_string())
            .collect::<Vec<_>>(),
        [format!("{JOB}:2026-01-01"), format!("{JOB}:2026-01-02")]
    );
    assert_eq!(
        report
            .enqueued
            .iter()
            .map(|k| k.to_string())
            .collect::<Vec<_>>(),
        [format!("{JOB}:2026-01-03")]
    );
    // A direct insert is refused, whoever sends it.
    let e = sqlx::query(
        "INSERT INTO batch_job_run (job_key, job_name, business_date, max_attempts) \
         VALUES ('daily-settlement:2026-01-01', 'daily-settlement', '2026-01-01', 3)",
    )
    .execute(&db.pool)
    .await
    .unwrap_err();
    assert_eq!(
        sql_code(&e).as_deref(),
        Some(queue::ARCHIVED_SQLSTATE),
        "{e}"
    );
    assert!(e.to_string().contains("is archived"), "{e}");
    assert_eq!(
        count(
            &db.pool,
            "SELECT count(*) FROM batch_job_run WHERE job_key = 'daily-settlement:2026-01-01'"
        )
        .await,
        0
    );

    // `runs show` says it is archived, with its attempts; `runs list` does not list it.
    let out = bin(
        &db.url,
        &file,
        &["runs", "show", &format!("{JOB}:2026-01-01")],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("status:         SUCCEEDED"), "{stdout}");
    assert!(
        stdout.contains("w-archive"),
        "the archived attempt: {stdout}"
    );
    assert!(
        stdout.contains("archived:") && stdout.contains(&format!("by audit row {audit}")),
        "{stdout}"
    );
    let out = bin(&db.url, &file, &["runs", "list"]);
    let (stdout, _) = text(&out);
    assert!(!stdout.contains("2026-01-01"), "{stdout}");
    assert!(stdout.contains("2026-01-02"), "{stdout}");

    // Bad input: one clear error line each, nothing archived.
    for (args, code, want) in [
        (
            vec![
                "--before",
                "2026-1-2",
                "--operator",
                "alice",
                "--reason",
                "tidy up",
            ],
            1,
            "invalid --before",
        ),
        (
            vec![
                "--before",
                "2100-01-01",
                "--operator",
                "alice",
                "--reason",
                "tidy up",
            ],
            1,
            "is not in the past",
        ),
        (
            vec![
                "--before",
                "2026-01-03",
                "--operator",
                "alice",
                "--reason",
                "tidy up",
                "--job",
                "nope",
            ],
            1,
            "unknown job nope",
        ),
        (
            vec![
                "--before",
                "2026-01-03",
                "--operator",
                "alice",
                "--reason",
                "x",
            ],
            1,
            "invalid --reason",
        ),
        (
            vec!["--before", "2026-01-03", "--operator", "alice"],
            2,
            "--reason",
        ),
    ] {
        let mut all = vec!["runs", "archive"];
        all.extend(args.iter().copied());
        let out = bin(&db.url, &file, &all);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stdout}{stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        if code == 1 {
            assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        }
    }
    assert_eq!(
        count(&db.pool, "SELECT count(*) FROM batch_job_run_archive").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_operator_login_may_archive() {
    let db = TestDb::empty().await;
    let file = config_file("roles", CONFIG);
    let logins = common::logins::Logins::apply(BIN, &db, &file).await;
    let cfg = config(CONFIG);
    seed(
        &db.pool,
        &cfg,
        JOB,
        &[("2026-01-01", "SUCCEEDED"), ("2026-01-02", "SUCCEEDED")],
    )
    .await;
    for part in ["producer", "worker", "readonly", "console", "program"] {
        let pool = logins.pool(part).await;
        let e = queue::archive(&pool, &request("2026-01-02", None, 10), Clock::Db, |_| {})
            .await
            .unwrap_err();
        assert_eq!(archive_code(&e).as_deref(), Some("42501"), "{part}: {e}");
        pool.close().await;
    }
    // The command line, as the operator's login.
    let out = archive_cli(&logins.url("operator"), &file, &[]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("archived 1 runs and 1 attempts"),
        "{stdout}"
    );
    let who: String = sqlx::query_scalar("SELECT session_user_name FROM batch_operator_action")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(who, logins.role("operator"));
    // The inspecting logins read the archive, never a token in it.
    for part in ["readonly", "operator", "console"] {
        let pool = logins.pool(part).await;
        let n: i64 = sqlx::query_scalar("SELECT count(job_key) FROM batch_job_run_archive")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(n, 1, "{part}");
        for table in ["batch_job_run_archive", "batch_job_attempt_archive"] {
            let e = sqlx::query(&format!("SELECT lease_token FROM {table}"))
                .fetch_all(&pool)
                .await
                .unwrap_err();
            assert_eq!(
                sql_code(&e).as_deref(),
                Some("42501"),
                "{part} {table}: {e}"
            );
        }
        pool.close().await;
    }
    // `runs show` of the archived key, as the readonly login.
    let out = bin(
        &logins.url("readonly"),
        &file,
        &["runs", "show", &format!("{JOB}:2026-01-01")],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("archived:"), "{stdout}");
    // The producer's enqueue reports the archived key as a duplicate.
    let producer = logins.pool("producer").await;
    let report = queue::enqueue(&producer, &[run_of(&cfg, JOB, "2026-01-01")], Clock::Db)
        .await
        .unwrap();
    assert_eq!(report.duplicates.len(), 1, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_and_interrupted_archives_never_lose_or_double_a_run() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let cfg = config(CONFIG);
    let days: Vec<String> = (0..300)
        .map(|i| {
            (date("2025-01-01") + chrono::Days::new(i))
                .format("%Y-%m-%d")
                .to_string()
        })
        .collect();
    let seeded: Vec<(&str, &str)> = days.iter().map(|d| (d.as_str(), "SUCCEEDED")).collect();
    seed(&db.pool, &cfg, JOB, &seeded).await;
    let total = accounted(&db.pool).await;
    assert_eq!(total, (300, 300));

    // A killed archive: every run it committed is archived, every other live.
    let file = config_file("kill", CONFIG);
    let mut child = Command::new(BIN)
        .env("DATABASE_URL", &db.url)
        .env("BATCHONCE_CONFIG", &file)
        .args([
            "runs",
            "archive",
            "--before",
            "2026-01-01",
            "--operator",
            "alice",
            "--reason",
            "interrupted on purpose",
            "--batch",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    batchonce::testing::wait_until(
        "the archive to commit some batches",
        Duration::from_secs(30),
        || async { count(&db.pool, "SELECT count(*) FROM batch_job_run_archive").await >= 20 },
    )
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();
    assert_eq!(accounted(&db.pool).await, total);

    // Two archives at once, while a worker claims and finishes new runs.
    let fresh: Vec<NewRun> = (0..50)
        .map(|i| {
            let d = (date("2026-02-01") + chrono::Days::new(i))
                .format("%Y-%m-%d")
                .to_string();
            run_of(&cfg, OTHER, &d)
        })
        .collect();
    queue::enqueue(&db.pool, &fresh, Clock::Db).await.unwrap();
    let (one, two) = (
        request("2026-01-01", Some(JOB), 7),
        request("2026-01-01", None, 5),
    );
    let (a, b, claimed) = tokio::join!(
        queue::archive(&db.pool, &one, Clock::Db, |_| {}),
        queue::archive(&db.pool, &two, Clock::Db, |_| {}),
        async {
            let spec = ClaimSpec {
                job: JobName::parse(OTHER).unwrap(),
                lease_ttl: Duration::from_secs(300),
            };
            let mut n = 0;
            loop {
                let got = queue::claim(
                    &db.pool,
                    "w-meanwhile",
                    std::slice::from_ref(&spec),
                    5,
                    Clock::Db,
                )
                .await
                .unwrap();
                if got.is_empty() {
                    return n;
                }
                for lease in got {
                    queue::finish(&db.pool, &lease.fence(), &Finish::Succeeded, Clock::Db)
                        .await
                        .unwrap();
                    n += 1;
                }
            }
        }
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(claimed, 50);
    assert_eq!(accounted(&db.pool).await, (350, 350));
    assert_eq!(
        count(
            &db.pool,
            "SELECT count(*) FROM batch_job_run WHERE job_name = 'daily-settlement'"
        )
        .await,
        0,
        "every finished run before the date is archived"
    );
    // The audit rows account for every archived run exactly once.
    let audited: i64 = count(
        &db.pool,
        "SELECT sum(substring(detail from 'archived ([0-9]+) runs')::bigint)::bigint \
         FROM batch_operator_action WHERE action = 'archive'",
    )
    .await;
    assert_eq!(audited, 300);
    assert!(
        a.iter().chain(&b).map(|j| j.runs).sum::<i64>() > 0,
        "the two archives moved runs: {a:?} {b:?}"
    );
    assert_lists_in_step(&db.pool).await;
}

/// A column a later migration adds to the ledger and not to the archive
/// would be dropped by the copy: the archive refuses instead, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_column_the_archive_does_not_copy_stops_it() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let cfg = config(CONFIG);
    seed(&db.pool, &cfg, JOB, &[("2026-01-01", "SUCCEEDED")]).await;
    sqlx::query("ALTER TABLE batch_job_run ADD COLUMN later_column integer")
        .execute(&db.pool)
        .await
        .unwrap();
    match queue::archive(
        &db.pool,
        &request("2026-01-02", None, 10),
        Clock::Db,
        |_| {},
    )
    .await
    {
        Err(ArchiveError::Refused(r)) => {
            assert!(r.0.contains("batch_job_run.later_column"), "{r}")
        }
        other => panic!("{other:?}"),
    }
    // Added to the archive table too, it is still not in the copy.
    sqlx::query("ALTER TABLE batch_job_run_archive ADD COLUMN later_column integer")
        .execute(&db.pool)
        .await
        .unwrap();
    assert!(matches!(
        queue::archive(
            &db.pool,
            &request("2026-01-02", None, 10),
            Clock::Db,
            |_| {}
        )
        .await,
        Err(ArchiveError::Refused(_))
    ));
    assert_eq!(
        count(&db.pool, "SELECT count(*) FROM batch_job_run_archive").await,
        0
    );
}

/// An insert of a key that an archive in progress is moving waits for that
/// archive (the unique index) and is then refused: the check runs after the
/// insert, so it sees the archive's commit. A check before the insert would
/// have let the key into the ledger a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_racing_an_archive_of_its_key_is_refused() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let cfg = config(CONFIG);
    seed(&db.pool, &cfg, JOB, &[("2026-01-01", "SUCCEEDED")]).await;
    let mut archiving = db.pool.begin().await.unwrap();
    let moved: i64 = sqlx::query_scalar(
        "SELECT runs_moved FROM batchonce_operator_archive('2026-01-02', NULL, 10, 'alice', \
         'racing an insert', false, NULL)",
    )
    .fetch_one(&mut *archiving)
    .await
    .unwrap();
    assert_eq!(moved, 1);
    let pool = db.pool.clone();
    let insert = tokio::spawn(async move {
        sqlx::query(
            "INSERT INTO batch_job_run (job_key, job_name, business_date, max_attempts) \
             VALUES ('daily-settlement:2026-01-01', 'daily-settlement', '2026-01-01', 3) \
             ON CONFLICT (job_key) DO NOTHING",
        )
        .execute(&pool)
        .await
    });
    batchonce::testing::wait_until(
        "the insert to wait for the archive",
        Duration::from_secs(10),
        || async {
            count(
                &db.pool,
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND query LIKE 'INSERT INTO batch_job_run %'",
            )
            .await
                == 1
        },
    )
    .await;
    archiving.commit().await.unwrap();
    let e = insert.await.unwrap().unwrap_err();
    assert_eq!(
        sql_code(&e).as_deref(),
        Some(queue::ARCHIVED_SQLSTATE),
        "{e}"
    );
    assert_eq!(accounted(&db.pool).await, (1, 1));
}
