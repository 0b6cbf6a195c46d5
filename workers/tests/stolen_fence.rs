//! Issue 42, item 3, under real logins of every role (`common::logins`): a
//! lease token is a capability, so no role but the holding attempt may read
//! a live one anywhere, and the database refuses an item write that does
//! not hold the fence of the row's run (`batchonce_require_fence`, SQLSTATE
//! BO010). Also the fence functions themselves: the lease a commit extends
//! is the run's own, the fences they record are swept when their sessions
//! are gone, and a previous-release write that still carries the raw token
//! stores its attempt's number instead.
//!
//! `cargo test -p batchonce-workers --test stolen_fence`.

mod common;

use std::process::Output;

use batchonce::testing::TestDb;
use chrono::NaiveDate;
use sqlx::PgPool;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");

fn day(d: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 9, d).unwrap()
}

/// The database with one login per role, orders for four dates and their
/// settlement runs enqueued by the producer login.
struct Rig {
    db: TestDb,
    logins: common::logins::Logins,
}

impl Rig {
    async fn new() -> Self {
        let db = TestDb::empty().await;
        let logins = common::logins::Logins::apply(BIN, &db, common::samples_config()).await;
        for d in 15..=18 {
            common::seed_orders(&db.pool, day(d), i64::from(d) * 1_000, 50).await;
            let out = cli(
                &logins.url("producer"),
                &["enqueue", "daily-settlement", "--date", &day(d).to_string()],
            );
            assert!(out.status.success(), "{}", text(&out));
        }
        Self { db, logins }
    }
}

fn cli(url: &str, args: &[&str]) -> Output {
    common::logins::run(BIN, url, common::samples_config(), args)
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A lease, as the claimer learns it.
#[derive(Debug, Clone)]
struct Held {
    key: String,
    token: i64,
    attempt: i32,
}

/// Claims the earliest due run through the worker function.
async fn claim(worker: &PgPool) -> Held {
    let (key, token, attempt): (String, i64, i32) = sqlx::query_as(
        "SELECT job_key, lease_token, attempts FROM batchonce_claim(ARRAY['daily-settlement'], \
         ARRAY[30::float8], 1, 'thief', NULL)",
    )
    .fetch_one(worker)
    .await
    .unwrap();
    Held {
        key,
        token,
        attempt,
    }
}

fn sqlstate(e: &sqlx::Error) -> String {
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
        .unwrap_or_else(|| format!("not a database error: {e}"))
}

/// Inserts one settlement item for `key`'s date (the date is the key's).
const ITEM: &str = "INSERT INTO settlement_item \
    (business_date, order_id, merchant_id, amount_minor, job_key, attempt) \
    VALUES (split_part($1, ':', 2)::date, $2, 1, 100, $1, $3)";

async fn fence_open(tx: &mut sqlx::PgConnection, h: &Held) {
    let n: Vec<(i32,)> = sqlx::query_as("SELECT pid FROM batchonce_fence_open($1, $2, NULL)")
        .bind(&h.key)
        .bind(h.token)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    assert_eq!(n.len(), 1, "the fence of {} did not open", h.key);
}

/// A worker login holding no lease, one holding another run's fence, and
/// one in a transaction that does not hold the fence it held a moment ago
/// are each refused with BO010; the fenced chunk of the run's own holder
/// is accepted, and a row without a key takes the key of the one fence
/// the transaction holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn item_writes_need_the_fence_of_their_own_run() {
    let rig = Rig::new().await;
    let worker = rig.logins.pool("worker").await;
    // The 15th: claimed and SUCCEEDED.
    let done = claim(&worker).await;
    let finished: Vec<String> = sqlx::query_scalar(
        "SELECT job_key FROM batchonce_finish(ARRAY[$1], ARRAY[$2::bigint], ARRAY['succeeded'], \
         ARRAY[NULL::text], ARRAY[0::float8], NULL)",
    )
    .bind(&done.key)
    .bind(done.token)
    .fetch_all(&worker)
    .await
    .unwrap();
    assert_eq!(finished, vec![done.key.clone()]);
    // The 16th: held by this login.
    let held = claim(&worker).await;

    // 1. No lease at all: an item for the SUCCEEDED date.
    let e = sqlx::query(ITEM)
        .bind(&done.key)
        .bind(15_001_i64)
        .bind(done.attempt)
        .execute(&worker)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "BO010", "no lease: {e}");
    assert!(e.to_string().contains(&done.key), "{e}");

    // 2. Holding the fence of another run (the 16th), writing the 15th's.
    let mut tx = worker.begin().await.unwrap();
    fence_open(&mut tx, &held).await;
    let e = sqlx::query(ITEM)
        .bind(&done.key)
        .bind(15_002_i64)
        .bind(done.attempt)
        .execute(&mut *tx)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "BO010", "another run's fence: {e}");
    tx.rollback().await.unwrap();

    // 3. Its own fenced chunk: accepted, with its counters.
    let mut tx = worker.begin().await.unwrap();
    fence_open(&mut tx, &held).await;
    sqlx::query(ITEM)
        .bind(&held.key)
        .bind(16_001_i64)
        .bind(held.attempt)
        .execute(&mut *tx)
        .await
        .unwrap();
    // A summary row without its key takes the key of the fence held.
    sqlx::query(
        "INSERT INTO settlement_summary (business_date, merchant_id, order_count, total_minor) \
         VALUES ('2026-09-16', 1, 1, 100)",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    let n: i32 = sqlx::query_scalar("SELECT batchonce_fence_commit($1, $2, 1, 0, 30, NULL)")
        .bind(&held.key)
        .bind(held.token)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(n, 1);
    tx.commit().await.unwrap();
    let (key, attempt): (String, Option<i32>) =
        sqlx::query_as("SELECT job_key::text, attempt FROM settlement_item WHERE order_id = 16001")
            .fetch_one(&rig.db.pool)
            .await
            .unwrap();
    assert_eq!(
        (key.as_str(), attempt),
        (held.key.as_str(), Some(held.attempt))
    );
    let summary_key: Option<String> = sqlx::query_scalar(
        "SELECT job_key::text FROM settlement_summary WHERE business_date = '2026-09-16'",
    )
    .fetch_one(&rig.db.pool)
    .await
    .unwrap();
    assert_eq!(summary_key.as_deref(), Some(held.key.as_str()));

    // 4. The next transaction of the same session holds no fence: the
    // record of the one before names a transaction that has ended.
    let e = sqlx::query(ITEM)
        .bind(&held.key)
        .bind(16_002_i64)
        .bind(held.attempt)
        .execute(&worker)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "BO010", "a committed fence: {e}");
    let e = sqlx::query(
        "INSERT INTO settlement_summary (business_date, merchant_id, order_count, total_minor) \
         VALUES ('2026-09-16', 2, 1, 100)",
    )
    .execute(&worker)
    .await
    .unwrap_err();
    assert_eq!(sqlstate(&e), "BO010", "a summary without key or fence: {e}");

    // 5. Another session of the same login, while the holder's fence is
    // open: the fence is the holder's transaction's, not the login's.
    let other = rig.logins.pool("worker").await;
    let mut tx = worker.begin().await.unwrap();
    fence_open(&mut tx, &held).await;
    let e = sqlx::query(ITEM)
        .bind(&held.key)
        .bind(16_003_i64)
        .bind(held.attempt)
        .execute(&other)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "BO010", "another session: {e}");
    tx.rollback().await.unwrap();

    let items: i64 = sqlx::query_scalar("SELECT count(*) FROM settlement_item")
        .fetch_one(&rig.db.pool)
        .await
        .unwrap();
    assert_eq!(items, 1, "only the fenced chunk's item was written");
}

/// Every column each role may read, in every table of the schema, is
/// searched for the live lease tokens: none may hold one. Runs are held and
/// items written as the worker does (fenced), and as the previous release
/// does (the raw token in the row). The inspection commands still work
/// under the read-only login, and print no token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_role_reads_a_live_token_anywhere() {
    let rig = Rig::new().await;
    let worker = rig.logins.pool("worker").await;
    let a = claim(&worker).await;
    let b = claim(&worker).await;
    let mut tx = worker.begin().await.unwrap();
    fence_open(&mut tx, &a).await;
    sqlx::query(ITEM)
        .bind(&a.key)
        .bind(15_001_i64)
        .bind(a.attempt)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // The previous release's item: its token in the row, under its fence.
    let mut tx = worker.begin().await.unwrap();
    fence_open(&mut tx, &b).await;
    sqlx::query(
        "INSERT INTO settlement_item \
         (business_date, order_id, merchant_id, amount_minor, job_key, lease_token) \
         VALUES ('2026-09-16', 16001, 1, 100, $1, $2)",
    )
    .bind(&b.key)
    .bind(b.token)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let live: Vec<String> = sqlx::query_scalar(
        "SELECT lease_token::text FROM batch_job_run WHERE status = 'RUNNING' ORDER BY 1",
    )
    .fetch_all(&rig.db.pool)
    .await
    .unwrap();
    assert_eq!(live.len(), 2);
    let mut found = Vec::new();
    for part in [
        "worker", "producer", "operator", "readonly", "console", "program",
    ] {
        let role = rig.logins.role(part);
        let columns: Vec<(String, String)> = sqlx::query_as(
            "SELECT c.relname::text, a.attname::text FROM pg_class c \
             JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
             WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'v', 'p') \
               AND a.atttypid IN ('int8'::regtype, 'numeric'::regtype, 'text'::regtype, 'varchar'::regtype) \
               AND has_column_privilege($1, c.oid, a.attnum, 'SELECT')",
        )
        .bind(&role)
        .fetch_all(&rig.db.pool)
        .await
        .unwrap();
        for (table, column) in columns {
            let n: i64 = sqlx::query_scalar(&format!(
                "SELECT count(*) FROM \"{table}\" WHERE \"{column}\"::text = ANY($1)"
            ))
            .bind(&live)
            .fetch_one(&rig.db.pool)
            .await
            .unwrap();
            if n > 0 {
                found.push(format!(
                    "{part} reads {n} live token(s) in {table}.{column}"
                ));
            }
        }
    }
    assert!(found.is_empty(), "{found:#?}");

    // Asking for the token columns is refused outright.
    for part in [
        "worker", "producer", "operator", "readonly", "console", "program",
    ] {
        let pool = rig.logins.pool(part).await;
        for table in ["batch_job_run", "batch_job_attempt"] {
            let e = sqlx::query(&format!("SELECT lease_token FROM {table}"))
                .execute(&pool)
                .await
                .unwrap_err();
            assert_eq!(
                sqlstate(&e),
                "42501",
                "{part} reads {table}.lease_token: {e}"
            );
        }
        pool.close().await;
    }

    // The views read only what these roles may read.
    let readonly = rig.logins.url("readonly");
    for args in [
        vec!["runs", "show", a.key.as_str()],
        vec!["runs", "list"],
        vec!["status"],
        vec!["runs", "stale"],
    ] {
        let out = cli(&readonly, &args);
        let t = text(&out);
        assert!(out.status.success(), "{args:?} as readonly: {t}");
        for token in &live {
            assert!(!t.contains(token.as_str()), "{args:?} printed a token: {t}");
        }
    }
    let t = text(&cli(&readonly, &["runs", "show", a.key.as_str()]));
    assert!(t.contains("attempt 1"), "runs show names the attempt: {t}");
}

/// The previous release's workers fence by locking the run row and send
/// the raw token with each item: the row stores the attempt's number and
/// no token, and a summary without a key takes the run's. A token that is
/// not the run's live lease fences nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_previous_release_write_stores_its_attempt_not_its_token() {
    let rig = Rig::new().await;
    let worker = rig.logins.pool("worker").await;
    let held = claim(&worker).await;
    let owner = &rig.db.pool;
    // The previous release's begin_fenced, then its chunk.
    let lock = "SELECT 1 FROM batch_job_run WHERE job_key = $1 AND lease_token = $2 \
                AND status = 'RUNNING' AND lease_expires_at > now() FOR NO KEY UPDATE";
    let mut tx = owner.begin().await.unwrap();
    sqlx::query(lock)
        .bind(&held.key)
        .bind(held.token)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO settlement_item \
         (business_date, order_id, merchant_id, amount_minor, job_key, lease_token) \
         VALUES ('2026-09-15', 15001, 1, 100, $1, $2) \
         ON CONFLICT ON CONSTRAINT settlement_item_business_date_order_id_key DO NOTHING",
    )
    .bind(&held.key)
    .bind(held.token)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let (token, attempt): (Option<i64>, Option<i32>) =
        sqlx::query_as("SELECT lease_token, attempt FROM settlement_item WHERE order_id = 15001")
            .fetch_one(owner)
            .await
            .unwrap();
    assert_eq!((token, attempt), (None, Some(held.attempt)));
    // Its summary, in a transaction of its own fenced the same way.
    let mut tx = owner.begin().await.unwrap();
    sqlx::query(lock)
        .bind(&held.key)
        .bind(held.token)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO settlement_summary (business_date, merchant_id, order_count, total_minor) \
         SELECT business_date, merchant_id, count(*), sum(amount_minor) FROM settlement_item \
         WHERE business_date = '2026-09-15' GROUP BY 1, 2",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let key: Option<String> = sqlx::query_scalar("SELECT job_key::text FROM settlement_summary")
        .fetch_one(owner)
        .await
        .unwrap();
    assert_eq!(key.as_deref(), Some(held.key.as_str()));

    // A worker login sending a token that is not the lease: refused, and
    // nothing is stored.
    for token in [held.token ^ 1, 0] {
        let e = sqlx::query(
            "INSERT INTO settlement_item \
             (business_date, order_id, merchant_id, amount_minor, job_key, lease_token) \
             VALUES ('2026-09-15', 15002, 1, 100, $1, $2)",
        )
        .bind(&held.key)
        .bind(token)
        .execute(&worker)
        .await
        .unwrap_err();
        assert_eq!(sqlstate(&e), "BO010", "{e}");
    }
    let stored: i64 =
        sqlx::query_scalar("SELECT count(*) FROM settlement_item WHERE lease_token IS NOT NULL")
            .fetch_one(owner)
            .await
            .unwrap();
    assert_eq!(stored, 0);
}

/// A fenced commit extends the lease by the run's own stored length, never
/// by what the caller asks; it refuses negative counts, and a worker login
/// cannot name the instant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_commit_extends_the_lease_by_the_runs_own_length() {
    let rig = Rig::new().await;
    let worker = rig.logins.pool("worker").await;
    let held = claim(&worker).await;
    let commit = |ttl: f64, processed: i64, at: Option<chrono::DateTime<chrono::Utc>>| {
        let worker = worker.clone();
        let held = held.clone();
        async move {
            let mut tx = worker.begin().await.unwrap();
            fence_open(&mut tx, &held).await;
            let r: Result<i32, _> =
                sqlx::query_scalar("SELECT batchonce_fence_commit($1, $2, $3, 0, $4, $5)")
                    .bind(&held.key)
                    .bind(held.token)
                    .bind(processed)
                    .bind(ttl)
                    .bind(at)
                    .fetch_one(&mut *tx)
                    .await;
            if r.is_ok() {
                tx.commit().await.unwrap();
            }
            r
        }
    };
    assert_eq!(commit(1e9, 1, None).await.unwrap(), 1);
    let (left, stored): (f64, f64) = sqlx::query_as(
        "SELECT extract(epoch FROM lease_expires_at - clock_timestamp())::float8, \
                extract(epoch FROM lease_ttl)::float8 FROM batch_job_run WHERE job_key = $1",
    )
    .bind(&held.key)
    .fetch_one(&rig.db.pool)
    .await
    .unwrap();
    assert!(
        left <= stored + 1.0,
        "a commit asking for 1e9 s extended the lease to {left} s (the run's own: {stored} s)"
    );
    let e = commit(30.0, -1_000_000, None).await.unwrap_err();
    assert_eq!(sqlstate(&e), "22023", "{e}");
    let e = commit(
        30.0,
        1,
        Some(chrono::Utc::now() + chrono::Duration::days(365_000)),
    )
    .await
    .unwrap_err();
    assert_eq!(sqlstate(&e), "42501", "{e}");
}

/// A backend's first fence sweeps the records of sessions that are gone,
/// and leaves those of live sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_fence_sweeps_the_records_of_gone_sessions() {
    let rig = Rig::new().await;
    let owner = &rig.db.pool;
    let live: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(owner)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO batch_fence_held (pid, xact_start, job_key) VALUES \
         (2147483000, now() - interval '1 day', 'gone:2026-09-01'), ($1, now(), 'live:2026-09-01')",
    )
    .bind(live)
    .execute(owner)
    .await
    .unwrap();
    let worker = rig.logins.pool("worker").await;
    let held = claim(&worker).await;
    let mut tx = worker.begin().await.unwrap();
    fence_open(&mut tx, &held).await;
    tx.commit().await.unwrap();
    let left: Vec<String> =
        sqlx::query_scalar("SELECT job_key::text FROM batch_fence_held ORDER BY 1")
            .fetch_all(owner)
            .await
            .unwrap();
    assert_eq!(left, vec![held.key.clone(), "live:2026-09-01".to_owned()]);
}
