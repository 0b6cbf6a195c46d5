//! The settlement workload through PgBouncer in transaction pooling mode
//! (Debian's `pgbouncer`, which `.ci/run` installs): the producer's enqueue
//! and two worker processes reach PostgreSQL only through a pool of three
//! server connections that every transaction shares, with `--pgbouncer`;
//! one worker LISTENs on a direct `--listen-url`, the other polls. Every run
//! must succeed with every order settled once, exactly as without a pooler.
//! Without `--pgbouncer` the worker cannot even connect (its session setting
//! is refused), and the commands that need a session refuse the flag.

use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use batchonce::testing::TestDb;
use chrono::{Days, NaiveDate};
use sqlx::postgres::PgConnectOptions;
use sqlx::Row;

mod common;

use common::{free_port, http_status};

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");
const DATES: u64 = 3;
const ORDERS: i64 = 400;

/// The installed `pgbouncer`, or `None` (a local run without it skips; CI
/// must have it).
fn pgbouncer() -> Option<PathBuf> {
    let found = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "pgbouncer is missing in CI: .ci/run must install Debian's pgbouncer package"
        );
        eprintln!("skipped: pgbouncer not installed (apt-get install -y pgbouncer)");
    }
    found
}

/// A PgBouncer process in front of one test database.
struct Bouncer {
    child: Child,
    port: u16,
    dir: PathBuf,
    /// The server's password for its user (percent-encoded, as in the URL),
    /// which clients of the bouncer need too.
    password: Option<String>,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Bouncer {
    /// Starts PgBouncer with `pool_mode = transaction` and three server
    /// connections for the test database `db_url`.
    fn start(bin: &Path, db_url: &str, dir: &Path) -> Self {
        let opts = PgConnectOptions::from_str(db_url).unwrap();
        let host = match opts.get_socket() {
            Some(socket) => socket.display().to_string(),
            None => opts.get_host().to_owned(),
        };
        let database = opts.get_database().unwrap_or("postgres").to_owned();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // The server's password, which PgBouncer logs in with and asks its
        // own clients for: the private test cluster lets nobody in without
        // it. Without one (a DATABASE_URL server that trusts local logins),
        // PgBouncer trusts its clients as the server would.
        let password = url::Url::parse(db_url)
            .unwrap()
            .password()
            .map(str::to_owned);
        let plain = password.as_deref().map(|p| {
            url::form_urlencoded::parse(format!("p={p}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        });
        let auth_type = if plain.is_some() {
            "scram-sha-256"
        } else {
            "trust"
        };
        // 0600: the file holds the password.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dir.join("userlist.txt"))
            .unwrap()
            .write_all(
                format!(
                    "\"{}\" \"{}\"\n",
                    opts.get_username(),
                    plain.unwrap_or_default().replace('"', "\"\"")
                )
                .as_bytes(),
            )
            .unwrap();
        // sqlx sends extra_float_digits at startup, which PgBouncer does not
        // track: it must be ignored. `options` is deliberately not ignored,
        // so a client that sends session settings is refused, not silently
        // stripped of them.
        let ini = format!(
            "[databases]\nbench = host={host} port={} dbname={database} user={}\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = {auth_type}\nauth_file = {dir}/userlist.txt\npool_mode = transaction\n\
             default_pool_size = 3\nmax_client_conn = 200\nignore_startup_parameters = extra_float_digits\n\
             idle_transaction_timeout = 10\nadmin_users = {}\nlogfile = {dir}/pgbouncer.log\n",
            opts.get_port(),
            opts.get_username(),
            opts.get_username(),
            dir = dir.display()
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
        // PgBouncer refuses to run as root; the private test cluster runs as
        // `postgres` for the same reason.
        let root = nix::unistd::Uid::effective().is_root();
        let mut cmd = if root {
            let user = nix::unistd::User::from_name("postgres").unwrap().unwrap();
            nix::unistd::chown(dir, Some(user.uid), Some(user.gid)).unwrap();
            for f in ["userlist.txt", "pgbouncer.ini"] {
                nix::unistd::chown(&dir.join(f), Some(user.uid), Some(user.gid)).unwrap();
            }
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(bin);
            c
        } else {
            Command::new(bin)
        };
        let child = cmd
            .arg(dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let bouncer = Self {
            child,
            port,
            dir: dir.to_owned(),
            password,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "pgbouncer did not listen: {}",
                std::fs::read_to_string(dir.join("pgbouncer.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        bouncer
    }

    fn url(&self, user: &str) -> String {
        match &self.password {
            Some(p) => format!("postgres://{user}:{p}@127.0.0.1:{}/bench", self.port),
            None => format!("postgres://{user}@127.0.0.1:{}/bench", self.port),
        }
    }
}

fn command(url: &str, config: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.env("DATABASE_URL", url)
        .env_remove("BATCHONCE_CONFIG")
        .env_remove("BATCHONCE_PGBOUNCER")
        .env_remove("BATCHONCE_LISTEN_URL")
        .env("RUST_LOG", "info")
        .arg("--config")
        .arg(config)
        .args(args)
        .stdin(Stdio::null());
    c
}

/// Runs a command that must be refused: exit code 1 and one error line
/// containing `want`.
fn refused(url: &str, config: &Path, args: &[&str], want: &str) {
    let out = command(url, config, args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    assert!(err.contains(want), "{args:?}: {err}");
}

/// A worker process that is stopped when the test ends, even by a panic.
struct Running(Option<Child>);

impl Running {
    /// SIGTERM, and a failed test if it does not exit in time.
    fn stop(mut self) {
        if let Some(child) = self.0.take() {
            common::stop(child);
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_settlement_workload_runs_through_pgbouncer_in_transaction_mode() {
    let Some(bin) = pgbouncer() else { return };
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let dir = batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), "pgbouncer");
    let bouncer = Bouncer::start(&bin, &db.url, &dir);
    let user = PgConnectOptions::from_str(&db.url)
        .unwrap()
        .get_username()
        .to_owned();
    let via = bouncer.url(&user);
    // PgBouncer is no way around the server's password.
    if bouncer.password.is_some() {
        let bare = format!("postgres://{user}@127.0.0.1:{}/bench", bouncer.port);
        let err = sqlx::PgPool::connect(&bare).await.unwrap_err().to_string();
        assert!(err.contains("authentication failed"), "{err}");
    }
    let config = dir.join("batchonce.toml");
    std::fs::write(
        &config,
        "[jobs.daily-settlement]\ntimezone = \"Asia/Seoul\"\nlease_ttl = \"3s\"\nchunk_size = 25\n\
         chunk_pause = \"5ms\"\nbackoff = \"200ms\"\nbackoff_max = \"1s\"\n\
         [jobs.inventory-sync]\nenabled = false\n",
    )
    .unwrap();
    let first = NaiveDate::from_ymd_opt(2026, 9, 1).unwrap();
    let dates: Vec<NaiveDate> = (0..DATES)
        .map(|i| first.checked_add_days(Days::new(i)).unwrap())
        .collect();
    for (i, d) in dates.iter().enumerate() {
        common::seed_orders(&db.pool, *d, i as i64 * 1_000_000, ORDERS).await;
    }

    // The commands that need a session of their own refuse the flag, and a
    // worker that would LISTEN through the pooler is refused too.
    refused(
        &via,
        &config,
        &["--pgbouncer", "migrate"],
        "needs a direct connection",
    );
    refused(
        &via,
        &config,
        &["--pgbouncer", "worker", "--metrics-addr", "127.0.0.1:0"],
        "--listen-url",
    );

    // The producer's enqueue, through the pooler.
    let (from, to) = (dates[0].to_string(), dates[dates.len() - 1].to_string());
    let out = command(
        &via,
        &config,
        &[
            "--pgbouncer",
            "enqueue",
            "daily-settlement",
            "--from",
            &from,
            "--to",
            &to,
        ],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .matches("enqueued")
            .count(),
        DATES as usize
    );

    // Two workers of four handlers each share three server connections.
    let spawn = |i: usize, extra: &[&str]| {
        let log = std::fs::File::create(dir.join(format!("w{i}.log"))).unwrap();
        command(
            &via,
            &config,
            &[
                "--pgbouncer",
                "--log-format",
                "json",
                "worker",
                "--worker-id",
                &format!("w{i}"),
            ],
        )
        .args([
            "--concurrency",
            "4",
            "--poll-interval",
            "200ms",
            "--grace",
            "5s",
        ])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map(|c| Running(Some(c)))
        .unwrap()
    };
    let w0 = spawn(0, &["--listen-url", &db.url]);
    let w1 = spawn(1, &["--no-listen"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM batch_job_run WHERE status <> 'SUCCEEDED'")
                .fetch_one(&db.pool)
                .await
                .unwrap();
        if left == 0 {
            break;
        }
        if Instant::now() > deadline {
            let runs: Vec<(String, String, Option<String>)> = sqlx::query_as(
                "SELECT job_key, status, error_message FROM batch_job_run ORDER BY 1",
            )
            .fetch_all(&db.pool)
            .await
            .unwrap();
            panic!(
                "runs did not succeed through pgbouncer: {runs:?}\nw0: {}\nw1: {}",
                std::fs::read_to_string(dir.join("w0.log")).unwrap_or_default(),
                std::fs::read_to_string(dir.join("w1.log")).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    w0.stop();
    w1.stop();

    // The oracle: every order of every run's stored period settled once,
    // under its run, by a token of its attempts, committed while that
    // attempt held the lease; and no lease was lost on the way.
    let o = common::oracle::settlement(&db.pool).await;
    o.assert_holds("through PgBouncer");
    assert_eq!(o.items, ORDERS * dates.len() as i64);
    let lost: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM batch_job_attempt WHERE outcome IS DISTINCT FROM 'succeeded'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(lost, 0, "every attempt succeeded at once");
    for i in 0..2 {
        let log = std::fs::read_to_string(dir.join(format!("w{i}.log"))).unwrap();
        assert!(log.contains("\"connection budget\""), "w{i}: {log}");
        assert!(
            !log.contains("prepared statement"),
            "w{i} hit a prepared-statement error: {log}"
        );
    }

    // PgBouncer really carried the work: its admin console (simple protocol
    // only) counts the transactions it passed on to the server.
    let admin = sqlx::PgPool::connect(&batchonce::db::with_database(&via, "pgbouncer").unwrap())
        .await
        .unwrap();
    let stats = sqlx::raw_sql("SHOW STATS").fetch_all(&admin).await.unwrap();
    // The simple protocol returns text; PgBouncer declares its counters as
    // numeric, which is read here as the text it is.
    let text = |r: &sqlx::postgres::PgRow, c: &str| -> String {
        r.try_get_unchecked::<String, _>(c).unwrap_or_default()
    };
    let xacts: i64 = stats
        .iter()
        .filter(|r| text(r, "database") == "bench")
        .map(|r| text(r, "total_xact_count").parse::<i64>().unwrap_or(0))
        .sum();
    assert!(xacts > 100, "pgbouncer passed on only {xacts} transactions");
    admin.close().await;

    // Without --pgbouncer the worker's session setting is refused at once.
    // PgBouncer's refusal is a connection error, so the worker retries:
    // it stays up, but never gets a session, so it never registers and
    // never turns ready. Two refusals logged show that it tried and retried;
    // its readiness and the registry show what came of it.
    let mport = free_port();
    let log = std::fs::File::create(dir.join("plain.log")).unwrap();
    let mut plain = command(
        &via,
        &config,
        &[
            "--log-format",
            "json",
            "worker",
            "--worker-id",
            "plain",
            "--no-listen",
        ],
    )
    .args(["--metrics-addr", &format!("127.0.0.1:{mport}")])
    .args(["--poll-interval", "200ms"])
    .stdout(Stdio::null())
    .stderr(log)
    .spawn()
    .map(|c| Running(Some(c)))
    .unwrap();
    let refusals = || {
        std::fs::read_to_string(dir.join("plain.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("unsupported startup parameter"))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while refusals() < 2 {
        let child = plain.0.as_mut().unwrap();
        assert!(
            child.try_wait().unwrap().is_none(),
            "the worker without --pgbouncer exited instead of retrying: {}",
            std::fs::read_to_string(dir.join("plain.log")).unwrap_or_default()
        );
        assert!(
            Instant::now() < deadline,
            "the worker without --pgbouncer was not refused twice within 20s: {}",
            std::fs::read_to_string(dir.join("plain.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(http_status(mport, "/healthz"), Some(200));
    assert_eq!(
        http_status(mport, "/readyz"),
        Some(503),
        "a worker whose session setting is refused reports ready"
    );
    let registered: i64 =
        sqlx::query_scalar("SELECT count(*) FROM batch_worker WHERE worker_id = 'plain'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(registered, 0, "the worker without --pgbouncer registered");
    plain.stop();
    let _ = std::fs::remove_dir_all(&bouncer.dir);
}
