//! Issue 42, item 5, under real logins (one per role of `batchonce roles`):
//!
//! - each process writes only its own registry rows: a worker login can
//!   neither rewrite nor delete the producer's `batch_worker` and
//!   `batch_process_config` rows, nor another worker login's, while the
//!   previous release's plain SQL on its own row keeps working;
//! - one bad registry row is reported, never takes a view down: the
//!   exporter still serves its gauges, the console's overview answers 200
//!   and `status` exits 0, each naming the row;
//! - ending a session: an operator login ends only a session that holds an
//!   open fence of the run it acts on, and only after a committed audit row
//!   names that session.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use batchonce::queue::{self, ClaimSpec, NewRun};
use batchonce::runtime::worker_registry::{self, Role};
use batchonce::testing::{wait_until, TestDb};
use batchonce::{Clock, JobConfig, JobKey, JobName};
use chrono::NaiveDate;
use sqlx::PgPool;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");
const PASSWORD: &str = "registry-test-password";

fn run(url: &str, args: &[&str]) -> Output {
    common::logins::run(BIN, url, common::samples_config(), args)
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A second login in the group role `group`, as another process of the
/// same kind would have.
async fn second_login(db: &TestDb, group: &str, name: &str) -> PgPool {
    sqlx::query(&format!(
        "CREATE ROLE {name} LOGIN PASSWORD '{PASSWORD}' IN ROLE {group}"
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let mut u = url::Url::parse(&db.url).unwrap();
    u.set_username(name).unwrap();
    u.set_password(Some(PASSWORD)).unwrap();
    batchonce::db::connect(u.as_str(), "stolen-registry-test", 1)
        .await
        .unwrap()
}

fn sqlstate(e: &sqlx::Error) -> Option<String> {
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
}

async fn rows(pool: &PgPool, sql: &str) -> u64 {
    sqlx::query(sql)
        .execute(pool)
        .await
        .unwrap()
        .rows_affected()
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_writes_only_its_own_registry_rows() {
    let db = TestDb::empty().await;
    let logins = common::logins::Logins::apply(BIN, &db, common::samples_config()).await;
    let producer = logins.pool("producer").await;
    let worker = logins.pool("worker").await;
    let other = second_login(
        &db,
        &logins.role("worker"),
        &format!("{}_w2", logins.prefix),
    )
    .await;
    let job = JobName::parse("daily-settlement").unwrap();
    let cfg = JobConfig::default();

    // The producer and a worker register as the engine does.
    worker_registry::register_process(
        &producer,
        "producer-a",
        Role::Producer,
        "1",
        Duration::from_secs(60),
        &[(job.clone(), &cfg)],
    )
    .await
    .unwrap();
    worker_registry::register_process(
        &other,
        "worker-b",
        Role::Worker,
        "1",
        Duration::from_secs(60),
        &[(job.clone(), &cfg)],
    )
    .await
    .unwrap();
    let owners: Vec<(String, String)> =
        sqlx::query_as("SELECT worker_id::text, registered_by FROM batch_worker ORDER BY 1")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        owners,
        [
            ("producer-a".to_owned(), logins.role("producer")),
            ("worker-b".to_owned(), format!("{}_w2", logins.prefix)),
        ]
    );

    // The worker login sees every row, but its writes to others' rows
    // change nothing (updates and deletes) or are refused (inserts).
    assert_eq!(count(&worker, "SELECT count(*) FROM batch_worker").await, 2);
    for victim in ["producer-a", "worker-b"] {
        assert_eq!(
            rows(&worker, &format!("UPDATE batch_worker SET live_until = 'infinity', last_seen = 'infinity' WHERE worker_id = '{victim}'")).await,
            0,
            "{victim}"
        );
        assert_eq!(
            rows(&worker, &format!("UPDATE batch_process_config SET settings = '[1]' WHERE process_id = '{victim}'")).await,
            0,
            "{victim}"
        );
        assert_eq!(
            rows(
                &worker,
                &format!("DELETE FROM batch_process_config WHERE process_id = '{victim}'")
            )
            .await,
            0,
            "{victim}"
        );
        assert_eq!(
            rows(
                &worker,
                &format!("DELETE FROM batch_worker WHERE worker_id = '{victim}'")
            )
            .await,
            0,
            "{victim}"
        );
        // Re-registering under another login's id is refused, not a takeover.
        let e = worker_registry::register(&worker, victim, "evil")
            .await
            .unwrap_err();
        assert_eq!(sqlstate(&e).as_deref(), Some("42501"), "{victim}: {e}");
        // A configuration under another process's name is refused.
        let e = sqlx::query(&format!(
            "INSERT INTO batch_process_config (process_id, job_name, fingerprint, settings) \
             VALUES ('{victim}', 'inventory-sync', left(md5('{{}}'::jsonb::text), 16), '{{}}')"
        ))
        .execute(&worker)
        .await
        .unwrap_err();
        assert_eq!(sqlstate(&e).as_deref(), Some("42501"), "{victim}: {e}");
    }
    // Nor can a row claim to be another login's.
    let e = sqlx::query(&format!(
        "INSERT INTO batch_worker (worker_id, host, pid, version, registered_by) \
         VALUES ('forged', 'h', 1, '1', '{}')",
        logins.role("producer")
    ))
    .execute(&worker)
    .await
    .unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("42501"), "{e}");
    let e = sqlx::query(&format!(
        "UPDATE batch_worker SET registered_by = '{}' WHERE worker_id = 'worker-b'",
        logins.role("producer")
    ))
    .execute(&other)
    .await
    .unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("42501"), "{e}");
    let untouched: (String, bool, i64) = sqlx::query_as(
        "SELECT w.registered_by, w.live_until < now() + interval '1 day', \
                (SELECT count(*) FROM batch_process_config c WHERE c.process_id = w.worker_id) \
         FROM batch_worker w WHERE worker_id = 'producer-a'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(untouched, (logins.role("producer"), true, 1));
    assert_eq!(
        count(&db.pool, "SELECT count(*) FROM batch_worker").await,
        2
    );

    // The previous release's plain SQL on its own row works under the
    // worker login: the column default records it.
    assert_eq!(
        rows(
            &worker,
            "INSERT INTO batch_worker (worker_id, host, pid, version, started_at, last_seen) \
             VALUES ('old-release', 'h', 7, '0.9', now(), now()) \
             ON CONFLICT (worker_id) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid, \
                 version = EXCLUDED.version, started_at = now(), last_seen = now()"
        )
        .await,
        1
    );
    assert_eq!(
        rows(
            &worker,
            "UPDATE batch_worker SET last_seen = now() WHERE worker_id = 'old-release'"
        )
        .await,
        1
    );
    assert_eq!(
        rows(
            &worker,
            "DELETE FROM batch_worker WHERE worker_id = 'old-release'"
        )
        .await,
        1
    );
    // This release's own lifecycle too: register, touch, deregister.
    worker_registry::register_process(
        &worker,
        "worker-a",
        Role::Worker,
        "1",
        Duration::from_secs(60),
        &[(job.clone(), &cfg)],
    )
    .await
    .unwrap();
    worker_registry::touch(&worker, "worker-a", "1", Duration::from_secs(60))
        .await
        .unwrap();
    worker_registry::deregister(&worker, "worker-a")
        .await
        .unwrap();
    assert_eq!(
        count(
            &db.pool,
            "SELECT count(*) FROM batch_worker WHERE worker_id = 'worker-a'"
        )
        .await,
        0
    );

    // A row written before rows recorded their writer is claimed by the
    // first login to update it; the rows of processes gone for over 30
    // days are pruned by whoever registers next.
    sqlx::query(
        "INSERT INTO batch_worker (worker_id, host, pid, version, registered_by, live_until, last_seen) \
         VALUES ('legacy', 'h', 1, '1', NULL, now() - interval '1 minute', now() - interval '2 minutes'), \
                ('long-gone', 'h', 1, '1', 'someone_else', now() - interval '31 days', now() - interval '31 days')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    worker_registry::touch(&worker, "legacy", "1", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        sqlx::query_scalar::<_, Option<String>>(
            "SELECT registered_by FROM batch_worker WHERE worker_id = 'legacy'"
        )
        .fetch_one(&db.pool)
        .await
        .unwrap(),
        Some(logins.role("worker"))
    );
    worker_registry::register(&worker, "worker-a", "1")
        .await
        .unwrap();
    assert_eq!(
        count(
            &db.pool,
            "SELECT count(*) FROM batch_worker WHERE worker_id = 'long-gone'"
        )
        .await,
        0
    );
}

/// One HTTP/1.1 GET: the status code and the body.
fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let resp = String::from_utf8_lossy(&buf).into_owned();
    let code = resp.split_whitespace().nth(1)?.parse().ok()?;
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((code, body))
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The console, served in this process on `pool`, behind a proxy that
/// names the user in a header.
async fn console(pool: PgPool) -> SocketAddr {
    use batchonce::console::auth::{hash_password, Role as UserRole, Users};
    use batchonce::console::{router, ConsoleOptions, ProxyAuth};
    let users = Users::from_hashes(&[("vera", UserRole::Viewer, hash_password(PASSWORD).unwrap())]);
    let app = router(
        pool,
        ConsoleOptions {
            proxy: Some(ProxyAuth {
                user_header: "x-user".into(),
                secret: PASSWORD.into(),
            }),
            secure_cookies: Some(false),
            ..ConsoleOptions::new("127.0.0.1:0".parse().unwrap(), users)
        },
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await;
    });
    addr
}

async fn console_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        get(
            addr,
            &path,
            &[("x-user", "vera"), ("x-batchonce-proxy-secret", PASSWORD)],
        )
        .unwrap_or((0, "no answer".into()))
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_registry_row_is_reported_and_never_takes_a_view_down() {
    let db = TestDb::empty().await;
    let logins = common::logins::Logins::apply(BIN, &db, common::samples_config()).await;
    let producer = logins.pool("producer").await;
    let worker = logins.pool("worker").await;
    let job = JobName::parse("daily-settlement").unwrap();
    let cfg = JobConfig::default();

    // A run, so the gauges have something to say, and a sound producer
    // that declares its job.
    let key = JobKey::parse("daily-settlement:2026-09-15").unwrap();
    let day = NaiveDate::from_ymd_opt(2026, 9, 15).unwrap();
    queue::enqueue(&db.pool, &[NewRun::new(key, day, &cfg).unwrap()], Clock::Db)
        .await
        .unwrap();
    worker_registry::register_process(
        &producer,
        "producer-a",
        Role::Producer,
        "1",
        Duration::from_secs(600),
        &[(job.clone(), &cfg)],
    )
    .await
    .unwrap();

    // A stolen worker login writes hostile rows, each its own: a process
    // whose times no process wrote, with an escape sequence in its id, and
    // a live process whose configurations are no job name, settings that
    // are no object (beside the producer's, for the same job: drift) and a
    // fingerprint not of its settings. Also an old release's row (no
    // live_until), which is sound and shown as not live.
    let evil = "evil\u{1b}[31m-times";
    sqlx::query(
        "INSERT INTO batch_worker (worker_id, host, pid, version, started_at, last_seen, live_until) \
         VALUES ($1, 'h', 1, '1', 'infinity', 'infinity', 'infinity'), \
                ('evil-config', 'h', 2, '1', now(), now(), now() + interval '10 minutes'), \
                ('old-release', 'h', 3, '0.9', now(), now(), NULL)",
    )
    .bind(evil)
    .execute(&worker)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO batch_process_config (process_id, job_name, fingerprint, settings) VALUES \
           ('evil-config', 'Not A Job', left(md5('{}'::jsonb::text), 16), '{}'), \
           ('evil-config', 'daily-settlement', left(md5('[1, 2]'::jsonb::text), 16), '[1, 2]'), \
           ('evil-config', 'inventory-sync', '0000000000000000', '{\"a\": 1}'), \
           ($1, 'notification-send', left(md5('{}'::jsonb::text), 16), '{}')",
    )
    .bind(evil)
    .execute(&worker)
    .await
    .unwrap();

    // `status` (as the read-only login) exits 0 and names the bad rows,
    // escaped.
    let out = run(&logins.url("readonly"), &["status"]);
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(
        shown.contains("registry: left out batch_process_config row of process evil-config, job Not A Job: job_name is not a job name"),
        "{shown}"
    );
    assert!(
        shown.contains("registry: left out batch_process_config row of process evil-config, job daily-settlement: settings are not a JSON object"),
        "{shown}"
    );
    assert!(
        shown.contains("registry: left out batch_process_config row of process evil-config, job inventory-sync: fingerprint is not that of its settings"),
        "{shown}"
    );
    assert!(
        shown.contains("registry: left out batch_worker row of process evil\\x1b[31m-times: started_at or last_seen is not a time a process wrote"),
        "{shown}"
    );
    assert!(!shown.contains('\u{1b}'), "{shown}");
    assert!(!shown.contains("old-release"), "{shown}");
    assert!(shown.contains("daily-settlement"), "{shown}");
    let out = run(&logins.url("readonly"), &["--json", "status"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["registry_left_out_count"], 4, "{v}");
    let out = run(&logins.url("readonly"), &["runs", "stale"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // The exporter (as the read-only login) serves its gauges and counts
    // the rows it left out.
    let addr = free_addr();
    let log = std::fs::File::create(std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(
        format!("stolen-registry-exporter-{}.log", std::process::id()),
    ))
    .unwrap();
    let _exporter = Killed(
        Command::new(BIN)
            .env("DATABASE_URL", logins.url("readonly"))
            .env("BATCHONCE_CONFIG", common::samples_config())
            .args([
                "exporter",
                "--interval",
                "200ms",
                "--metrics-addr",
                &addr.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let mut metrics = String::new();
    wait_until("the exporter's gauges", Duration::from_secs(30), || {
        let got = get(addr, "/metrics", &[]);
        let done = got
            .as_ref()
            .is_some_and(|(_, b)| b.contains("batchonce_exporter_last_success_timestamp_seconds"));
        if let Some((_, b)) = got {
            metrics = b;
        }
        async move { done }
    })
    .await;
    assert!(
        metrics.contains(r#"batchonce_runs{job="daily-settlement",status="PENDING"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"batchonce_config_fingerprints{job="daily-settlement"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("batchonce_registry_rows_left_out 4"),
        "{metrics}"
    );
    assert!(!metrics.contains("Not A Job"), "{metrics}");

    // The console (as the console login) answers 200 on the overview and
    // the workers page, naming the rows; the sound ones are all there.
    let addr = console(logins.pool("console").await).await;
    let (code, page) = console_get(addr, "/").await;
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("Registry rows left out: 4"), "{page}");
    assert!(
        page.contains("evil-config, job Not A Job: job_name is not a job name"),
        "{page}"
    );
    assert!(page.contains("producer-a"), "{page}");
    assert!(page.contains("daily-settlement:2026-09-15"), "{page}");
    let (code, page) = console_get(addr, "/workers").await;
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("old-release"), "{page}");
    assert!(page.contains("Registry rows left out: 4"), "{page}");
}

/// `roles --apply` has made the terminator, a role no login holds, the
/// owner of the audited end of a session, and taken pg_signal_backend from
/// the operator and the console.
async fn assert_terminator_owns_the_end_of_sessions(db: &TestDb, logins: &common::logins::Logins) {
    let owner: String = sqlx::query_scalar(
        "SELECT proowner::regrole::text FROM pg_proc WHERE proname = 'batchonce_operator_terminate'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(owner, logins.role("terminator"));
    for part in ["operator", "console"] {
        let signals: bool =
            sqlx::query_scalar("SELECT pg_has_role($1, 'pg_signal_backend', 'MEMBER')")
                .bind(logins.role(part))
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert!(!signals, "{part} may still signal any session");
    }
}

/// A session in an open transaction, as a fence holder or a stranger:
/// its pid and transaction start.
async fn session_in_transaction(
    conn: &mut sqlx::PgConnection,
) -> (i32, chrono::DateTime<chrono::Utc>) {
    sqlx::query_as("SELECT pg_backend_pid(), now()")
        .fetch_one(conn)
        .await
        .unwrap()
}

async fn alive(pool: &PgPool, pid: i32) -> bool {
    count(
        pool,
        &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}"),
    )
    .await
        == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_ends_only_an_audited_fence_holder_of_its_run() {
    let db = TestDb::empty().await;
    let logins = common::logins::Logins::apply(BIN, &db, common::samples_config()).await;
    assert_terminator_owns_the_end_of_sessions(&db, &logins).await;
    let worker = batchonce::db::connect(&logins.url("worker"), "fence-holder", 2)
        .await
        .unwrap();
    let operator = logins.pool("operator").await;
    let cfg = JobConfig::default();
    let key = "daily-settlement:2026-09-15";
    let day = NaiveDate::from_ymd_opt(2026, 9, 15).unwrap();
    queue::enqueue(
        &db.pool,
        &[NewRun::new(JobKey::parse(key).unwrap(), day, &cfg).unwrap()],
        Clock::Db,
    )
    .await
    .unwrap();
    let lease = queue::claim(
        &worker,
        "w-holder",
        &[ClaimSpec {
            job: JobName::parse("daily-settlement").unwrap(),
            lease_ttl: Duration::from_secs(3600),
        }],
        1,
        Clock::Db,
    )
    .await
    .unwrap()
    .remove(0);
    let fenced = queue::begin_fenced(
        &worker,
        &lease.fence(),
        Duration::from_secs(3600),
        Clock::Db,
    )
    .await
    .unwrap();
    let holder = fenced.session();
    // A stranger: another session of the cluster, in a transaction, that
    // holds no fence (the migrator's own, say).
    let stranger_pool = logins.pool("migrator").await;
    let mut stranger = stranger_pool.begin().await.unwrap();
    let (spid, sstart) = session_in_transaction(&mut stranger).await;

    // No pg_signal_backend: the operator cannot end anyone directly.
    for pid in [spid, holder.pid] {
        let e = sqlx::query(&format!("SELECT pg_terminate_backend({pid})"))
            .execute(&operator)
            .await
            .unwrap_err();
        assert_eq!(sqlstate(&e).as_deref(), Some("42501"), "{e}");
    }
    // Nor through the functions: a session that holds no fence of the run
    // may be named in an audit row, but it is not ended: refused, nothing
    // terminated.
    let audit = |pids: Vec<i32>, starts: Vec<chrono::DateTime<chrono::Utc>>| {
        let operator = operator.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT batchonce_operator_audit_terminate_sessions($1, 'mallory', 'because', 'detail', $2, $3)",
            )
            .bind(key)
            .bind(pids)
            .bind(starts)
            .fetch_one(&operator)
            .await
        }
    };
    let terminate = |id: i64| {
        let operator = operator.clone();
        async move {
            sqlx::query_scalar::<_, i32>("SELECT * FROM batchonce_operator_terminate($1)")
                .bind(id)
                .fetch_all(&operator)
                .await
        }
    };
    let id = audit(vec![spid], vec![sstart]).await.unwrap();
    let e = terminate(id).await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("42501"), "{e}");
    assert!(e.to_string().contains("holds no open fence"), "{e}");
    assert!(alive(&db.pool, spid).await);
    // The holder's pid with another transaction start is not the holder:
    // nothing is ended.
    let id = audit(vec![holder.pid], vec![sstart]).await.unwrap();
    assert_eq!(terminate(id).await.unwrap(), Vec::<i32>::new());
    assert!(alive(&db.pool, holder.pid).await);
    // Without a committed audit row naming it, nothing is ended: no row,
    // or a row written in the same transaction.
    let e = terminate(12345).await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("42501"), "{e}");
    let mut tx = operator.begin().await.unwrap();
    let id: i64 = sqlx::query_scalar(
        "SELECT batchonce_operator_audit_terminate_sessions($1, 'mallory', 'because', 'detail', $2, $3)",
    )
    .bind(key)
    .bind(vec![holder.pid])
    .bind(vec![holder.xact_start])
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let e = sqlx::query_scalar::<_, i32>("SELECT * FROM batchonce_operator_terminate($1)")
        .bind(id)
        .fetch_all(&mut *tx)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("42501"), "{e}");
    assert!(e.to_string().contains("not committed"), "{e}");
    tx.rollback().await.unwrap();
    assert!(alive(&db.pool, holder.pid).await);
    assert!(alive(&db.pool, spid).await);
    let before: i64 = count(
        &db.pool,
        "SELECT coalesce(max(id), 0) FROM batch_operator_action",
    )
    .await;

    // The real thing: `runs fail --terminate-blocker` as the operator login
    // waits for the fence holder, audits it, ends it and fails the run.
    // Like a worker whose handler failed, the holder's worker sends its next
    // statement once the session is gone (and waits behind the action).
    let next = {
        let (pool, db_pool, token) = (worker.clone(), db.pool.clone(), lease.token);
        tokio::spawn(async move {
            wait_until("the fence holder is ended", Duration::from_secs(30), || {
                let p = db_pool.clone();
                async move { !alive(&p, holder.pid).await }
            })
            .await;
            sqlx::query_scalar::<_, i32>("SELECT batchonce_fence_commit($1, $2, 0, 0, 60, NULL)")
                .bind(key)
                .bind(token)
                .fetch_one(&pool)
                .await
        })
    };
    let out = run(
        &logins.url("operator"),
        &[
            "runs",
            "fail",
            key,
            "--force",
            "--operator",
            "alice",
            "--reason",
            "stuck",
            "--lock-timeout",
            "2s",
            "--terminate-blocker",
        ],
    );
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(
        shown.contains(&format!("terminated session {}", holder.pid)),
        "{shown}"
    );
    wait_until("the fence holder is gone", Duration::from_secs(10), || {
        let pool = db.pool.clone();
        async move { !alive(&pool, holder.pid).await }
    })
    .await;
    assert!(alive(&db.pool, spid).await, "the stranger lives on");
    let audit_rows: Vec<(String, Option<Vec<i32>>)> = sqlx::query_as(
        "SELECT action::text, target_pids FROM batch_operator_action WHERE id > $1 ORDER BY id",
    )
    .bind(before)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        audit_rows,
        [
            ("terminate-blocker".to_owned(), Some(vec![holder.pid])),
            ("fail".to_owned(), None)
        ]
    );
    let status: String =
        sqlx::query_scalar("SELECT status::text FROM batch_job_run WHERE job_key = $1")
            .bind(key)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(status, "FAILED");
    // The worker's late commit finds the run taken over.
    assert_eq!(next.await.unwrap().unwrap(), 0);
    // The committed audit row cannot be used again on the stranger: it
    // names only the holder, who is gone.
    let used: i64 = sqlx::query_scalar(
        "SELECT max(id) FROM batch_operator_action WHERE action = 'terminate-blocker'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(terminate(used).await.unwrap().is_empty());
    assert!(alive(&db.pool, spid).await);
    drop(fenced);
    stranger.rollback().await.unwrap();
}
