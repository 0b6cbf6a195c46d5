//! The console's enqueue of missing periods, over HTTP against a real
//! database: a preview that lists every key and refuses periods the stored
//! schedule does not expect (or not yet), periods with a run, and text that
//! is no period; an apply that needs a reason, builds each run's context
//! from the job's declaration, and writes one audit row per run; the
//! refusals of a viewer, a wrong token, too many periods and an unknown or
//! scoped job; and, under the console's own database login, the database
//! checking the enqueue against the declaration as it checks a producer's.

mod common;

use std::collections::BTreeMap;

use batchonce::console::auth::{hash_password, Role, Users};
use batchonce::console::ConsoleOptions;
use batchonce::queue::{self, NewRun};
use batchonce::schedule::CronSchedule;
use batchonce::testing::TestDb;
use batchonce::{JobConfig, JobKey, JobName};
use chrono::{Datelike, Days, NaiveDate, Weekday};
use common::console::{start, start_on, Console, PASSWORD};
use reqwest::header::{COOKIE, ORIGIN};
use reqwest::StatusCode;
use sqlx::PgPool;

/// Daily at 01:00 Seoul from Tuesday to Saturday, each firing for the day
/// before: Monday to Friday are expected, weekends never.
fn settle_config(skip: NaiveDate) -> JobConfig {
    JobConfig {
        timezone: chrono_tz::Asia::Seoul,
        covers: batchonce::schedule::Covers::PreviousDay,
        schedule: Some(CronSchedule::parse("0 1 * * 2-6").unwrap()),
        skip_dates: vec![skip],
        max_attempts: 7,
        lease_ttl: std::time::Duration::from_secs(45),
        chunk_size: 50,
        ..JobConfig::default()
    }
}

/// An audit row: operator, action, key, reason, before, after, address.
type AuditRow = (
    String,
    String,
    String,
    String,
    String,
    String,
    Option<String>,
);

async fn declare(pool: &PgPool, jobs: &[(&str, JobConfig)]) {
    let jobs: BTreeMap<JobName, JobConfig> = jobs
        .iter()
        .map(|(n, c)| (JobName::parse(n).unwrap(), c.clone()))
        .collect();
    queue::declare(pool, &jobs).await.unwrap();
}

/// The database's today in Seoul.
async fn today(pool: &PgPool) -> NaiveDate {
    sqlx::query_scalar("SELECT (now() AT TIME ZONE 'Asia/Seoul')::date")
        .fetch_one(pool)
        .await
        .unwrap()
}

fn weekday(d: NaiveDate) -> bool {
    !matches!(d.weekday(), Weekday::Sat | Weekday::Sun)
}

/// Four Monday-to-Friday dates at least three days back (newest first),
/// a Saturday as far back, and a weekday at least three days ahead.
fn dates(today: NaiveDate) -> ([NaiveDate; 4], NaiveDate, NaiveDate) {
    let back: Vec<NaiveDate> = (3..30).map(|n| today - Days::new(n)).collect();
    let w: Vec<NaiveDate> = back.iter().copied().filter(|d| weekday(*d)).collect();
    let sat = *back.iter().find(|d| d.weekday() == Weekday::Sat).unwrap();
    let future = (3..10)
        .map(|n| today + Days::new(n))
        .find(|d| weekday(*d))
        .unwrap();
    ([w[0], w[1], w[2], w[3]], sat, future)
}

async fn post(c: &Console, cookie: &str, path: &str, form: &[(&str, String)]) -> reqwest::Response {
    c.http
        .post(c.url(path))
        .header(COOKIE, format!("batchonce_session={cookie}"))
        .form(form)
        .send()
        .await
        .unwrap()
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[tokio::test]
async fn a_missing_period_is_enqueued_with_a_preview_from_its_declaration_and_audited() {
    let c = start(None).await;
    let today = today(&c.db.pool).await;
    let ([missing, skipped, failed, older], saturday, future) = dates(today);
    declare(&c.db.pool, &[("settle", settle_config(skipped))]).await;
    let d = |x: NaiveDate| x.to_string();
    c.runs("settle", &[(&d(failed), "FAILED", Some("bad data"))])
        .await;
    let alice = c.login("alice").await;
    let periods = [
        d(missing),
        d(skipped),
        d(failed),
        d(older),
        d(saturday),
        d(future),
        "2026-02-30".to_owned(),
        "<b>x</b>".to_owned(),
        d(missing),
    ];
    let mut form: Vec<(&str, String)> = vec![("csrf", alice.csrf.clone())];
    form.extend(periods.iter().map(|p| ("period", p.clone())));
    let res = post(&c, &alice.cookie, "/jobs/settle/enqueue/preview", &form).await;
    assert_eq!(res.status(), StatusCode::OK);
    let page = res.text().await.unwrap();
    // Every key is listed, with what would happen to it.
    for day in [missing, skipped, failed, older, saturday, future] {
        assert!(page.contains(&format!("settle:{day}")), "{day}: {page}");
    }
    assert!(
        page.contains("refused: it has a run already (FAILED)"),
        "{page}"
    );
    assert!(
        page.contains("refused: the job's schedule expects no run for this period"),
        "{page}"
    );
    assert!(
        page.contains("refused: not due yet: it is due at"),
        "{page}"
    );
    assert!(
        page.contains("refused: not a period of this job: write its business date"),
        "{page}"
    );
    assert!(
        page.contains("&lt;b&gt;x&lt;/b&gt;") && !page.contains("<b>x</b>"),
        "{page}"
    );
    assert!(page.contains("business calendar:"), "{page}");
    assert!(page.contains("Enqueue 3 runs"), "{page}");
    assert_eq!(page.matches("name=\"period\"").count(), 3, "{page}");
    // The preview wrote nothing.
    assert_eq!(
        count(&c.db.pool, "SELECT count(*) FROM batch_job_run").await,
        1
    );
    assert_eq!(
        count(&c.db.pool, "SELECT count(*) FROM batch_operator_action").await,
        0
    );

    // The apply needs a reason.
    let res = post(&c, &alice.cookie, "/jobs/settle/enqueue/apply", &form).await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert!(res.text().await.unwrap().contains("Reason"));
    form.push(("reason", "the feed was late, INC-9".to_owned()));
    let res = post(&c, &alice.cookie, "/jobs/settle/enqueue/apply", &form).await;
    assert_eq!(res.status(), StatusCode::OK);
    let page = res.text().await.unwrap();
    assert!(page.contains("3 of 8 periods enqueued"), "{page}");
    // Each run has the declaration's context and policies, not the
    // engine's defaults.
    let runs: Vec<(String, String, String, i32, f64, i32)> = sqlx::query_as(
        "SELECT job_key, status, timezone, max_attempts, extract(epoch FROM lease_ttl)::float8, \
         chunk_size FROM batch_job_run WHERE job_key <> $1 ORDER BY job_key",
    )
    .bind(format!("settle:{failed}"))
    .fetch_all(&c.db.pool)
    .await
    .unwrap();
    let want = |day: NaiveDate, status: &str| {
        (
            format!("settle:{day}"),
            status.to_owned(),
            "Asia/Seoul".to_owned(),
            7,
            45.0,
            50,
        )
    };
    let mut expected = vec![
        want(missing, "PENDING"),
        want(skipped, "SKIPPED"),
        want(older, "PENDING"),
    ];
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(runs, expected);
    // The period is the Seoul business day of the key.
    let start: String = sqlx::query_scalar(
        "SELECT to_char(period_start AT TIME ZONE 'Asia/Seoul', 'YYYY-MM-DD HH24:MI') \
         FROM batch_job_run WHERE job_key = $1",
    )
    .bind(format!("settle:{missing}"))
    .fetch_one(&c.db.pool)
    .await
    .unwrap();
    assert_eq!(start, format!("{missing} 00:00"));
    // One audit row per run enqueued, in the signed-in user's name.
    let audit: Vec<AuditRow> = sqlx::query_as(
        "SELECT operator, action, job_key, reason, before_status, after_status, remote_addr \
             FROM batch_operator_action ORDER BY job_key",
    )
    .fetch_all(&c.db.pool)
    .await
    .unwrap();
    let row = |day: NaiveDate, after: &str| {
        (
            "alice".to_owned(),
            "enqueue".to_owned(),
            format!("settle:{day}"),
            "the feed was late, INC-9".to_owned(),
            "MISSING".to_owned(),
            after.to_owned(),
            Some("127.0.0.1".to_owned()),
        )
    };
    let mut want_audit = vec![
        row(missing, "PENDING"),
        row(skipped, "SKIPPED"),
        row(older, "PENDING"),
    ];
    want_audit.sort();
    assert_eq!(audit, want_audit);
    // The audit page lists them under the new action.
    let audit_page = c
        .get_as(&alice.cookie, "/audit?action=enqueue")
        .await
        .text()
        .await
        .unwrap();
    assert!(
        audit_page.contains(&format!("settle:{missing}")),
        "{audit_page}"
    );

    // The same periods again: each has a run now, nothing is enqueued twice.
    let res = post(&c, &alice.cookie, "/jobs/settle/enqueue/apply", &form).await;
    assert_eq!(res.status(), StatusCode::CONFLICT);
    let page = res.text().await.unwrap();
    assert!(
        page.contains("refused: it has a run already (PENDING)"),
        "{page}"
    );
    assert_eq!(
        count(&c.db.pool, "SELECT count(*) FROM batch_operator_action").await,
        3
    );
}

#[tokio::test]
async fn enqueue_refuses_viewers_bad_tokens_too_many_periods_and_jobs_it_cannot_enqueue() {
    let c = start(None).await;
    let today = today(&c.db.pool).await;
    let ([missing, skipped, ..], ..) = dates(today);
    let scoped = JobConfig {
        scopes: Some(batchonce::config::ScopeSource::List(vec![
            batchonce::key::Scope::parse("north").unwrap(),
        ])),
        ..settle_config(skipped)
    };
    declare(
        &c.db.pool,
        &[("settle", settle_config(skipped)), ("regions", scoped)],
    )
    .await;
    c.runs("undeclared", &[("2026-09-15", "FAILED", None)])
        .await;
    let (alice, vera) = (c.login("alice").await, c.login("vera").await);
    let one = |csrf: &str| {
        vec![
            ("csrf", csrf.to_owned()),
            ("period", missing.to_string()),
            ("reason", "late feed".to_owned()),
        ]
    };
    // A viewer may look, not act.
    let res = post(
        &c,
        &vera.cookie,
        "/jobs/settle/enqueue/preview",
        &one(&vera.csrf),
    )
    .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let res = post(
        &c,
        &vera.cookie,
        "/jobs/settle/enqueue/apply",
        &one(&vera.csrf),
    )
    .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    // A missing or wrong token, and another site's form.
    let res = post(
        &c,
        &alice.cookie,
        "/jobs/settle/enqueue/apply",
        &one("forged"),
    )
    .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let res = c
        .http
        .post(c.url("/jobs/settle/enqueue/apply"))
        .header(COOKIE, format!("batchonce_session={}", alice.cookie))
        .header(ORIGIN, "https://evil.example")
        .form(&one(&alice.csrf))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        count(&c.db.pool, "SELECT count(*) FROM batch_job_run").await,
        1
    );
    // More than 400 periods at once.
    let mut many: Vec<(&str, String)> = vec![("csrf", alice.csrf.clone())];
    many.extend((0..401u64).map(|n| ("period", (today - Days::new(3 + n)).to_string())));
    let res = post(&c, &alice.cookie, "/jobs/settle/enqueue/preview", &many).await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let page = res.text().await.unwrap();
    assert!(page.contains("401 periods chosen; at most 400"), "{page}");
    assert!(page.contains("<nav aria-label=\"Main\">"), "{page}");
    // None at all.
    let res = post(
        &c,
        &alice.cookie,
        "/jobs/settle/enqueue/preview",
        &[("csrf", alice.csrf.clone())],
    )
    .await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    // An unknown job is a 404 with the navigation.
    let res = post(
        &c,
        &alice.cookie,
        "/jobs/ghost/enqueue/preview",
        &one(&alice.csrf),
    )
    .await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert!(res.text().await.unwrap().contains("No job is named ghost"));
    // A job with runs but no declaration, and a scoped job.
    let res = post(
        &c,
        &alice.cookie,
        "/jobs/undeclared/enqueue/preview",
        &one(&alice.csrf),
    )
    .await;
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert!(res
        .text()
        .await
        .unwrap()
        .contains("Job undeclared is not declared"));
    let res = post(
        &c,
        &alice.cookie,
        "/jobs/regions/enqueue/preview",
        &one(&alice.csrf),
    )
    .await;
    assert_eq!(res.status(), StatusCode::CONFLICT);
    let page = res.text().await.unwrap();
    assert!(page.contains("runs once per scope"), "{page}");
    assert_eq!(
        count(&c.db.pool, "SELECT count(*) FROM batch_job_run").await,
        1
    );
    assert_eq!(
        count(&c.db.pool, "SELECT count(*) FROM batch_operator_action").await,
        0
    );
}

/// The roles of one prefix, dropped from the server when this is dropped
/// (they are global to it), after the test's database, even on a failure.
struct DropRoles(String);

impl Drop for DropRoles {
    fn drop(&mut self) {
        let prefix = self.0.clone();
        let server = batchonce::testing::server().to_owned();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let admin = batchonce::db::connect(&server, "console-test", 1)
                    .await
                    .unwrap();
                for part in [
                    "login",
                    "migrator",
                    "producer",
                    "worker",
                    "operator",
                    "readonly",
                    "program",
                    "console",
                    "guard",
                    "terminator",
                ] {
                    let _ = sqlx::query(&format!("DROP ROLE IF EXISTS {prefix}_{part}"))
                        .execute(&admin)
                        .await;
                }
            });
        })
        .join();
    }
}

#[tokio::test]
async fn under_the_consoles_own_login_the_database_checks_the_enqueue_against_the_declaration() {
    // The roles of `batchonce roles`, and a login in the console's role;
    // declared first, so they are dropped after the database.
    let prefix = format!("bo_ce{:08x}", rand::random::<u32>());
    let _roles = DropRoles(prefix.clone());
    let db = TestDb::new(&[]).await;
    let today = today(&db.pool).await;
    let ([missing, skipped, ..], ..) = dates(today);
    declare(&db.pool, &[("settle", settle_config(skipped))]).await;
    batchonce::ops::roles::apply(&db.pool, &prefix, &Default::default())
        .await
        .unwrap();
    let password = format!("pw{:016x}", rand::random::<u64>());
    let login = format!("{prefix}_login");
    sqlx::query(&format!(
        "CREATE ROLE {login} LOGIN PASSWORD '{password}' IN ROLE {prefix}_console"
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let mut url = url::Url::parse(&db.url).unwrap();
    url.set_username(&login).unwrap();
    url.set_password(Some(&password)).unwrap();
    let pool = batchonce::db::connect(url.as_str(), "console-test", 4)
        .await
        .unwrap();

    // The database refuses what the declaration does not say, for this
    // login, although the function runs with the owner's rights.
    let job = JobName::parse("settle").unwrap();
    let utc = NewRun::new(JobKey::daily(&job, missing), missing, &JobConfig::default()).unwrap();
    let err = queue::operator_enqueue(&pool, std::slice::from_ref(&utc), "alice", "late", None)
        .await
        .unwrap_err();
    let code = |e: &queue::QueueError| match e {
        queue::QueueError::Database(e) => e
            .as_database_error()
            .and_then(|d| d.code())
            .map(|c| c.into_owned()),
        _ => None,
    };
    assert_eq!(code(&err).as_deref(), Some("22023"), "{err}");
    assert!(
        err.to_string()
            .contains("time zone UTC, not the declared Asia/Seoul"),
        "{err}"
    );
    let ghost = JobName::parse("ghost").unwrap();
    let undeclared = NewRun::new(
        JobKey::daily(&ghost, missing),
        missing,
        &settle_config(skipped),
    )
    .unwrap();
    let err = queue::operator_enqueue(&pool, &[undeclared], "alice", "late", None)
        .await
        .unwrap_err();
    assert_eq!(code(&err).as_deref(), Some("BO008"), "{err}");
    // Nothing else of the engine's may the login call to enqueue.
    let err = queue::enqueue(&pool, &[utc], batchonce::Clock::Db)
        .await
        .unwrap_err();
    assert_eq!(code(&err).as_deref(), Some("42501"), "{err}");

    // Through the console, on this login: enqueued and audited under it.
    let hash = hash_password(PASSWORD).unwrap();
    let users = Users::from_hashes(&[("alice", Role::Operator, hash)]);
    let opts = ConsoleOptions::new("127.0.0.1:0".parse().unwrap(), users);
    let c = start_on(db, pool, opts).await;
    let alice = c.login("alice").await;
    let form = vec![
        ("csrf", alice.csrf.clone()),
        ("period", missing.to_string()),
        ("reason", "late feed".to_owned()),
    ];
    let res = post(&c, &alice.cookie, "/jobs/settle/enqueue/apply", &form).await;
    let status = res.status();
    let page = res.text().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{page}");
    let row: (String, String, String, String) = sqlx::query_as(
        "SELECT a.session_user_name, a.after_status, r.timezone, r.status \
         FROM batch_operator_action a JOIN batch_job_run r USING (job_key)",
    )
    .fetch_one(&c.db.pool)
    .await
    .unwrap();
    assert_eq!(
        row,
        (
            login.clone(),
            "PENDING".into(),
            "Asia/Seoul".into(),
            "PENDING".into()
        )
    );
}
