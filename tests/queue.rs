//! Queue protocol tests against real PostgreSQL, each in its own database:
//! dedupe, claim exclusivity, fencing, retry timing, max_attempts, lease expiry.

use std::collections::HashSet;
use std::time::Duration;

use batchonce::queue::{self, ClaimSpec, Fence, Finish, HeldLease, NewRun, QueueError, RunStatus};
use batchonce::testing::TestDb;
use batchonce::{Clock, JobKey, JobName};
use chrono::{DateTime, NaiveDate, Utc};
use sqlx::PgPool;

fn job() -> JobName {
    JobName::parse("test-job").unwrap()
}

fn run(day: u32, max_attempts: u32) -> NewRun {
    run_with(
        day,
        batchonce::JobConfig {
            max_attempts,
            ..Default::default()
        },
    )
}

/// A run enqueued under `cfg`: its lease length and policies are the run's.
fn run_with(day: u32, cfg: batchonce::JobConfig) -> NewRun {
    let date = NaiveDate::from_ymd_opt(2026, 1, 1).unwrap() + chrono::Days::new(day as u64);
    NewRun::new(JobKey::daily(&job(), date), date, &cfg).unwrap()
}

/// A run whose stored lease lasts `ttl`.
fn run_ttl(day: u32, max_attempts: u32, ttl: Duration) -> NewRun {
    run_with(
        day,
        batchonce::JobConfig {
            max_attempts,
            lease_ttl: ttl,
            ..Default::default()
        },
    )
}

fn spec(ttl: Duration) -> Vec<ClaimSpec> {
    vec![ClaimSpec {
        job: job(),
        lease_ttl: ttl,
    }]
}

async fn db_now(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn status_of(pool: &PgPool, key: &JobKey) -> (String, i32, Option<i64>) {
    let row: (String, i32, Option<i64>) = sqlx::query_as(
        "SELECT status, attempts, lease_token FROM batch_job_run WHERE job_key = $1",
    )
    .bind(key.as_str())
    .fetch_one(pool)
    .await
    .unwrap();
    row
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dedupe_under_concurrency() {
    let db = TestDb::new(&[]).await;
    let runs: Vec<NewRun> = (0..1000).map(|d| run(d, 3)).collect();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let pool = db.pool.clone();
        let runs = runs.clone();
        tasks.push(tokio::spawn(async move {
            queue::enqueue(&pool, &runs, Clock::Db).await.unwrap()
        }));
    }
    let mut enqueued = 0;
    let mut duplicates = 0;
    let mut seen = HashSet::new();
    for t in tasks {
        let r = t.await.unwrap();
        enqueued += r.enqueued.len();
        duplicates += r.duplicates.len();
        for k in r.enqueued {
            assert!(seen.insert(k), "a key was reported enqueued twice");
        }
    }
    assert_eq!(enqueued, 1000);
    assert_eq!(duplicates, 15 * 1000);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM batch_job_run")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 1000);
}

#[tokio::test]
async fn enqueue_reports_repeats_within_one_call() {
    let db = TestDb::new(&[]).await;
    let r = queue::enqueue(&db.pool, &[run(1, 3), run(1, 3), run(2, 3)], Clock::Db)
        .await
        .unwrap();
    assert_eq!(r.enqueued.len(), 2);
    assert_eq!(r.duplicates, vec![run(1, 3).key]);
}

#[tokio::test]
async fn enqueue_rejects_oversized_payload_and_foreign_keys() {
    let db = TestDb::new(&[]).await;
    let mut big = run(1, 3);
    big.payload = serde_json::json!({ "x": "y".repeat(70_000) });
    assert!(matches!(
        queue::enqueue(&db.pool, &[big], Clock::Db).await,
        Err(QueueError::Invalid(m)) if m.contains("limit")
    ));
    let mut foreign = run(2, 3);
    foreign.job = JobName::parse("other").unwrap();
    assert!(queue::enqueue(&db.pool, &[foreign], Clock::Db)
        .await
        .is_err());
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM batch_job_run")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "nothing is written when a batch is rejected");
}

#[tokio::test]
async fn audit_rows_refuse_characters_that_disguise_text() {
    let db = TestDb::new(&[]).await;
    queue::enqueue(&db.pool, &[run(0, 3)], Clock::Db)
        .await
        .unwrap();
    let key = run(0, 3).key;
    let insert = |operator: String, reason: String| {
        let pool = db.pool.clone();
        let key = key.clone();
        async move {
            sqlx::query(
                "INSERT INTO batch_operator_action \
                 (operator, action, job_key, reason, before_status, after_status) \
                 VALUES ($1, 'skip', $2, $3, 'PENDING', 'SKIPPED')",
            )
            .bind(operator)
            .bind(key.as_str())
            .bind(reason)
            .execute(&pool)
            .await
        }
    };
    // Every character the migration names, at both ends of each range.
    let refused = [
        '\u{1}', '\u{9}', '\u{a}', '\u{1f}', '\u{7f}', '\u{80}', '\u{9f}', '\u{ad}', '\u{61c}',
        '\u{200b}', '\u{200f}', '\u{2028}', '\u{2029}', '\u{202a}', '\u{202e}', '\u{2060}',
        '\u{2064}', '\u{2066}', '\u{2069}', '\u{feff}',
    ];
    for c in refused {
        let spoofed = format!("adm{c}in");
        let err = insert(spoofed.clone(), "a reason".into())
            .await
            .unwrap_err();
        let db_err = err.as_database_error().expect("a database error");
        assert_eq!(
            db_err.constraint(),
            Some("batch_operator_action_operator_printable"),
            "U+{:04X}",
            c as u32
        );
        let err = insert("kim".into(), spoofed).await.unwrap_err();
        let db_err = err.as_database_error().expect("a database error");
        assert_eq!(
            db_err.constraint(),
            Some("batch_operator_action_reason_printable"),
            "U+{:04X}",
            c as u32
        );
    }
    // Ordinary text of any script, and the neighbours of the refused ranges,
    // are written (src/text.rs refuses more, U+2065 among them, before a
    // row is ever sent).
    for ok in [
        "김민준",
        "Ärger-Müller",
        "a b",
        "a\u{a0}b",
        "a\u{2010}b",
        "a\u{202f}b",
        "a\u{2065}b",
    ] {
        insert(ok.into(), format!("why: {ok}")).await.unwrap();
    }
    // Added NOT VALID: rows from before the migration are not checked.
    let validated: Vec<bool> = sqlx::query_scalar(
        "SELECT convalidated FROM pg_constraint WHERE conname LIKE 'batch_operator_action_%_printable' ORDER BY conname",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(validated, vec![false, false]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_are_exclusive() {
    let db = TestDb::new(&[]).await;
    let runs: Vec<NewRun> = (0..300).map(|d| run(d, 3)).collect();
    queue::enqueue(&db.pool, &runs, Clock::Db).await.unwrap();
    let mut tasks = Vec::new();
    for w in 0..12 {
        let pool = db.pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let leases = queue::claim(
                    &pool,
                    &format!("w{w}"),
                    &spec(Duration::from_secs(60)),
                    7,
                    Clock::Db,
                )
                .await
                .unwrap();
                if leases.is_empty() {
                    break;
                }
                got.extend(leases);
            }
            got
        }));
    }
    let mut keys = HashSet::new();
    let mut tokens = HashSet::new();
    for t in tasks {
        for lease in t.await.unwrap() {
            assert!(keys.insert(lease.key.clone()), "{} leased twice", lease.key);
            assert!(tokens.insert(lease.token), "token {} reused", lease.token);
            assert_eq!(lease.attempt, 1);
        }
    }
    assert_eq!(keys.len(), 300);
    let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM batch_job_attempt")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(attempts, 300, "one attempt row per claim");
}

#[tokio::test]
async fn claim_only_takes_named_jobs_and_due_runs() {
    let db = TestDb::new(&[]).await;
    queue::enqueue(&db.pool, &[run(1, 3)], Clock::Db)
        .await
        .unwrap();
    let other = vec![ClaimSpec {
        job: JobName::parse("other").unwrap(),
        lease_ttl: Duration::from_secs(5),
    }];
    assert!(queue::claim(&db.pool, "w", &other, 5, Clock::Db)
        .await
        .unwrap()
        .is_empty());
    // Enqueued "in the future" by a fixed clock: not due yet by the DB clock.
    let later = db_now(&db.pool).await + chrono::Duration::hours(1);
    queue::enqueue(&db.pool, &[run(2, 3)], Clock::At(later))
        .await
        .unwrap();
    let got = queue::claim(&db.pool, "w", &spec(Duration::from_secs(5)), 5, Clock::Db)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].key, run(1, 3).key);
}

/// Index entries of `batch_job_due_claim_idx` (the claim order of the due
/// runs) read so far in the open transaction of `conn`.
/// A fenced transaction ends itself after twice its run's lease of idleness
/// (at least `MIN_FENCED_IDLE`), whatever the session's own setting; the
/// setting is gone once it commits.
#[tokio::test]
async fn a_fenced_transaction_carries_its_own_idle_timeout() {
    let db = TestDb::new(&[]).await;
    let pool = batchonce::db::connect(&db.url, "one", 1).await.unwrap();
    queue::enqueue(&pool, &[run(1, 3)], Clock::Db)
        .await
        .unwrap();
    let lease = queue::claim(&pool, "w", &spec(Duration::from_secs(30)), 1, Clock::Db)
        .await
        .unwrap()
        .remove(0);
    let show = "SHOW idle_in_transaction_session_timeout";
    for (ttl, want) in [
        (Duration::from_secs(8), "16s"),
        (Duration::from_secs(1), "10s"),
    ] {
        let mut tx = queue::begin_fenced(&pool, &lease.fence(), ttl, Clock::Db)
            .await
            .unwrap();
        let inside: String = sqlx::query_scalar(show).fetch_one(tx.conn()).await.unwrap();
        assert_eq!(inside, want);
        tx.commit().await.unwrap();
        let after: String = sqlx::query_scalar(show).fetch_one(&pool).await.unwrap();
        assert_eq!(after, "0", "the setting outlived its transaction");
    }
}

#[tokio::test]
async fn a_stale_token_cannot_heartbeat_write_or_finish() {
    let db = TestDb::new(&[]).await;
    let r = run(1, 5);
    queue::enqueue(&db.pool, std::slice::from_ref(&r), Clock::Db)
        .await
        .unwrap();
    let ttl = Duration::from_secs(30);
    let old = queue::claim(&db.pool, "zombie", &spec(ttl), 1, Clock::Db)
        .await
        .unwrap()
        .remove(0);

    // While a fenced transaction is open, the row cannot be taken over.
    let mut tx = queue::begin_fenced(&db.pool, &old.fence(), ttl, Clock::Db)
        .await
        .unwrap();
    let future = db_now(&db.pool).await + chrono::Duration::minutes(5);
    let recovered = queue::recover_expired(&db.pool, &[job()], &[], Clock::At(future))
        .await
        .unwrap();
    assert!(
        recovered.is_empty(),
        "takeover skipped a row under a fenced transaction"
    );
    tx.add_progress(1, 0);
    tx.commit().await.unwrap();

    // The lease expires (simulated clock) and the run is recovered with a new token.
    let recovered = queue::recover_expired(&db.pool, &[job()], &[], Clock::At(future))
        .await
        .unwrap();
    assert_eq!(recovered.len(), 1);
    assert_eq!(recovered[0].status, RunStatus::Pending);
    let new = queue::claim(&db.pool, "fresh", &spec(ttl), 1, Clock::At(future))
        .await
        .unwrap()
        .remove(0);
    assert_ne!(new.token, old.token);
    assert_eq!(new.attempt, 2);

    let hb = queue::heartbeat(
        &db.pool,
        &[HeldLease {
            fence: old.fence(),
            lease_ttl: ttl,
        }],
        Clock::Db,
    )
    .await
    .unwrap();
    assert_eq!(hb.lost, vec![r.key.clone()]);
    assert!(matches!(
        queue::begin_fenced(&db.pool, &old.fence(), ttl, Clock::Db).await,
        Err(QueueError::LeaseLost(_))
    ));
    assert!(matches!(
        queue::finish(&db.pool, &old.fence(), &Finish::Succeeded, Clock::Db).await,
        Err(QueueError::LeaseLost(_))
    ));
    let (status, attempts, token) = status_of(&db.pool, &r.key).await;
    assert_eq!(
        (status.as_str(), attempts, token),
        ("RUNNING", 2, Some(new.token))
    );

    // The new holder can do all three.
    let hb = queue::heartbeat(
        &db.pool,
        &[HeldLease {
            fence: new.fence(),
            lease_ttl: ttl,
        }],
        Clock::Db,
    )
    .await
    .unwrap();
    assert_eq!(hb.extended, vec![r.key.clone()]);
    let tx = queue::begin_fenced(&db.pool, &new.fence(), ttl, Clock::Db)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        queue::finish(&db.pool, &new.fence(), &Finish::Succeeded, Clock::Db)
            .await
            .unwrap(),
        RunStatus::Succeeded
    );
    let processed: i64 = sqlx::query_scalar("SELECT processed_count FROM batch_job_run")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(processed, 1);
}

#[tokio::test]
async fn an_expired_lease_cannot_open_a_fence() {
    let db = TestDb::new(&[]).await;
    queue::enqueue(
        &db.pool,
        &[run_ttl(1, 5, Duration::from_secs(1))],
        Clock::Db,
    )
    .await
    .unwrap();
    let lease = queue::claim(&db.pool, "w", &spec(Duration::from_secs(1)), 1, Clock::Db)
        .await
        .unwrap()
        .remove(0);
    let later = db_now(&db.pool).await + chrono::Duration::seconds(2);
    assert!(matches!(
        queue::begin_fenced(
            &db.pool,
            &lease.fence(),
            Duration::from_secs(1),
            Clock::At(later)
        )
        .await,
        Err(QueueError::LeaseLost(_))
    ));
}

/// A fenced transaction that stays open most of the lease (a command job's
/// script, a long chunk) must not cost the lease: its FOR KEY SHARE lock
/// lets the heartbeat through (issue 15, item 3).
#[tokio::test]
async fn heartbeat_extends_a_lease_whose_fence_is_open() {
    let db = TestDb::new(&[]).await;
    queue::enqueue(&db.pool, &[run(1, 5), run(2, 5)], Clock::Db)
        .await
        .unwrap();
    let ttl = Duration::from_secs(30);
    let leases = queue::claim(&db.pool, "w", &spec(ttl), 2, Clock::Db)
        .await
        .unwrap();
    let tx = queue::begin_fenced(&db.pool, &leases[0].fence(), ttl, Clock::Db)
        .await
        .unwrap();
    let held: Vec<HeldLease> = leases
        .iter()
        .map(|l| HeldLease {
            fence: l.fence(),
            lease_ttl: ttl,
        })
        .collect();
    let hb = tokio::time::timeout(
        Duration::from_secs(5),
        queue::heartbeat(&db.pool, &held, Clock::Db),
    )
    .await
    .expect("heartbeat must not block")
    .unwrap();
    let mut extended = hb.extended.clone();
    extended.sort();
    let mut both: Vec<JobKey> = leases.iter().map(|l| l.key.clone()).collect();
    both.sort();
    assert_eq!(extended, both, "busy: {:?}", hb.busy);
    assert!(hb.busy.is_empty() && hb.lost.is_empty());
    // And the open fence still commits.
    tx.commit().await.unwrap();
}

/// Every takeover changes the lease token, a unique key, so PostgreSQL makes
/// it wait for an open fence: recovery skips the fenced run until the fence
/// ends, and a held fence's work commits before the run moves on.
#[tokio::test]
async fn a_takeover_waits_for_an_open_fence() {
    let db = TestDb::new(&[]).await;
    let ttl = Duration::from_secs(2);
    queue::enqueue(&db.pool, &[run_ttl(1, 5, ttl)], Clock::Db)
        .await
        .unwrap();
    let lease = queue::claim(&db.pool, "w", &spec(ttl), 1, Clock::Db)
        .await
        .unwrap()
        .remove(0);
    let tx = queue::begin_fenced(&db.pool, &lease.fence(), ttl, Clock::Db)
        .await
        .unwrap();
    let later = db_now(&db.pool).await + chrono::Duration::seconds(10);
    // Expired by the clock given, but fenced: not taken.
    let rec = queue::recover_expired(&db.pool, &[job()], &[], Clock::At(later))
        .await
        .unwrap();
    assert!(rec.is_empty(), "recovered under an open fence: {rec:?}");
    // An UPDATE that changes the token, whatever lock its statement asks
    // for, waits for the fence (the unique key makes it FOR UPDATE).
    let mut other = db.pool.acquire().await.unwrap();
    sqlx::query("SET lock_timeout = '300ms'")
        .execute(&mut *other)
        .await
        .unwrap();
    let e = sqlx::query("UPDATE batch_job_run SET lease_token = nextval('batch_lease_token_seq')")
        .execute(&mut *other)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("lock timeout"), "{e}");
    tx.commit().await.unwrap();
    let rec = queue::recover_expired(&db.pool, &[job()], &[], Clock::At(later))
        .await
        .unwrap();
    assert_eq!(rec.len(), 1);
}

#[tokio::test]
async fn retry_waits_for_backoff_on_the_database_clock() {
    let db = TestDb::new(&[]).await;
    let r = run(1, 3);
    queue::enqueue(&db.pool, std::slice::from_ref(&r), Clock::Db)
        .await
        .unwrap();
    let lease = queue::claim(&db.pool, "w", &spec(Duration::from_secs(30)), 1, Clock::Db)
        .await
        .unwrap()
        .remove(0);
    let before = db_now(&db.pool).await;
    let st = queue::finish(
        &db.pool,
        &lease.fence(),
        &Finish::Retry {
            error: "timeout".into(),
            delay: Duration::from_secs(10),
        },
        Clock::Db,
    )
    .await
    .unwrap();
    assert_eq!(st, RunStatus::Pending);
    let next: DateTime<Utc> = sqlx::query_scalar("SELECT next_run_at FROM batch_job_run")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let delay = (next - before).num_milliseconds();
    assert!(
        (9_000..=11_000).contains(&delay),
        "next_run_at is {delay}ms after now"
    );
    assert!(
        queue::claim(&db.pool, "w", &spec(Duration::from_secs(30)), 1, Clock::Db)
            .await
            .unwrap()
            .is_empty(),
        "not claimable before its backoff"
    );
    let at = next + chrono::Duration::milliseconds(1);
    let again = queue::claim(
        &db.pool,
        "w",
        &spec(Duration::from_secs(30)),
        1,
        Clock::At(at),
    )
    .await
    .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempt, 2);
    let outcomes: Vec<Option<String>> =
        sqlx::query_scalar("SELECT outcome FROM batch_job_attempt ORDER BY attempt")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(outcomes, vec![Some("retried".into()), None]);
}

#[tokio::test]
async fn attempts_exhausted_fail_the_run() {
    let db = TestDb::new(&[]).await;
    let r = run(1, 2);
    queue::enqueue(&db.pool, std::slice::from_ref(&r), Clock::Db)
        .await
        .unwrap();
    let mut at = db_now(&db.pool).await;
    let mut last = RunStatus::Pending;
    for _ in 0..2 {
        let lease = queue::claim(
            &db.pool,
            "w",
            &spec(Duration::from_secs(30)),
            1,
            Clock::At(at),
        )
        .await
        .unwrap()
        .remove(0);
        last = queue::finish(
            &db.pool,
            &lease.fence(),
            &Finish::Retry {
                error: "x".repeat(1500),
                delay: Duration::from_secs(1),
            },
            Clock::At(at),
        )
        .await
        .unwrap();
        at += chrono::Duration::seconds(2);
    }
    assert_eq!(last, RunStatus::Failed);
    assert!(queue::claim(
        &db.pool,
        "w",
        &spec(Duration::from_secs(30)),
        1,
        Clock::At(at)
    )
    .await
    .unwrap()
    .is_empty());
    let (msg, finished): (String, Option<DateTime<Utc>>) =
        sqlx::query_as("SELECT error_message, finished_at FROM batch_job_run")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        msg.chars().count(),
        1000,
        "error truncated to the stored limit"
    );
    assert!(finished.is_some());
    let outcomes: Vec<String> =
        sqlx::query_scalar("SELECT outcome FROM batch_job_attempt ORDER BY attempt")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(outcomes, vec!["retried", "failed"]);
}

#[tokio::test]
async fn fatal_errors_fail_at_once_and_success_clears_nothing_else() {
    let db = TestDb::new(&[]).await;
    queue::enqueue(&db.pool, &[run(1, 5), run(2, 5)], Clock::Db)
        .await
        .unwrap();
    let leases = queue::claim(&db.pool, "w", &spec(Duration::from_secs(30)), 2, Clock::Db)
        .await
        .unwrap();
    let st = queue::finish(
        &db.pool,
        &leases[0].fence(),
        &Finish::Fatal {
            error: "bad data".into(),
        },
        Clock::Db,
    )
    .await
    .unwrap();
    assert_eq!(st, RunStatus::Failed);
    let st = queue::finish(
        &db.pool,
        &leases[1].fence(),
        &Finish::Skipped {
            reason: "holiday".into(),
        },
        Clock::Db,
    )
    .await
    .unwrap();
    assert_eq!(st, RunStatus::Skipped);
    // Finishing twice is refused: the run is no longer RUNNING.
    assert!(matches!(
        queue::finish(&db.pool, &leases[0].fence(), &Finish::Succeeded, Clock::Db).await,
        Err(QueueError::LeaseLost(_))
    ));
}

#[tokio::test]
async fn lease_expiry_returns_the_run_with_a_new_token() {
    let db = TestDb::new(&[]).await;
    let r = run_ttl(1, 2, Duration::from_secs(2));
    queue::enqueue(&db.pool, std::slice::from_ref(&r), Clock::Db)
        .await
        .unwrap();
    let ttl = Duration::from_secs(2);
    let first = queue::claim(&db.pool, "dead", &spec(ttl), 1, Clock::Db)
        .await
        .unwrap()
        .remove(0);
    assert!(
        queue::recover_expired(&db.pool, &[job()], &[], Clock::Db)
            .await
            .unwrap()
            .is_empty(),
        "a live lease is not recovered"
    );
    let t1 = db_now(&db.pool).await + chrono::Duration::seconds(3);
    let rec = queue::recover_expired(&db.pool, &[job()], &[], Clock::At(t1))
        .await
        .unwrap();
    assert_eq!(rec.len(), 1);
    assert_eq!(rec[0].previous_owner.as_deref(), Some("dead"));
    let (status, attempts, token) = status_of(&db.pool, &r.key).await;
    assert_eq!(status, "PENDING");
    assert_eq!(attempts, 1, "the expired lease counted as an attempt");
    assert_ne!(token, Some(first.token), "the token was bumped");
    let outcome: String =
        sqlx::query_scalar("SELECT outcome FROM batch_job_attempt WHERE attempt = 1")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(outcome, "lease_expired");

    // The second (last) attempt also expires: FAILED, not PENDING again.
    let second = queue::claim(&db.pool, "dead2", &spec(ttl), 1, Clock::At(t1))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(second.attempt, 2);
    let t2 = t1 + chrono::Duration::seconds(3);
    let rec = queue::recover_expired(&db.pool, &[job()], &[], Clock::At(t2))
        .await
        .unwrap();
    assert_eq!(rec[0].status, RunStatus::Failed);
}

/// The hold filter, where it lives: a run enqueued under policy `hold` stays
/// RUNNING past its lease for an operator, while a `retry` run of the same
/// job expiring at the same moment is recovered. The policy is the run's,
/// whatever the recovering worker's configuration says.
#[tokio::test]
async fn hold_runs_are_never_recovered_and_retry_runs_are() {
    let db = TestDb::new(&[]).await;
    let ttl = Duration::from_secs(2);
    let hold = run_with(
        1,
        batchonce::JobConfig {
            lease_ttl: ttl,
            on_lease_expiry: batchonce::config::LeaseExpiryPolicy::Hold,
            ..Default::default()
        },
    );
    let retry = run_ttl(2, 3, ttl);
    queue::enqueue(&db.pool, &[hold.clone(), retry.clone()], Clock::Db)
        .await
        .unwrap();
    assert_eq!(
        queue::claim(&db.pool, "w", &spec(ttl), 2, Clock::Db)
            .await
            .unwrap()
            .len(),
        2
    );
    let later = db_now(&db.pool).await + chrono::Duration::hours(1);
    // The worker's file calls every job `retry` (legacy list): irrelevant
    // to runs that store their own policy.
    let rec = queue::recover_expired(&db.pool, &[job()], &[job()], Clock::At(later))
        .await
        .unwrap();
    let keys: Vec<&JobKey> = rec.iter().map(|r| &r.key).collect();
    assert_eq!(keys, vec![&retry.key]);
    assert_eq!(status_of(&db.pool, &hold.key).await.0, "RUNNING");
    assert_eq!(status_of(&db.pool, &retry.key).await.0, "PENDING");
    // A run of a job the worker does not serve is not touched either.
    let rec = queue::recover_expired(
        &db.pool,
        &[JobName::parse("other").unwrap()],
        &[],
        Clock::At(later),
    )
    .await
    .unwrap();
    assert!(rec.is_empty());
}

#[tokio::test]
async fn release_returns_the_run_at_once_and_fences_the_old_token() {
    let db = TestDb::new(&[]).await;
    let r = run(1, 3);
    queue::enqueue(&db.pool, std::slice::from_ref(&r), Clock::Db)
        .await
        .unwrap();
    let ttl = Duration::from_secs(30);
    let lease = queue::claim(&db.pool, "w", &spec(ttl), 1, Clock::Db)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        queue::finish(&db.pool, &lease.fence(), &Finish::Release, Clock::Db)
            .await
            .unwrap(),
        RunStatus::Pending
    );
    assert!(matches!(
        queue::begin_fenced(&db.pool, &lease.fence(), ttl, Clock::Db).await,
        Err(QueueError::LeaseLost(_))
    ));
    let again = queue::claim(&db.pool, "w2", &spec(ttl), 1, Clock::Db)
        .await
        .unwrap();
    assert_eq!(again.len(), 1, "released runs are due at once");
    assert_eq!(again[0].attempt, 2);
    assert_eq!(
        again[0].max_attempts, 4,
        "a release does not use up the budget"
    );
    let fence = Fence {
        key: r.key.clone(),
        token: lease.token,
    };
    assert!(
        queue::finish(&db.pool, &fence, &Finish::Succeeded, Clock::Db)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn status_counts_and_stale_runs() {
    let db = TestDb::new(&[]).await;
    queue::enqueue(&db.pool, &[run(1, 3), run(2, 3)], Clock::Db)
        .await
        .unwrap();
    queue::claim(&db.pool, "w", &spec(Duration::from_secs(30)), 1, Clock::Db)
        .await
        .unwrap();
    let later = db_now(&db.pool).await + chrono::Duration::minutes(30);
    // The runs carry their own stale_after (20 minutes, the default); the
    // fallback given here serves only runs without one.
    let st = queue::status(&db.pool, Clock::At(later)).await.unwrap();
    assert_eq!(st.stale.len(), 1);
    assert_eq!(st.expired_leases, 1);
    assert!(st.oldest_pending_seconds.unwrap() >= 1799.0);
    let total: i64 = st.counts.iter().map(|c| c.runs).sum();
    assert_eq!(total, 2);
}

/// A run's row and its attempt rows, as text: what must not change.
async fn snapshot(pool: &PgPool, key: &JobKey) -> (String, Vec<String>) {
    let run: String = sqlx::query_scalar("SELECT r::text FROM batch_job_run r WHERE job_key = $1")
        .bind(key.as_str())
        .fetch_one(pool)
        .await
        .unwrap();
    let attempts: Vec<String> = sqlx::query_scalar(
        "SELECT a::text FROM batch_job_attempt a WHERE job_key = $1 ORDER BY attempt",
    )
    .bind(key.as_str())
    .fetch_all(pool)
    .await
    .unwrap();
    (run, attempts)
}

/// What one finish left on a run: status, token, budget, lease, message,
/// whether it is finished, and seconds until it is due again.
type RunAfter = (String, Option<i64>, i32, bool, Option<String>, bool, f64);

async fn run_after(pool: &PgPool, key: &JobKey) -> RunAfter {
    sqlx::query_as(
        "SELECT status, lease_token, max_attempts, lease_expires_at IS NOT NULL, error_message, \
         finished_at IS NOT NULL, extract(epoch FROM next_run_at - now())::float8 \
         FROM batch_job_run WHERE job_key = $1",
    )
    .bind(key.as_str())
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The attempt rows of a run: (attempt, token, outcome, message, finished).
async fn attempts_of(
    pool: &PgPool,
    key: &JobKey,
) -> Vec<(i32, i64, Option<String>, Option<String>, bool)> {
    sqlx::query_as(
        "SELECT attempt, lease_token, outcome, error_message, finished_at IS NOT NULL \
         FROM batch_job_attempt WHERE job_key = $1 ORDER BY attempt",
    )
    .bind(key.as_str())
    .fetch_all(pool)
    .await
    .unwrap()
}

/// One batch, six runs, every kind of finish, and a stale token for a run
/// that is RUNNING again under another token: only the token can tell the
/// stale finish apart. Each run gets exactly its own outcome; the stale one
/// is left exactly as it was.
#[tokio::test]
async fn finish_many_ends_each_attempt_by_its_own_token() {
    let db = TestDb::new(&[]).await;
    let runs: Vec<NewRun> = (1..=6).map(|d| run(d, 2)).collect();
    queue::enqueue(&db.pool, &runs, Clock::Db).await.unwrap();
    let ttl = Duration::from_secs(30);
    let mut leases = queue::claim(&db.pool, "w", &spec(ttl), 6, Clock::Db)
        .await
        .unwrap();
    assert_eq!(leases.len(), 6);
    leases.sort_by(|a, b| a.key.as_str().cmp(b.key.as_str()));
    // The fourth run is released and claimed again by another worker before
    // the batch: RUNNING, under a new token.
    let stale = leases[3].fence();
    queue::finish(&db.pool, &stale, &Finish::Release, Clock::Db)
        .await
        .unwrap();
    let taken = queue::claim(&db.pool, "w2", &spec(ttl), 1, Clock::Db)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(taken.key, stale.key);
    assert_ne!(taken.token, stale.token);
    let stale_before = snapshot(&db.pool, &stale.key).await;
    let items = vec![
        (leases[4].fence(), Finish::Succeeded),
        (
            leases[0].fence(),
            Finish::Retry {
                error: "flaky".into(),
                delay: Duration::from_secs(60),
            },
        ),
        (stale.clone(), Finish::Succeeded),
        (
            leases[1].fence(),
            Finish::Skipped {
                reason: "holiday".into(),
            },
        ),
        (
            leases[2].fence(),
            Finish::Fatal {
                error: "bad data".into(),
            },
        ),
        (leases[5].fence(), Finish::Release),
    ];
    let statuses = queue::finish_many(&db.pool, &items, Clock::Db)
        .await
        .unwrap();
    assert_eq!(
        statuses,
        vec![
            Some(RunStatus::Succeeded),
            Some(RunStatus::Pending),
            None,
            Some(RunStatus::Skipped),
            Some(RunStatus::Failed),
            Some(RunStatus::Pending),
        ]
    );
    // The refused one: not a byte of its row or its attempts changed, and
    // its holder can still finish it.
    assert_eq!(
        snapshot(&db.pool, &stale.key).await,
        stale_before,
        "a stale token's finish changed the run it lost"
    );
    // Each of the others: exactly its own finish.
    for (i, want_status, same_token, budget, message, finished, due_in) in [
        (
            0,
            "PENDING",
            true,
            2,
            Some("flaky"),
            false,
            Some(55.0..=61.0),
        ),
        (1, "SKIPPED", true, 2, Some("holiday"), true, None),
        (2, "FAILED", true, 2, Some("bad data"), true, None),
        (4, "SUCCEEDED", true, 2, None, true, None),
        (5, "PENDING", false, 3, None, false, Some(-5.0..=1.0)),
    ] {
        let l = &leases[i];
        let (status, token, max_attempts, leased, error, done, wait) =
            run_after(&db.pool, &l.key).await;
        let what = format!(
            "{} (finish {:?})",
            l.key,
            items.iter().find(|x| x.0.key == l.key)
        );
        assert_eq!(status, want_status, "{what}");
        assert_eq!(
            token == Some(l.token),
            same_token,
            "{what}: token {token:?}"
        );
        assert!(token.is_some(), "{what}: no token");
        assert_eq!(max_attempts, budget, "{what}");
        assert!(!leased, "{what}: the lease was kept");
        assert_eq!(error.as_deref(), message, "{what}");
        assert_eq!(done, finished, "{what}: finished_at");
        if let Some(range) = due_in {
            // Measured on the database clock.
            assert!(range.contains(&wait), "{what}: due in {wait}s");
        }
        let outcome = match i {
            0 => "retried",
            1 => "skipped",
            2 => "fatal",
            4 => "succeeded",
            _ => "released",
        };
        assert_eq!(
            attempts_of(&db.pool, &l.key).await,
            vec![(
                1,
                l.token,
                Some(outcome.to_owned()),
                message.map(str::to_owned),
                true
            )],
            "{what}"
        );
    }
    assert_eq!(
        queue::finish(&db.pool, &taken.fence(), &Finish::Succeeded, Clock::Db)
            .await
            .unwrap(),
        RunStatus::Succeeded
    );
    assert_eq!(
        attempts_of(&db.pool, &stale.key).await,
        vec![
            (1, stale.token, Some("released".to_owned()), None, true),
            (2, taken.token, Some("succeeded".to_owned()), None, true),
        ]
    );
}

/// A batch is one statement and one commit: when it cannot be written
/// whole, none of it is. Here one run's row is held by an open fence, so
/// its release (a new token) cannot take the row within the lock timeout;
/// the other runs of the batch, free to finish, must not finish either.
/// A key twice in a batch is refused before anything is written.
#[tokio::test]
async fn a_finish_batch_is_written_whole_or_not_at_all() {
    let db = TestDb::new(&[]).await;
    let runs: Vec<NewRun> = (1..=4).map(|d| run(d, 3)).collect();
    queue::enqueue(&db.pool, &runs, Clock::Db).await.unwrap();
    let ttl = Duration::from_secs(30);
    let mut leases = queue::claim(&db.pool, "w", &spec(ttl), 4, Clock::Db)
        .await
        .unwrap();
    leases.sort_by(|a, b| a.key.as_str().cmp(b.key.as_str()));
    let mut before = Vec::new();
    for l in &leases {
        before.push(snapshot(&db.pool, &l.key).await);
    }
    let unchanged = |when: &'static str| {
        let pool = db.pool.clone();
        let leases = leases.clone();
        let before = before.clone();
        async move {
            for (l, b) in leases.iter().zip(&before) {
                assert_eq!(
                    &snapshot(&pool, &l.key).await,
                    b,
                    "{}: {when}, yet it changed",
                    l.key
                );
            }
        }
    };
    let batch = vec![
        (leases[0].fence(), Finish::Succeeded),
        (
            leases[1].fence(),
            Finish::Retry {
                error: "flaky".into(),
                delay: Duration::from_secs(1),
            },
        ),
        (leases[2].fence(), Finish::Release),
        (
            leases[3].fence(),
            Finish::Fatal {
                error: "bad data".into(),
            },
        ),
    ];
    // A key twice: refused whole, before the statement.
    let mut twice = batch.clone();
    twice.push((leases[0].fence(), Finish::Release));
    let e = queue::finish_many(&db.pool, &twice, Clock::Db)
        .await
        .expect_err("a batch naming a key twice was written");
    assert!(
        matches!(&e, QueueError::Invalid(m) if m.contains("finished twice")),
        "{e}"
    );
    unchanged("a batch naming a key twice was refused").await;

    // The third run's row under an open fence: the batch times out whole.
    let fence = queue::begin_fenced(&db.pool, &leases[2].fence(), ttl, Clock::Db)
        .await
        .unwrap();
    let e = queue::finish_many_within(
        &db.pool,
        &batch,
        Clock::Db,
        Some(Duration::from_millis(300)),
    )
    .await
    .unwrap_err();
    let code = match &e {
        QueueError::Database(sqlx::Error::Database(d)) => d.code().map(|c| c.into_owned()),
        _ => None,
    };
    assert_eq!(code.as_deref(), Some("55P03"), "not a lock timeout: {e}");
    unchanged("its batch timed out on another run's row").await;

    // Once the fence ends, the same batch is written whole.
    fence.commit().await.unwrap();
    let done = queue::finish_many_within(
        &db.pool,
        &batch,
        Clock::Db,
        Some(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let statuses: Vec<Option<RunStatus>> = done.iter().map(|d| d.map(|d| d.status)).collect();
    assert_eq!(
        statuses,
        vec![
            Some(RunStatus::Succeeded),
            Some(RunStatus::Pending),
            Some(RunStatus::Pending),
            Some(RunStatus::Failed),
        ]
    );
}

/// A run the previous release enqueued carries no context. Whoever freezes
/// it first decides it for good: a later freeze from another configuration
/// changes nothing, and `migrate`'s bulk freeze skips it.
#[tokio::test]
async fn a_legacy_run_gets_its_context_frozen_once() {
    let db = TestDb::new(&[]).await;
    // As the previous release's enqueue wrote it: no context columns.
    sqlx::query(
        "INSERT INTO batch_job_run (job_key, job_name, business_date, max_attempts) \
         VALUES ('test-job:2026-09-15', 'test-job', '2026-09-15', 3), \
                ('test-job:2026-09-16', 'test-job', '2026-09-16', 3)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let legacy = queue::context::legacy_runs(&db.pool, 100).await.unwrap();
    assert_eq!(legacy.len(), 2);
    let lease = queue::claim(&db.pool, "w", &spec(Duration::from_secs(30)), 1, Clock::Db)
        .await
        .unwrap()
        .remove(0);
    assert!(lease.context.is_none());
    let seoul = batchonce::JobConfig {
        timezone: chrono_tz::Asia::Seoul,
        ..Default::default()
    };
    let utc = batchonce::JobConfig::default();
    let ctx = |cfg: &batchonce::JobConfig, key: &JobKey| {
        let period = key.as_str().split_once(':').unwrap().1;
        batchonce::config::context::RunContext::for_key(cfg, lease.business_date, period).unwrap()
    };
    let first = queue::context::freeze_held(&db.pool, &lease.fence(), &ctx(&seoul, &lease.key))
        .await
        .unwrap();
    assert_eq!(first.timezone, chrono_tz::Asia::Seoul);
    assert_eq!(first.period_start.to_rfc3339(), "2026-09-14T15:00:00+00:00");
    // Another process with another file: the stored context stands.
    let again = queue::context::freeze_held(&db.pool, &lease.fence(), &ctx(&utc, &lease.key))
        .await
        .unwrap();
    assert_eq!(again, first);
    let frozen =
        queue::context::freeze_legacy(&db.pool, &[(lease.key.clone(), ctx(&utc, &lease.key))])
            .await
            .unwrap();
    assert_eq!(frozen, 0);
    // A stale token cannot freeze anything.
    let stale = Fence {
        key: lease.key.clone(),
        token: lease.token + 1000,
    };
    assert!(matches!(
        queue::context::freeze_held(&db.pool, &stale, &ctx(&utc, &lease.key)).await,
        Err(QueueError::LeaseLost(_))
    ));
    // The other legacy run is frozen in bulk, once.
    let other = JobKey::parse("test-job:2026-09-16").unwrap();
    let n = queue::context::freeze_legacy(&db.pool, &[(other.clone(), ctx(&seoul, &other))])
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert!(queue::context::legacy_runs(&db.pool, 100)
        .await
        .unwrap()
        .is_empty());
    let (view, _) = queue::show_run(&db.pool, &other).await.unwrap().unwrap();
    assert_eq!(view.context.unwrap().timezone, chrono_tz::Asia::Seoul);
}

/// What a run is enqueued with is what claims, recovery and the views use,
/// whatever the claimer's own specification says.
#[tokio::test]
async fn the_stored_lease_length_wins_over_the_claimers() {
    let db = TestDb::new(&[]).await;
    queue::enqueue(
        &db.pool,
        &[run_ttl(1, 3, Duration::from_secs(7))],
        Clock::Db,
    )
    .await
    .unwrap();
    let lease = queue::claim(&db.pool, "w", &spec(Duration::from_secs(600)), 1, Clock::Db)
        .await
        .unwrap()
        .remove(0);
    let ttl: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM lease_expires_at - started_at)::float8 FROM batch_job_run",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(ttl, 7.0);
    assert_eq!(lease.context.unwrap().lease_ttl, Duration::from_secs(7));
}

/// An attempt that finishes after its lease expired, before anyone took the
/// run over, is accepted but reported, so the worker counts a lost lease.
/// One batch holds an expired lease, a live one and a stale token: each is
/// reported on its own.
#[tokio::test]
async fn a_finish_after_the_lease_expired_is_reported() {
    let db = TestDb::new(&[]).await;
    queue::enqueue(
        &db.pool,
        &[
            run_ttl(1, 3, Duration::from_secs(2)),
            run_ttl(2, 3, Duration::from_secs(60)),
            run_ttl(3, 3, Duration::from_secs(60)),
        ],
        Clock::Db,
    )
    .await
    .unwrap();
    let mut leases = queue::claim(&db.pool, "w", &spec(Duration::from_secs(2)), 3, Clock::Db)
        .await
        .unwrap();
    leases.sort_by(|a, b| a.key.as_str().cmp(b.key.as_str()));
    let later = db_now(&db.pool).await + chrono::Duration::seconds(5);
    let stale = Fence {
        key: leases[2].key.clone(),
        token: leases[2].token ^ 1,
    };
    let done = queue::finish_many_detailed(
        &db.pool,
        &[
            (leases[1].fence(), Finish::Succeeded),
            (stale, Finish::Succeeded),
            (leases[0].fence(), Finish::Succeeded),
        ],
        Clock::At(later),
    )
    .await
    .unwrap();
    assert_eq!(
        done,
        vec![
            Some(queue::Finished {
                status: RunStatus::Succeeded,
                lease_expired: false
            }),
            None,
            Some(queue::Finished {
                status: RunStatus::Succeeded,
                lease_expired: true
            }),
        ]
    );
    let (status, _, token) = status_of(&db.pool, &leases[2].key).await;
    assert_eq!((status.as_str(), token), ("RUNNING", Some(leases[2].token)));
}

/// A state the schema should have refused (or one of a newer release) is a
/// decode error naming it, never a panic or a default: the views decode
/// `status` once, through `RunStatus`'s sqlx `Decode`.
#[tokio::test]
async fn an_unknown_status_from_the_database_is_an_error() {
    let db = TestDb::new(&[]).await;
    for s in RunStatus::ALL {
        let back: RunStatus = sqlx::query_scalar("SELECT $1::varchar(20)")
            .bind(s)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(back, s);
    }
    let err = sqlx::query_scalar::<_, RunStatus>("SELECT 'DONE'::varchar(20)")
        .fetch_one(&db.pool)
        .await
        .unwrap_err();
    assert!(matches!(err, sqlx::Error::ColumnDecode { .. }), "{err:?}");
    assert!(err.to_string().contains("\"DONE\""), "{err}");

    // Through a view: a run row holding a state no release knows.
    let r = run(1, 3);
    queue::enqueue(&db.pool, std::slice::from_ref(&r), Clock::Db)
        .await
        .unwrap();
    for sql in [
        "ALTER TABLE batch_job_run DROP CONSTRAINT batch_job_run_status_check",
        "UPDATE batch_job_run SET status = 'DONE'",
    ] {
        sqlx::query(sql).execute(&db.pool).await.unwrap();
    }
    match queue::show_run(&db.pool, &r.key).await {
        Err(QueueError::Database(e @ sqlx::Error::ColumnDecode { .. })) => {
            assert!(e.to_string().contains("\"DONE\""), "{e}")
        }
        other => panic!("expected a decode error, got {other:?}"),
    }
}
