//! Partitioned runs (issue 23) against real PostgreSQL: one business date
//! of `daily-settlement` split over four partitions and two workers, with
//! the summary written once by the final step; a poisoned partition fails
//! the run alone and a rerun redoes only it; the partitioning stays the one
//! the run was enqueued with; `notification-send` judges the date's
//! rejections once, after its partitions; a command job gets its step in the
//! environment and its token fences its own partition only; operator actions
//! on a run reach its partitions and a partition is stale on its own; and a
//! kind that cannot split a run refuses `partitions`.

use std::time::Duration;

use batchonce::config::Config;
use batchonce::queue::{self, Action, NewRun, OperatorRequest};
use batchonce::testing::{wait_for_status, TestDb};
use batchonce::{Clock, JobKey, JobName, Registry};
use batchonce_workers::notification::{self, NotificationSend, OutboxSender};
use batchonce_workers::settlement::{self, DailySettlement};
use chrono::NaiveDate;
use sqlx::PgPool;

mod common;

use common::Workers;

const KEY: &str = "daily-settlement:2026-09-15";

fn date() -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 9, 15).unwrap()
}

async fn db() -> TestDb {
    TestDb::new(&batchonce_workers::migrations()).await
}

fn settlement_config(extra: &str) -> Config {
    let kinds = Registry::new().register(DailySettlement).default_configs();
    let text = format!(
        "[jobs.daily-settlement]\ntimezone = \"Asia/Seoul\"\nchunk_size = 50\nlease_ttl = \"5s\"\n\
         backoff = \"100ms\"\nbackoff_max = \"200ms\"\nmax_attempts = 3\n{extra}"
    );
    Config::parse(&text, "test.toml", &kinds).unwrap()
}

async fn enqueue(pool: &PgPool, config: &Config, key: &str) {
    let job = config
        .job(&JobName::parse(key.split_once(':').unwrap().0).unwrap())
        .unwrap();
    let report = queue::enqueue(
        pool,
        &[NewRun::new(JobKey::parse(key).unwrap(), date(), job).unwrap()],
        Clock::Db,
    )
    .await
    .unwrap();
    assert_eq!(report.enqueued.len(), 1);
}

/// The run's `error_message`.
async fn message(pool: &PgPool, key: &str) -> String {
    sqlx::query_scalar("SELECT error_message FROM batch_job_run WHERE job_key = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// (key, status, attempts, processed) of a run and its partitions, in key order.
async fn rows(pool: &PgPool, parent: &str) -> Vec<(String, String, i32, i64)> {
    sqlx::query_as(
        "SELECT job_key, status, attempts, processed_count FROM batch_job_run \
         WHERE job_key = $1 OR partition_of = $1 ORDER BY job_key",
    )
    .bind(parent)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_date_split_over_two_workers_settles_each_order_once_and_summarizes_once() {
    let db = db().await;
    common::seed_orders(&db.pool, date(), 0, 2_000).await;
    let config = settlement_config("partitions = 4");
    enqueue(&db.pool, &config, KEY).await;
    let runs = rows(&db.pool, KEY).await;
    assert_eq!(
        runs.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
        [
            KEY,
            "daily-settlement:2026-09-15.p1",
            "daily-settlement:2026-09-15.p2",
            "daily-settlement:2026-09-15.p3",
            "daily-settlement:2026-09-15.p4"
        ],
        "the partitions are inserted with the run"
    );
    // A second enqueue of the same period is a duplicate, partitions included.
    let again = queue::enqueue(
        &db.pool,
        &[NewRun::new(
            JobKey::parse(KEY).unwrap(),
            date(),
            config
                .job(&JobName::parse(settlement::NAME).unwrap())
                .unwrap(),
        )
        .unwrap()],
        Clock::Db,
    )
    .await
    .unwrap();
    assert_eq!(again.duplicates.len(), 1);
    assert_eq!(rows(&db.pool, KEY).await.len(), 5);

    let workers = Workers::start(
        &db,
        || Registry::new().register(DailySettlement),
        &config,
        &["w-a", "w-b"],
    );
    workers.stop_when(&db, KEY, &["SUCCEEDED", "FAILED"]).await;

    let runs = rows(&db.pool, KEY).await;
    assert!(runs.iter().all(|r| r.1 == "SUCCEEDED"), "{runs:?}");
    // The final step ran once, and wrote no item of its own.
    assert_eq!(runs[0].2, 1, "{runs:?}");
    assert_eq!(runs[0].3, 0, "{runs:?}");
    assert_eq!(
        runs[1..].iter().map(|r| r.3).sum::<i64>(),
        2_000,
        "{runs:?}"
    );
    assert!(
        runs[1..].iter().all(|r| r.3 > 0),
        "every partition has orders: {runs:?}"
    );
    // Every item was written by the partition its order belongs to, under
    // that partition's token, and the summaries match the orders.
    common::oracle::settlement(&db.pool)
        .await
        .assert_holds("four partitions");
    let under_parent: i64 =
        sqlx::query_scalar("SELECT count(*) FROM settlement_item WHERE job_key = $1")
            .bind(KEY)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(under_parent, 0);
    assert!(
        settlement::verify(&db.pool, chrono_tz::Asia::Seoul, date())
            .await
            .unwrap()
            .ok
    );
    // The views count the run once and its partitions apart.
    let st = queue::status(&db.pool, Clock::Db).await.unwrap();
    assert_eq!(
        st.counts.iter().map(|c| c.runs).sum::<i64>(),
        1,
        "{:?}",
        st.counts
    );
    assert_eq!(
        st.partitions.iter().map(|c| c.runs).sum::<i64>(),
        4,
        "{:?}",
        st.partitions
    );
    let listed = queue::list_runs(&db.pool, None, None, None, 100)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].step, queue::Step::Final { count: 4 });
    let gauges = queue::gauges(&db.pool, &[], Clock::Db).await.unwrap();
    let (_, g) = gauges
        .iter()
        .find(|(j, _)| j.as_str() == settlement::NAME)
        .unwrap();
    let of = |v: &[(queue::RunStatus, i64)]| {
        v.iter()
            .find(|(s, _)| *s == queue::RunStatus::Succeeded)
            .unwrap()
            .1
    };
    assert_eq!((of(&g.runs), of(&g.partitions)), (1, 4));
    // `runs show` lists the partitions under the run's final step.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_batchonce"))
        .env("DATABASE_URL", &db.url)
        .env_remove("BATCHONCE_CONFIG")
        .args(["runs", "show", KEY])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("partitions:     4 (this run's own attempts are its final step)"),
        "{text}"
    );
    assert!(text.contains("partitions: 4 of 4 succeeded"), "{text}");
    assert!(text.contains("daily-settlement:2026-09-15.p4"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_partition_fails_the_run_and_a_rerun_redoes_only_that_partition() {
    let db = db().await;
    common::seed_orders(&db.pool, date(), 0, 1_000).await;
    // One order with a negative amount: its partition fails at once.
    let poisoned: i64 = 437;
    sqlx::query("UPDATE orders SET amount_minor = -5 WHERE order_id = $1")
        .bind(poisoned)
        .execute(&db.pool)
        .await
        .unwrap();
    let bad_part: i32 = sqlx::query_scalar("SELECT batchonce_partition($1::text, 4)")
        .bind(poisoned.to_string())
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let bad_key = format!("{KEY}.p{bad_part}");
    let config = settlement_config("partitions = 4");
    enqueue(&db.pool, &config, KEY).await;
    let workers = Workers::start(
        &db,
        || Registry::new().register(DailySettlement),
        &config,
        &["w-a", "w-b"],
    );
    wait_for_status(&db.pool, Some(KEY), &["FAILED"], Duration::from_secs(60)).await;
    // The other partitions finish on their own.
    batchonce::testing::wait_until(
        "the healthy partitions to succeed",
        Duration::from_secs(60),
        || async {
            rows(&db.pool, KEY).await[1..]
                .iter()
                .filter(|r| r.1 == "SUCCEEDED")
                .count()
                == 3
        },
    )
    .await;
    workers.stop().await;
    let runs = rows(&db.pool, KEY).await;
    let message = message(&db.pool, KEY).await;
    assert!(
        message.starts_with(&format!(
            "partition {bad_part} of 4 failed: order {poisoned} has a negative amount"
        )),
        "{message}"
    );
    assert_eq!(runs[0].2, 0, "no final step ran: {runs:?}");
    let bad = runs.iter().find(|r| r.0 == bad_key).unwrap();
    assert_eq!((bad.1.as_str(), bad.2, bad.3), ("FAILED", 1, 0), "{runs:?}");
    let healthy: Vec<_> = runs[1..]
        .iter()
        .filter(|r| r.0 != bad_key)
        .cloned()
        .collect();
    assert!(
        healthy.iter().all(|r| r.1 == "SUCCEEDED" && r.2 == 1),
        "{runs:?}"
    );
    let items_before: Vec<(i64, String, Option<i32>)> = sqlx::query_as(
        "SELECT order_id, job_key::text, attempt FROM settlement_item ORDER BY order_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();

    // Fix the data; re-run the run (not the partition): only the FAILED
    // partition runs again, then the final step.
    sqlx::query("UPDATE orders SET amount_minor = 5 WHERE order_id = $1")
        .bind(poisoned)
        .execute(&db.pool)
        .await
        .unwrap();
    let req = OperatorRequest {
        action: Action::Rerun,
        key: JobKey::parse(KEY).unwrap(),
        operator: "alice".into(),
        reason: "fixed order 437".into(),
        force: false,
        stale_after: Duration::from_secs(3600),
        max_attempts: 3,
    };
    queue::apply_action(&db.pool, &req, Clock::Db)
        .await
        .unwrap()
        .unwrap();
    let runs = rows(&db.pool, KEY).await;
    assert_eq!(runs[0].1, "PENDING");
    assert!(runs
        .iter()
        .filter(|r| r.0 != KEY && r.0 != bad_key)
        .all(|r| r.1 == "SUCCEEDED"));
    assert_eq!(runs.iter().find(|r| r.0 == bad_key).unwrap().1, "PENDING");

    let workers = Workers::start(
        &db,
        || Registry::new().register(DailySettlement),
        &config,
        &["w-c"],
    );
    workers.stop_when(&db, KEY, &["SUCCEEDED"]).await;
    let after = rows(&db.pool, KEY).await;
    for (b, a) in runs.iter().zip(&after) {
        if b.0 == bad_key || b.0 == KEY {
            assert_eq!(
                (a.1.as_str(), a.2),
                ("SUCCEEDED", if b.0 == KEY { 1 } else { 2 }),
                "{after:?}"
            );
        } else {
            assert_eq!(
                a,
                &healthy.iter().find(|h| h.0 == b.0).unwrap().clone(),
                "untouched: {after:?}"
            );
        }
    }
    // Nothing the healthy partitions wrote was rewritten.
    let items_after: Vec<(i64, String, Option<i32>)> = sqlx::query_as(
        "SELECT order_id, job_key::text, attempt FROM settlement_item ORDER BY order_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    for item in &items_before {
        assert!(items_after.contains(item), "{item:?} was rewritten");
    }
    assert_eq!(items_after.len(), 1_000);
    common::oracle::settlement(&db.pool)
        .await
        .assert_holds("after the rerun");
    let audit: Vec<(String, String)> =
        sqlx::query_as("SELECT job_key, action FROM batch_operator_action ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(audit, [(KEY.to_owned(), "rerun".to_owned())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_partitioning_is_the_one_the_run_was_enqueued_with() {
    let db = db().await;
    common::seed_orders(&db.pool, date(), 0, 600).await;
    enqueue(&db.pool, &settlement_config("partitions = 3"), KEY).await;
    // The workers' file now says 2 partitions, and then none: the run keeps 3.
    for extra in ["partitions = 2", ""] {
        let config = settlement_config(extra);
        let workers = Workers::start(
            &db,
            || Registry::new().register(DailySettlement),
            &config,
            &["w"],
        );
        workers.stop_when(&db, KEY, &["SUCCEEDED"]).await;
    }
    let runs = rows(&db.pool, KEY).await;
    assert_eq!(runs.len(), 4, "{runs:?}");
    common::oracle::settlement(&db.pool)
        .await
        .assert_holds("three partitions");
    // A kind that cannot split a run says so when the file is read.
    let kinds = batchonce_workers::registry().default_configs();
    let e = Config::parse("[jobs.inventory-sync]\npartitions = 2\n", "t.toml", &kinds)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("jobs.inventory-sync.partitions") && e.contains("cannot split a run"),
        "{e}"
    );
    for bad in ["0", "257", "\"4\""] {
        let e = Config::parse(
            &format!("[jobs.daily-settlement]\npartitions = {bad}\n"),
            "t.toml",
            &kinds,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("jobs.daily-settlement.partitions"), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notification_partitions_send_once_and_the_final_step_judges_the_date() {
    let db = db().await;
    // 300 customers; 5 undeliverable addresses, more than max_item_failures.
    sqlx::query(
        "INSERT INTO notification_request (business_date, campaign, customer_id, channel, address, body) \
         SELECT $1, 'winter', g, 'email', CASE WHEN g % 60 = 0 THEN 'nobody' ELSE 'c' || g || '@example.com' END, 'Hi' \
         FROM generate_series(1, 300) g",
    )
    .bind(date())
    .execute(&db.pool)
    .await
    .unwrap();
    let outbox = batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), "partition-outbox");
    let kinds = Registry::new()
        .register(NotificationSend::new())
        .default_configs();
    let config = Config::parse(
        "[jobs.notification-send]\nchunk_size = 20\npartitions = 3\nmax_item_failures = 3\n\
         backoff = \"100ms\"\nbackoff_max = \"200ms\"\nmax_attempts = 2\n",
        "t.toml",
        &kinds,
    )
    .unwrap();
    let key = "notification-send:2026-09-15";
    enqueue(&db.pool, &config, key).await;
    let dir = outbox.clone();
    let workers = Workers::start(
        &db,
        move || {
            Registry::new().register(NotificationSend::with_sender(std::sync::Arc::new(
                OutboxSender::new(&dir),
            )))
        },
        &config,
        &["n-a", "n-b"],
    );
    workers.stop_when(&db, key, &["SUCCEEDED", "FAILED"]).await;
    let runs = rows(&db.pool, key).await;
    // Every partition did its sends; the final step found 5 rejections > 3.
    assert!(runs[1..].iter().all(|r| r.1 == "SUCCEEDED"), "{runs:?}");
    assert_eq!(runs[0].1, "FAILED", "{runs:?}");
    let message = message(&db.pool, key).await;
    assert!(message.starts_with("5 of 300 deliveries"), "{message}");
    let states: Vec<(String, i64)> = sqlx::query_as(
        "SELECT state, count(*) FROM notification_delivery GROUP BY state ORDER BY state",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(states, [("failed".to_owned(), 5), ("sent".to_owned(), 295)]);
    // Each delivery was written by the partition its key belongs to.
    let misplaced: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM notification_delivery d JOIN batch_job_run r ON r.job_key = d.job_key \
         WHERE r.partition_no IS DISTINCT FROM batchonce_partition(d.idempotency_key, 3)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(misplaced, 0);
    let sent: Vec<String> = sqlx::query_scalar(
        "SELECT idempotency_key FROM notification_delivery WHERE state = 'sent'",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let report = notification::outbox_report(&outbox, date(), &sent);
    assert_eq!(
        (report.delivered, report.missing, report.second_keys),
        (295, 0, 0),
        "{report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_job_gets_its_step_and_fences_its_partition_alone() {
    let db = db().await;
    let dir = batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), "partition-cmd");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    // Each step writes down its variables; a partition then tries the fence
    // with its token on its sibling's key (refused) and on its own (held).
    let script = dir.join("step.sh");
    std::fs::write(
        &script,
        r#"set -u
f="$OUT/$BATCHONCE_JOB_KEY"
env | grep -E '^(BATCHONCE_STEP|BATCHONCE_PARTITIONS?|BATCHONCE_JOB_KEY)=' | sort > "$f"
if [ "$BATCHONCE_STEP" = partition ]; then
  other="${BATCHONCE_JOB_KEY%.p*}.p$(( BATCHONCE_PARTITION % BATCHONCE_PARTITIONS + 1 ))"
  if psql "$DATABASE_URL" -Atq -c "SELECT batchonce_fence('$other', $BATCHONCE_LEASE_TOKEN)" >/dev/null 2>&1
  then echo "sibling fence: held" >> "$f.fence"; else echo "sibling fence: refused" >> "$f.fence"; fi
  psql "$DATABASE_URL" -Atq -v ON_ERROR_STOP=1 \
    -c "SELECT batchonce_fence('$BATCHONCE_JOB_KEY', $BATCHONCE_LEASE_TOKEN)" >/dev/null \
    && echo "own fence: held" >> "$f.fence"
fi
"#,
    )
    .unwrap();
    let cfg = dir.join("batchonce.toml");
    std::fs::write(
        &cfg,
        format!(
            "[jobs.split-report]\npartitions = 2\ncommand = [\"sh\", {:?}]\n\
             env = {{ OUT = {:?} }}\ndatabase_url_env = \"SPLIT_DATABASE_URL\"\n",
            script.display().to_string(),
            out.display().to_string()
        ),
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_batchonce");
    let base = || {
        let mut c = std::process::Command::new(bin);
        c.env("DATABASE_URL", &db.url)
            .env_remove("BATCHONCE_CONFIG")
            .arg("--config")
            .arg(&cfg);
        c
    };
    let o = base()
        .args(["enqueue", "split-report", "--date", "2026-09-15"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let key = "split-report:2026-09-15";
    let mut worker = base()
        .env("SPLIT_DATABASE_URL", &db.url)
        .args(["worker", "--worker-id", "c-a", "--poll-interval", "100ms"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for_status(
        &db.pool,
        Some(key),
        &["SUCCEEDED", "FAILED"],
        Duration::from_secs(60),
    )
    .await;
    common::sigterm_and_wait(&mut worker);
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap();
    assert_eq!(
        read("split-report:2026-09-15.p2"),
        "BATCHONCE_JOB_KEY=split-report:2026-09-15.p2\nBATCHONCE_PARTITION=2\nBATCHONCE_PARTITIONS=2\nBATCHONCE_STEP=partition\n"
    );
    assert_eq!(
        read(key),
        "BATCHONCE_JOB_KEY=split-report:2026-09-15\nBATCHONCE_PARTITIONS=2\nBATCHONCE_STEP=final\n"
    );
    assert!(read("split-report:2026-09-15.p1").contains("BATCHONCE_PARTITION=1\n"));
    for p in ["p1", "p2"] {
        assert_eq!(
            read(&format!("split-report:2026-09-15.{p}.fence")),
            "sibling fence: refused\nown fence: held\n",
            "{p}: a partition's token fences its own partition only"
        );
    }
    let runs = rows(&db.pool, key).await;
    assert!(
        runs.iter().all(|r| r.1 == "SUCCEEDED" && r.2 == 1),
        "{runs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_actions_on_a_run_reach_its_partitions_and_a_partition_is_stale_on_its_own() {
    let db = db().await;
    let config = settlement_config("partitions = 3\non_lease_expiry = \"hold\"");
    let key = |d: u32| format!("daily-settlement:2026-09-{d:02}");
    for d in [15, 16] {
        let job = config
            .job(&JobName::parse(settlement::NAME).unwrap())
            .unwrap();
        let date = NaiveDate::from_ymd_opt(2026, 9, d).unwrap();
        queue::enqueue(
            &db.pool,
            &[NewRun::new(JobKey::parse(&key(d)).unwrap(), date, job).unwrap()],
            Clock::Db,
        )
        .await
        .unwrap();
    }
    let act = |action: Action, k: String, force: bool| {
        let pool = db.pool.clone();
        async move {
            let req = OperatorRequest {
                action,
                key: JobKey::parse(&k).unwrap(),
                operator: "olga".into(),
                reason: "operator test".into(),
                force,
                stale_after: Duration::from_secs(3600),
                max_attempts: 3,
            };
            queue::apply_action(&pool, &req, Clock::Db).await.unwrap()
        }
    };
    let states = |k: String| {
        let pool = db.pool.clone();
        async move {
            rows(&pool, &k)
                .await
                .into_iter()
                .map(|r| r.1)
                .collect::<Vec<_>>()
        }
    };
    // Claim partition 1 of the 16th, as a worker would, and let its lease
    // lapse under `hold`: it is stale by its own key, the run is not.
    let specs = [queue::ClaimSpec {
        job: JobName::parse(settlement::NAME).unwrap(),
        lease_ttl: Duration::from_secs(5),
    }];
    let later = Clock::At(chrono::Utc::now() + chrono::Duration::hours(1));
    let claimed = queue::claim(&db.pool, "gone", &specs, 1, Clock::Db)
        .await
        .unwrap();
    assert_eq!(claimed[0].key.as_str(), format!("{}.p1", key(15)));
    assert_eq!(claimed[0].step, queue::Step::Partition { no: 1, count: 3 });
    let stale: Vec<String> = queue::stale_runs(&db.pool, later)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.job_key)
        .collect();
    assert_eq!(stale, [format!("{}.p1", key(15))]);

    // `fail --force` of the waiting run fails its partitions, fencing the holder.
    act(Action::Fail, key(15), true).await.unwrap();
    assert_eq!(states(key(15)).await, ["FAILED"; 4]);
    let fenced = queue::begin_fenced(
        &db.pool,
        &claimed[0].fence(),
        Duration::from_secs(5),
        Clock::Db,
    )
    .await;
    assert!(
        fenced.is_err(),
        "the old holder of partition 1 can no longer write"
    );
    // `rerun` brings back every partition, and the run waits for them.
    act(Action::Rerun, key(15), false).await.unwrap();
    assert_eq!(states(key(15)).await, ["PENDING"; 4]);
    let listed = queue::list_runs(&db.pool, None, None, None, 10)
        .await
        .unwrap();
    assert!(listed.iter().all(queue::is_waiting), "{listed:?}");
    // `skip` of the other run skips its partitions; none is claimable then.
    act(Action::Skip, key(16), false).await.unwrap();
    assert_eq!(states(key(16)).await, ["SKIPPED"; 4]);
    // An action on one partition is that partition's; the run follows.
    act(Action::Skip, format!("{}.p2", key(15)), false)
        .await
        .unwrap();
    act(Action::Fail, format!("{}.p3", key(15)), true)
        .await
        .unwrap();
    assert_eq!(
        states(key(15)).await,
        ["FAILED", "PENDING", "SKIPPED", "FAILED"]
    );
    let audit: i64 = sqlx::query_scalar("SELECT count(*) FROM batch_operator_action")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        audit, 5,
        "one audit row per action, the run's or the partition's"
    ); // The counts every view reads followed each action, the run's and its
       // partitions' (the parent's through the trigger).
    batchonce::testing::assert_lists_in_step(&db.pool).await;
}

/// An operator acting on a run while one of its partitions changes state
/// (a finish, whose trigger then takes the run's row): both complete,
/// neither is chosen as a deadlock victim, because the operator takes the
/// partitions' rows before the run's, the order the finish takes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_and_a_finishing_partition_never_deadlock() {
    let db = db().await;
    let config = settlement_config("partitions = 2");
    enqueue(&db.pool, &config, KEY).await;
    let part = format!("{KEY}.p1");
    // The "worker": holds partition 1's row as a finish does.
    let mut finish = db.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM batch_job_run WHERE job_key = $1 FOR NO KEY UPDATE")
        .bind(&part)
        .execute(&mut *finish)
        .await
        .unwrap();
    // The operator: `runs fail --force` of the run, which waits for that row.
    let pool = db.pool.clone();
    let operator = tokio::spawn(async move {
        let req = OperatorRequest {
            action: Action::Fail,
            key: JobKey::parse(KEY).unwrap(),
            operator: "olga".into(),
            reason: "deadlock test".into(),
            force: true,
            stale_after: Duration::from_secs(3600),
            max_attempts: 3,
        };
        queue::apply_action(&pool, &req, Clock::Db).await
    });
    batchonce::testing::wait_for_count(
        &db.pool,
        "the operator to wait for a row lock",
        "SELECT count(*) FROM pg_locks WHERE NOT granted",
        1,
        Duration::from_secs(30),
    )
    .await;
    // The finish goes on: the partition's change makes its trigger take the
    // run's row, which the operator must not hold yet.
    sqlx::query(
        "UPDATE batch_job_run SET status = 'SKIPPED', finished_at = now() WHERE job_key = $1",
    )
    .bind(&part)
    .execute(&mut *finish)
    .await
    .unwrap();
    finish.commit().await.unwrap();
    let done = operator.await.unwrap().unwrap();
    assert!(done.is_ok(), "{done:?}");
    let states: Vec<String> = rows(&db.pool, KEY).await.into_iter().map(|r| r.1).collect();
    assert_eq!(states, ["FAILED", "SKIPPED", "FAILED"]);
    batchonce::testing::assert_lists_in_step(&db.pool).await;
}
