//! Several network hosts on one machine: PostgreSQL in a Linux network
//! namespace of its own, two workers and a producer each in theirs, every
//! one joined to the database's namespace by its own veth pair. The test cuts
//! the link of the worker that holds a lease and checks what docs/deployment.md
//! promises for a partition: the other worker takes the run over once the
//! lease has expired, the cut-off worker stops its handler on its own clock
//! (self-fencing), and nothing it tries after the link comes back commits.
//!
//! ```text
//!   bo<pid>w1  eth0 10.213.1.2/30 ──veth── to-w1 10.213.1.1/30 ┐
//!   bo<pid>w2  eth0 10.213.2.2/30 ──veth── to-w2 10.213.2.1/30 ├ bo<pid>db
//!   bo<pid>pr  eth0 10.213.3.2/30 ──veth── to-pr 10.213.3.1/30 ┘ lo 10.213.0.1 (PostgreSQL)
//! ```
//!
//! It needs root and iproute2, so it runs only when asked:
//! `BATCHONCE_NETNS_TEST=1 cargo test -p batchonce-workers --test hosts -- --nocapture`.
//! Under `CI=true` it must run: `.ci/run` sets the variable, and a CI run
//! without it fails rather than passing as skipped.

use std::ffi::OsStr;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use batchonce::testing::{wait_for_count, wait_for_status, wait_until};
use chrono::{DateTime, NaiveDate, Utc};
use nix::sys::signal::{kill, Signal};
use nix::unistd::{Pid, Uid, User};
use sqlx::PgPool;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");
const KEY: &str = "daily-settlement:2026-09-15";
const ORDERS: i64 = 2000;
/// The lease ttl of the config below; every bound of the test derives from it.
const TTL: Duration = Duration::from_secs(2);
/// The database's address, on the loopback interface of its namespace, so
/// that one address serves every host whatever link it arrives on.
const DB_ADDR: &str = "10.213.0.1";
/// The database namespace is new and empty, so every port in it is free, and
/// the unix socket lives in a folder of this test's own: the standard port
/// cannot clash with any other cluster.
const PG_PORT: u16 = 5432;
/// The hosts besides the database, each with the third octet of its /30.
const HOSTS: [(&str, u8); 3] = [("w1", 1), ("w2", 2), ("pr", 3)];
const SELF_FENCING: &str = "no heartbeat within the lease ttl; stopping the handler (self-fencing)";
/// Every worker serves its metrics on this port of its own namespace's
/// loopback; each namespace is new and empty, so the port is free in each.
const METRICS_PORT: u16 = 9464;
const JOB_LABEL: &str = "job=\"daily-settlement\"";

/// Whether this is a CI run, where a missing prerequisite fails the test.
fn ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false")
}

fn date() -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 9, 15).unwrap()
}

/// A system tool, looked up on PATH and in the sbin folders, which a test
/// runner's PATH often lacks.
fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).trim().to_owned()
}

/// The namespaces, the PostgreSQL server and the worker processes of one
/// test. Dropping it tears everything down, also when the test panics, so a
/// failed run leaves no namespace, server or data folder behind.
struct Lab {
    ip: PathBuf,
    runuser: PathBuf,
    pg_bin: PathBuf,
    /// `bo<pid>`: the process id keeps concurrent test processes apart.
    prefix: String,
    namespaces: Vec<String>,
    pg_dir: Option<PathBuf>,
    pg_started: bool,
    children: Vec<Child>,
}

impl Lab {
    fn new(ip: PathBuf, runuser: PathBuf, pg_bin: PathBuf) -> Self {
        Self {
            ip,
            runuser,
            pg_bin,
            prefix: format!("bo{}", std::process::id()),
            namespaces: Vec::new(),
            pg_dir: None,
            pg_started: false,
            children: Vec::new(),
        }
    }

    fn ns(&self, host: &str) -> String {
        format!("{}{host}", self.prefix)
    }

    /// `ip args`. Drop uses this and `postgres_command` directly, so that
    /// a failure while tearing down cannot panic inside a panic.
    fn ip_command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.ip);
        c.args(args).stdin(Stdio::null());
        c
    }

    fn ip_output(&self, args: &[&str]) -> Output {
        self.ip_command(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.ip.display()))
    }

    /// Runs `ip` with the words of `args` (none of them holds a space),
    /// which must succeed.
    fn ip(&self, args: &str) {
        let words: Vec<&str> = args.split_whitespace().collect();
        let out = self.ip_output(&words);
        assert!(
            out.status.success(),
            "`ip {args}` failed: {}",
            stderr_of(&out)
        );
    }

    /// The four namespaces, a veth pair and a /30 from each host to the
    /// database's namespace, and a host route to the database's address.
    /// Nothing is added to the namespace the test runs in, so no traffic
    /// can leave the lab.
    fn build_network(&mut self) {
        for host in ["db", "w1", "w2", "pr"] {
            let name = self.ns(host);
            // A namespace of this name can only be left over from a killed
            // earlier test process that had the same pid: that process is
            // gone, so its namespace is nobody's.
            if Path::new("/run/netns").join(&name).exists() {
                let _ = self.ip_output(&["netns", "del", &name]);
            }
            let out = self.ip_output(&["netns", "add", &name]);
            assert!(
                out.status.success(),
                "BATCHONCE_NETNS_TEST=1, but `ip netns add {name}` failed (the test needs root \
                 with CAP_SYS_ADMIN and network namespaces): {}",
                stderr_of(&out)
            );
            self.namespaces.push(name.clone());
            self.ip(&format!("-n {name} link set lo up"));
        }
        let db = self.ns("db");
        self.ip(&format!("-n {db} addr add {DB_ADDR}/32 dev lo"));
        for (host, net) in HOSTS {
            let ns = self.ns(host);
            // Both ends are created inside their namespaces, so not even a
            // moment passes with an interface in the test's own namespace.
            self.ip(&format!(
                "-n {db} link add to-{host} type veth peer name eth0 netns {ns}"
            ));
            self.ip(&format!("-n {db} addr add 10.213.{net}.1/30 dev to-{host}"));
            self.ip(&format!("-n {ns} addr add 10.213.{net}.2/30 dev eth0"));
            self.ip(&format!("-n {db} link set to-{host} up"));
            self.ip(&format!("-n {ns} link set eth0 up"));
            self.ip(&format!(
                "-n {ns} route add {DB_ADDR}/32 via 10.213.{net}.1"
            ));
        }
    }

    /// A PostgreSQL program run as `postgres` (the server refuses root)
    /// inside the database's namespace, working in `dir`, which `postgres`
    /// must be able to enter.
    fn postgres_command(&self, dir: &Path, program: &str, args: &[&OsStr]) -> Command {
        let mut c = self.ip_command(&["netns", "exec", &self.ns("db")]);
        c.arg(&self.runuser)
            .args(["-u", "postgres", "--"])
            .arg(self.pg_bin.join(program))
            .args(args)
            .env("LC_ALL", "C")
            .env_remove("PGDATA")
            .current_dir(dir);
        c
    }

    fn as_postgres(&self, program: &str, args: &[&OsStr]) -> Output {
        let dir = self.pg_dir.as_ref().expect("the PostgreSQL folder");
        self.postgres_command(dir, program, args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
    }

    /// initdb into a fresh folder under /tmp owned by `postgres`, trust for
    /// the lab's subnet, and a server listening on the database's address
    /// only. Returns a URL over the unix socket, which the test process (in
    /// its own namespace) can use: unix sockets with a path are not bound
    /// to a network namespace, and they keep the test's own queries
    /// independent of the links it cuts.
    fn start_postgres(&mut self) -> String {
        let user = User::from_name("postgres")
            .ok()
            .flatten()
            .expect("BATCHONCE_NETNS_TEST=1 needs a `postgres` user to run the server as");
        // Under /tmp, because `postgres` may not be able to reach the target
        // folder (a checkout under /root); `create` rather than
        // `create_dir_all`, so a folder someone else made first is refused.
        // 0700: the server trusts its socket's users, so only root and
        // `postgres` may reach the socket in it.
        let dir = PathBuf::from(format!(
            "/tmp/batchonce-hosts-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        self.pg_dir = Some(dir.clone());
        nix::unistd::chown(&dir, Some(user.uid), Some(user.gid)).unwrap();
        let data = dir.join("data");
        let out = self.as_postgres(
            "initdb",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-U".as_ref(),
                "postgres".as_ref(),
                "--auth=trust".as_ref(),
                "-E".as_ref(),
                "UTF8".as_ref(),
                "--locale=C".as_ref(),
                "--no-sync".as_ref(),
                "--no-instructions".as_ref(),
            ],
        );
        assert!(out.status.success(), "initdb failed: {}", stderr_of(&out));
        let hba = data.join("pg_hba.conf");
        let mut text = std::fs::read_to_string(&hba).unwrap();
        text.push_str("host all all 10.213.0.0/16 trust\n");
        std::fs::write(&hba, text).unwrap();
        let opts = format!(
            "-c listen_addresses={DB_ADDR} -c port={PG_PORT} -k {} -c max_connections=60 \
             -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
             -c track_commit_timestamp=on",
            dir.display()
        );
        let log = dir.join("server.log");
        // Set before the start, so that a start that fails half-way is
        // still stopped by Drop.
        self.pg_started = true;
        let out = self.as_postgres(
            "pg_ctl",
            &[
                "start".as_ref(),
                "-w".as_ref(),
                "-t".as_ref(),
                "60".as_ref(),
                "-D".as_ref(),
                data.as_os_str(),
                "-l".as_ref(),
                log.as_os_str(),
                "-o".as_ref(),
                opts.as_ref(),
            ],
        );
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}\n{}",
            stderr_of(&out),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        format!(
            "postgres://postgres@localhost:{PG_PORT}/postgres?host={}",
            dir.display()
        )
    }

    /// `batchonce --config config args` on `host`, with `url` as its
    /// database; the environment cannot slip in another configuration.
    fn batchonce(&self, host: &str, url: &str, config: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(&self.ip);
        c.args(["netns", "exec", &self.ns(host)])
            .arg(BIN)
            .env("DATABASE_URL", url)
            .env_remove("BATCHONCE_CONFIG")
            .env_remove("BATCHONCE_LISTEN_URL")
            .env_remove("BATCHONCE_PGBOUNCER")
            .env("RUST_LOG", "info")
            .arg("--config")
            .arg(config)
            .args(args)
            .stdin(Stdio::null());
        c
    }

    /// Starts worker `id` on the host of the same name, its JSON log in
    /// `log`. `ip netns exec` execs the binary, so the child's pid is the
    /// worker's own and signals reach it directly. Returns its index.
    fn spawn_worker(&mut self, id: &str, url: &str, config: &Path, log: &Path) -> usize {
        let file = std::fs::File::create(log).unwrap();
        let child = self
            .batchonce(
                id,
                url,
                config,
                &["--log-format", "json", "worker", "--worker-id", id],
            )
            .args(["--concurrency", "1", "--poll-interval", "200ms"])
            .args(["--grace", "5s", "--metrics-addr"])
            .arg(format!("127.0.0.1:{METRICS_PORT}"))
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        self.children.push(child);
        self.children.len() - 1
    }

    /// The `/metrics` text of the worker on `host`, fetched from inside its
    /// namespace (its loopback is reachable nowhere else) by bash's
    /// `/dev/tcp`, within 5 s; `None` if it does not answer.
    fn metrics(&self, host: &str) -> Option<String> {
        let request = format!(
            "exec 3<>/dev/tcp/127.0.0.1/{METRICS_PORT} || exit 1; \
             printf 'GET /metrics HTTP/1.0\\r\\nHost: 127.0.0.1\\r\\n\\r\\n' >&3; cat <&3"
        );
        let out = self
            .ip_command(&[
                "netns",
                "exec",
                &self.ns(host),
                "timeout",
                "5",
                "bash",
                "-c",
            ])
            .arg(request)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.ip.display()));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success() && text.starts_with("HTTP/1.") && text.contains(" 200 "))
            .then_some(text)
    }

    fn alive(&mut self, i: usize) -> bool {
        self.children[i].try_wait().unwrap().is_none()
    }

    /// SIGTERM, then the exit status within 15 s (the grace is 5 s).
    fn terminate(&mut self, i: usize) -> ExitStatus {
        let child = &mut self.children[i];
        kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "worker {i} did not stop within 15s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Processes first: a namespace outlives its name while a process
        // is still inside it.
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if self.pg_started {
            if let Some(dir) = self.pg_dir.clone() {
                let data = dir.join("data");
                let stopped = self
                    .postgres_command(
                        &dir,
                        "pg_ctl",
                        &[
                            "stop".as_ref(),
                            "-m".as_ref(),
                            "immediate".as_ref(),
                            "-w".as_ref(),
                            "-D".as_ref(),
                            data.as_os_str(),
                        ],
                    )
                    .output()
                    .is_ok_and(|out| out.status.success());
                // If pg_ctl could not do it, the postmaster's pid (the first
                // line of postmaster.pid) still can be killed directly.
                if !stopped {
                    if let Some(pid) = std::fs::read_to_string(data.join("postmaster.pid"))
                        .ok()
                        .and_then(|t| t.lines().next().and_then(|l| l.trim().parse().ok()))
                    {
                        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                    }
                }
            }
        }
        for ns in self.namespaces.iter().rev() {
            let _ = self.ip_command(&["netns", "del", ns]).output();
        }
        if let Some(dir) = &self.pg_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A short lease and small paced chunks, so that one run takes several
/// seconds and the cut lands in the middle of it.
///
/// The other bundled kinds get the same lease, although they have no runs,
/// so that the sessions' own idle_in_transaction_session_timeout (twice the
/// largest lease of every kind a worker runs) is short too; a fenced
/// transaction sets its own from its run's lease (at least 10 s) in any
/// case.
fn write_config(dir: &Path) -> PathBuf {
    let path = dir.join("batchonce.toml");
    let ttl = TTL.as_secs();
    std::fs::write(
        &path,
        format!(
            "[jobs.daily-settlement]\ntimezone = \"Asia/Seoul\"\nmax_attempts = 5\n\
             lease_ttl = \"{ttl}s\"\nstale_after = \"1m\"\nchunk_size = 25\nchunk_pause = \"80ms\"\n\
             backoff = \"200ms\"\nbackoff_max = \"1s\"\n\
             [jobs.inventory-sync]\nlease_ttl = \"{ttl}s\"\n\
             [jobs.notification-send]\nlease_ttl = \"{ttl}s\"\n"
        ),
    )
    .unwrap();
    path
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// The value of the sample `name{...}` whose labels include each of
/// `labels` (`key="value"`), in Prometheus text format; 0 when absent,
/// as a counter that was never incremented is.
fn sample(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Whether w1's log has the self-fencing warning for the run.
fn self_fenced(log: &Path) -> bool {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .any(|v| v["message"] == SELF_FENCING && v["job_key"] == KEY)
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_host_cut_off_mid_lease_fences_itself_and_is_taken_over() {
    if std::env::var("BATCHONCE_NETNS_TEST").as_deref() != Ok("1") {
        assert!(
            !ci(),
            "CI=true, but BATCHONCE_NETNS_TEST is not 1: CI must run the many-hosts test \
             (.ci/run exports BATCHONCE_NETNS_TEST=1 and installs iproute2)"
        );
        println!("skipped: set BATCHONCE_NETNS_TEST=1 (needs root and iproute2)");
        return;
    }
    assert!(
        Uid::effective().is_root(),
        "BATCHONCE_NETNS_TEST=1, but the test does not run as root: network namespaces and \
         veth pairs need root"
    );
    let ip = tool("ip").expect(
        "BATCHONCE_NETNS_TEST=1, but iproute2's `ip` is not installed (apt-get install -y iproute2)",
    );
    let runuser =
        tool("runuser").expect("BATCHONCE_NETNS_TEST=1, but util-linux's `runuser` is missing");
    let pg_bin = batchonce::ops::embedded::find_bindir().unwrap_or_else(|e| panic!("{e}"));
    let started = Instant::now();
    let mut lab = Lab::new(ip, runuser, pg_bin);
    lab.build_network();
    let socket_url = lab.start_postgres();
    let pool = batchonce::db::connect(&socket_url, "hosts-test", 4)
        .await
        .unwrap();
    let url = format!("postgres://postgres@{DB_ADDR}:{PG_PORT}/postgres");
    let dir = batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), "hosts");
    let config = write_config(&dir);

    // The producer host migrates the database and enqueues the run, over
    // its link; the test seeds the source orders over the socket.
    let out = lab
        .batchonce("pr", &url, &config, &["migrate"])
        .output()
        .unwrap();
    assert!(out.status.success(), "migrate: {}", stderr_of(&out));
    common::seed_orders(&pool, date(), 0, ORDERS).await;
    let out = lab
        .batchonce(
            "pr",
            &url,
            &config,
            &["enqueue", "daily-settlement", "--date", "2026-09-15"],
        )
        .output()
        .unwrap();
    assert!(out.status.success(), "enqueue: {}", stderr_of(&out));

    // Only w1 at first, so that it is w1 that holds the lease.
    let w1_log = dir.join("w1.log");
    let w1 = lab.spawn_worker("w1", &url, &config, &w1_log);
    wait_for_count(
        &pool,
        "w1 to hold the run and write items",
        "SELECT count(*) FROM settlement_item i JOIN batch_job_run r USING (job_key) \
         WHERE r.status = 'RUNNING' AND r.lease_owner = 'w1' AND i.job_key = r.job_key AND i.attempt = r.attempts",
        100,
        Duration::from_secs(30),
    )
    .await;
    let token: i64 = sqlx::query_scalar(
        "SELECT lease_token FROM batch_job_run WHERE job_key = $1 AND lease_owner = 'w1'",
    )
    .bind(KEY)
    .fetch_one(&pool)
    .await
    .unwrap();
    // w1's metrics answer from inside its namespace, and it has lost no
    // lease yet: the count after the cut is this run's.
    let before = lab
        .metrics("w1")
        .expect("w1 serves /metrics on its namespace's loopback");
    assert_eq!(
        sample(&before, "batchonce_leases_lost_total", &[JOB_LABEL]),
        0.0,
        "{before}"
    );
    // w2 must be up before the cut, so that it can take the run over; the
    // run is w1's, so w2 has nothing to claim until then.
    let w2_log = dir.join("w2.log");
    let w2 = lab.spawn_worker("w2", &url, &config, &w2_log);
    wait_for_count(
        &pool,
        "w2 to register",
        "SELECT count(*) FROM batch_worker WHERE worker_id = 'w2'",
        1,
        Duration::from_secs(30),
    )
    .await;

    // Cut between two chunks if one can: a cut inside a chunk's transaction
    // leaves the run row locked on the server until the worker session's
    // fenced transaction's idle_in_transaction_session_timeout (10 s for
    // this lease, see `queue::MIN_FENCED_IDLE`) ends it, which delays the takeover by that much
    // (RELIABILITY.md). Either case must hold the invariant; the first
    // measures the lease alone. The chunk pause (80 ms) is far longer than
    // this check plus starting `ip`.
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline
        && count(
            &pool,
            "SELECT count(*) FROM pg_stat_activity \
             WHERE application_name = 'w1' AND xact_start IS NOT NULL",
        )
        .await
            > 0
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The database's end of w1's link goes down, as a switch port would:
    // w1's interface keeps its address and route but loses its carrier, so
    // its packets are dropped without an error and its queries hang rather
    // than fail. That silent partition is what the heartbeat's timeouts
    // exist for.
    let db = lab.ns("db");
    lab.ip(&format!("-n {db} link set to-w1 down"));
    let cut = Instant::now();
    let still_w1s: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM batch_job_run WHERE job_key = $1 AND status = 'RUNNING' AND lease_token = $2",
    )
    .bind(KEY)
    .bind(token)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        still_w1s, 1,
        "w1 no longer held the run when its link was cut"
    );
    // A statement that was running at the cut finishes within milliseconds
    // (its answer is lost on the way); what is still open after that is a
    // transaction waiting for w1.
    wait_until(
        "w1's sessions to finish the statements they were running at the cut",
        Duration::from_secs(5),
        || async {
            count(
                &pool,
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = 'w1' AND state = 'active'",
            )
            .await
                == 0
        },
    )
    .await;
    let in_transaction = count(
        &pool,
        "SELECT count(*) FROM pg_stat_activity \
         WHERE application_name = 'w1' AND state LIKE 'idle in transaction%'",
    )
    .await
        > 0;

    // (a) w2 takes the run over, (b) w1 fences itself; both while the link
    // is still down. Self-fencing is judged by w1's own state, its metrics
    // (the handler was stopped and the lease counted lost, which with the
    // link down nothing but the self-fencing check can do), and its log
    // line is checked as well.
    let mut takeover = None;
    let mut fenced = None;
    let mut counted: Option<(Duration, String)> = None;
    let deadline = cut + Duration::from_secs(30);
    while takeover.is_none() || fenced.is_none() || counted.is_none() {
        assert!(
            Instant::now() < deadline,
            "after 30s: takeover by w2 {takeover:?}, self-fencing in w1's log {fenced:?}, \
             lease counted lost in w1's metrics {:?}\nw1's log:\n{}",
            counted.as_ref().map(|c| c.0),
            std::fs::read_to_string(&w1_log).unwrap_or_default()
        );
        if takeover.is_none()
            && sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM batch_job_attempt WHERE job_key = $1 AND worker_id = 'w2'",
            )
            .bind(KEY)
            .fetch_one(&pool)
            .await
            .unwrap()
                > 0
        {
            takeover = Some(cut.elapsed());
        }
        if fenced.is_none() && self_fenced(&w1_log) {
            fenced = Some(cut.elapsed());
        }
        if counted.is_none() {
            if let Some(m) = lab.metrics("w1") {
                if sample(&m, "batchonce_leases_lost_total", &[JOB_LABEL]) >= 1.0 {
                    counted = Some((cut.elapsed(), m));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (takeover, fenced) = (takeover.unwrap(), fenced.unwrap());
    let (counted, w1_metrics) = counted.unwrap();
    // One lease, lost once, and its attempt ended as lease_lost: the
    // handler was stopped, not left waiting on the dead link.
    assert_eq!(
        sample(&w1_metrics, "batchonce_leases_lost_total", &[JOB_LABEL]),
        1.0,
        "{w1_metrics}"
    );
    assert_eq!(
        sample(
            &w1_metrics,
            "batchonce_attempts_total",
            &[JOB_LABEL, "outcome=\"lease_lost\""]
        ),
        1.0,
        "{w1_metrics}"
    );
    assert!(
        sample(&w1_metrics, "batchonce_heartbeat_failures_total", &[]) >= 1.0,
        "w1 fenced itself without a failed heartbeat: {w1_metrics}"
    );
    // Not before the lease could have expired: the last lease extension
    // (a heartbeat every ttl/3, or a chunk commit) came at most a little
    // before the cut.
    assert!(
        takeover >= TTL / 2,
        "w2 took the run over {takeover:?} after the cut, before w1's lease could expire"
    );
    // The lease, one recovery interval (ttl/2) and a claim; plus the idle
    // transaction timeout when the cut left a chunk's transaction open.
    let takeover_bound = TTL
        + Duration::from_secs(3)
        + if in_transaction {
            Duration::from_secs(10)
        } else {
            Duration::ZERO
        };
    assert!(
        takeover <= takeover_bound,
        "takeover took {takeover:?} (cut inside a transaction: {in_transaction})"
    );
    // The worker fences itself at the end of the first heartbeat tick that
    // finds its last good heartbeat a ttl or more in the past. The last good
    // one came before the cut, and a tick lasts at most ttl/3 + ttl/6 +
    // ttl/4 (sleep, last_seen refresh, heartbeat), so 1.75 × ttl after the
    // cut is the design's bound; a loaded machine gets 2 × ttl and a second.
    assert!(
        fenced <= TTL * 2 + Duration::from_secs(1),
        "w1 fenced itself only {fenced:?} after the cut"
    );
    // Stopping the handler first ends its own open sessions, for at most
    // 1 s (`end_own_sessions`), and then counts the lease lost.
    assert!(
        counted <= TTL * 2 + Duration::from_secs(3),
        "w1 counted its lease lost only {counted:?} after the cut"
    );
    let old_outcome: Option<String> = sqlx::query_scalar(
        "SELECT outcome FROM batch_job_attempt WHERE job_key = $1 AND lease_token = $2",
    )
    .bind(KEY)
    .bind(token)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(old_outcome.as_deref(), Some("lease_expired"));
    assert!(lab.alive(w1), "w1 exited while cut off");

    // (c) The link comes back. w1 reconnects (its registry row is refreshed
    // again), and whatever it still had in flight must commit nothing.
    lab.ip(&format!("-n {db} link set to-w1 up"));
    let up = Instant::now();
    let up_db: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&pool)
        .await
        .unwrap();
    wait_until(
        "w1 to reach the database again",
        Duration::from_secs(20),
        || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM batch_worker WHERE worker_id = 'w1' AND last_seen > $1",
            )
            .bind(up_db)
            .fetch_one(&pool)
            .await
            .is_ok_and(|n| n > 0)
        },
    )
    .await;
    let reconnected = up.elapsed();
    wait_for_status(&pool, Some(KEY), &["SUCCEEDED"], Duration::from_secs(40)).await;

    // The oracle (tests/common/oracle.rs): every order of the run's stored
    // period settled once, under it, by a token of its attempts, committed
    // while that attempt held the lease.
    let o = common::oracle::settlement(&pool).await;
    o.assert_holds("after the cut-off host's takeover");
    assert_eq!(o.items, ORDERS);
    // Nothing under w1's token committed after the transaction that ended
    // its attempt committed (by commit time, not by the transaction's start).
    let late: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM settlement_item i JOIN batch_job_attempt a \
           ON a.job_key = i.job_key AND a.attempt = i.attempt \
         WHERE a.lease_token = $1 AND (a.finished_at IS NULL \
           OR pg_xact_commit_timestamp(i.xmin) > pg_xact_commit_timestamp(a.xmin))",
    )
    .bind(token)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(late, 0, "w1 committed after its attempt ended");
    let items_by_w1: i64 =
        sqlx::query_scalar("SELECT count(*) FROM settlement_item i JOIN batch_job_attempt a ON a.job_key = i.job_key AND a.attempt = i.attempt WHERE a.lease_token = $1")
            .bind(token)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(items_by_w1 > 0, "w1 wrote nothing before the cut");
    let attempts: Vec<(i32, String, i64, Option<String>)> = sqlx::query_as(
        "SELECT attempt, worker_id, lease_token, outcome FROM batch_job_attempt \
         WHERE job_key = $1 ORDER BY attempt",
    )
    .bind(KEY)
    .fetch_all(&pool)
    .await
    .unwrap();
    let last = attempts.last().unwrap();
    assert!(
        last.1 == "w2" && last.2 != token && last.3.as_deref() == Some("succeeded"),
        "the run was not finished by w2: {attempts:?}"
    );

    // w1 kept serving through all of it, and both stop cleanly.
    assert!(lab.alive(w1), "w1 exited after the link came back");
    let status = lab.terminate(w1);
    assert!(status.success(), "w1 exited with {status}");
    let status = lab.terminate(w2);
    assert!(status.success(), "w2 exited with {status}");
    println!(
        "hosts: lease ttl {}s; w2 took the run over {:.1}s after w1's link was cut ({}); \
         w1 fenced itself after {:.1}s on its own clock and reached the database again {:.1}s \
         after the link came back; w1 wrote {} items, none after its attempt ended; the run \
         SUCCEEDED with {} items in {} attempts, the oracle holds; total {:.1}s",
        TTL.as_secs(),
        secs(takeover),
        if in_transaction {
            "cut inside a chunk's transaction"
        } else {
            "cut between chunks"
        },
        secs(fenced),
        secs(reconnected),
        items_by_w1,
        o.items,
        attempts.len(),
        secs(started.elapsed()),
    );
    pool.close().await;
}
