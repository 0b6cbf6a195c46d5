//! The engine's statements read what they touch, whatever the planner's
//! statistics say (migration 20261207000002), against real PostgreSQL,
//! each test in its own database: the claim's pick reads the head of the
//! due list's index, and the claim, the finish and lease-expiry recovery
//! read every table by key. The statistics are the ones that misled the
//! planner before: tables analyzed while empty and a backlog since, or
//! analyzed as they are while still small. Each count of rows read is taken
//! in a transaction on a connection of its own, under custom and generic
//! plans (`plan_cache_mode`): PostgreSQL 15's per-transaction counters also
//! hold a previous transaction's counts until the session reports them.

use std::time::Duration;

use batchonce::queue::{self, ClaimSpec, Fence, Finish, NewRun};
use batchonce::testing::TestDb;
use batchonce::{Clock, JobKey, JobName};
use chrono::{DateTime, NaiveDate, Utc};
use sqlx::{Connection, PgPool};

fn job() -> JobName {
    JobName::parse("test-job").unwrap()
}

fn run(day: u32) -> NewRun {
    let date = NaiveDate::from_ymd_opt(2026, 1, 1).unwrap() + chrono::Days::new(day as u64);
    NewRun::new(
        JobKey::daily(&job(), date),
        date,
        &batchonce::JobConfig::default(),
    )
    .unwrap()
}

fn spec() -> Vec<ClaimSpec> {
    vec![ClaimSpec {
        job: job(),
        lease_ttl: Duration::from_secs(30),
    }]
}

async fn db_now(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A connection of its own whose statements are planned under `mode` (a
/// value of `plan_cache_mode`).
async fn planned(db: &TestDb, mode: &str) -> sqlx::PgConnection {
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query(&format!("SET plan_cache_mode = {mode}"))
        .execute(&mut conn)
        .await
        .unwrap();
    let set: String = sqlx::query_scalar("SELECT current_setting('plan_cache_mode')")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(set, mode);
    conn
}

/// A backlog that statistics do not know about is claimed from the head of
/// the due list's index, not by reading and sorting every due run on each
/// claim. The statistics here are a quiet system's: the due list was last
/// analyzed while it was empty, and then an outage's worth of runs arrives.
#[tokio::test]
async fn a_backlog_unknown_to_statistics_is_claimed_from_the_head() {
    let db = TestDb::new(&[]).await;
    // No statistics are gathered during the test but the ones taken below.
    for table in ["batch_job_run", "batch_job_due"] {
        sqlx::query(&format!(
            "ALTER TABLE {table} SET (autovacuum_enabled = false)"
        ))
        .execute(&db.pool)
        .await
        .unwrap();
    }
    // History (finished runs, here recorded as skipped), analyzed while
    // nothing was due, then the backlog.
    let history: Vec<NewRun> = (0..2000)
        .map(|d| NewRun {
            skip_reason: Some("history".into()),
            ..run(d)
        })
        .collect();
    queue::enqueue(&db.pool, &history, Clock::Db).await.unwrap();
    sqlx::query("ANALYZE batch_job_run, batch_job_due")
        .execute(&db.pool)
        .await
        .unwrap();
    let backlog: Vec<NewRun> = (2000..7000).map(run).collect();
    queue::enqueue(&db.pool, &backlog, Clock::Db).await.unwrap();

    for mode in ["force_custom_plan", "force_generic_plan"] {
        // The plain pick, planned under these statistics, reads and sorts
        // the whole backlog (5,000 entries) for a custom plan. If it did
        // not, these statistics would not be the ones that hurt, and the
        // claim's check below would say nothing.
        let mut conn = planned(&db, mode).await;
        let mut tx = conn.begin().await.unwrap();
        let plain: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT job_key FROM batch_job_due \
             WHERE next_run_at <= $1 AND job_name = ANY($2) \
             ORDER BY next_run_at, job_key LIMIT $3 FOR UPDATE SKIP LOCKED) p",
        )
        .bind(db_now(&db.pool).await)
        .bind(vec!["test-job"])
        .bind(10i64)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        assert_eq!(plain, 10);
        let plain_reads = table_reads(&mut tx, "batch_job_due").await;
        // The generic plan happens to take the index here; the custom plan
        // (a session's first five executions, and any after that cost less
        // by the statistics) is the one misled.
        if mode == "force_custom_plan" {
            assert!(
                plain_reads >= 5000,
                "the plain pick read only {plain_reads} entries; the statistics do not mislead it"
            );
        }
        tx.rollback().await.unwrap();

        // The claim (its pick, its delete of the entries it took) reads
        // about as many entries as it takes.
        let mut conn = planned(&db, mode).await;
        let mut tx = conn.begin().await.unwrap();
        let picked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM batchonce_claim3('{test-job}', '{30}', 10, 'w', NULL, false)",
        )
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        assert_eq!(picked, 10);
        let reads = table_reads(&mut tx, "batch_job_due").await;
        assert!(reads <= 30, "{mode}: the claim read {reads} due entries");
        // And the runs it updated, their attempts' check and the running
        // list, by key: not the 7,000 runs of the table.
        assert_reads_within(&mut tx, 100, &format!("{mode}: the claim")).await;
        tx.rollback().await.unwrap();
    }

    // And the claim takes the oldest due runs, in order.
    let got = queue::claim(&db.pool, "w", &spec(), 10, Clock::Db)
        .await
        .unwrap();
    let want: Vec<JobKey> = backlog[..10].iter().map(|r| r.key.clone()).collect();
    let mut keys: Vec<JobKey> = got.iter().map(|l| l.key.clone()).collect();
    keys.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    assert_eq!(keys, want);
}

/// Rows of `table` read so far in this transaction: by scanning it, or as
/// entries of any of its indexes.
async fn table_reads(conn: &mut sqlx::PgConnection, table: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT pg_stat_get_xact_tuples_returned($1::regclass) \
              + (SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(indexrelid)), 0)::bigint \
                 FROM pg_index WHERE indrelid = $1::regclass)",
    )
    .bind(table)
    .fetch_one(conn)
    .await
    .unwrap()
}

/// A database whose engine tables were analyzed while empty and are not
/// analyzed again unless a test says so: then 5,000 runs enqueued and the
/// first 2,000 of them claimed and finished, so that reading all of any
/// table costs more than the bounds the tests set.
async fn history_unknown_to_statistics() -> TestDb {
    let db = TestDb::new(&[]).await;
    for table in ENGINE_TABLES.split(", ") {
        sqlx::query(&format!(
            "ALTER TABLE {table} SET (autovacuum_enabled = false)"
        ))
        .execute(&db.pool)
        .await
        .unwrap();
    }
    analyze_engine_tables(&db).await;
    let backlog: Vec<NewRun> = (0..5000).map(run).collect();
    queue::enqueue(&db.pool, &backlog, Clock::Db).await.unwrap();
    let done = queue::claim(&db.pool, "w", &spec(), 2000, Clock::Db)
        .await
        .unwrap();
    let items: Vec<(Fence, Finish)> = done
        .iter()
        .map(|l| (l.fence(), Finish::Succeeded))
        .collect();
    for chunk in items.chunks(queue::MAX_FINISH_BATCH) {
        queue::finish_many(&db.pool, chunk, Clock::Db)
            .await
            .unwrap();
    }
    db
}

const ENGINE_TABLES: &str = "batch_job_run, batch_job_due, batch_job_running, batch_job_attempt";

async fn analyze_engine_tables(db: &TestDb) {
    sqlx::query(&format!("ANALYZE {ENGINE_TABLES}"))
        .execute(&db.pool)
        .await
        .unwrap();
}

/// Panics if this transaction read more than `bound` rows or index entries
/// of any engine table.
async fn assert_reads_within(tx: &mut sqlx::PgConnection, bound: i64, what: &str) {
    for table in ENGINE_TABLES.split(", ") {
        let n = table_reads(tx, table).await;
        assert!(n <= bound, "{what} read {n} rows of {table}");
    }
}

/// A finish reads its runs by key, whatever the statistics say of the run
/// table: analyzed while it was empty (a new deployment) and a backlog
/// enqueued since, or analyzed as it is while it is still small, when a
/// plan that reads all of its primary key looks cheap. Either way, a finish
/// of 200 reads about 200 runs twice (to lock them, then to update them),
/// and about 200 rows of each other table, under custom and generic plans.
#[tokio::test]
async fn a_finish_reads_its_runs_by_key_whatever_the_statistics() {
    let db = history_unknown_to_statistics().await;
    for stats in ["analyzed while empty", "analyzed as it is"] {
        if stats == "analyzed as it is" {
            analyze_engine_tables(&db).await;
        }
        let leases = queue::claim(&db.pool, "w", &spec(), 200, Clock::Db)
            .await
            .unwrap();
        assert_eq!(leases.len(), 200);
        let keys: Vec<String> = leases.iter().map(|l| l.key.to_string()).collect();
        let tokens: Vec<i64> = leases.iter().map(|l| l.token).collect();
        for mode in ["force_custom_plan", "force_generic_plan"] {
            let mut conn = planned(&db, mode).await;
            let mut tx = conn.begin().await.unwrap();
            let finished: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM batchonce_finish($1, $2, \
                    array_fill('succeeded'::text, ARRAY[200]), array_fill(''::text, ARRAY[200]), \
                    array_fill(0::float8, ARRAY[200]), NULL)",
            )
            .bind(&keys)
            .bind(&tokens)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
            assert_eq!(finished, 200);
            // At most five index entries or rows a run of the batch (a key
            // may have entries of row versions not yet vacuumed), against
            // 5,000 runs and 2,200 or more attempts in the tables.
            assert_reads_within(&mut tx, 1000, &format!("{stats}, {mode}: the finish")).await;
            tx.rollback().await.unwrap();
        }
    }
}

/// Lease-expiry recovery, which every worker runs on a timer, reads the
/// running runs by key whatever the statistics say, both when no lease has
/// expired and when all 200 have.
#[tokio::test]
async fn recovery_reads_the_running_runs_by_key_whatever_the_statistics() {
    let db = history_unknown_to_statistics().await;
    let leases = queue::claim(&db.pool, "w", &spec(), 200, Clock::Db)
        .await
        .unwrap();
    assert_eq!(leases.len(), 200);
    for stats in ["analyzed while empty", "analyzed as it is"] {
        if stats == "analyzed as it is" {
            analyze_engine_tables(&db).await;
        }
        for mode in ["force_custom_plan", "force_generic_plan"] {
            for (when, expired) in [("now()", 0i64), ("now() + interval '1 day'", 200)] {
                let mut conn = planned(&db, mode).await;
                let mut tx = conn.begin().await.unwrap();
                let recovered: i64 = sqlx::query_scalar(&format!(
                    "SELECT count(*) FROM batchonce_recover_expired('{{test-job}}', '{{test-job}}', {when})"
                ))
                .fetch_one(&mut *tx)
                .await
                .unwrap();
                assert_eq!(recovered, expired, "{stats}, {mode}, at {when}");
                let what = format!("{stats}, {mode}: recovery at {when}");
                assert_reads_within(&mut tx, 1000, &what).await;
                tx.rollback().await.unwrap();
            }
        }
    }
}
