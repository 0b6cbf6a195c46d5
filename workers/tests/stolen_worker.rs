//! A stolen worker login against the engine's worker functions (issue 42,
//! items 1 and 2; migration 20261208000002): it cannot choose the clock
//! the claim, the heartbeat, the finish and recovery decide with, nor move
//! a lease or a due time past the bounds of the run's own policies, nor
//! switch off the keeping of the run lists with `batchonce.in_step`. Each
//! test logs in as a real worker role (`common::logins`); the owner sets
//! up the runs and checks the rows. The last test is the schema's rule
//! every SECURITY DEFINER function follows for that parameter.

use std::time::Duration;

use batchonce::queue::{self, ClaimSpec, NewRun};
use batchonce::testing::{assert_lists_in_step, TestDb};
use batchonce::{Clock, JobConfig, JobKey, JobName};
use chrono::{DateTime, NaiveDate, Utc};
use sqlx::{Connection, PgConnection, PgPool};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");
const JOB: &str = "daily-settlement";

fn job() -> JobName {
    JobName::parse(JOB).unwrap()
}

fn date(day: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 9, day).unwrap()
}

fn key(day: u32) -> String {
    JobKey::daily(&job(), date(day)).to_string()
}

fn y2999() -> DateTime<Utc> {
    "2999-01-01T00:00:00Z".parse().unwrap()
}

/// Enqueues the runs of `days` as the owner, with the default policies
/// (a 30 s lease, backoff_max 10 min), due at `clock`'s instant.
async fn enqueue(owner: &PgPool, days: &[u32], clock: Clock) {
    let runs: Vec<NewRun> = days
        .iter()
        .map(|d| {
            NewRun::new(
                JobKey::daily(&job(), date(*d)),
                date(*d),
                &JobConfig::default(),
            )
            .unwrap()
        })
        .collect();
    queue::enqueue(owner, &runs, clock).await.unwrap();
}

/// A connection of the worker login, so that a session setting stays.
async fn worker(logins: &common::logins::Logins) -> PgConnection {
    PgConnection::connect(&logins.url("worker")).await.unwrap()
}

/// The SQLSTATE of a statement the worker login sends, which must fail.
async fn sqlstate(w: &mut PgConnection, sql: &str, now: Option<DateTime<Utc>>) -> String {
    let err = sqlx::query(sql)
        .bind(now)
        .execute(&mut *w)
        .await
        .expect_err(sql);
    err.as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned())
        .unwrap_or_else(|| panic!("{sql}: not a database error: {err}"))
}

/// Claims through batchonce_claim3 as the worker login with the
/// database's clock and a lease length of `ttl`: (key, token) of each run.
async fn claim3(w: &mut PgConnection, limit: i64, ttl: f64) -> Vec<(String, i64)> {
    sqlx::query_as(
        "SELECT job_key, lease_token FROM batchonce_claim3($1, $2, $3, 'stolen', NULL, true)",
    )
    .bind(vec![JOB])
    .bind(vec![ttl])
    .bind(limit)
    .fetch_all(&mut *w)
    .await
    .unwrap()
}

/// The run's status, attempts and lease token, as the owner reads them.
async fn run_row(owner: &PgPool, key: &str) -> (String, i32, Option<i64>) {
    sqlx::query_as(
        "SELECT status::text, attempts, lease_token FROM batch_job_run WHERE job_key = $1",
    )
    .bind(key)
    .fetch_one(owner)
    .await
    .unwrap()
}

/// Whether `expr` holds for the run, as the owner reads it (after the
/// statement that changed the run, so `now()` is later than its clock).
async fn holds(owner: &PgPool, key: &str, expr: &str) -> bool {
    sqlx::query_scalar(&format!(
        "SELECT ({expr}) IS TRUE FROM batch_job_run WHERE job_key = $1"
    ))
    .bind(key)
    .fetch_one(owner)
    .await
    .unwrap()
}

/// Item 1: every worker function decides with the database's clock when a
/// worker login calls it, and a caller's durations stay inside the run's
/// policies; the owner (the tests) still injects its clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_worker_login_cannot_move_the_engines_clock() {
    let db = TestDb::empty().await;
    let logins = common::logins::Logins::apply(BIN, &db, common::samples_config()).await;
    let owner = &db.pool;
    let mut w = worker(&logins).await;
    // Due in 2998 by the owner's clock: not due for a long time.
    let later: DateTime<Utc> = "2998-06-01T00:00:00Z".parse().unwrap();
    enqueue(owner, &[1], Clock::At(later)).await;

    // The claims: naming an instant is refused, and nothing is claimed.
    for sql in [
        "SELECT * FROM batchonce_claim3('{daily-settlement}', '{30}', 10, 'stolen', $1, true)",
        "SELECT * FROM batchonce_claim2('{daily-settlement}', '{30}', 10, 'stolen', $1)",
        "SELECT * FROM batchonce_claim('{daily-settlement}', '{30}', 10, 'stolen', $1)",
    ] {
        assert_eq!(sqlstate(&mut w, sql, Some(y2999())).await, "42501", "{sql}");
    }
    assert_eq!(run_row(owner, &key(1)).await.0, "PENDING");
    assert_eq!(run_row(owner, &key(1)).await.1, 0);
    assert!(claim3(&mut w, 10, 30.0).await.is_empty());

    // The heartbeat: a run due now, claimed by the worker login, keeps its
    // stored 30 s lease whatever ttl the caller sends.
    enqueue(owner, &[2], Clock::Db).await;
    let held = claim3(&mut w, 10, 30.0).await;
    assert_eq!(held.len(), 1, "{held:?}");
    let (k2, t2) = held[0].clone();
    assert_eq!(k2, key(2));
    let hb = "SELECT * FROM batchonce_heartbeat('{daily-settlement:2026-09-02}', \
              ARRAY[$2::bigint], '{1e12}', $1)";
    let err = sqlx::query(hb)
        .bind(Some(y2999()))
        .bind(t2)
        .execute(&mut w)
        .await
        .unwrap_err();
    assert_eq!(err.as_database_error().unwrap().code().unwrap(), "42501");
    let extended: bool = sqlx::query_scalar(
        "SELECT extended FROM batchonce_heartbeat(ARRAY[$1], ARRAY[$2::bigint], '{1e12}', NULL)",
    )
    .bind(&k2)
    .bind(t2)
    .fetch_one(&mut w)
    .await
    .unwrap();
    assert!(extended);
    assert!(
        holds(owner, &k2, "lease_expires_at <= now() + lease_ttl").await,
        "the heartbeat extended the lease beyond the run's lease_ttl"
    );
    assert!(holds(owner, &k2, "lease_ttl = interval '30 seconds'").await);

    // A run enqueued without a context (by an earlier release): the
    // caller's ttl applies, cut to 24 h, at the claim and the heartbeat;
    // and it cannot freeze a context outside the bounds either.
    sqlx::query(
        "INSERT INTO batch_job_run (job_key, job_name, business_date, max_attempts) \
         VALUES ($1, $2, $3, 3)",
    )
    .bind(key(3))
    .bind(JOB)
    .bind(date(3))
    .execute(owner)
    .await
    .unwrap();
    let legacy = claim3(&mut w, 10, 1e12).await;
    assert_eq!(legacy.len(), 1, "{legacy:?}");
    let (k3, t3) = legacy[0].clone();
    assert_eq!(k3, key(3));
    assert!(
        holds(
            owner,
            &k3,
            "lease_expires_at <= now() + interval '24 hours'"
        )
        .await,
        "the claim gave a legacy run a lease beyond 24 h"
    );
    sqlx::query("SELECT * FROM batchonce_heartbeat(ARRAY[$1], ARRAY[$2::bigint], '{1e12}', NULL)")
        .bind(&k3)
        .bind(t3)
        .execute(&mut w)
        .await
        .unwrap();
    assert!(
        holds(
            owner,
            &k3,
            "lease_expires_at <= now() + interval '24 hours'"
        )
        .await,
        "the heartbeat extended a legacy run's lease beyond 24 h"
    );
    let freeze = sqlx::query(
        "SELECT * FROM batchonce_freeze_context($1, $2, 'UTC', '2026-09-03', '2026-09-04', \
         'same-day', 1e12, 1e12, 'retry', 500, 10, 600, NULL, 3)",
    )
    .bind(&k3)
    .bind(t3)
    .execute(&mut w)
    .await
    .unwrap_err();
    assert_eq!(
        freeze.as_database_error().unwrap().code().unwrap(),
        "22023",
        "{freeze}"
    );
    assert!(holds(owner, &k3, "timezone IS NULL AND lease_ttl IS NULL").await);

    // Recovery: with an instant of its own, refused; the live leases of
    // others stay theirs.
    let rec =
        "SELECT * FROM batchonce_recover_expired('{daily-settlement}', '{daily-settlement}', $1)";
    assert_eq!(sqlstate(&mut w, rec, Some(y2999())).await, "42501");
    assert_eq!(run_row(owner, &k2).await, ("RUNNING".into(), 1, Some(t2)));
    assert_eq!(run_row(owner, &k3).await, ("RUNNING".into(), 1, Some(t3)));
    let recovered: Vec<(String, String, String)> = sqlx::query_as(rec)
        .bind(None::<DateTime<Utc>>)
        .fetch_all(&mut w)
        .await
        .unwrap();
    assert!(recovered.is_empty(), "{recovered:?}");

    // The finish: no instant of its own, and a retry puts the run off by
    // at most 7 days (the cap of backoff_max and of a handler's RetryAfter).
    let fin = "SELECT status FROM batchonce_finish(ARRAY[$2], ARRAY[$3::bigint], '{retry}', \
               '{boom}', '{1e12}', $1)";
    let err = sqlx::query(fin)
        .bind(Some(y2999()))
        .bind(&k2)
        .bind(t2)
        .execute(&mut w)
        .await
        .unwrap_err();
    assert_eq!(err.as_database_error().unwrap().code().unwrap(), "42501");
    assert_eq!(run_row(owner, &k2).await.0, "RUNNING");
    let status: String = sqlx::query_scalar(fin)
        .bind(None::<DateTime<Utc>>)
        .bind(&k2)
        .bind(t2)
        .fetch_one(&mut w)
        .await
        .unwrap();
    assert_eq!(status, "PENDING");
    assert!(
        holds(owner, &k2, "next_run_at <= now() + interval '7 days'").await,
        "a retry put the run off beyond 7 days"
    );
    assert!(holds(owner, &k2, "next_run_at > now() + interval '6 days'").await);
    assert_lists_in_step(owner).await;

    // The owner's injected clock still works (Clock::At in every test).
    let leases = queue::claim(
        owner,
        "owner",
        &[ClaimSpec {
            job: job(),
            lease_ttl: Duration::from_secs(30),
        }],
        10,
        Clock::At(y2999()),
    )
    .await
    .unwrap();
    let mut keys: Vec<String> = leases.iter().map(|l| l.key.to_string()).collect();
    keys.sort();
    assert_eq!(keys, vec![key(1), key(2)]);
    w.close().await.unwrap();
}

/// Asserts that the worker's session still has `batchonce.in_step` on, so
/// each call below starts with the caller's value set.
async fn in_step_on(w: &mut PgConnection) {
    let v: Option<String> = sqlx::query_scalar("SELECT current_setting('batchonce.in_step', true)")
        .fetch_one(&mut *w)
        .await
        .unwrap();
    assert_eq!(v.as_deref(), Some("on"));
}

/// Item 2: `SET batchonce.in_step = on` in the worker login's session does
/// not switch the list-keeping trigger off for the engine's writes: each
/// claim leaves its RUNNING run on the running list, each finish and a
/// recovery put their PENDING run back on the due list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_worker_login_cannot_switch_off_the_run_lists() {
    let db = TestDb::empty().await;
    let logins = common::logins::Logins::apply(BIN, &db, common::samples_config()).await;
    let owner = &db.pool;
    enqueue(owner, &[1, 2, 3], Clock::Db).await;
    let mut w = worker(&logins).await;
    sqlx::query("SET batchonce.in_step = on")
        .execute(&mut w)
        .await
        .unwrap();

    let mut held = Vec::new();
    for claim in ["batchonce_claim", "batchonce_claim2"] {
        in_step_on(&mut w).await;
        let got: Vec<(String, i64)> = sqlx::query_as(&format!(
            "SELECT job_key, lease_token FROM {claim}('{{daily-settlement}}', '{{30}}', 1, 'stolen', NULL)"
        ))
        .fetch_all(&mut w)
        .await
        .unwrap();
        assert_eq!(got.len(), 1, "{claim}: {got:?}");
        assert_lists_in_step(owner).await;
        held.extend(got);
    }
    in_step_on(&mut w).await;
    let got = claim3(&mut w, 1, 30.0).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_lists_in_step(owner).await;
    held.extend(got);

    // A release and a retry: PENDING again, and on the due list.
    for ((k, t), kind) in held[..2].iter().zip(["release", "retry"]) {
        in_step_on(&mut w).await;
        let status: String = sqlx::query_scalar(
            "SELECT status FROM batchonce_finish(ARRAY[$1], ARRAY[$2::bigint], ARRAY[$3], \
             '{stop}', '{0}', NULL)",
        )
        .bind(k)
        .bind(t)
        .bind(kind)
        .fetch_one(&mut w)
        .await
        .unwrap();
        assert_eq!(status, "PENDING", "{kind}");
        assert_lists_in_step(owner).await;
    }

    // Recovery of an expired lease: PENDING again, and on the due list.
    let (k3, _) = &held[2];
    sqlx::query(
        "UPDATE batch_job_run SET lease_expires_at = now() - interval '1 second' WHERE job_key = $1",
    )
    .bind(k3)
    .execute(owner)
    .await
    .unwrap();
    in_step_on(&mut w).await;
    let recovered: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT * FROM batchonce_recover_expired('{daily-settlement}', '{daily-settlement}', NULL)",
    )
    .fetch_all(&mut w)
    .await
    .unwrap();
    assert_eq!(recovered.len(), 1, "{recovered:?}");
    assert_eq!(&recovered[0].0, k3);
    assert_eq!(recovered[0].1, "PENDING");
    assert_lists_in_step(owner).await;
    w.close().await.unwrap();
}

/// Functions that reset nothing themselves because every write of theirs
/// follows a call of a function that does: each with that callee, which the
/// test checks is called in the body and resets first itself.
const DELEGATES: &[(&str, &str)] = &[
    // Writes only through batchonce_enqueue2.
    ("batchonce_enqueue", "batchonce_enqueue2"),
    // Refuses scoped jobs, then writes only through the unscoped body.
    (
        "batchonce_enqueue_declared",
        "batchonce_enqueue_declared_unscoped",
    ),
    // Checks its counts, then fences (batchonce_fence resets) before it writes.
    ("batchonce_progress", "batchonce_fence"),
];

/// The first statement of a function's body, whitespace collapsed: what
/// follows the first BEGIN of a PL/pgSQL body, or a SQL body itself.
fn first_statement(lang: &str, src: &str) -> String {
    // Comments are not statements: a body may say why before it resets.
    let code: String = src
        .lines()
        .map(|l| l.split_once("--").map_or(l, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n");
    let words: Vec<&str> = code.split_whitespace().collect();
    let start = if lang == "plpgsql" {
        words
            .iter()
            .position(|w| w.eq_ignore_ascii_case("BEGIN"))
            .map_or(words.len(), |i| i + 1)
    } else {
        0
    };
    words[start..].join(" ")
}

/// The rule behind item 2: every SECURITY DEFINER function of the schema
/// that is not a trigger function and that a role other than its owner may
/// call (the owner's own helpers run only inside those) keeps the caller's `batchonce.in_step`
/// from its statements, by resetting it as its first statement (or, where
/// a superuser created it, pinning it off in its settings). A function
/// SET clause with a custom parameter is for superusers only, so the
/// schema is migrated here by the migrator role, as in production.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_security_definer_function_resets_in_step() {
    let db = TestDb::empty().await;
    let _logins = common::logins::Logins::apply(BIN, &db, common::samples_config()).await;
    let functions: Vec<(String, String, String, Option<Vec<String>>)> = sqlx::query_as(
        "SELECT p.oid::regprocedure::text, l.lanname::text, p.prosrc, p.proconfig \
         FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang \
         WHERE p.pronamespace = current_schema()::regnamespace AND p.prosecdef \
           AND p.prorettype <> 'trigger'::regtype \
           AND (p.proacl IS NULL OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a \
                WHERE a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner)) \
         ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        functions
            .iter()
            .any(|f| f.0.starts_with("batchonce_claim3(")),
        "{functions:?}"
    );
    let reset = |lang: &str| {
        if lang == "plpgsql" {
            "PERFORM set_config('batchonce.in_step', 'off', true);"
        } else {
            "SELECT set_config('batchonce.in_step', 'off', true);"
        }
    };
    let broken: Vec<&str> = functions
        .iter()
        .filter(|(f, _, src, _)| {
            // A delegate passes if it calls its callee, which is checked
            // like every other function (it must not be in `broken`).
            !DELEGATES.iter().any(|(d, callee)| {
                f.starts_with(&format!("{d}(")) && src.contains(&format!("{callee}("))
            })
        })
        .filter(|(_, lang, src, config)| {
            let pinned = config
                .iter()
                .flatten()
                .any(|c| c == "batchonce.in_step=off");
            !pinned && !first_statement(lang, src).starts_with(reset(lang))
        })
        .map(|f| f.0.as_str())
        .collect();
    assert!(
        broken.is_empty(),
        "SECURITY DEFINER functions that let the caller's batchonce.in_step through: {broken:?}"
    );
}
