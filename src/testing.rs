//! Test support (feature `testing`): a fresh database per test, on
//! `DATABASE_URL`'s server when it is set, otherwise on a private cluster
//! under `target/` started once from the installed PostgreSQL binaries and
//! shared by every test process. Tests can run in parallel.
//!
//! `TestDb::new(migrators)` creates and migrates a fresh `bo_test_<pid>_<random>` database, and
//! `TestDb::empty()` creates one with nothing in it, for a test that migrates it itself
//! (`workers/tests/roles.rs` migrates as the migrator role). They use `DATABASE_URL`'s server, or a
//! shared private cluster in `target/batchonce-test-pg` (`BATCHONCE_TEST_PGDIR`, at most 400
//! connections; `cluster_options()` gives its `ClusterOptions`, for the tests of the cluster
//! itself). Dropping the value drops the database. `server()` is the URL of that server, for a test
//! that needs a connection outside its database, for example to drop the roles it created, which
//! belong to the whole server. `wait_until` polls a condition every 50 ms until a timeout;
//! `wait_for_count` (an `i64` query reaching a value, to act mid-run) and `wait_for_status` (a run
//! reaching one of some statuses) are the two waits the process tests share; and `scratch_dir`
//! makes a fresh folder for one test's files; `assert_lists_in_step` checks that the
//! due and running lists name exactly the PENDING and RUNNING runs. `OwnCluster` is a PostgreSQL cluster of one test's
//! own, for tests that stop and restart the server (a worker surviving a database restart). The engine's integration tests and the job-kind
//! crates' tests use it through a dev-dependency with `features = ["testing"]`.

use std::path::PathBuf;
use std::sync::OnceLock;

use sqlx::migrate::Migrator;
use sqlx::PgPool;

use crate::db;
use crate::ops::embedded::{Cluster, ClusterOptions};

/// The server tests create their databases on.
fn server_url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(u) = std::env::var("DATABASE_URL") {
            if !u.trim().is_empty() {
                return u;
            }
        }
        // Tests cannot run without a database: failing loudly is the point.
        let cluster =
            Cluster::start(&cluster_options()).unwrap_or_else(|e| panic!("test database: {e}"));
        cluster.url("postgres")
    })
}

/// The shared private cluster the tests use when `DATABASE_URL` is unset:
/// under `target/batchonce-test-pg` (or `BATCHONCE_TEST_PGDIR`), at most 400
/// connections, no fsync. `Cluster::start` with these attaches to it (for
/// tests of the cluster itself).
pub fn cluster_options() -> ClusterOptions {
    let dir = std::env::var_os("BATCHONCE_TEST_PGDIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/batchonce-test-pg")
        });
    ClusterOptions {
        dir,
        durable: false,
        max_connections: 400,
    }
}

/// The server tests create databases on (for tests that need another
/// connection to it, e.g. to create roles).
pub fn server() -> &'static str {
    server_url()
}

/// A database of its own for one test, dropped when the value is dropped.
pub struct TestDb {
    pub name: String,
    /// URL of this test's database (for child processes).
    pub url: String,
    pub pool: PgPool,
}

impl TestDb {
    /// A fresh, migrated database (engine tables plus the given job kinds').
    pub async fn new(kinds: &[&'static Migrator]) -> Self {
        let db = Self::empty().await;
        db::migrate(&db.pool, kinds)
            .await
            .unwrap_or_else(|e| panic!("migrate test database: {e}"));
        db
    }

    /// A fresh database with nothing in it.
    pub async fn empty() -> Self {
        let server = server_url();
        let name = format!(
            "bo_test_{}_{:08x}",
            std::process::id(),
            rand::random::<u32>()
        );
        let admin = db::connect(server, "batchonce-test", 1)
            .await
            .unwrap_or_else(|e| panic!("test database server: {e}"));
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&admin)
            .await
            .unwrap_or_else(|e| panic!("create test database: {e}"));
        admin.close().await;
        let url = db::with_database(server, &name).expect("test URL");
        let pool = db::connect(&url, "batchonce-test", 16)
            .await
            .unwrap_or_else(|e| panic!("connect test database: {e}"));
        Self { name, url, pool }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Drop runs outside any runtime guarantees, so a small runtime of its
        // own removes the database; a failure only leaves it behind.
        let name = self.name.clone();
        let server = server_url().to_owned();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(admin) = db::connect(&server, "batchonce-test", 1).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&admin)
                        .await;
                }
            });
        })
        .join();
    }
}

/// Polls `f` every 50ms until it is true; panics naming `what` after `timeout`.
pub async fn wait_until<F, Fut>(what: &str, timeout: std::time::Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + timeout;
    while !f().await {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Polls an `i64` query until it returns at least `at_least` (e.g. items
/// written so far, to act mid-run); panics naming `what` after `timeout`.
pub async fn wait_for_count(
    pool: &PgPool,
    what: &str,
    sql: &str,
    at_least: i64,
    timeout: std::time::Duration,
) {
    wait_until(what, timeout, || async {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(pool)
            .await
            .is_ok_and(|n| n >= at_least)
    })
    .await
}

/// Polls the status of the run `key` (or of the only run, when `None`)
/// until it is one of `want`; panics after `timeout`.
pub async fn wait_for_status(
    pool: &PgPool,
    key: Option<&str>,
    want: &[&str],
    timeout: std::time::Duration,
) {
    let what = format!("{} to be {want:?}", key.unwrap_or("the run"));
    wait_until(&what, timeout, || async {
        let status: Option<String> = sqlx::query_scalar(
            "SELECT status FROM batch_job_run WHERE $1::text IS NULL OR job_key = $1",
        )
        .bind(key)
        .fetch_optional(pool)
        .await
        .ok()
        .flatten();
        status.is_some_and(|s| want.contains(&s.as_str()))
    })
    .await
}

/// Every PENDING run listed in `batch_job_due` (due at its run's
/// `next_run_at`, or, for a job `batch_job_pause` lists, at 9999-12-31 and
/// never otherwise: migration 20261210000001), every RUNNING run in
/// `batch_job_running` and every FAILED run in `batch_job_failed`, and
/// nothing else listed (migrations 20261207000001 and 20261209000001), and
/// `batch_job_tally` summing to the SUCCEEDED and SKIPPED runs of each job:
/// panics naming the runs or counts out of step. Stale entries
/// would be harmless (every reader checks the run row), but they mean a
/// writer forgot its lists, and a forgotten PENDING run is never claimed.
pub async fn assert_lists_in_step(pool: &PgPool) {
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT 'due' AS list, r.job_key::text, r.status::text FROM batch_job_run r \
         WHERE (r.status = 'PENDING') <> EXISTS (SELECT FROM batch_job_due d \
               WHERE d.job_key = r.job_key \
                 AND d.next_run_at = CASE WHEN EXISTS (SELECT FROM batch_job_pause p \
                                                       WHERE p.job_name = r.job_name) \
                                          THEN '9999-12-31T00:00:00Z' ELSE r.next_run_at END \
                 AND d.job_name = r.job_name AND d.scoped = (r.scope IS NOT NULL)) \
         UNION ALL SELECT 'running', r.job_key::text, r.status::text FROM batch_job_run r \
         WHERE (r.status = 'RUNNING') <> EXISTS (SELECT FROM batch_job_running l \
               WHERE l.job_key = r.job_key AND l.job_name = r.job_name) \
         UNION ALL SELECT 'due', d.job_key::text, 'no run' FROM batch_job_due d \
         WHERE NOT EXISTS (SELECT FROM batch_job_run r WHERE r.job_key = d.job_key) \
         UNION ALL SELECT 'running', l.job_key::text, 'no run' FROM batch_job_running l \
         WHERE NOT EXISTS (SELECT FROM batch_job_run r WHERE r.job_key = l.job_key) \
         ORDER BY 2 LIMIT 20",
    )
    .fetch_all(pool)
    .await
    .unwrap_or_else(|e| panic!("reading the run lists: {e}"));
    assert!(
        rows.is_empty(),
        "runs out of step with their lists (list, key, status): {rows:?}"
    );
    // The failed list and the tally (migration 20261209000001) against a
    // count of the whole ledger: the views' counts are exact or wrong.
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT 'failed', r.job_key::text, r.status::text FROM batch_job_run r \
         WHERE (r.status = 'FAILED') <> EXISTS (SELECT FROM batch_job_failed f \
               WHERE f.job_key = r.job_key AND f.job_name = r.job_name \
                 AND f.business_date = r.business_date \
                 AND f.part = (r.partition_of IS NOT NULL) AND f.scoped = (r.scope IS NOT NULL) \
                 AND f.period_start IS NOT DISTINCT FROM r.period_start \
                 AND f.failed_at IS NOT DISTINCT FROM r.finished_at) \
         UNION ALL SELECT 'failed', f.job_key::text, 'no run' FROM batch_job_failed f \
         WHERE NOT EXISTS (SELECT FROM batch_job_run r WHERE r.job_key = f.job_key) \
         UNION ALL SELECT 'tally', job_name || ' ' || status || CASE WHEN part THEN ' partitions' ELSE '' END, \
                format('ledger %s, tally %s', sum(ledger), sum(tally)) FROM ( \
           SELECT job_name::text, status::text, partition_of IS NOT NULL AS part, count(*) AS ledger, \
                  0 AS tally FROM batch_job_run WHERE status IN ('SUCCEEDED', 'SKIPPED') GROUP BY 1, 2, 3 \
           UNION ALL SELECT job_name::text, status::text, part, 0, runs FROM batch_job_tally) c \
         GROUP BY job_name, status, part HAVING sum(ledger) <> sum(tally) \
         ORDER BY 2 LIMIT 20",
    )
    .fetch_all(pool)
    .await
    .unwrap_or_else(|e| panic!("reading the failed list and the tally: {e}"));
    assert!(
        rows.is_empty(),
        "counts out of step with the ledger (list, key or count, status): {rows:?}"
    );
}

/// A fresh folder for one test's files (configs, logs, clusters) under
/// `base`, normally the integration test's `CARGO_TARGET_TMPDIR`.
pub fn scratch_dir(base: &str, name: &str) -> PathBuf {
    let dir = PathBuf::from(base).join(format!(
        "{name}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    // Tests cannot run without their folder: failing loudly is the point.
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

/// A PostgreSQL cluster of one test's own, so restarting it disturbs no
/// other test: started, migrated with the engine's and `kinds`' migrations,
/// with a pool on it.
pub struct OwnCluster {
    opts: ClusterOptions,
    cluster: Option<Cluster>,
    pub url: String,
}

impl OwnCluster {
    /// Starts a cluster under `dir/pg` with at most `max_connections`.
    pub async fn start(
        dir: &std::path::Path,
        max_connections: u32,
        kinds: &[&'static Migrator],
    ) -> (Self, PgPool) {
        let opts = ClusterOptions {
            dir: dir.join("pg"),
            durable: false,
            max_connections,
        };
        let o = opts.clone();
        let cluster = tokio::task::spawn_blocking(move || Cluster::start(&o))
            .await
            .expect("cluster start task")
            .unwrap_or_else(|e| panic!("own cluster: {e}"));
        let url = cluster.url("postgres");
        let pool = db::connect(&url, "restart-test", 2)
            .await
            .unwrap_or_else(|e| panic!("connect own cluster: {e}"));
        db::migrate(&pool, kinds)
            .await
            .unwrap_or_else(|e| panic!("migrate own cluster: {e}"));
        let me = Self {
            opts,
            cluster: Some(cluster),
            url,
        };
        (me, pool)
    }

    /// Stops the server (fast shutdown: sessions are ended).
    pub async fn stop(&mut self) {
        if let Some(c) = self.cluster.take() {
            tokio::task::spawn_blocking(move || c.stop())
                .await
                .expect("cluster stop task")
                .unwrap_or_else(|e| panic!("stop own cluster: {e}"));
        }
    }

    /// Starts it again on the same data; returns a fresh pool.
    pub async fn start_again(&mut self) -> PgPool {
        let o = self.opts.clone();
        let c = tokio::task::spawn_blocking(move || Cluster::start(&o))
            .await
            .expect("cluster start task")
            .unwrap_or_else(|e| panic!("restart own cluster: {e}"));
        self.cluster = Some(c);
        db::connect(&self.url, "restart-test", 2)
            .await
            .unwrap_or_else(|e| panic!("connect own cluster: {e}"))
    }
}
