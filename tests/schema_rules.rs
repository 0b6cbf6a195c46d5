//! The schema's own rules against real PostgreSQL, each test in its own
//! database: every rule on what a run is refuses a bad row by the rule's
//! name, on insert and on any update that sets what it reads; the claim and
//! the finish do not check those rules again; an attempt always names a run
//! that exists, and a run with attempts is never deleted nor re-keyed.

use batchonce::queue::{self, NewRun};
use batchonce::testing::TestDb;
use batchonce::{Clock, JobKey, JobName};
use chrono::NaiveDate;
use sqlx::PgPool;

fn run(day: u32) -> NewRun {
    let job = JobName::parse("test-job").unwrap();
    let date = NaiveDate::from_ymd_opt(2026, 1, 1).unwrap() + chrono::Days::new(day as u64);
    NewRun::new(
        JobKey::daily(&job, date),
        date,
        &batchonce::JobConfig::default(),
    )
    .unwrap()
}

/// The constraint a statement was refused by, or a panic if it was not.
async fn refused_by(pool: &PgPool, sql: &str) -> String {
    let err = sqlx::query(sql).execute(pool).await.expect_err(sql);
    let db_err = err.as_database_error().expect("a database error");
    db_err
        .constraint()
        .unwrap_or_else(|| panic!("{sql}: no constraint named in {db_err}"))
        .to_owned()
}

#[tokio::test]
async fn schema_checks_reject_bad_rows_by_name() {
    let db = TestDb::new(&[]).await;
    let insert = "INSERT INTO batch_job_run (job_key, job_name, business_date, max_attempts";
    let cases = [
        (format!("{insert}, status) VALUES ('test-job:2026-01-01', 'test-job', '2026-01-01', 3, 'DONE')"),
         "batch_job_run_status_check"),
        (format!("{insert}) VALUES ('Test Job:2026-01-01', 'test-job', '2026-01-01', 3)"),
         "batch_job_run_job_key_check"),
        (format!("{insert}) VALUES ('other:2026-01-01', 'test-job', '2026-01-01', 3)"),
         "batch_job_run_job_key_check"),
        (format!("{insert}) VALUES ('Test-Job:2026-01-01', 'Test-Job', '2026-01-01', 3)"),
         "batch_job_run_job_name_check"),
        (format!("{insert}, error_message) VALUES ('test-job:2026-01-01', 'test-job', '2026-01-01', 3, repeat('x', 1001))"),
         "batch_job_run_error_message_check"),
        (format!("{insert}, status) VALUES ('test-job:2026-01-01', 'test-job', '2026-01-01', 3, 'RUNNING')"),
         "batch_job_run_lease_check"),
        (format!("{insert}, lease_expires_at) VALUES ('test-job:2026-01-01', 'test-job', '2026-01-01', 3, now())"),
         "batch_job_run_lease_expiry_check"),
        (format!("{insert}, payload) VALUES ('test-job:2026-01-01', 'test-job', '2026-01-01', 3, \
                  jsonb_build_object('x', repeat('y', 70000)))"),
         "batch_job_run_payload_check"),
        (format!("{insert}, timezone) VALUES ('test-job:2026-01-01', 'test-job', '2026-01-01', 3, 'UTC')"),
         "batch_job_run_context_check"),
        (format!("{insert}, partition_no) VALUES ('test-job:2026-01-01', 'test-job', '2026-01-01', 3, 1)"),
         "batch_job_run_partition_check"),
    ];
    for (sql, constraint) in cases {
        assert_eq!(refused_by(&db.pool, &sql).await, constraint, "{sql}");
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM batch_job_run")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);
}

/// The rules that are checked on insert are checked again by any update that
/// sets a column they read, whoever sends it, and the row is left as it was.
#[tokio::test]
async fn an_update_that_sets_what_a_rule_reads_is_checked() {
    let db = TestDb::new(&[]).await;
    queue::enqueue(&db.pool, &[run(0)], Clock::Db)
        .await
        .unwrap();
    let key = "test-job:2026-01-01";
    let cases = [
        ("job_name = 'Test-Job'", "batch_job_run_job_name_check"),
        (
            "job_key = 'other:2026-01-01'",
            "batch_job_run_job_key_check",
        ),
        (
            "job_key = 'test-job:2026-01-01@north'",
            "batch_job_run_scope_check",
        ),
        ("scope = 'north'", "batch_job_run_scope_check"),
        (
            "payload = jsonb_build_object('x', repeat('y', 70000))",
            "batch_job_run_payload_check",
        ),
        ("partition_count = 1", "batch_job_run_partition_check"),
        ("partition_no = 1", "batch_job_run_partition_check"),
        ("chunk_size = 0", "batch_job_run_context_check"),
        ("timezone = NULL", "batch_job_run_context_check"),
        ("period_end = period_start", "batch_job_run_context_check"),
        ("backoff_max = interval '0'", "batch_job_run_context_check"),
        ("attempt_budget = 1001", "batch_job_run_context_check"),
        ("max_item_failures = -1", "batch_job_run_context_check"),
        ("on_lease_expiry = 'never'", "batch_job_run_context_check"),
    ];
    let before: String = sqlx::query_scalar("SELECT row_to_json(r)::text FROM batch_job_run r")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    for (set, constraint) in cases {
        let sql = format!("UPDATE batch_job_run SET {set} WHERE job_key = '{key}'");
        assert_eq!(refused_by(&db.pool, &sql).await, constraint, "{sql}");
    }
    let after: String = sqlx::query_scalar("SELECT row_to_json(r)::text FROM batch_job_run r")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(before, after, "a refused update changes nothing");
}

/// The claim and the finish set only the state, the lease and the counters,
/// so the fixed rules are not evaluated again for them: that is the point of
/// keeping those rules in a trigger with a column list, and a column added
/// to its list that the claim or the finish sets would cost every run again.
/// A claim's attempts are checked against their runs in one call.
#[tokio::test]
async fn a_claim_and_a_finish_do_not_check_the_fixed_rules_again() {
    let db = TestDb::new(&[]).await;
    let runs: Vec<NewRun> = (0..5).map(run).collect();
    queue::enqueue(&db.pool, &runs, Clock::Db).await.unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    // Counting calls within one transaction needs function tracking on for
    // it (a superuser setting, as the tests' own cluster gives).
    sqlx::query("SET LOCAL track_functions = 'pl'")
        .execute(&mut *tx)
        .await
        .expect(
            "track_functions needs a superuser: the tests' own cluster, or DATABASE_URL as one",
        );
    // The counts are the backend's since it last reported them, which may
    // include the enqueue's on the same connection: only differences count.
    let calls = "SELECT coalesce(pg_stat_get_xact_function_calls('batch_job_run_validate'::regproc), 0), \
                        coalesce(pg_stat_get_xact_function_calls('batch_job_attempt_run_exists'::regproc), 0)";
    let (validate0, exists0): (i64, i64) = sqlx::query_as(calls).fetch_one(&mut *tx).await.unwrap();
    let claimed: Vec<(String, i64)> = sqlx::query_as(
        "SELECT job_key, lease_token FROM batchonce_claim3(ARRAY['test-job'], ARRAY[30::float8], \
         10, 'w1', now(), false)",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    assert_eq!(claimed.len(), 5);
    let (keys, tokens): (Vec<String>, Vec<i64>) = claimed.into_iter().unzip();
    let finished: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM batchonce_finish($1, $2, array_fill('succeeded'::text, ARRAY[5]), \
         array_fill(NULL::text, ARRAY[5]), array_fill(0::float8, ARRAY[5]), now())",
    )
    .bind(&keys)
    .bind(&tokens)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(finished, 5);
    let (validate, exists): (i64, i64) = sqlx::query_as(calls).fetch_one(&mut *tx).await.unwrap();
    assert_eq!(
        validate - validate0,
        0,
        "the claim and the finish re-checked the fixed rules"
    );
    assert_eq!(
        exists - exists0,
        1,
        "the claim's five attempts are checked in one call"
    );
    // An update that sets a checked column is checked, once per row.
    sqlx::query("UPDATE batch_job_run SET payload = '{\"a\": 1}' WHERE job_key = $1")
        .bind(&keys[0])
        .execute(&mut *tx)
        .await
        .unwrap();
    let (validate2, _): (i64, i64) = sqlx::query_as(calls).fetch_one(&mut *tx).await.unwrap();
    assert_eq!(validate2 - validate, 1);
    tx.rollback().await.unwrap();
}

const ATTEMPT: &str =
    "INSERT INTO batch_job_attempt (job_key, attempt, lease_token, worker_id, started_at)";

#[tokio::test]
async fn an_attempt_names_a_run_that_exists() {
    let db = TestDb::new(&[]).await;
    queue::enqueue(&db.pool, &[run(0), run(1)], Clock::Db)
        .await
        .unwrap();
    let fkey = "batch_job_attempt_run_fkey";
    // One attempt of an unknown run refuses its whole statement.
    let sql = format!(
        "{ATTEMPT} VALUES ('test-job:2026-01-01', 1, 1, 'w', now()), \
                          ('test-job:2026-02-01', 1, 2, 'w', now())"
    );
    assert_eq!(refused_by(&db.pool, &sql).await, fkey);
    let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM batch_job_attempt")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(attempts, 0, "nothing of a refused statement is kept");
    sqlx::query(&format!(
        "{ATTEMPT} VALUES ('test-job:2026-01-01', 1, 1, 'w', now())"
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    // An attempt does not move to a run that does not exist; it may move to
    // one that does (no engine statement moves one at all).
    let moved = "UPDATE batch_job_attempt SET job_key = 'test-job:2026-02-01'";
    assert_eq!(refused_by(&db.pool, moved).await, fkey);
    // A run with attempts is neither deleted nor re-keyed; one without may
    // be deleted (as `preflight` deletes its scratch runs).
    let delete = "DELETE FROM batch_job_run WHERE job_key = 'test-job:2026-01-01'";
    assert_eq!(refused_by(&db.pool, delete).await, fkey);
    let rekey =
        "UPDATE batch_job_run SET job_key = 'test-job:2026-03-01', business_date = '2026-03-01' \
                 WHERE job_key = 'test-job:2026-01-01'";
    assert_eq!(refused_by(&db.pool, rekey).await, fkey);
    // Setting the key to what it was changes nothing, as behind the key.
    sqlx::query("UPDATE batch_job_run SET job_key = job_key WHERE job_key = 'test-job:2026-01-01'")
        .execute(&db.pool)
        .await
        .unwrap();
    let gone = sqlx::query("DELETE FROM batch_job_run WHERE job_key = 'test-job:2026-01-02'")
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(gone.rows_affected(), 1);
}

/// As behind a foreign key: a run whose attempt is being inserted is locked
/// until that transaction ends, so a delete waits and then finds the attempt.
#[tokio::test]
async fn an_attempt_being_inserted_holds_its_run() {
    let db = TestDb::new(&[]).await;
    queue::enqueue(&db.pool, &[run(0)], Clock::Db)
        .await
        .unwrap();
    let mut inserting = db.pool.begin().await.unwrap();
    sqlx::query(&format!(
        "{ATTEMPT} VALUES ('test-job:2026-01-01', 1, 1, 'w', now())"
    ))
    .execute(&mut *inserting)
    .await
    .unwrap();
    let mut deleting = db.pool.begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '300ms'")
        .execute(&mut *deleting)
        .await
        .unwrap();
    let err = sqlx::query("DELETE FROM batch_job_run WHERE job_key = 'test-job:2026-01-01'")
        .execute(&mut *deleting)
        .await
        .expect_err("the run is locked by the transaction inserting its attempt");
    assert_eq!(
        err.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("55P03"),
        "{err}"
    );
    deleting.rollback().await.unwrap();
    inserting.commit().await.unwrap();
    let delete = "DELETE FROM batch_job_run WHERE job_key = 'test-job:2026-01-01'";
    assert_eq!(
        refused_by(&db.pool, delete).await,
        "batch_job_attempt_run_fkey"
    );
}

/// A function that runs with its owner's rights resolves names in the
/// engine's schema only, and PUBLIC may not call it: a migration that
/// replaces one (CREATE OR REPLACE resets its settings) must pin its search
/// path again.
#[tokio::test]
async fn every_owner_rights_function_pins_its_search_path() {
    let db = TestDb::new(&[]).await;
    let unpinned: Vec<(String, Option<Vec<String>>, bool)> = sqlx::query_as(
        "SELECT p.oid::regprocedure::text, p.proconfig,
                has_function_privilege('public', p.oid, 'EXECUTE')
         FROM pg_proc p
         WHERE p.pronamespace = current_schema()::regnamespace
           AND p.prosecdef
           AND (NOT coalesce(p.proconfig, '{}') @> ARRAY[
                    format('search_path=%s, pg_temp', quote_ident(current_schema()))]
                OR has_function_privilege('public', p.oid, 'EXECUTE'))
         ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        unpinned.is_empty(),
        "owner-rights functions not pinned or open to PUBLIC: {unpinned:?}"
    );
    let count: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_proc
         WHERE pronamespace = current_schema()::regnamespace AND prosecdef",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    // The claim, the finish, recovery and the other engine steps.
    assert!(count >= 5, "only {count} owner-rights functions found");
}

/// A database that applied the released text of a migration reworded since
/// (in comments only) migrates on: `migrate` records the new checksum rather
/// than sqlx refusing the migration as edited. A checksum that is neither
/// the released nor the present one is still refused.
#[tokio::test]
async fn a_reworded_migration_is_accepted_and_an_edited_one_refused() {
    let db = TestDb::new(&[]).await;
    let version = 20260901000001_i64;
    let present = batchonce::db::ENGINE_MIGRATIONS
        .iter()
        .find(|m| m.version == version)
        .unwrap()
        .checksum
        .to_vec();
    let recorded = |pool: PgPool| async move {
        sqlx::query_scalar::<_, Vec<u8>>("SELECT checksum FROM _sqlx_migrations WHERE version = $1")
            .bind(version)
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    // As a database migrated by 0.1.0 recorded it.
    sqlx::query(
        "UPDATE _sqlx_migrations SET checksum = decode('9c02367fe981dd5768d7b1e1edb97c56390a9fe35170e0f9ce864fa3c70cb3d0098d84b103aed702e65b75ab7a5b42b3', 'hex') WHERE version = $1",
    )
    .bind(version)
    .execute(&db.pool)
    .await
    .unwrap();
    batchonce::db::migrate(&db.pool, &[]).await.unwrap();
    assert_eq!(recorded(db.pool.clone()).await, present);

    sqlx::query("UPDATE _sqlx_migrations SET checksum = decode('00', 'hex') WHERE version = $1")
        .bind(version)
        .execute(&db.pool)
        .await
        .unwrap();
    let err = batchonce::db::migrate(&db.pool, &[]).await.unwrap_err();
    assert!(err.to_string().contains("modified"), "{err}");
    assert_eq!(recorded(db.pool.clone()).await, vec![0u8]);
}

/// A database whose due and running lists drifted from the runs before the
/// row trigger kept them (20261207000001 filled them while the previous
/// release's workers still wrote) is put in step by 20261211000001: a
/// PENDING run missing from the due list, a RUNNING run missing from the
/// running list and an entry for a run in neither state.
#[tokio::test]
async fn the_resync_migration_puts_drifted_lists_in_step() {
    let db = TestDb::empty().await;
    let before = batchonce::db::combined(&[]);
    let before = sqlx::migrate::Migrator {
        migrations: std::borrow::Cow::Owned(
            before
                .iter()
                .filter(|m| m.version < 20261211000001)
                .cloned()
                .collect(),
        ),
        ..sqlx::migrate::Migrator::DEFAULT
    };
    before.run(&db.pool).await.unwrap();
    let runs: Vec<NewRun> = (0..3).map(run).collect();
    queue::enqueue(&db.pool, &runs, Clock::Db).await.unwrap();
    let claimed: String = sqlx::query_scalar(
        "SELECT job_key FROM batchonce_claim3(ARRAY['test-job'], ARRAY[30::float8], \
         1, 'w1', now(), false)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let pending = runs
        .iter()
        .map(|r| r.key.to_string())
        .find(|k| *k != claimed)
        .unwrap();
    // The drift: what the row trigger never saw.
    for sql in [
        format!("DELETE FROM batch_job_due WHERE job_key = '{pending}'"),
        "DELETE FROM batch_job_running".to_owned(),
        format!("INSERT INTO batch_job_due VALUES ('{claimed}', 'test-job', now(), false)"),
    ] {
        sqlx::query(&sql).execute(&db.pool).await.unwrap();
    }
    batchonce::db::migrate(&db.pool, &[]).await.unwrap();
    batchonce::testing::assert_lists_in_step(&db.pool).await;
}
