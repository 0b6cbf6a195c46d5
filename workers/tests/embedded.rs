//! The private cluster (src/ops/embedded/) is its user's alone: another local
//! user (`nobody`) reaches neither the test suite's cluster nor the demo's,
//! a folder or symlink planted where a cluster goes is refused before
//! anything is written, a home path full of shell syntax is only a path,
//! the password is never printed, and an earlier version's open cluster
//! (trust authentication, 0755) is stopped and replaced.
//!
//! Most of this needs root (to act as `nobody` and to plant what another
//! user would) and the `nobody` user. Without them a test prints `skipped:`
//! and passes; under `CI` it fails instead.

use std::ffi::OsStr;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use batchonce::ops::embedded::{Cluster, ClusterOptions, EmbeddedError};
use nix::unistd::{Uid, User};

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");

fn scratch(name: &str) -> PathBuf {
    batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), name)
}

fn ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false")
}

/// `nobody`, when the test runs as root and the user exists. Otherwise
/// `None` after saying why, or a failure under CI, where both must be there.
fn nobody() -> Option<User> {
    let missing = if !Uid::effective().is_root() {
        "the test does not run as root, which it needs to act as `nobody` and to plant \
         folders another user owns"
    } else if User::from_name("nobody").ok().flatten().is_none() {
        "there is no `nobody` user to act as another local user"
    } else {
        return User::from_name("nobody").ok().flatten();
    };
    assert!(!ci(), "under CI this test must run: {missing}");
    eprintln!("skipped: {missing}");
    None
}

/// The `psql` of the installed server binaries (no wrapper script, so it
/// runs the same for every user).
fn psql() -> PathBuf {
    let bindir = batchonce::ops::embedded::find_bindir().unwrap_or_else(|e| panic!("{e}"));
    let p = bindir.join("psql");
    if p.is_file() {
        p
    } else {
        PathBuf::from("psql")
    }
}

/// The URL without its password, and the password.
fn split_password(url: &str) -> (String, String) {
    let mut u = url::Url::parse(url).unwrap();
    let password = u
        .password()
        .expect("the cluster's URL has a password")
        .to_owned();
    u.set_password(None).unwrap();
    (u.to_string(), password)
}

/// `psql -c sql` on `url`, as `user` (or as we are), with `password` given
/// through the environment (never on a command line, which `ps` shows) and
/// no password file to fall back on.
fn psql_as(user: Option<&User>, url: &str, password: Option<&str>, sql: &str) -> Output {
    let mut c = Command::new(psql());
    c.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("PGPASSFILE", "/dev/null")
        .args(["-X", "-w", "-A", "-t", "-d", url, "-c", sql])
        .current_dir("/")
        .stdin(Stdio::null());
    if let Some(p) = password {
        c.env("PGPASSWORD", p);
    }
    if let Some(u) = user {
        c.uid(u.uid.as_raw()).gid(u.gid.as_raw());
    }
    c.output().unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// Who may use the cluster, checked from outside: its folders and socket
/// are 0700 and its password file 0600, `nobody` cannot reach the socket
/// even with the password, without the password nobody logs in (not even
/// root, who can reach the socket), and the server listens on no TCP port
/// and knows no authentication but SCRAM.
fn only_its_user_connects(cluster: &Cluster, nobody: &User) {
    let server_user = User::from_name("postgres").unwrap().unwrap();
    for d in [cluster.dir(), cluster.socket_dir()] {
        let m = std::fs::symlink_metadata(d).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o700, "{}", d.display());
        assert_eq!(m.uid(), server_user.uid.as_raw(), "{}", d.display());
    }
    let socket = cluster.socket_dir().join(".s.PGSQL.5432");
    assert_eq!(mode(&socket) & 0o777, 0o700, "{}", socket.display());
    let pgpass = cluster.dir().join(batchonce::ops::embedded::PASSWORD_FILE);
    assert_eq!(mode(&pgpass), 0o600);
    assert_eq!(std::fs::metadata(&pgpass).unwrap().uid(), 0);

    let (bare, password) = split_password(&cluster.url("postgres"));
    for pw in [Some(password.as_str()), None] {
        let out = psql_as(Some(nobody), &bare, pw, "SELECT 1");
        assert!(!out.status.success(), "nobody connected: {}", text(&out));
        assert!(
            text(&out).contains("Permission denied"),
            "nobody, password {}: {}",
            pw.is_some(),
            text(&out)
        );
    }
    let out = psql_as(None, &bare, None, "SELECT 1");
    assert!(!out.status.success(), "root connected without the password");
    assert!(
        text(&out).contains("password authentication failed")
            || text(&out).contains("no password supplied"),
        "{}",
        text(&out)
    );
    let out = psql_as(
        None,
        &bare,
        Some(&password),
        "SELECT current_setting('listen_addresses') || '|' || \
         current_setting('unix_socket_permissions') || '|' || \
         (SELECT string_agg(DISTINCT auth_method, ',') FROM pg_hba_file_rules)",
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "|0700|scram-sha-256"
    );
}

#[test]
fn nobody_cannot_reach_the_test_suites_cluster() {
    let Some(nobody) = nobody() else { return };
    // Attaches to the shared cluster every test uses (starting it if no
    // test has yet), and leaves it running as the tests do.
    let cluster = Cluster::start(&batchonce::testing::cluster_options()).unwrap();
    only_its_user_connects(&cluster, &nobody);
}

/// A planted folder's or file's state: whatever we did to it shows here.
#[derive(Debug, PartialEq)]
struct Snapshot {
    mode: u32,
    uid: u32,
    ctime: (i64, i64),
    mtime: (i64, i64),
    entries: Vec<String>,
    content: Option<Vec<u8>>,
}

fn snapshot(p: &Path) -> Snapshot {
    let m = std::fs::symlink_metadata(p).unwrap();
    let mut entries: Vec<String> = if m.is_dir() {
        std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    } else {
        Vec::new()
    };
    entries.sort();
    Snapshot {
        mode: m.mode(),
        uid: m.uid(),
        ctime: (m.ctime(), m.ctime_nsec()),
        mtime: (m.mtime(), m.mtime_nsec()),
        entries,
        content: m.is_file().then(|| std::fs::read(p).unwrap()),
    }
}

/// Something of `nobody`'s for a planted symlink to point at.
fn victim(base: &Path, nobody: &User) -> PathBuf {
    let v = base.join("victim");
    std::fs::create_dir(&v).unwrap();
    std::fs::write(v.join("keep"), "nobody's file").unwrap();
    for p in [v.join("keep"), v.clone()] {
        nix::unistd::chown(&p, Some(nobody.uid), Some(nobody.gid)).unwrap();
    }
    std::fs::set_permissions(&v, std::fs::Permissions::from_mode(0o755)).unwrap();
    v
}

/// Starting a cluster in `dir` is refused naming `planted`, and nothing
/// that can be seen from `watched` changed.
fn refused(dir: &Path, planted: &Path, watched: &[&Path], want: &str) {
    let before: Vec<Snapshot> = watched.iter().map(|p| snapshot(p)).collect();
    let err = match Cluster::start(&ClusterOptions {
        dir: dir.to_owned(),
        durable: false,
        max_connections: 20,
    }) {
        Ok(cluster) => {
            drop(Running(cluster));
            panic!("{} was not refused", planted.display());
        }
        Err(e) => e,
    };
    match &err {
        EmbeddedError::Refused { path, reason } => {
            assert_eq!(path, planted, "{err}");
            assert!(reason.contains(want), "{err}");
        }
        other => panic!("{} was not refused: {other}", planted.display()),
    }
    assert_eq!(err.to_string().lines().count(), 1, "{err}");
    let after: Vec<Snapshot> = watched.iter().map(|p| snapshot(p)).collect();
    assert_eq!(before, after, "{} was written to", planted.display());
}

/// A cluster of one test's own, stopped when the test ends, pass or fail.
struct Running(Cluster);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.stop();
    }
}

impl std::ops::Deref for Running {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.0
    }
}

fn start(dir: &Path, durable: bool) -> Running {
    Running(
        Cluster::start(&ClusterOptions {
            dir: dir.to_owned(),
            durable,
            max_connections: 20,
        })
        .unwrap(),
    )
}

/// Removes a path under /tmp when the test ends, pass or fail.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn planted_folders_and_symlinks_are_refused_before_anything_is_written() {
    let Some(nobody) = nobody() else { return };
    let base = std::fs::canonicalize(scratch("planted")).unwrap();
    let v = victim(&base, &nobody);

    // The cluster's own folder: a symlink to nobody's folder, a folder of
    // nobody's, and a folder anyone may write to.
    std::fs::create_dir(base.join("a")).unwrap();
    symlink(&v, base.join("a/pg")).unwrap();
    let planted = base.join("a/pg");
    refused(&planted, &planted, &[&v, &planted], "symbolic link");

    let planted = base.join("b/pg");
    std::fs::create_dir_all(&planted).unwrap();
    nix::unistd::chown(&planted, Some(nobody.uid), Some(nobody.gid)).unwrap();
    refused(&planted, &planted, &[&planted], "belongs to nobody");

    let planted = base.join("c/pg");
    std::fs::create_dir_all(&planted).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o777)).unwrap();
    refused(&planted, &planted, &[&planted], "writable by other users");

    // The lock file of a folder that is ours: a symlink to nobody's file...
    let dir = base.join("f/pg");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    symlink(v.join("keep"), dir.join("lock")).unwrap();
    refused(
        &dir,
        &dir.join("lock"),
        &[&v, &v.join("keep")],
        "symbolic link",
    );

    // ... and to a file of root's, which the owner check alone would let
    // through: it must not be opened, let alone set to 0600.
    let rootfile = base.join("root-file");
    std::fs::write(&rootfile, "root's file").unwrap();
    std::fs::set_permissions(&rootfile, std::fs::Permissions::from_mode(0o644)).unwrap();
    let dir = base.join("g/pg");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    symlink(&rootfile, dir.join("lock")).unwrap();
    refused(&dir, &dir.join("lock"), &[&rootfile], "symbolic link");

    // The socket folder under /tmp of a folder too deep for a socket path.
    let deep = base.join(format!("{}/pg", "d".repeat(100)));
    let sock = batchonce::ops::embedded::socket_dir_for(&deep);
    assert!(sock.starts_with("/tmp"), "{}", sock.display());
    let _gone = Cleanup(sock.clone());
    let _ = std::fs::remove_file(&sock);
    symlink(&v, &sock).unwrap();
    refused(&deep, &sock, &[&v], "symbolic link");

    // As root, a project `postgres` cannot reach moves to a folder named
    // after it under /tmp, which anyone could have made first.
    let private = base.join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let dir = private.join("pg");
    let moved = batchonce::ops::embedded::relocation_for(&dir);
    let _gone = Cleanup(moved.clone());
    let _ = std::fs::remove_file(&moved);
    symlink(&v, &moved).unwrap();
    refused(&dir, &moved, &[&v], "symbolic link");
    std::fs::remove_file(&moved).unwrap();
    std::fs::create_dir(&moved).unwrap();
    nix::unistd::chown(&moved, Some(nobody.uid), Some(nobody.gid)).unwrap();
    refused(&dir, &moved, &[&moved], "belongs to nobody");
    std::fs::remove_dir(&moved).unwrap();

    // Nothing planted: the relocated cluster starts, `postgres`'s alone.
    let cluster = start(&dir, false);
    assert_eq!(cluster.dir(), moved);
    only_its_user_connects(&cluster, &nobody);
}

#[test]
fn a_home_full_of_shell_syntax_is_only_a_path_and_the_password_is_never_printed() {
    let tag = format!("{}-{:08x}", std::process::id(), rand::random::<u32>());
    let pwned = [
        PathBuf::from(format!("/tmp/pwned-{tag}-dollar")),
        PathBuf::from(format!("/tmp/pwned-{tag}-tick")),
    ];
    // The slashes inside `$(...)` make nested folders: still one path.
    let home = scratch("shell").join(format!(
        "a b $(touch {}) `touch {}` 'single' \"double\" ;|&",
        pwned[0].display(),
        pwned[1].display()
    ));
    std::fs::create_dir_all(&home).unwrap();
    let out = Command::new(BIN)
        .arg("demo")
        .env_remove("DATABASE_URL")
        .env("BATCHONCE_HOME", &home)
        .output()
        .unwrap();
    let printed = text(&out);
    let ran: Vec<&PathBuf> = pwned.iter().filter(|p| p.exists()).collect();
    for p in &ran {
        let _ = std::fs::remove_file(p);
    }
    assert!(ran.is_empty(), "{ran:?} were created: a shell ran");
    assert!(out.status.success(), "demo failed:\n{printed}");
    assert!(printed.contains("demo passed"), "{printed}");

    // The demo stopped the cluster it started; start it again, as the
    // demo does, to look at it running.
    let cluster = start(&home.join("pg"), true);
    let _gone = cluster
        .socket_dir()
        .starts_with("/tmp")
        .then(|| Cleanup(cluster.socket_dir().to_owned()));
    let (bare, password) = split_password(&cluster.url("postgres"));
    assert!(password.len() >= 32);
    let pgpass = std::fs::read_to_string(cluster.dir().join("pgpass")).unwrap();
    assert!(pgpass.contains(&password));

    // Never printed: not by the demo, its workers' logs, its files, the
    // server's log, a `Cluster`'s Debug or an error line with the URL.
    assert!(
        !printed.contains(&password),
        "the demo printed the password"
    );
    assert!(printed.contains(&format!(
        "password in {}",
        cluster.dir().join("pgpass").display()
    )));
    let mut files = vec![cluster.dir().join("server.log")];
    for e in std::fs::read_dir(&home).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            files.push(p);
        }
    }
    for f in &files {
        let content = std::fs::read(f).unwrap();
        assert!(
            !String::from_utf8_lossy(&content).contains(&password),
            "{} holds the password",
            f.display()
        );
    }
    assert!(!format!("{:?}", *cluster).contains(&password));
    let out = Command::new(BIN)
        .arg("status")
        .env("DATABASE_URL", cluster.url("no_such_database"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("postgres:***@"), "{err}");
    assert!(
        !err.contains(&password),
        "the error line shows the password"
    );
    // The server is handed neither the password nor our environment.
    let data = cluster.dir().join("data");
    let pid = std::fs::read_to_string(data.join("postmaster.pid")).unwrap();
    let pid = pid.lines().next().unwrap().trim().to_owned();
    for what in ["environ", "cmdline"] {
        let seen = std::fs::read(format!("/proc/{pid}/{what}")).unwrap();
        assert!(
            !String::from_utf8_lossy(&seen).contains(&password),
            "{what}"
        );
    }
    assert!(
        !String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/environ")).unwrap())
            .contains("DATABASE_URL")
    );

    // The demo's cluster is its user's alone.
    if let Some(nobody) = nobody() {
        only_its_user_connects(&cluster, &nobody);
    } else {
        let out = psql_as(None, &bare, None, "SELECT 1");
        assert!(!out.status.success(), "connected without the password");
    }
}

/// Whether process `pid` runs (a zombie no longer does: whoever adopted
/// the daemonized server may not have reaped it yet).
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().to_owned())
        })
        .is_some_and(|state| !state.starts_with('Z'))
}

/// Runs a server binary as the server's user (`postgres` when root).
fn as_server(bin: &Path, args: &[&OsStr]) -> Output {
    let mut c = Command::new(bin);
    c.args(args).env("LC_ALL", "C").current_dir("/");
    if Uid::effective().is_root() {
        let u = User::from_name("postgres").unwrap().unwrap();
        c.uid(u.uid.as_raw()).gid(u.gid.as_raw());
    }
    c.output().unwrap()
}

#[test]
fn an_earlier_versions_open_cluster_is_stopped_and_replaced() {
    let bindir = batchonce::ops::embedded::find_bindir().unwrap();
    let dir = std::fs::canonicalize(scratch("legacy")).unwrap().join("pg");
    // The earlier version's layout: 0755 folders, trust authentication, a
    // socket anyone could use, the server started and left running.
    let data = dir.join("data");
    let sock = dir.join("sock");
    for d in [&dir, &sock] {
        std::fs::create_dir(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        if Uid::effective().is_root() {
            let u = User::from_name("postgres").unwrap().unwrap();
            nix::unistd::chown(d, Some(u.uid), Some(u.gid)).unwrap();
        }
    }
    let os = |s: &str| std::ffi::OsString::from(s);
    let out = as_server(
        &bindir.join("initdb"),
        &[
            os("-D").as_os_str(),
            data.as_os_str(),
            os("-U").as_os_str(),
            os("postgres").as_os_str(),
            os("--auth=trust").as_os_str(),
            os("--no-instructions").as_os_str(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    // The scratch path is ours and plain, so `-o` through the shell is safe
    // here, as it was not in the earlier version.
    let opts = format!(
        "-c listen_addresses='' -k {} -c unix_socket_permissions=0777",
        sock.display()
    );
    let log = dir.join("server.log");
    let out = as_server(
        &bindir.join("pg_ctl"),
        &[
            os("start").as_os_str(),
            os("-w").as_os_str(),
            os("-D").as_os_str(),
            data.as_os_str(),
            os("-l").as_os_str(),
            log.as_os_str(),
            os("-o").as_os_str(),
            os(&opts).as_os_str(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    // Stopped at the end whatever happens (already stopped if all went well).
    struct Legacy(PathBuf, PathBuf);
    impl Drop for Legacy {
        fn drop(&mut self) {
            let args = [
                OsStr::new("stop"),
                OsStr::new("-m"),
                OsStr::new("immediate"),
            ];
            let mut args: Vec<&OsStr> = args.to_vec();
            args.extend([OsStr::new("-D"), self.1.as_os_str()]);
            let _ = as_server(&self.0.join("pg_ctl"), &args);
        }
    }
    let _legacy = Legacy(bindir.clone(), data.clone());
    let old = format!(
        "postgres://postgres@localhost/postgres?host={}",
        sock.display()
    );
    let out = psql_as(None, &old, None, "CREATE TABLE left_by_anyone (x int)");
    assert!(out.status.success(), "the old cluster: {}", text(&out));
    let old_pid = std::fs::read_to_string(data.join("postmaster.pid")).unwrap();
    let old_pid = old_pid.lines().next().unwrap().trim().to_owned();

    let cluster = start(&dir, false);
    assert!(cluster.started_here);
    assert!(!alive(&old_pid), "the old server still runs");
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&sock), 0o700);
    let (bare, password) = split_password(&cluster.url("postgres"));
    let out = psql_as(None, &bare, None, "SELECT 1");
    assert!(!out.status.success(), "still open: {}", text(&out));
    let out = psql_as(
        None,
        &bare,
        Some(&password),
        "SELECT count(*) FROM pg_tables WHERE tablename = 'left_by_anyone'",
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "0",
        "the old data was kept"
    );
    drop(cluster);
    // And the next start reuses the new cluster and its password.
    let again = start(&dir, false);
    assert!(again.started_here);
    assert_eq!(split_password(&again.url("postgres")).1, password);
}
