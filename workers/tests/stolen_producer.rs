//! Issue 42, items 1, 2 and 6, as a stolen producer or operator login
//! would try them: each logs in as its role (`roles --apply`, `migrate` as
//! the migrator with this file's configuration) and calls the functions it
//! may execute with hostile arguments. The database's clock decides, the
//! list-keeping trigger cannot be switched off, the audit row's state
//! before is the run's, and a producer enqueues only what `migrate`
//! declared, as declared, within the documented bounds. Every refusal
//! writes nothing.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use batchonce::clock::Clock;
use batchonce::config::Config;
use batchonce::key::{JobKey, JobName};
use batchonce::queue::{self, ClaimSpec, NewRun, QueueError};
use batchonce::testing::TestDb;
use chrono::{DateTime, NaiveDate, Utc};
use sqlx::PgPool;

mod common;

use common::ok;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");
const JOB: &str = "daily-settlement";

/// The declaration every test migrates with: settlement in Seoul (its
/// kind's schedule, the day before), a holiday and Sundays skipped.
const CONFIG: &str = "[jobs.daily-settlement]\nskip_dates = [\"2026-12-25\"]\nskip_weekdays = [\"Sun\"]\n\n[jobs.notification-send]\n";

fn config_file(name: &str, text: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "stolen-producer-{name}-{}.toml",
        std::process::id()
    ));
    std::fs::write(&p, text).unwrap();
    p
}

fn config(text: &str) -> Config {
    Config::parse(
        text,
        "test",
        &batchonce_workers::registry().default_configs(),
    )
    .unwrap()
}

fn date(s: &str) -> NaiveDate {
    NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
}

/// A run of `job` for `day` as the file declares it.
fn run_of(cfg: &Config, job: &str, day: &str) -> NewRun {
    let name = JobName::parse(job).unwrap();
    let jc = cfg.job(&name).cloned().unwrap_or_default();
    NewRun::new(
        JobKey::parse(&format!("{job}:{day}")).unwrap(),
        date(day),
        &jc,
    )
    .unwrap()
}

fn code(e: &QueueError) -> Option<String> {
    match e {
        QueueError::Database(e) => e
            .as_database_error()
            .and_then(|d| d.code().map(|c| c.into_owned())),
        _ => None,
    }
}

fn sql_code(e: &sqlx::Error) -> Option<String> {
    e.as_database_error()
        .and_then(|d| d.code().map(|c| c.into_owned()))
}

async fn runs(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM batch_job_run")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// PENDING runs that no claim would ever find.
async fn pending_off_the_list(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT r.job_key::text FROM batch_job_run r WHERE r.status = 'PENDING' \
         AND NOT EXISTS (SELECT 1 FROM batch_job_due d WHERE d.job_key = r.job_key)",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

fn bin(url: &str, cfg: Option<&PathBuf>, args: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.env("DATABASE_URL", url).env_remove("BATCHONCE_CONFIG");
    if let Some(cfg) = cfg {
        c.env("BATCHONCE_CONFIG", cfg);
    }
    c.current_dir(env!("CARGO_TARGET_TMPDIR"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

async fn setup(name: &str) -> (TestDb, common::logins::Logins, PathBuf) {
    let db = TestDb::empty().await;
    let file = config_file(name, CONFIG);
    let logins = common::logins::Logins::apply(BIN, &db, &file).await;
    (db, logins, file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_and_operator_logins_get_the_database_clock() {
    let (db, logins, file) = setup("clock").await;
    let cfg = config(CONFIG);
    let producer = logins.pool("producer").await;
    let far: DateTime<Utc> = "2999-01-01T00:00:00Z".parse().unwrap();
    let back: DateTime<Utc> = "2001-01-01T00:00:00Z".parse().unwrap();
    for at in [far, back] {
        let e = queue::enqueue(&producer, &[run_of(&cfg, JOB, "2026-09-15")], Clock::At(at))
            .await
            .unwrap_err();
        assert_eq!(code(&e).as_deref(), Some("42501"), "{e}");
    }
    assert_eq!(runs(&db.pool).await, 0, "a refused enqueue wrote a run");

    // Without an instant the run is due now, stamped by the database.
    let r = queue::enqueue(&producer, &[run_of(&cfg, JOB, "2026-09-15")], Clock::Db)
        .await
        .unwrap();
    assert_eq!(r.enqueued.len(), 1);
    let fresh: bool = sqlx::query_scalar(
        "SELECT bool_and(enqueued_at > now() - interval '1 minute' AND next_run_at <= now()) \
         FROM batch_job_run",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(fresh, "the run was not stamped with the database's clock");

    // The operator may neither judge staleness nor finish a run on a
    // clock of its own.
    let operator = logins.pool("operator").await;
    let e = sqlx::query(
        "SELECT * FROM batchonce_operator_check('daily-settlement:2026-09-15', 1200, $1, false)",
    )
    .bind(far)
    .fetch_all(&operator)
    .await
    .unwrap_err();
    assert_eq!(sql_code(&e).as_deref(), Some("42501"), "{e}");
    let e = sqlx::query(
        "SELECT batchonce_operator_apply('daily-settlement:2026-09-15', 'fail', \
         ARRAY['RUNNING', 'PENDING'], 'FAILED', 'drill', $1, 5, 'kim', 'drill', 'PENDING')",
    )
    .bind(back)
    .execute(&operator)
    .await
    .unwrap_err();
    assert_eq!(sql_code(&e).as_deref(), Some("42501"), "{e}");
    let (status, audits): (String, i64) = sqlx::query_as(
        "SELECT status::text, (SELECT count(*) FROM batch_operator_action) FROM batch_job_run",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((status.as_str(), audits), ("PENDING", 0));
    // With the database's clock the action is the operator's to take.
    let done: Option<String> = sqlx::query_scalar(
        "SELECT batchonce_operator_apply('daily-settlement:2026-09-15', 'fail', \
         ARRAY['RUNNING', 'PENDING'], 'FAILED', 'drill', NULL, 5, 'kim', 'drill', 'PENDING')",
    )
    .fetch_one(&operator)
    .await
    .unwrap();
    assert_eq!(done.as_deref(), Some("daily-settlement:2026-09-15"));
    let recent: bool =
        sqlx::query_scalar("SELECT finished_at > now() - interval '1 minute' FROM batch_job_run")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(recent, "finished_at was not the database's time");

    // `produce --now` under a producer login plans with the simulated
    // instant and enqueues on the database's clock.
    let out = ok(&bin(
        &logins.url("producer"),
        Some(&file),
        &["produce", "--once", "--now", "2026-09-04T02:00:00+09:00"],
    ));
    assert!(
        out.contains("enqueued daily-settlement:2026-09-03"),
        "{out}"
    );
    assert!(out.contains("skipped daily-settlement:2026-08-30"), "{out}");
    let (n, stamped_now): (i64, bool) = sqlx::query_as(
        "SELECT count(*), bool_and(enqueued_at > now() - interval '1 minute') FROM batch_job_run \
         WHERE business_date BETWEEN '2026-08-28' AND '2026-09-03'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(n, 7);
    assert!(
        stamped_now,
        "produce --now stamped a producer's runs with its own instant"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_step_set_by_a_caller_keeps_nothing_off_the_due_list() {
    let (db, logins, _file) = setup("in-step").await;
    let cfg = config(CONFIG);
    // One connection each, so the session setting is the one each call sees.
    let producer = logins.pool("producer").await;
    sqlx::query("SET batchonce.in_step = on")
        .execute(&producer)
        .await
        .unwrap();
    let on: String = sqlx::query_scalar("SELECT current_setting('batchonce.in_step')")
        .fetch_one(&producer)
        .await
        .unwrap();
    assert_eq!(on, "on");
    let r = queue::enqueue(
        &producer,
        &[
            run_of(&cfg, JOB, "2026-09-15"),
            run_of(&cfg, JOB, "2026-09-16"),
        ],
        Clock::Db,
    )
    .await
    .unwrap();
    assert_eq!(r.enqueued.len(), 2);
    assert_eq!(pending_off_the_list(&db.pool).await, Vec::<String>::new());

    // A rerun by an operator login with the setting on.
    let failed: Option<String> = sqlx::query_scalar(
        "SELECT batchonce_operator_apply('daily-settlement:2026-09-15', 'fail', \
         ARRAY['PENDING'], 'FAILED', 'drill', NULL, 5, 'kim', 'drill', NULL)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(failed.is_some());
    let operator = logins.pool("operator").await;
    sqlx::query("SET batchonce.in_step = on")
        .execute(&operator)
        .await
        .unwrap();
    let rerun: Option<String> = sqlx::query_scalar(
        "SELECT batchonce_operator_apply('daily-settlement:2026-09-15', 'rerun', \
         ARRAY['FAILED'], 'PENDING', 'again', NULL, 5, 'kim', 'drill', 'FAILED')",
    )
    .fetch_one(&operator)
    .await
    .unwrap();
    assert_eq!(rerun.as_deref(), Some("daily-settlement:2026-09-15"));
    assert_eq!(pending_off_the_list(&db.pool).await, Vec::<String>::new());
    let due: i64 = sqlx::query_scalar("SELECT count(*) FROM batch_job_due")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(due, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_row_says_the_state_the_run_was_in() {
    let (db, logins, _file) = setup("before").await;
    let cfg = config(CONFIG);
    queue::enqueue(&db.pool, &[run_of(&cfg, JOB, "2026-09-15")], Clock::Db)
        .await
        .unwrap();
    let leases = queue::claim(
        &db.pool,
        "w1",
        &[ClaimSpec {
            job: JobName::parse(JOB).unwrap(),
            lease_ttl: Duration::from_secs(60),
        }],
        1,
        Clock::Db,
    )
    .await
    .unwrap();
    assert_eq!(leases.len(), 1);
    // The operator login claims the run was PENDING.
    let operator = logins.pool("operator").await;
    let done: Option<String> = sqlx::query_scalar(
        "SELECT batchonce_operator_apply('daily-settlement:2026-09-15', 'fail', \
         ARRAY['RUNNING', 'PENDING'], 'FAILED', 'drill', NULL, 5, 'kim', 'drill', 'PENDING')",
    )
    .fetch_one(&operator)
    .await
    .unwrap();
    assert_eq!(done.as_deref(), Some("daily-settlement:2026-09-15"));
    let (before, after, who): (String, String, String) = sqlx::query_as(
        "SELECT before_status::text, after_status::text, session_user_name::text \
         FROM batch_operator_action",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (before.as_str(), after.as_str()),
        ("RUNNING", "FAILED"),
        "the audit row took the caller's word for the state before"
    );
    assert_eq!(who, logins.role("operator"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_enqueues_only_what_migrate_declared() {
    let (db, logins, file) = setup("declared").await;
    let cfg = config(CONFIG);
    let producer = logins.pool("producer").await;
    let declared = queue::declared_jobs(&db.pool).await.unwrap();
    assert_eq!(declared, ["daily-settlement", "notification-send"]);

    // inventory-sync is a registered kind this file never declared.
    let e = queue::enqueue(
        &producer,
        &[
            run_of(&cfg, JOB, "2026-09-15"),
            run_of(&cfg, "inventory-sync", "2026-09-15"),
        ],
        Clock::Db,
    )
    .await
    .unwrap_err();
    assert_eq!(code(&e).as_deref(), Some("BO008"), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("inventory-sync") && msg.contains("batchonce migrate"),
        "{msg}"
    );
    assert_eq!(runs(&db.pool).await, 0, "a refused enqueue wrote a run");
    // The owner (tests, the migrator) may enqueue any job.
    queue::enqueue(
        &db.pool,
        &[run_of(&cfg, "inventory-sync", "2026-09-15")],
        Clock::Db,
    )
    .await
    .unwrap();

    // A migrate with a file that drops notification-send undeclares it; a
    // migrate without any file leaves the declarations alone.
    let smaller = config_file("declared-smaller", "[jobs.daily-settlement]\n");
    let out = ok(&bin(&logins.url("migrator"), Some(&smaller), &["migrate"]));
    assert!(
        out.contains("no longer declared: notification-send"),
        "{out}"
    );
    let out = ok(&bin(&logins.url("migrator"), None, &["migrate"]));
    assert!(out.contains("declared jobs unchanged"), "{out}");
    assert_eq!(
        queue::declared_jobs(&db.pool).await.unwrap(),
        ["daily-settlement"]
    );
    let e = queue::enqueue(
        &producer,
        &[run_of(&cfg, "notification-send", "2026-09-15")],
        Clock::Db,
    )
    .await
    .unwrap_err();
    assert_eq!(code(&e).as_deref(), Some("BO008"), "{e}");
    ok(&bin(&logins.url("migrator"), Some(&file), &["migrate"]));
    queue::enqueue(
        &producer,
        &[run_of(&cfg, "notification-send", "2026-09-15")],
        Clock::Db,
    )
    .await
    .unwrap();

    // A producer whose file has a job `migrate` never declared: that job
    // misses the tick, named, and the other jobs are enqueued.
    let wider = config_file(
        "declared-wider",
        &format!("{CONFIG}\n[jobs.inventory-sync]\n"),
    );
    let out = ok(&bin(
        &logins.url("producer"),
        Some(&wider),
        &[
            "--json",
            "produce",
            "--once",
            "--now",
            "2026-10-02T02:00:00+09:00",
        ],
    ));
    let ticks: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let tick = |job: &str| {
        ticks
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["job"] == job)
            .unwrap_or_else(|| panic!("{job}: {out}"))
            .clone()
    };
    let inventory = tick("inventory-sync");
    assert!(
        inventory["error"]
            .as_str()
            .is_some_and(|e| e.contains("not declared")),
        "{out}"
    );
    assert_eq!(inventory["enqueued"].as_array().unwrap().len(), 0, "{out}");
    assert!(
        tick(JOB)["enqueued"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k == "daily-settlement:2026-10-01"),
        "{out}"
    );
    let inventory_runs: i64 =
        sqlx::query_scalar("SELECT count(*) FROM batch_job_run WHERE job_name = 'inventory-sync'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(inventory_runs, 1, "only the owner's run of inventory-sync");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calendar_skip_is_one_the_stored_calendar_makes() {
    let (db, logins, _file) = setup("calendar").await;
    let cfg = config(CONFIG);
    let producer = logins.pool("producer").await;
    // 2026-09-15 is a Tuesday and no holiday.
    let mut run = run_of(&cfg, JOB, "2026-09-15");
    run.skip_reason = Some("business calendar: 2026-09-15 is in skip_dates".into());
    let e = queue::enqueue(&producer, &[run], Clock::Db)
        .await
        .unwrap_err();
    assert_eq!(code(&e).as_deref(), Some("22023"), "{e}");
    assert!(e.to_string().contains("calendar"), "{e}");
    assert_eq!(runs(&db.pool).await, 0, "a refused enqueue wrote a run");

    // The stored holiday and a stored weekday (2026-09-20 is a Sunday) are
    // skips; the reason recorded is the database's.
    let mut holiday = run_of(&cfg, JOB, "2026-12-25");
    holiday.skip_reason = Some("because I say so".into());
    let mut sunday = run_of(&cfg, JOB, "2026-09-20");
    sunday.skip_reason = Some("business calendar: 2026-09-20 is a Sun, in skip_weekdays".into());
    let r = queue::enqueue(&producer, &[holiday, sunday], Clock::Db)
        .await
        .unwrap();
    assert_eq!(r.enqueued.len(), 2);
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT job_key::text, status::text, error_message FROM batch_job_run ORDER BY job_key",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        [
            (
                "daily-settlement:2026-09-20".to_owned(),
                "SKIPPED".to_owned(),
                "business calendar: 2026-09-20 is a Sun, in skip_weekdays".to_owned()
            ),
            (
                "daily-settlement:2026-12-25".to_owned(),
                "SKIPPED".to_owned(),
                "business calendar: 2026-12-25 is in skip_dates".to_owned()
            ),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_outside_the_documented_bounds_is_refused() {
    let (db, logins, _file) = setup("bounds").await;
    let cfg = config(CONFIG);
    let producer = logins.pool("producer").await;
    let hours = |h: i64| chrono::Duration::hours(h);
    type Spoil = Box<dyn Fn(&mut NewRun)>;
    let cases: Vec<(&str, Spoil)> = vec![
        (
            "lease_ttl",
            Box::new(|r| r.context.lease_ttl = Duration::from_secs(2 * 86_400)),
        ),
        (
            "stale_after",
            Box::new(|r| r.context.stale_after = Duration::from_secs(1)),
        ),
        ("max_attempts", Box::new(|r| r.max_attempts = 5000)),
        (
            "backoff",
            Box::new(|r| r.context.backoff = Duration::from_secs(8 * 86_400)),
        ),
        (
            "local day",
            Box::new(move |r| {
                r.context.period_start += hours(7);
                r.context.period_end += hours(7);
            }),
        ),
        (
            "local day",
            Box::new(move |r| r.context.period_end += hours(24 * 300)),
        ),
        // Tokyo's day is Seoul's: within the bounds, but not as declared.
        (
            "time zone",
            Box::new(|r| r.context.timezone = chrono_tz::Asia::Tokyo),
        ),
        ("partitions", Box::new(|r| r.partitions = 7)),
        (
            "business date",
            Box::new(|r| r.key = JobKey::parse("daily-settlement:2026-09-14").unwrap()),
        ),
    ];
    for (want, spoil) in &cases {
        let mut run = run_of(&cfg, JOB, "2026-09-15");
        spoil(&mut run);
        let e = queue::enqueue(&producer, &[run], Clock::Db)
            .await
            .unwrap_err();
        assert_eq!(code(&e).as_deref(), Some("22023"), "{want}: {e}");
        assert!(e.to_string().contains(want), "{want}: {e}");
        assert_eq!(
            runs(&db.pool).await,
            0,
            "{want}: a refused enqueue wrote a run"
        );
    }
    // And the run as declared goes in.
    queue::enqueue(&producer, &[run_of(&cfg, JOB, "2026-09-15")], Clock::Db)
        .await
        .unwrap();
    assert_eq!(runs(&db.pool).await, 1);
}
