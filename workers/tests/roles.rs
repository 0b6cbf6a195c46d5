//! Least privilege: `batchonce roles --apply` before and after `migrate`
//! (run by the migrator role, which then owns the tables), then every part
//! of the system under its own role: the producer enqueues, a worker settles
//! a date, an operator re-runs, the read-only role inspects, and each is
//! refused what it must not do (deleting items, rewriting the audit trail).

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use batchonce::testing::{wait_for_status, TestDb};
use batchonce_workers::settlement;
use chrono::NaiveDate;

mod common;

use common::ok;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");

/// The URL of `url`'s server as `user`, who logs in with `password`: the
/// private test cluster lets nobody in without one (SCRAM).
fn as_user(url: &str, user: &str, password: &str) -> String {
    let mut u = url::Url::parse(url).unwrap();
    u.set_username(user).unwrap();
    u.set_password(Some(password)).unwrap();
    u.to_string()
}

fn run(url: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .env("DATABASE_URL", url)
        .env("BATCHONCE_CONFIG", common::samples_config())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

async fn denied(url: &str, sql: &str) {
    let pool = batchonce::db::connect(url, "roles-test", 1).await.unwrap();
    let err = sqlx::query(sql).execute(&pool).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("permission denied") || msg.contains("append-only"),
        "{sql}: {msg}"
    );
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_part_runs_under_its_own_least_privilege_role() {
    let db = TestDb::empty().await;
    let prefix = format!("bo_t{:08x}", rand::random::<u32>());
    let role = |part: &str| format!("{prefix}_{part}");
    // 1. Roles first: the migrator must exist before it creates tables.
    let out = run(&db.url, &["roles", "--prefix", &prefix, "--apply"]);
    ok(&out);
    let admin = &db.pool;
    // Alphanumeric, so it needs no quoting in SQL or in a URL.
    let password = format!(
        "pw{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    );
    for part in [
        "migrator", "producer", "worker", "operator", "readonly", "program", "console",
    ] {
        sqlx::query(&format!(
            "ALTER ROLE {} LOGIN PASSWORD '{password}'",
            role(part)
        ))
        .execute(admin)
        .await
        .unwrap();
    }
    let url = |part: &str| as_user(&db.url, &role(part), &password);
    // 2. The migrator creates (and owns) every table.
    ok(&run(&url("migrator"), &["migrate"]));
    let owner: String = sqlx::query_scalar(
        "SELECT tableowner::text FROM pg_tables WHERE tablename = 'settlement_item'",
    )
    .fetch_one(admin)
    .await
    .unwrap();
    assert_eq!(owner, role("migrator"));
    // 3. Grants on what now exists; applying twice changes nothing.
    ok(&run(&db.url, &["roles", "--prefix", &prefix, "--apply"]));
    ok(&run(&db.url, &["roles", "--prefix", &prefix, "--apply"]));

    // Source data, as the application would write it.
    let date = NaiveDate::from_ymd_opt(2026, 9, 15).unwrap();
    let (start, end) = settlement::day_bounds(date, chrono_tz::Asia::Seoul);
    sqlx::query(
        "INSERT INTO orders (order_id, merchant_id, amount_minor, paid_at) \
         SELECT g, 1 + g % 5, 100 + g, $1 + ($2 - $1) * ((g - 1)::float8 / 300) FROM generate_series(1, 300) g",
    )
    .bind(start)
    .bind(end)
    .execute(admin)
    .await
    .unwrap();

    // The producer enqueues, and may not touch a run otherwise.
    ok(&run(
        &url("producer"),
        &["enqueue", "daily-settlement", "--date", "2026-09-15"],
    ));
    denied(
        &url("producer"),
        "UPDATE batch_job_run SET status = 'FAILED'",
    )
    .await;
    denied(&url("producer"), "DELETE FROM batch_job_run").await;
    // A finished run inserted directly would block its period forever.
    denied(
        &url("producer"),
        "INSERT INTO batch_job_run (job_key, job_name, business_date, max_attempts, status) \
         VALUES ('daily-settlement:2030-01-01', 'daily-settlement', '2030-01-01', 1, 'SUCCEEDED')",
    )
    .await;
    denied(
        &url("producer"),
        "SELECT * FROM batchonce_claim(ARRAY['daily-settlement'], ARRAY[30::float8], 1, 'p', NULL)",
    )
    .await;
    // An application enqueues as the producer too: the function is its to
    // call (it refuses here only because no live process declares the job).
    {
        let pool = batchonce::db::connect(&url("producer"), "roles-test", 1)
            .await
            .unwrap();
        let err = sqlx::query(
            "SELECT * FROM batchonce_enqueue_declared('undeclared-job', ARRAY[DATE '2026-09-15'])",
        )
        .execute(&pool)
        .await
        .unwrap_err();
        let code = err
            .as_database_error()
            .and_then(|d| d.code().map(|c| c.into_owned()));
        assert_eq!(code.as_deref(), Some("BO002"), "{err}");
        pool.close().await;
    }
    denied(
        &url("program"),
        "SELECT * FROM batchonce_enqueue_declared('daily-settlement', ARRAY[DATE '2026-09-15'])",
    )
    .await;

    // A worker settles the date.
    let mut worker = Command::new(BIN)
        .env("DATABASE_URL", url("worker"))
        .env("BATCHONCE_CONFIG", common::samples_config())
        .args([
            "worker",
            "--worker-id",
            "least-priv",
            "--poll-interval",
            "200ms",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_status(&db.pool, None, &["SUCCEEDED"], Duration::from_secs(60)).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(worker.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = worker.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(worker.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{err}");
    assert!(!err.contains("permission denied"), "{err}");
    let v = settlement::verify(admin, chrono_tz::Asia::Seoul, date)
        .await
        .unwrap();
    assert!(v.ok, "{}", v.detail);
    // The worker writes items but never deletes them, nor runs or history.
    denied(&url("worker"), "DELETE FROM settlement_item").await;
    denied(&url("worker"), "TRUNCATE settlement_item").await;
    denied(&url("worker"), "DELETE FROM batch_job_run").await;
    denied(&url("worker"), "INSERT INTO batch_job_run (job_key, job_name, business_date, max_attempts) VALUES ('x:2026-01-01', 'x', '2026-01-01', 1)").await;
    denied(&url("worker"), "INSERT INTO batch_operator_action (operator, action, job_key, reason, before_status, after_status) VALUES ('w', 'fail', 'daily-settlement:2026-09-15', 'r', 'RUNNING', 'FAILED')").await;
    // Nor changes a run, or learns another run's token, but through the
    // functions that take its lease token; nor writes the application's
    // source tables.
    denied(
        &url("worker"),
        "UPDATE batch_job_run SET status = 'SUCCEEDED' WHERE job_key = 'daily-settlement:2026-09-15'",
    )
    .await;
    denied(&url("worker"), "SELECT lease_token FROM batch_job_run").await;
    denied(
        &url("worker"),
        "UPDATE batch_job_attempt SET outcome = 'succeeded'",
    )
    .await;
    denied(&url("worker"), "UPDATE orders SET amount_minor = 0").await;
    denied(
        &url("worker"),
        "INSERT INTO orders (order_id, merchant_id, amount_minor, paid_at) VALUES (999999, 1, 1, now())",
    )
    .await;
    denied(
        &url("worker"),
        "SELECT batchonce_operator_hold_row('daily-settlement:2026-09-15')",
    )
    .await;

    // The operator acts through the audited commands, and cannot rewrite
    // the audit trail or delete items.
    let out = ok(&run(
        &url("operator"),
        &[
            "runs",
            "rerun",
            "daily-settlement:2026-09-15",
            "--force",
            "--reason",
            "least privilege drill",
            "--operator",
            "kim",
        ],
    ));
    assert!(out.contains("PENDING"), "{out}");
    ok(&run(&url("operator"), &["runs", "stale"]));
    denied(
        &url("operator"),
        "UPDATE batch_operator_action SET reason = 'nothing happened'",
    )
    .await;
    denied(&url("operator"), "DELETE FROM batch_operator_action").await;
    denied(&url("operator"), "DELETE FROM settlement_item").await;
    // No state change but the audited one, and no audit row of its own
    // making (back-dated, naming another session).
    denied(
        &url("operator"),
        "UPDATE batch_job_run SET status = 'FAILED' WHERE job_key = 'daily-settlement:2026-09-15'",
    )
    .await;
    denied(
        &url("operator"),
        "INSERT INTO batch_operator_action (at, operator, session_user_name, action, job_key, reason, before_status, after_status) \
         VALUES ('2020-01-01', 'kim', 'somebody_else', 'fail', 'daily-settlement:2026-09-15', 'r', 'RUNNING', 'FAILED')",
    )
    .await;
    denied(
        &url("operator"),
        "SELECT * FROM batchonce_finish(ARRAY['daily-settlement:2026-09-15'], ARRAY[1::bigint], ARRAY['succeeded'], ARRAY[NULL::text], ARRAY[0::float8], NULL)",
    )
    .await;
    let actions: i64 = sqlx::query_scalar("SELECT count(*) FROM batch_operator_action")
        .fetch_one(admin)
        .await
        .unwrap();
    assert_eq!(actions, 1);
    // Even the owner cannot rewrite history: the trigger refuses.
    denied(&url("migrator"), "DELETE FROM batch_operator_action").await;
    // And the database stamps every audit row with its own time and
    // session, whatever the client sends, the owner included.
    let owner_pool = batchonce::db::connect(&url("migrator"), "roles-test", 1)
        .await
        .unwrap();
    let (at_recent, who): (bool, String) = sqlx::query_as(
        "INSERT INTO batch_operator_action (at, operator, session_user_name, action, job_key, reason, before_status, after_status) \
         VALUES ('2020-01-01', 'kim', 'somebody_else', 'skip', 'daily-settlement:2026-09-15', 'a drill', 'PENDING', 'PENDING') \
         RETURNING at > now() - interval '1 minute', session_user_name",
    )
    .fetch_one(&owner_pool)
    .await
    .unwrap();
    owner_pool.close().await;
    assert!(at_recent, "a back-dated audit row was kept");
    assert_eq!(who, role("migrator"));

    // A worker holding a lease, and the narrower role of a command job's
    // program: the fence and its progress, for the token it was given, and
    // nothing else.
    ok(&run(
        &url("producer"),
        &["enqueue", "daily-settlement", "--date", "2026-09-16"],
    ));
    let worker_pool = batchonce::db::connect(&url("worker"), "roles-test", 1)
        .await
        .unwrap();
    let (key, token): (String, i64) = sqlx::query_as(
        "SELECT job_key, lease_token FROM batchonce_claim(ARRAY['daily-settlement'], ARRAY[30::float8], 1, 'roles-test', NULL)",
    )
    .fetch_one(&worker_pool)
    .await
    .unwrap();
    // Presenting any other token changes nothing.
    let finished: Vec<String> = sqlx::query_scalar(
        "SELECT job_key FROM batchonce_finish(ARRAY[$1], ARRAY[$2::bigint], ARRAY['succeeded'], ARRAY[NULL::text], ARRAY[0::float8], NULL)",
    )
    .bind(&key)
    .bind(token ^ 1)
    .fetch_all(&worker_pool)
    .await
    .unwrap();
    assert!(finished.is_empty());
    worker_pool.close().await;
    let before: i64 =
        sqlx::query_scalar("SELECT processed_count FROM batch_job_run WHERE job_key = $1")
            .bind(&key)
            .fetch_one(admin)
            .await
            .unwrap();
    let program = batchonce::db::connect(&url("program"), "roles-test", 1)
        .await
        .unwrap();
    let mut tx = program.begin().await.unwrap();
    sqlx::query("SELECT batchonce_fence($1, $2)")
        .bind(&key)
        .bind(token)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("SELECT batchonce_progress($1, $2, 7)")
        .bind(&key)
        .bind(token)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let bad = sqlx::query("SELECT batchonce_progress($1, $2, 7)")
        .bind(&key)
        .bind(token ^ 1)
        .execute(&program)
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("lease lost"), "{bad}");
    program.close().await;
    let (status, processed): (String, i64) =
        sqlx::query_as("SELECT status, processed_count FROM batch_job_run WHERE job_key = $1")
            .bind(&key)
            .fetch_one(admin)
            .await
            .unwrap();
    assert_eq!((status.as_str(), processed), ("RUNNING", before + 7));
    denied(
        &url("program"),
        "UPDATE batch_job_run SET status = 'SUCCEEDED'",
    )
    .await;
    denied(&url("program"), "SELECT * FROM orders").await;
    denied(&url("program"), "SELECT lease_token FROM batch_job_run").await;
    denied(
        &url("program"),
        "SELECT * FROM batchonce_finish(ARRAY['x:1'], ARRAY[1::bigint], ARRAY['succeeded'], ARRAY[NULL::text], ARRAY[0::float8], NULL)",
    )
    .await;
    // A role that was granted nothing calls none of the engine's functions:
    // none is executable by PUBLIC.
    sqlx::query(&format!(
        "CREATE ROLE {prefix}_nobody LOGIN PASSWORD '{password}'"
    ))
    .execute(admin)
    .await
    .unwrap();
    sqlx::query(&format!("GRANT USAGE ON SCHEMA public TO {prefix}_nobody"))
        .execute(admin)
        .await
        .unwrap();
    for f in [
        "SELECT batchonce_fence('x:1', 1)",
        "SELECT batchonce_new_token()",
        "SELECT * FROM batchonce_attempt_output('x:1', 1, 'o')",
        "SELECT * FROM batchonce_enqueue_declared('x', ARRAY[DATE '2026-09-15'])",
        "SELECT batchonce_start_of_day(DATE '2026-09-15', 'UTC')",
        "SELECT * FROM batchonce_due_runs(ARRAY['x'], 1, now())",
        "SELECT * FROM batchonce_enqueue(ARRAY[]::text[], ARRAY[]::text[], ARRAY[]::date[], ARRAY[]::int[], ARRAY[]::jsonb[], NULL, ARRAY[]::text[], ARRAY[]::text[], ARRAY[]::timestamptz[], ARRAY[]::timestamptz[], ARRAY[]::text[], ARRAY[]::float8[], ARRAY[]::float8[], ARRAY[]::text[], ARRAY[]::int[], ARRAY[]::float8[], ARRAY[]::float8[], ARRAY[]::bigint[], ARRAY[]::int[])",
    ] {
        denied(&as_user(&db.url, &format!("{prefix}_nobody"), &password), f).await;
    }

    // The read-only role inspects and changes nothing.
    ok(&run(&url("readonly"), &["status"]));
    ok(&run(&url("readonly"), &["runs", "list"]));
    let out = run(
        &url("readonly"),
        &["enqueue", "daily-settlement", "--date", "2026-09-16"],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("permission denied"), "{err}");
    denied(&url("readonly"), "UPDATE batch_job_run SET attempts = 0").await;

    // The console's role reads everything and acts only through the
    // operator's audited functions: no direct write, no audit row of its own.
    ok(&run(&url("console"), &["status"]));
    ok(&run(&url("console"), &["runs", "list"]));
    denied(&url("console"), "UPDATE batch_job_run SET attempts = 0").await;
    denied(
        &url("console"),
        "INSERT INTO batch_operator_action (operator, action, job_key, reason, before_status, after_status) \
         VALUES ('x', 'fail', 'daily-settlement:2026-09-15', 'r', 'FAILED', 'FAILED')",
    )
    .await;
    denied(&url("console"), "DELETE FROM batch_operator_action").await;

    // The roles are global to the server: remove them with the database.
    let server = batchonce::testing::server().to_owned();
    drop(db);
    let admin = batchonce::db::connect(&server, "roles-test", 1)
        .await
        .unwrap();
    sqlx::query(&format!("DROP ROLE IF EXISTS {prefix}_nobody"))
        .execute(&admin)
        .await
        .unwrap();
    for part in [
        "migrator", "producer", "worker", "operator", "readonly", "program", "console",
    ] {
        sqlx::query(&format!("DROP ROLE IF EXISTS {}", role(part)))
            .execute(&admin)
            .await
            .unwrap();
    }
}

#[test]
fn roles_prints_sql_and_refuses_a_bad_prefix() {
    let out = Command::new(BIN).args(["roles"]).output().unwrap();
    let sql = ok(&out);
    assert!(sql.contains("CREATE ROLE \"batchonce_worker\" NOLOGIN"));
    assert!(sql.contains("GRANT CREATE ON SCHEMA \"public\" TO \"batchonce_migrator\""));
    let out = Command::new(BIN)
        .args(["roles", "--prefix", "x; DROP TABLE batch_job_run"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("invalid role prefix"), "{err}");
}
