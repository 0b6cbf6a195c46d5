//! Pausing a job (issue 44, migration 20261210000001) against a real
//! database: a paused job's PENDING runs are claimed by no claim, this
//! release's or the previous ones', nor are runs enqueued, retried or
//! re-run while it stays paused; a RUNNING run finishes; resume makes them
//! claimable again in their order. An enqueue in flight when the pause
//! starts, or waiting while it commits, is held all the same. Every pause
//! and resume is audited and refused when it would change nothing; only
//! the operator and console roles may call them; the lists stay in step in
//! every state, a finish that re-queues nothing never reads the pause
//! table, and the exporter publishes `batchonce_job_paused`.

use std::time::Duration;

use batchonce::queue::pause::{self, PauseError, PauseRequest, PAUSE_SQLSTATE};
use batchonce::queue::{self, ClaimSpec, Fence, Finish, NewRun};
use batchonce::testing::{assert_lists_in_step, wait_until, TestDb};
use batchonce::{Clock, JobKey, JobName};
use chrono::NaiveDate;
use sqlx::PgPool;

fn name(job: &str) -> JobName {
    JobName::parse(job).unwrap()
}

fn run(job: &str, day: u32) -> NewRun {
    let date = NaiveDate::from_ymd_opt(2026, 3, 1).unwrap() + chrono::Days::new(day as u64);
    let cfg = batchonce::JobConfig {
        max_attempts: 3,
        lease_ttl: Duration::from_secs(30),
        ..Default::default()
    };
    NewRun::new(JobKey::daily(&name(job), date), date, &cfg).unwrap()
}

fn spec(jobs: &[&str]) -> Vec<ClaimSpec> {
    jobs.iter()
        .map(|j| ClaimSpec {
            job: name(j),
            lease_ttl: Duration::from_secs(30),
        })
        .collect()
}

fn request(job: &str, operator: &str, reason: &str) -> PauseRequest {
    PauseRequest {
        job: name(job),
        operator: operator.into(),
        reason: reason.into(),
    }
}

/// The keys this release's claim takes now, at most `limit`.
async fn claim(pool: &PgPool, jobs: &[&str], limit: u32) -> Vec<(String, Fence)> {
    queue::claim(pool, "w-now", &spec(jobs), limit, Clock::Db)
        .await
        .unwrap()
        .into_iter()
        .map(|l| (l.key.to_string(), l.fence()))
        .collect()
}

/// The keys the previous releases' claims take now, called as those
/// releases call them (`batchonce_claim2`, and `batchonce_claim` of the
/// releases before partitions), each in a transaction rolled back after.
async fn old_claims(pool: &PgPool, jobs: &[&str]) -> Vec<String> {
    let names: Vec<String> = jobs.iter().map(|j| j.to_string()).collect();
    let ttls: Vec<f64> = vec![30.0; jobs.len()];
    let mut keys = Vec::new();
    for f in ["batchonce_claim2", "batchonce_claim"] {
        let mut tx = pool.begin().await.unwrap();
        let got: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT job_key FROM {f}($1, $2, 100, 'w-old', NULL)"
        ))
        .bind(&names)
        .bind(&ttls)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        tx.rollback().await.unwrap();
        keys.extend(got);
    }
    keys
}

fn keys_of(job: &str, days: &[u32]) -> Vec<String> {
    days.iter().map(|d| run(job, *d).key.to_string()).collect()
}

async fn audit_rows(pool: &PgPool) -> Vec<(String, String, String, String, String, String)> {
    sqlx::query_as(
        "SELECT operator, action, job_key, reason, before_status || '>' || after_status, \
                COALESCE(remote_addr, '-') FROM batch_operator_action ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_paused_jobs_runs_are_claimed_by_no_release_until_resumed() {
    let db = TestDb::new(&[]).await;
    let pool = &db.pool;
    let runs: Vec<NewRun> = (0..4)
        .map(|d| run("settle", d))
        .chain([run("other", 0)])
        .collect();
    queue::enqueue(pool, &runs, Clock::Db).await.unwrap();
    // One run of the job is RUNNING before the pause.
    let held = claim(pool, &["settle"], 1).await;
    assert_eq!(held[0].0, keys_of("settle", &[0])[0]);

    let done = pause::pause(
        pool,
        &request("settle", "alice", "bank file late"),
        Clock::Db,
        None,
    )
    .await
    .unwrap();
    assert_eq!(done.runs_held, 3);
    assert_lists_in_step(pool).await;
    // No claim takes a paused job's runs: the other job's run is claimed.
    assert!(old_claims(pool, &["settle"]).await.is_empty());
    let other = claim(pool, &["settle", "other"], 10).await;
    assert_eq!(
        other.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
        ["other:2026-03-01"]
    );
    // Enqueued while paused: held too.
    queue::enqueue(pool, &[run("settle", 9)], Clock::Db)
        .await
        .unwrap();
    // The RUNNING run finishes; its retry is held as well.
    let status = queue::finish(
        pool,
        &held[0].1,
        &Finish::Retry {
            error: "the bank file is not there".into(),
            delay: Duration::ZERO,
        },
        Clock::Db,
    )
    .await
    .unwrap();
    assert_eq!(status, queue::RunStatus::Pending);
    assert!(claim(pool, &["settle"], 10).await.is_empty());
    assert!(old_claims(pool, &["settle"]).await.is_empty());
    assert_lists_in_step(pool).await;
    // So is a run an operator re-runs while the job is paused (through the
    // list-keeping trigger, as the enqueue).
    sqlx::query(
        "UPDATE batch_job_run SET status = 'FAILED', finished_at = now() WHERE job_key = $1",
    )
    .bind(keys_of("settle", &[3])[0].as_str())
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("UPDATE batch_job_run SET status = 'PENDING', finished_at = NULL, next_run_at = now() WHERE job_key = $1")
        .bind(keys_of("settle", &[3])[0].as_str())
        .execute(pool)
        .await
        .unwrap();
    assert!(claim(pool, &["settle"], 10).await.is_empty());
    // Counted as PENDING all along, but none of them is a due run.
    let st = queue::status(pool, Clock::Db).await.unwrap();
    let pending = st
        .counts
        .iter()
        .find(|c| c.job_name == "settle" && c.status == queue::RunStatus::Pending)
        .map(|c| c.runs);
    assert_eq!(pending, Some(5));
    assert_eq!(st.oldest_pending_seconds, None);
    assert_lists_in_step(pool).await;

    // Resumed: every held run is claimable, in claim order.
    let want: Vec<String> = sqlx::query_scalar(
        "SELECT job_key::text FROM batch_job_run WHERE job_name = 'settle' AND status = 'PENDING' \
         ORDER BY next_run_at, job_key",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let back = pause::resume(
        pool,
        &request("settle", "bob", "file arrived"),
        Clock::Db,
        None,
    )
    .await
    .unwrap();
    assert_eq!(back.runs_released, 5);
    assert_lists_in_step(pool).await;
    let mut got = Vec::new();
    for _ in 0..want.len() {
        got.extend(claim(pool, &["settle"], 1).await.into_iter().map(|c| c.0));
    }
    assert_eq!(got, want);
    assert_lists_in_step(pool).await;
}

#[tokio::test]
async fn pause_and_resume_are_audited_and_refused_when_they_change_nothing() {
    let db = TestDb::new(&[]).await;
    let pool = &db.pool;
    queue::enqueue(pool, &[run("settle", 0)], Clock::Db)
        .await
        .unwrap();
    let req = request("settle", "alice", "bank file late");
    let first = pause::pause(pool, &req, Clock::Db, None).await.unwrap();
    let paused = queue::paused_jobs(pool, Clock::Db).await.unwrap();
    assert_eq!(paused.len(), 1);
    assert_eq!(
        (paused[0].job.as_str(), paused[0].paused_by.as_str()),
        ("settle", "alice")
    );
    assert_eq!(paused[0].reason, "bank file late");
    assert_eq!(paused[0].paused_at, first.paused_at);

    // Twice: one clear error, nothing written.
    let again = pause::pause(pool, &request("settle", "bob", "me too"), Clock::Db, None).await;
    match again {
        Err(PauseError::Conflict(m)) => {
            assert!(m.contains("already paused") && m.contains("alice"), "{m}")
        }
        other => panic!("a second pause: {other:?}"),
    }
    let still = queue::paused_jobs(pool, Clock::Db).await.unwrap();
    assert_eq!(
        (still.len(), &still[0].paused_by, still[0].paused_at),
        (1, &paused[0].paused_by, paused[0].paused_at)
    );
    // The SQLSTATE, as a script calling the function sees it.
    let e = sqlx::query("SELECT * FROM batchonce_operator_pause('settle', 'x', 'bob', NULL)")
        .execute(pool)
        .await
        .unwrap_err();
    assert_eq!(
        e.as_database_error().and_then(|d| d.code()).as_deref(),
        Some(PAUSE_SQLSTATE)
    );

    let back = pause::resume(
        pool,
        &request("settle", "bob", "file arrived"),
        Clock::Db,
        None,
    )
    .await
    .unwrap();
    assert_eq!(back.paused_at, first.paused_at);
    match pause::resume(pool, &request("settle", "bob", "again"), Clock::Db, None).await {
        Err(PauseError::Conflict(m)) => assert!(m.contains("is not paused"), "{m}"),
        other => panic!("a second resume: {other:?}"),
    }
    // Bad input: one error each, nothing written.
    for (job, reason, why) in [
        ("nobody", "r", "unknown job"),
        ("settle", "   ", "a reason"),
    ] {
        match pause::pause(pool, &request(job, "alice", reason), Clock::Db, None).await {
            Err(PauseError::Invalid(m)) => assert!(m.contains(why), "{m}"),
            other => panic!("pause of {job} with {reason:?}: {other:?}"),
        }
    }
    assert!(queue::paused_jobs(pool, Clock::Db)
        .await
        .unwrap()
        .is_empty());
    // The lists' check takes the far date only for a paused job's entries.
    assert_lists_in_step(pool).await;
    sqlx::query("UPDATE batch_job_due SET next_run_at = '9999-12-31T00:00:00Z'")
        .execute(pool)
        .await
        .unwrap();
    let p = pool.clone();
    let check = tokio::spawn(async move { assert_lists_in_step(&p).await }).await;
    assert!(
        check.is_err_and(|e| e.is_panic()),
        "a held entry of an active job passed"
    );
    sqlx::query("UPDATE batch_job_due d SET next_run_at = r.next_run_at FROM batch_job_run r WHERE r.job_key = d.job_key")
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(
        audit_rows(pool).await,
        [
            (
                "alice".into(),
                "pause".into(),
                "settle:*".into(),
                "bank file late".into(),
                "ACTIVE>PAUSED".into(),
                "-".into()
            ),
            (
                "bob".into(),
                "resume".into(),
                "settle:*".into(),
                "file arrived".into(),
                "PAUSED>ACTIVE".into(),
                "-".into()
            ),
        ]
    );
    assert_lists_in_step(pool).await;
}

/// The lock on the due list: an enqueue whose transaction is open when the
/// pause starts commits first and is held; one that starts while the pause
/// is open waits for it and is held. Neither leaves a claimable entry. The
/// first pause also enables the holding triggers, which the waiting enqueue
/// must then see; for the others another job is paused throughout, so the
/// triggers are already on and the pause's own lock is all that orders them.
#[tokio::test]
async fn an_enqueue_racing_a_pause_is_held_either_way() {
    let db = TestDb::new(&[]).await;
    let pool = &db.pool;
    queue::enqueue(pool, &[run("settle", 0), run("other", 0)], Clock::Db)
        .await
        .unwrap();
    let waiting_on_the_due_list = |pool: PgPool| async move {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT FROM pg_locks WHERE relation = 'batch_job_due'::regclass \
             AND NOT granted)",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };

    // No job paused yet: a pause open while an enqueue starts. The enqueue
    // waits, then meets the triggers the pause enabled.
    let mut first = pool.begin().await.unwrap();
    sqlx::query("SELECT * FROM batchonce_operator_pause('settle', 'hold', 'bob', NULL)")
        .execute(&mut *first)
        .await
        .unwrap();
    let p = pool.clone();
    let enqueuing = tokio::spawn(async move {
        queue::enqueue(&p, &[run("settle", 7)], Clock::Db)
            .await
            .map(|r| r.enqueued.len())
    });
    wait_until(
        "the enqueue to wait for the due list",
        Duration::from_secs(10),
        || waiting_on_the_due_list(pool.clone()),
    )
    .await;
    first.commit().await.unwrap();
    assert_eq!(enqueuing.await.unwrap().unwrap(), 1);
    assert!(claim(pool, &["settle"], 10).await.is_empty());
    assert_lists_in_step(pool).await;
    pause::resume(pool, &request("settle", "bob", "go"), Clock::Db, None)
        .await
        .unwrap();

    pause::pause(
        pool,
        &request("other", "alice", "hold it too"),
        Clock::Db,
        None,
    )
    .await
    .unwrap();

    // An enqueue in flight: its transaction has listed a run, not committed.
    let mut enqueue = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO batch_job_run (job_key, job_name, business_date, max_attempts) \
         VALUES ('settle:2026-03-05', 'settle', '2026-03-05', 3)",
    )
    .execute(&mut *enqueue)
    .await
    .unwrap();
    let p = pool.clone();
    let pausing = tokio::spawn(async move {
        pause::pause(&p, &request("settle", "alice", "hold"), Clock::Db, None).await
    });
    wait_until(
        "the pause to wait for the due list",
        Duration::from_secs(10),
        || waiting_on_the_due_list(pool.clone()),
    )
    .await;
    enqueue.commit().await.unwrap();
    let done = pausing.await.unwrap().unwrap();
    assert_eq!(done.runs_held, 3, "the committed enqueue's run is held too");
    assert!(claim(pool, &["settle"], 10).await.is_empty());
    assert_lists_in_step(pool).await;

    // A pause open while an enqueue starts: the enqueue waits, then is held.
    let mut second = pool.begin().await.unwrap();
    sqlx::query("SELECT * FROM batchonce_operator_resume('settle', 'go', 'bob', NULL)")
        .execute(&mut *second)
        .await
        .unwrap();
    second.commit().await.unwrap();
    let mut open_pause = pool.begin().await.unwrap();
    sqlx::query("SELECT * FROM batchonce_operator_pause('settle', 'hold again', 'bob', NULL)")
        .execute(&mut *open_pause)
        .await
        .unwrap();
    let p = pool.clone();
    let enqueuing = tokio::spawn(async move {
        queue::enqueue(&p, &[run("settle", 6)], Clock::Db)
            .await
            .map(|r| r.enqueued.len())
    });
    wait_until(
        "the enqueue to wait for the due list",
        Duration::from_secs(10),
        || waiting_on_the_due_list(pool.clone()),
    )
    .await;
    open_pause.commit().await.unwrap();
    assert_eq!(enqueuing.await.unwrap().unwrap(), 1);
    assert!(claim(pool, &["settle"], 10).await.is_empty());
    assert!(old_claims(pool, &["settle"]).await.is_empty());
    assert_lists_in_step(pool).await;
}

/// Each role of `batchonce roles` calls pause and resume as its login
/// would: the operator and the console may, no other.
#[tokio::test]
async fn only_the_operator_and_console_roles_may_pause_or_resume() {
    let db = TestDb::new(&[]).await;
    let pool = &db.pool;
    queue::enqueue(pool, &[run("settle", 0)], Clock::Db)
        .await
        .unwrap();
    let prefix = format!("bo_p{:08x}", rand::random::<u32>());
    batchonce::ops::roles::apply(pool, &prefix, &Default::default())
        .await
        .unwrap();
    let as_role = |part: &'static str, sql: &'static str| {
        let (pool, role) = (pool.clone(), format!("{prefix}_{part}"));
        async move {
            let mut tx = pool.begin().await.unwrap();
            sqlx::query(&format!("SET LOCAL ROLE {role}"))
                .execute(&mut *tx)
                .await
                .unwrap();
            let r = sqlx::query(sql).execute(&mut *tx).await;
            tx.commit().await.unwrap();
            r.err().and_then(|e| {
                e.as_database_error()
                    .and_then(|d| d.code())
                    .map(|c| c.into_owned())
            })
        }
    };
    let pause_sql = "SELECT * FROM batchonce_operator_pause('settle', 'hold', 'mallory', NULL)";
    for part in ["worker", "producer", "readonly", "program"] {
        assert_eq!(
            as_role(part, pause_sql).await.as_deref(),
            Some("42501"),
            "{part} may not pause"
        );
    }
    assert!(queue::paused_jobs(pool, Clock::Db)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(as_role("operator", pause_sql).await, None);
    let resume_sql = "SELECT * FROM batchonce_operator_resume('settle', 'go', 'kim', NULL)";
    assert_eq!(
        as_role("worker", resume_sql).await.as_deref(),
        Some("42501")
    );
    assert_eq!(as_role("console", resume_sql).await, None);
    let actions: Vec<String> =
        sqlx::query_scalar("SELECT action::text FROM batch_operator_action ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(actions, ["pause", "resume"]);
    // Only the owner writes the pause table.
    assert_eq!(
        as_role(
            "operator",
            "INSERT INTO batch_job_pause VALUES ('settle', now(), 'x', 'y')"
        )
        .await
        .as_deref(),
        Some("42501")
    );
}

/// The relations one transaction holds a lock on (in any mode), by name,
/// but the catalog's: PostgreSQL's fast path holds 16 of them.
async fn locked(tx: &mut sqlx::PgConnection) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT DISTINCT c.relname::text FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
         WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' \
           AND c.relnamespace <> 'pg_catalog'::regnamespace ORDER BY 1",
    )
    .fetch_all(tx)
    .await
    .unwrap()
}

/// A finish that re-queues nothing never reads the pause table, even while
/// a job is paused, so it locks no more relations than before; a retry
/// re-queued while a job is paused does read it.
#[tokio::test]
async fn a_finish_that_requeues_nothing_never_reads_the_pause_table() {
    let db = TestDb::new(&[]).await;
    let pool = &db.pool;
    let runs = [run("other", 0), run("other", 1), run("settle", 0)];
    queue::enqueue(pool, &runs, Clock::Db).await.unwrap();
    pause::pause(pool, &request("settle", "alice", "hold"), Clock::Db, None)
        .await
        .unwrap();
    let held = claim(pool, &["other"], 2).await;
    for (fence, kind, reads) in [
        (&held[0].1, "succeeded", false),
        (&held[1].1, "retry", true),
    ] {
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("SELECT * FROM batchonce_finish($1, $2, $3, $4, $5, NULL)")
            .bind(vec![fence.key.to_string()])
            .bind(vec![fence.token])
            .bind(vec![kind])
            .bind(vec!["x"])
            .bind(vec![0.0f64])
            .execute(&mut *tx)
            .await
            .unwrap();
        let rels = locked(&mut tx).await;
        tx.rollback().await.unwrap();
        assert_eq!(
            rels.iter().any(|r| r.starts_with("batch_job_pause")),
            reads,
            "{kind}: {rels:?}"
        );
        assert!(
            rels.len() <= 16,
            "{kind} locks {} relations: {rels:?}",
            rels.len()
        );
    }
}

#[tokio::test]
async fn the_exporter_publishes_which_jobs_are_paused_and_for_how_long() {
    let db = TestDb::new(&[]).await;
    let pool = &db.pool;
    queue::enqueue(pool, &[run("settle", 0), run("other", 0)], Clock::Db)
        .await
        .unwrap();
    pause::pause(pool, &request("settle", "alice", "hold"), Clock::Db, None)
        .await
        .unwrap();
    let handle = batchonce::telemetry::install().expect("the recorder");
    batchonce::ops::exporter::publish_once(pool, &[name("declared-only")])
        .await
        .unwrap();
    let text = handle.render();
    assert!(
        text.contains("batchonce_job_paused{job=\"settle\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("batchonce_job_paused{job=\"other\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("batchonce_job_paused{job=\"declared-only\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("batchonce_job_paused_seconds{job=\"settle\"}"),
        "{text}"
    );
    assert!(
        text.contains("batchonce_job_paused_seconds{job=\"other\"} 0"),
        "{text}"
    );
    let gauges = queue::gauges(pool, &[], Clock::Db).await.unwrap();
    let settle = gauges.iter().find(|(j, _)| j.as_str() == "settle").unwrap();
    assert!(settle.1.paused_seconds.is_some_and(|s| s >= 0.0));
    assert_eq!(settle.1.oldest_pending_seconds, 0.0);
}
