//! A command job's program, assumed hostile (issue 42, item 8, the programs
//! half): it must not reach the secrets of the worker that started it.
//!
//! - A program that runs as the worker's own unprivileged user reads
//!   `/proc/<worker>/environ` and `/proc/<supervisor>/environ`: both are
//!   refused, because every batchonce process is non-dumpable, so the
//!   worker's `DATABASE_URL` and `SECRET_TOKEN` never reach it.
//! - `run_as_user = "nobody"` under a root worker runs the program as
//!   nobody (its `id -u`, `HOME`, `USER`, `LOGNAME`), which can read neither
//!   the worker's environment nor its 0600 configuration, nor signal its
//!   supervisor, and the run succeeds. A user that does not exist, a
//!   working directory the user cannot search, and a worker that may not
//!   switch users each fail the run at once with a reason, and the program
//!   never runs (as the worker's user or any other).
//! - A worker that is not root but holds CAP_SETUID, CAP_SETGID and CAP_KILL
//!   (systemd's `AmbientCapabilities=`) passes none of them to a program,
//!   whether the program switches users or not.
//! - A bad `run_as_user` is one configuration error.
//!
//! The worker runs as `nobody` (created with `useradd` when missing), which
//! needs root: without it a test says `skipped:` and passes, under `CI` it
//! fails. The unprivileged worker reaches the database through a TCP
//! forwarder of the test's, since the test cluster's socket is its user's
//! alone.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use batchonce::testing::{wait_for_status, TestDb};
use nix::unistd::{Uid, User};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");

const TOKEN: &str = "tok-42-a-program-must-never-see-this";
const DATE: &str = "2026-09-15";

fn ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false")
}

/// Says why a test cannot run, and passes, or fails under CI.
fn missing(why: &str) {
    assert!(!ci(), "under CI this test must run: {why}");
    eprintln!("skipped: {why}");
}

/// The local user `name`, created (no home, no shell) when it is missing.
/// `None` after saying why when the test cannot act as another user.
fn user(name: &str) -> Option<User> {
    if !Uid::effective().is_root() {
        missing("the test does not run as root, which it needs to start processes as another user");
        return None;
    }
    if let Some(u) = User::from_name(name).ok().flatten() {
        return Some(u);
    }
    let out = Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ])
        .output();
    match (out, User::from_name(name).ok().flatten()) {
        (_, Some(u)) => Some(u),
        (out, None) => {
            missing(&format!(
                "no user {name}, and useradd could not create it: {out:?}"
            ));
            None
        }
    }
}

/// A fresh folder that every user can reach (under the system's temporary
/// folder, 0755), for what the unprivileged processes must read.
fn public_dir(name: &str) -> PathBuf {
    let tmp = std::env::temp_dir();
    let dir = batchonce::testing::scratch_dir(tmp.to_str().unwrap(), name);
    chmod(&dir, 0o755);
    dir
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The binary under test where `nobody` can execute it: as it is when
/// every folder above it lets others through, otherwise a copy in `dir`.
fn reachable_binary(dir: &Path) -> PathBuf {
    let bin = Path::new(BIN);
    let open = bin
        .ancestors()
        .skip(1)
        .all(|a| std::fs::metadata(a).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
        && std::fs::metadata(bin).is_ok_and(|m| m.permissions().mode() & 0o005 == 0o005);
    if open {
        return bin.to_path_buf();
    }
    let copy = dir.join("batchonce");
    std::fs::copy(bin, &copy).unwrap();
    chmod(&copy, 0o755);
    copy
}

/// A URL for `url`'s database that any local user can use: a TCP port on
/// loopback that this test forwards to the server (the private test
/// cluster listens on a socket only its own user may reach).
async fn forwarded(url: &str) -> String {
    use sqlx::postgres::PgConnectOptions;
    let opts: PgConnectOptions = url.parse().unwrap();
    let socket = opts
        .get_socket()
        .map(|s| s.join(format!(".s.PGSQL.{}", opts.get_port())));
    let (host, port) = (opts.get_host().to_owned(), opts.get_port());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let local = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let (socket, host) = (socket.clone(), host.clone());
            tokio::spawn(async move {
                if let Some(path) = socket {
                    if let Ok(mut up) = tokio::net::UnixStream::connect(path).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
                    }
                } else if let Ok(mut up) = tokio::net::TcpStream::connect((host, port)).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
                }
            });
        }
    });
    let mut u = url::Url::parse(url).unwrap();
    let query: Vec<(String, String)> = u
        .query_pairs()
        .filter(|(k, _)| k != "host" && k != "port")
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    u.set_host(Some("127.0.0.1")).unwrap();
    u.set_port(Some(local)).unwrap();
    u.set_query(None);
    if !query.is_empty() {
        u.query_pairs_mut().extend_pairs(query);
    }
    u.to_string()
}

/// Enqueues `jobs` for [`DATE`] as the database's owner.
fn enqueue(db: &TestDb, cfg: &Path, jobs: &[&str]) {
    for job in jobs {
        let o = Command::new(BIN)
            .env("DATABASE_URL", &db.url)
            .env_remove("BATCHONCE_CONFIG")
            .arg("--config")
            .arg(cfg)
            .args(["enqueue", job, "--date", DATE])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
}

/// A worker of `bin` with `cfg`, as `user` (or as the test), holding
/// `SECRET_TOKEN` and its `DATABASE_URL` in its environment and nothing
/// else of the test's.
fn worker(bin: &Path, cfg: &Path, url: &str, user: Option<&User>, log: &Path) -> Child {
    let mut c = Command::new(bin);
    c.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("DATABASE_URL", url)
        .env("SECRET_TOKEN", TOKEN)
        .env("RUST_LOG", "info")
        .current_dir(cfg.parent().unwrap())
        .arg("--config")
        .arg(cfg)
        .args(["--log-format", "json", "worker", "--worker-id", "w-stolen"])
        .args(["--poll-interval", "200ms", "--metrics-addr", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    if let Some(u) = user {
        c.uid(u.uid.as_raw()).gid(u.gid.as_raw());
    }
    c.spawn().unwrap()
}

async fn wait_done(db: &TestDb, jobs: &[&str]) {
    for job in jobs {
        wait_for_status(
            &db.pool,
            Some(&format!("{job}:{DATE}")),
            &["SUCCEEDED", "FAILED", "SKIPPED"],
            Duration::from_secs(60),
        )
        .await;
    }
}

/// The run's status, attempts, error and the output kept on its attempts.
async fn run(db: &TestDb, job: &str) -> (String, i32, String, String) {
    let key = format!("{job}:{DATE}");
    let (status, attempts, error): (String, i32, Option<String>) = sqlx::query_as(
        "SELECT status, attempts, error_message FROM batch_job_run WHERE job_key = $1",
    )
    .bind(&key)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let output: Option<String> = sqlx::query_scalar(
        "SELECT string_agg(output_tail, E'\\n') FROM batch_job_attempt WHERE job_key = $1",
    )
    .bind(&key)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    (
        status,
        attempts,
        error.unwrap_or_default(),
        output.unwrap_or_default(),
    )
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The program's probe: who it is, and what it can read of the worker (its
/// supervisor's parent) and of the supervisor, each into `$OUT`. It prints
/// what it read, as a program that exfiltrates through its output would.
const PROBE: &str = r#"
W=$(sed -n 's/^PPid:[[:space:]]*//p' /proc/$PPID/status)
echo "$W $PPID" > "$OUT/pids"
id -u > "$OUT/uid"
id -g > "$OUT/gid"
echo "$HOME $USER $LOGNAME" > "$OUT/account"
{ tr '\000' '\n' < /proc/$W/environ; } > "$OUT/worker.environ" 2> "$OUT/worker.err"
{ tr '\000' '\n' < /proc/$PPID/environ; } > "$OUT/supervisor.environ" 2> "$OUT/supervisor.err"
if [ -n "${CONFIG:-}" ]; then { cat "$CONFIG"; } > "$OUT/config.copy" 2> "$OUT/config.err"; fi
kill -0 $PPID 2> "$OUT/kill.err"; echo $? > "$OUT/kill"
cat "$OUT/worker.environ" "$OUT/supervisor.environ"
exit 0
"#;

/// A folder the programs write their findings to: every user may write.
fn out_dir(dir: &Path) -> PathBuf {
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    chmod(&out, 0o777);
    out
}

/// What the probe found in `out`: the worker's environment it read, and
/// why a read failed.
fn assert_no_secret_reached(out: &Path, worker_pid: u32, worker_log: &Path, output: &str) {
    let pids = read(&out.join("pids"));
    let found: Vec<u32> = pids
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(found[0], worker_pid, "the probe found the worker: {pids}");
    let environ = read(&out.join("worker.environ"));
    assert!(
        !environ.contains(TOKEN) && !environ.contains("DATABASE_URL="),
        "the program read the worker's environment through /proc/{worker_pid}/environ: {environ}"
    );
    let refused = read(&out.join("worker.err"));
    assert!(refused.contains("Permission denied"), "{refused}");
    let sup = read(&out.join("supervisor.environ"));
    assert_eq!(sup.trim(), "", "the supervisor's environment");
    let sup_refused = read(&out.join("supervisor.err"));
    assert!(sup_refused.contains("Permission denied"), "{sup_refused}");
    for (what, text) in [("log", read(worker_log)), ("output", output.to_owned())] {
        assert!(
            !text.contains(TOKEN),
            "the secret reached the worker's {what}"
        );
    }
}

/// A worker of an unprivileged user runs a program as that same user: the
/// program cannot read the worker's or the supervisor's environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_of_the_workers_own_user_cannot_read_its_secrets() {
    let Some(nobody) = user("nobody") else { return };
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let url = forwarded(&db.url).await;
    let dir = public_dir("stolen-same-user");
    let bin = reachable_binary(&dir);
    let out = out_dir(&dir);
    let cfg = dir.join("batchonce.toml");
    std::fs::write(
        &cfg,
        format!(
            "[jobs.peek]\ncommand = [\"sh\", \"-c\", '''{PROBE}''']\nworking_dir = \"{out}\"\n\
             env = {{ OUT = \"{out}\" }}\nmax_attempts = 1\n",
            out = out.display()
        ),
    )
    .unwrap();
    chmod(&cfg, 0o644);
    enqueue(&db, &cfg, &["peek"]);
    let log = dir.join("worker.log");
    let mut w = worker(&bin, &cfg, &url, Some(&nobody), &log);
    wait_done(&db, &["peek"]).await;
    common::sigterm_and_wait(&mut w);

    let (status, _, error, output) = run(&db, "peek").await;
    assert_eq!(status, "SUCCEEDED", "{error}");
    // The program ran as the worker's own user, which is the point.
    assert_eq!(read(&out.join("uid")).trim(), nobody.uid.to_string());
    assert_no_secret_reached(&out, w.id(), &log, &output);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A root worker runs programs as `nobody`; a user it cannot switch to, or
/// a working directory that user cannot search, fails the run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_as_user_runs_the_program_as_another_user() {
    let Some(nobody) = user("nobody") else { return };
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let dir = public_dir("stolen-run-as");
    let out = out_dir(&dir);
    let private = dir.join("private");
    std::fs::create_dir_all(&private).unwrap();
    chmod(&private, 0o700);
    let cfg = dir.join("batchonce.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"# config-secret-{TOKEN}
[jobs.as-nobody]
command = ["sh", "-c", '''{PROBE}''']
run_as_user = "{name}"
working_dir = "{out}"
env = {{ OUT = "{out}", CONFIG = "{cfg}" }}
max_attempts = 1

[jobs.ghost]
command = ["sh", "-c", "echo ran > {out}/ghost.ran"]
run_as_user = "bo-no-such-user-42"
max_attempts = 3

[jobs.shut-out]
command = ["sh", "-c", "echo ran > {out}/shut-out.ran"]
run_as_user = "{name}"
working_dir = "{private}"
max_attempts = 3
"#,
            name = nobody.name,
            out = out.display(),
            cfg = cfg.display(),
            private = private.display(),
        ),
    )
    .unwrap();
    // The worker's configuration holds secrets too: its user's alone.
    chmod(&cfg, 0o600);
    let jobs = ["as-nobody", "ghost", "shut-out"];
    enqueue(&db, &cfg, &jobs);
    let log = dir.join("worker.log");
    let mut w = worker(Path::new(BIN), &cfg, &db.url, None, &log);
    wait_done(&db, &jobs).await;
    common::sigterm_and_wait(&mut w);

    let (status, _, error, output) = run(&db, "as-nobody").await;
    assert_eq!(status, "SUCCEEDED", "{error}");
    assert_eq!(read(&out.join("uid")).trim(), nobody.uid.to_string());
    assert_eq!(read(&out.join("gid")).trim(), nobody.gid.to_string());
    assert_eq!(
        read(&out.join("account")).trim(),
        format!("{} {} {}", nobody.dir.display(), nobody.name, nobody.name)
    );
    assert_no_secret_reached(&out, w.id(), &log, &output);
    let copy = read(&out.join("config.copy"));
    assert!(
        !copy.contains("config-secret"),
        "the program read the config"
    );
    assert!(read(&out.join("config.err")).contains("Permission denied"));
    // Nor can it signal its supervisor, which keeps the worker's identity.
    assert_ne!(
        read(&out.join("kill")).trim(),
        "0",
        "the program signalled its supervisor"
    );

    let (status, attempts, error, _) = run(&db, "ghost").await;
    assert_eq!((status.as_str(), attempts), ("FAILED", 1), "{error}");
    assert!(
        error.contains("run_as_user = \"bo-no-such-user-42\": no such user on this host"),
        "{error}"
    );
    assert!(!out.join("ghost.ran").exists(), "the program ran anyway");

    let (status, attempts, error, _) = run(&db, "shut-out").await;
    assert_eq!((status.as_str(), attempts), ("FAILED", 1), "{error}");
    assert!(
        error.contains(&format!(
            "cannot start `sh` as user {}: permission denied (can {} search the working directory",
            nobody.name, nobody.name
        )),
        "{error}"
    );
    assert!(!out.join("shut-out.ran").exists(), "the program ran anyway");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A worker that may not switch users (not root, no CAP_SETUID) fails a
/// `run_as_user` job at once, and never runs the program as itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_as_user_needs_a_worker_that_may_switch() {
    let Some(nobody) = user("nobody") else { return };
    let Some(other) = user("daemon").or_else(|| user("bo-program-other")) else {
        return;
    };
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let url = forwarded(&db.url).await;
    let dir = public_dir("stolen-no-privilege");
    let bin = reachable_binary(&dir);
    let out = out_dir(&dir);
    let cfg = dir.join("batchonce.toml");
    std::fs::write(
        &cfg,
        format!(
            "[jobs.switch]\ncommand = [\"sh\", \"-c\", \"id -u > {out}/switch.ran\"]\n\
             run_as_user = \"{user}\"\nmax_attempts = 3\n\n\
             [jobs.as-itself]\ncommand = [\"sh\", \"-c\", \"id -u > {out}/itself.ran\"]\n\
             run_as_user = \"{me}\"\nmax_attempts = 3\n",
            out = out.display(),
            user = other.name,
            me = nobody.name,
        ),
    )
    .unwrap();
    chmod(&cfg, 0o644);
    enqueue(&db, &cfg, &["switch", "as-itself"]);
    let log = dir.join("worker.log");
    let mut w = worker(&bin, &cfg, &url, Some(&nobody), &log);
    wait_done(&db, &["switch", "as-itself"]).await;
    common::sigterm_and_wait(&mut w);

    let (status, attempts, error, _) = run(&db, "switch").await;
    assert_eq!((status.as_str(), attempts), ("FAILED", 1), "{error}");
    assert!(
        error.contains(&format!(
            "run_as_user = \"{}\" needs a worker that runs as root or holds CAP_SETUID",
            other.name
        )),
        "{error}"
    );
    assert!(
        error.contains("never runs as the worker's user instead"),
        "{error}"
    );
    assert!(!out.join("switch.ran").exists(), "the program ran anyway");

    let (status, attempts, error, _) = run(&db, "as-itself").await;
    assert_eq!((status.as_str(), attempts), ("FAILED", 1), "{error}");
    assert!(error.contains("names the worker's own user"), "{error}");
    assert!(!out.join("itself.ran").exists(), "the program ran anyway");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The capability sets of a `grep ^Cap /proc/self/status` dump, by name,
/// without the bounding set (every process has one).
fn capabilities(p: &Path) -> Vec<(String, String)> {
    read(p)
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .filter(|(k, _)| k != "CapBnd")
        .collect()
}

/// A worker that is not root but holds CAP_SETUID, CAP_SETGID and CAP_KILL
/// as ambient capabilities (as systemd's `AmbientCapabilities=` gives
/// them) runs a `run_as_user` program as that user, and neither it nor the
/// program of a job without `run_as_user` keeps any capability.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capable_worker_passes_no_capability_to_its_programs() {
    let Some(nobody) = user("nobody") else { return };
    let Some(other) = user("daemon").or_else(|| user("bo-program-other")) else {
        return;
    };
    if Command::new("setpriv").arg("--version").output().is_err() {
        return missing("setpriv (util-linux) is not installed");
    }
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let url = forwarded(&db.url).await;
    let dir = public_dir("stolen-capable");
    let bin = reachable_binary(&dir);
    let out = out_dir(&dir);
    let cfg = dir.join("batchonce.toml");
    let probe = |name: &str| {
        format!(
            "id -u > {out}/{name}.uid; grep ^Cap /proc/self/status > {out}/{name}.caps",
            out = out.display()
        )
    };
    std::fs::write(
        &cfg,
        format!(
            "[jobs.as-other]\ncommand = [\"sh\", \"-c\", \"{other_probe}\"]\nrun_as_user = \"{user}\"\n\
             working_dir = \"{out}\"\nmax_attempts = 1\n\n\
             [jobs.plain]\ncommand = [\"sh\", \"-c\", \"{plain_probe}\"]\nmax_attempts = 1\n",
            other_probe = probe("other"),
            plain_probe = probe("plain"),
            user = other.name,
            out = out.display(),
        ),
    )
    .unwrap();
    chmod(&cfg, 0o644);
    let jobs = ["as-other", "plain"];
    enqueue(&db, &cfg, &jobs);
    let log = dir.join("worker.log");
    let caps = "+setuid,+setgid,+kill";
    let mut w = Command::new("setpriv")
        .arg(format!("--reuid={}", nobody.uid))
        .arg(format!("--regid={}", nobody.gid))
        .arg("--clear-groups")
        .arg(format!("--inh-caps={caps}"))
        .arg(format!("--ambient-caps={caps}"))
        .arg(&bin)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("DATABASE_URL", &url)
        .env("SECRET_TOKEN", TOKEN)
        .current_dir(&dir)
        .arg("--config")
        .arg(&cfg)
        .args([
            "worker",
            "--worker-id",
            "w-capable",
            "--poll-interval",
            "200ms",
        ])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_done(&db, &jobs).await;
    common::sigterm_and_wait(&mut w);

    for job in jobs {
        let (status, _, error, _) = run(&db, job).await;
        assert_eq!(status, "SUCCEEDED", "{job}: {error}");
    }
    assert_eq!(read(&out.join("other.uid")).trim(), other.uid.to_string());
    assert_eq!(read(&out.join("plain.uid")).trim(), nobody.uid.to_string());
    for name in ["other", "plain"] {
        let caps = capabilities(&out.join(format!("{name}.caps")));
        assert_eq!(caps.len(), 4, "{name}: {caps:?}");
        for (set, mask) in &caps {
            assert_eq!(
                mask, "0000000000000000",
                "{name}: the program kept the worker's capabilities in {set}: {caps:?}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_run_as_user_is_one_config_error() {
    let dir = batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), "stolen-bad-user");
    for (text, want) in [
        (
            "run_as_user = \"bad name!\"",
            "`jobs.x.run_as_user`: \"bad name!\" is not a user name",
        ),
        (
            "run_as_user = \"\"",
            "`jobs.x.run_as_user`: \"\" is not a user name",
        ),
        ("run_as_user = \"0\"", "is not a user name"),
        (
            "run_as_user = 65534",
            "`jobs.x.run_as_user`: expected a string",
        ),
        (
            "run_as_user = \"nobody\"\nrun_as_group = \"no group\"",
            "`jobs.x.run_as_group`: \"no group\" is not a group name",
        ),
        (
            "run_as_group = \"nogroup\"",
            "`jobs.x.run_as_group`: only with run_as_user",
        ),
    ] {
        common::config_refused(
            BIN,
            &dir,
            &format!("[jobs.x]\ncommand = [\"true\"]\n{text}\n"),
            &["enqueue", "x", "--date", DATE],
            want,
        );
    }
    common::config_refused(
        BIN,
        &dir,
        "[jobs.daily-settlement]\nrun_as_user = \"nobody\"\n",
        &["enqueue", "daily-settlement", "--date", DATE],
        "`jobs.daily-settlement.run_as_user`: only a command job",
    );
}
