//! Every operator view costs what is open and what it shows, not the
//! ledger (issue 43), against real PostgreSQL, each test in its own
//! database. A ledger of 8,000 finished runs (a daily job, and a scoped job
//! of 25 scopes a day) with a little open work; each view is read on a
//! connection of its own, and the rows and index entries of
//! `batch_job_run` it read are taken from the statistics the server keeps
//! (flushed on demand), under the plans a fresh session makes and the
//! generic ones it makes after five runs. The bound is the open work, what
//! the view shows and one scoped period (the newest, which `status` and the
//! exporter show per state), with room to spare: a tenth of the ledger. The
//! views before issue 43 read all of it. Each job's health (issue 44) probes
//! its MISSING periods by key, never its history.

use std::time::Duration;

use batchonce::queue::{self, ClaimSpec, NewRun, RunFilter, RunStatus};
use batchonce::testing::{assert_lists_in_step, wait_until, TestDb};
use batchonce::{Clock, JobKey, JobName, Scope};
use chrono::NaiveDate;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

const DAILY_DAYS: u32 = 3000;
const SCOPED_DAYS: u32 = 200;
const SCOPES: u32 = 25;
/// Finished runs in the ledger.
const HISTORY: i64 = (DAILY_DAYS + SCOPED_DAYS * SCOPES) as i64;
/// What a view may read of `batch_job_run`, rows and index entries each.
const BOUND: i64 = HISTORY / 10;

fn daily() -> JobName {
    JobName::parse("hist-daily").unwrap()
}

fn scoped() -> JobName {
    JobName::parse("hist-scoped").unwrap()
}

fn date(day: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(2010, 1, 1).unwrap() + chrono::Days::new(day as u64)
}

fn run(job: &JobName, day: u32, scope: Option<u32>) -> NewRun {
    let mut key = JobKey::daily(job, date(day));
    if let Some(s) = scope {
        key = key
            .with_scope(&Scope::parse(&format!("seller-{s}")).unwrap())
            .unwrap();
    }
    NewRun::new(key, date(day), &batchonce::JobConfig::default()).unwrap()
}

/// The ledger: every run enqueued as the producer would, then finished by
/// the owner in one statement per job (through the triggers that keep the
/// counts). Every hundredth daily run FAILED, every fiftieth SKIPPED. Then
/// the open work: three daily runs due (one of them claimed), and the
/// scoped job's newest day with five of its scopes still PENDING.
async fn ledger(pool: &PgPool) {
    let mut runs: Vec<NewRun> = (0..DAILY_DAYS).map(|d| run(&daily(), d, None)).collect();
    for d in 0..SCOPED_DAYS {
        runs.extend((0..SCOPES).map(|s| run(&scoped(), d, Some(s))));
    }
    for chunk in runs.chunks(2000) {
        queue::enqueue(pool, chunk, Clock::Db).await.unwrap();
    }
    sqlx::query(
        "UPDATE batch_job_run SET attempts = 1, finished_at = now() - interval '1 hour', \
           status = CASE WHEN job_name = 'hist-daily' AND business_date - date '2010-01-01' IN \
                           (SELECT g * 100 FROM generate_series(0, 30) g) THEN 'FAILED' \
                         WHEN job_name = 'hist-daily' AND (business_date - date '2010-01-01') % 50 = 7 \
                           THEN 'SKIPPED' ELSE 'SUCCEEDED' END, \
           error_message = CASE WHEN job_name = 'hist-daily' AND business_date - date '2010-01-01' IN \
                           (SELECT g * 100 FROM generate_series(0, 30) g) THEN 'boom' END",
    )
    .execute(pool)
    .await
    .unwrap();
    // The scoped job's last 20 days each have a FAILED scope, so its newest
    // done period is 20 periods back: the exporter walks past the 20 open
    // ones (by the lists), never through their runs.
    sqlx::query(
        "UPDATE batch_job_run SET status = 'FAILED', error_message = 'boom' \
         WHERE job_name = 'hist-scoped' AND scope = 'seller-7' AND business_date >= $1",
    )
    .bind(date(SCOPED_DAYS - 20))
    .execute(pool)
    .await
    .unwrap();
    let open: Vec<NewRun> = (DAILY_DAYS..DAILY_DAYS + 3)
        .map(|d| run(&daily(), d, None))
        .chain((0..SCOPES).map(|s| run(&scoped(), SCOPED_DAYS, Some(s))))
        .collect();
    queue::enqueue(pool, &open, Clock::Db).await.unwrap();
    sqlx::query(
        "UPDATE batch_job_run SET status = 'SUCCEEDED', attempts = 1, finished_at = now() \
         WHERE job_name = 'hist-scoped' AND business_date = $1 AND scope NOT IN \
           ('seller-0', 'seller-1', 'seller-2', 'seller-3', 'seller-4')",
    )
    .bind(date(SCOPED_DAYS))
    .execute(pool)
    .await
    .unwrap();
    let spec = [ClaimSpec {
        job: daily(),
        lease_ttl: Duration::from_secs(60),
    }];
    let claimed = queue::claim(pool, "w", &spec, 1, Clock::Db).await.unwrap();
    assert_eq!(claimed.len(), 1);
    // Both jobs are declared daily, with 60 days of catch-up: their MISSING
    // periods (the last 60 days, long after the ledger's) are probed by key.
    let mut jobs = std::collections::BTreeMap::new();
    let cfg = batchonce::JobConfig {
        schedule: Some(batchonce::schedule::CronSchedule::parse("0 0 * * *").unwrap()),
        catch_up: Duration::from_secs(60 * 86_400),
        ..batchonce::JobConfig::default()
    };
    jobs.insert(daily(), cfg.clone());
    let scopes = (0..SCOPES)
        .map(|s| Scope::parse(&format!("seller-{s}")).unwrap())
        .collect();
    jobs.insert(
        scoped(),
        batchonce::JobConfig {
            scopes: Some(batchonce::config::ScopeSource::List(scopes)),
            ..cfg
        },
    );
    queue::declare(pool, &jobs).await.unwrap();
    // As autovacuum would have; and the tally folded, as workers do.
    sqlx::query("VACUUM ANALYZE batch_job_run")
        .execute(pool)
        .await
        .unwrap();
    queue::fold_tally(pool).await.unwrap();
    assert_lists_in_step(pool).await;
}

/// Rows and index entries of `batch_job_run` this session has read, as the
/// statistics say once its pending counts are flushed.
async fn reads(pool: &PgPool) -> (i64, i64) {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query_as(
        "SELECT (SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) \
                 FROM pg_stat_user_tables WHERE relid = 'batch_job_run'::regclass), \
                (SELECT coalesce(sum(idx_tup_read), 0)::bigint FROM pg_stat_user_indexes \
                 WHERE relid = 'batch_job_run'::regclass)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Reads one view seven times on a session of its own (the first runs
/// planned afresh, the last with the generic plans a session settles on),
/// asserting each read stays within the bound.
async fn within_bound<F, Fut>(db: &TestDb, what: &str, view: F)
where
    F: Fn(PgPool) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .unwrap();
    for round in 0..7 {
        let (rows0, entries0) = reads(&pool).await;
        view(pool.clone()).await;
        let (rows1, entries1) = reads(&pool).await;
        let (rows, entries) = (rows1 - rows0, entries1 - entries0);
        assert!(
            rows <= BOUND && entries <= BOUND,
            "{what} (round {round}) read {rows} runs and {entries} index entries of a \
             ledger of {HISTORY}; at most {BOUND} each"
        );
    }
    pool.close().await;
}

/// Under the statistics of a ledger analyzed while its lists never were
/// (what misled the planner into reading the ledger for a list of seven),
/// and once everything is analyzed.
#[tokio::test]
async fn every_view_reads_the_open_work_and_what_it_shows() {
    let db = TestDb::new(&[]).await;
    quietly(&db, |pool| async move { ledger(&pool).await }).await;
    check_views(&db).await;
    quietly(&db, |pool| async move {
        sqlx::query("ANALYZE").execute(&pool).await.unwrap();
    })
    .await;
    check_views(&db).await;
}

/// Runs `work` on a pool of its own, closes it and waits until its sessions
/// are gone: a session reports what it read when it goes idle, up to ten
/// seconds later, or when it ends, and the counts a view is measured by
/// must not take in the ledger's building.
async fn quietly<F, Fut>(db: &TestDb, work: F)
where
    F: FnOnce(PgPool) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&db.url)
        .await
        .unwrap();
    work(pool.clone()).await;
    pool.close().await;
    // The test database's own pool too (it migrated the schema).
    let server = PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .unwrap();
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .execute(&server)
    .await
    .unwrap();
    wait_until(
        "the other sessions to end",
        Duration::from_secs(30),
        || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            .fetch_one(&server)
            .await
            .is_ok_and(|n| n == 0)
        },
    )
    .await;
    server.close().await;
}

async fn check_views(db: &TestDb) {
    within_bound(db, "status", |p| async move {
        let s = queue::status(&p, Clock::Db).await.unwrap();
        assert_eq!(s.stale.len(), 0);
    })
    .await;
    within_bound(db, "the exporter's gauges", |p| async move {
        let g = queue::gauges(&p, &[], Clock::Db).await.unwrap();
        assert_eq!(g.len(), 2);
    })
    .await;
    within_bound(db, "each job's health", |p| async move {
        let h = queue::job_health(&p, Clock::Db).await.unwrap();
        assert_eq!(h.jobs.len(), 2);
        for j in &h.jobs {
            assert!(j.missing.known && j.missing.count >= 59, "{j:?}");
        }
    })
    .await;
    within_bound(db, "the status command", |p| async move {
        let out = batchonce::cli::status_output(&p, true).await.unwrap();
        assert!(out.contains("\"jobs\""));
    })
    .await;
    within_bound(db, "the console's charts", |p| async move {
        let names = vec![daily().to_string(), scoped().to_string()];
        let recent = queue::recent_runs(&p, &names, queue::RECENT_RUNS, Clock::Db)
            .await
            .unwrap();
        assert!(recent.values().all(|r| r.len() == 30), "{recent:?}");
    })
    .await;
    within_bound(db, "runs stale", |p| async move {
        assert!(queue::stale_runs(&p, Clock::Db).await.unwrap().is_empty());
    })
    .await;
    within_bound(db, "the scoped periods", |p| async move {
        // The newest three, all among the 21 with a scope not done, and
        // no more than a view lists.
        let periods = queue::scope_periods(&p, None, 3).await.unwrap();
        assert_eq!(periods.len() as i64, queue::MAX_PERIODS.min(21));
    })
    .await;
    within_bound(db, "the console's newest runs", |p| async move {
        let names = vec![daily().to_string(), scoped().to_string()];
        assert_eq!(queue::latest_runs(&p, &names).await.unwrap().len(), 2);
    })
    .await;
    for status in [
        None,
        Some(RunStatus::Failed),
        Some(RunStatus::Pending),
        Some(RunStatus::Running),
        Some(RunStatus::Succeeded),
    ] {
        for job in [None, Some(daily())] {
            let what = format!("runs list --status {status:?} --job {job:?}");
            within_bound(db, &what, |p| {
                let job = job.clone();
                async move {
                    let rows = queue::list_runs(&p, status, job.as_ref(), None, 50)
                        .await
                        .unwrap();
                    assert!(!rows.is_empty());
                }
            })
            .await;
        }
    }
    within_bound(db, "the calendar's month", |p| async move {
        let filter = RunFilter {
            job: Some(daily()),
            from: Some(date(2000)),
            to: Some(date(2030)),
            ..Default::default()
        };
        let rows = queue::search_runs(&p, &filter, None, 100).await.unwrap();
        assert_eq!(rows.len(), 31);
    })
    .await;
}

/// The counts the views read from the lists and the tally are the ledger's
/// own, and `status` and the exporter show the same ones.
#[tokio::test]
async fn the_counts_are_the_ledgers_and_every_view_shows_the_same() {
    let db = TestDb::new(&[]).await;
    ledger(&db.pool).await;
    let truth: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT job_name::text, status::text, count(*) FROM batch_job_run \
         WHERE partition_of IS NULL GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let status = queue::status(&db.pool, Clock::Db).await.unwrap();
    let shown: Vec<(String, String, i64)> = status
        .counts
        .iter()
        .map(|c| (c.job_name.clone(), c.status.to_string(), c.runs))
        .collect();
    assert_eq!(shown, truth);
    let gauges = queue::gauges(&db.pool, &[], Clock::Db).await.unwrap();
    let mut from_gauges: Vec<(String, String, i64)> = gauges
        .iter()
        .flat_map(|(job, g)| {
            g.runs
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(move |(s, n)| (job.to_string(), s.to_string(), *n))
        })
        .collect();
    from_gauges.sort();
    assert_eq!(from_gauges, truth);
    // The newest failure and the newest success are the ledger's too.
    let (failure, success): (f64, f64) = sqlx::query_as(
        "SELECT extract(epoch FROM max(finished_at) FILTER (WHERE status = 'FAILED'))::float8, \
                extract(epoch FROM max(finished_at) FILTER (WHERE status = 'SUCCEEDED'))::float8 \
         FROM batch_job_run WHERE job_name = 'hist-daily'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let g = &gauges.iter().find(|(j, _)| *j == daily()).unwrap().1;
    assert!((g.newest_failure_unix - failure).abs() < 1e-3);
    assert!((g.last_success_unix.unwrap() - success).abs() < 1e-3);
    // The scoped job's newest day is not done while five scopes are open,
    // nor are the 20 days before it with a FAILED scope each: its newest
    // done period is the day before those.
    let s = &gauges.iter().find(|(j, _)| *j == scoped()).unwrap().1;
    let before: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM max(period_start))::float8 FROM batch_job_run \
         WHERE job_name = 'hist-scoped' AND business_date = $1",
    )
    .bind(date(SCOPED_DAYS - 21))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(s.last_done_period_start_unix, Some(before));
    let pending = s
        .scopes
        .iter()
        .find(|(st, _)| *st == RunStatus::Pending)
        .unwrap()
        .1;
    assert_eq!(pending, 5);
}
