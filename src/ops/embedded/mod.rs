//! The private PostgreSQL cluster that `demo` and the tests use when no
//! `DATABASE_URL` is given: started from the PostgreSQL binaries installed on
//! the machine ([`find_bindir`]), with its data and unix socket under a
//! project folder, no TCP port, and reused on the next run. It is for the
//! demo and the tests only, never for production (`docs/security.md`, "The
//! embedded cluster"). [`Cluster::start`] says step by step how a cluster is
//! found, made and started.
//!
//! Invariants (`workers/tests/embedded.rs` checks all three):
//!
//! - Only the user who started it can connect: its folders are 0700 (as
//!   root, owned by `postgres`, whom root can still reach), its socket is
//!   0700, and every login needs a random password (SCRAM) kept in a 0600
//!   file that only that user can read.
//! - Every folder is verified before anything is written into it, without
//!   following a symlink (`verified`).
//! - No path ever goes through a shell: the server, `pg_ctl stop` and
//!   `pg_ctl status` are started directly, their settings as separate
//!   arguments.
//!
//! Test clusters turn off fsync; the demo's cluster keeps it on.

mod secret;
mod verified;

use std::ffi::OsString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::unistd::{Uid, User};

use secret::Secret;
use verified::{Access, Dir, Open};

/// The file holding the cluster's password, in the format of a libpq
/// password file (`PGPASSFILE`), so `psql` can use it too.
pub const PASSWORD_FILE: &str = "pgpass";
/// The password for `initdb`, which runs as the server's user and cannot
/// read ours; removed as soon as `initdb` is done.
const INITDB_PASSWORD_FILE: &str = "initdb.pw";
/// How long the server may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error("no PostgreSQL server binaries found (looked in $BATCHONCE_PG_BINDIR, `pg_config --bindir` and /usr/lib/postgresql/*/bin); install them (Debian: apt-get install -y postgresql) or set DATABASE_URL to an existing server")]
    NotInstalled,
    #[error("running as root, but there is no `postgres` user to run the private cluster as; create one (useradd postgres) or set DATABASE_URL")]
    NoPostgresUser,
    #[error("{what} failed: {detail}")]
    Command { what: String, detail: String },
    #[error("cannot prepare {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A folder or file at a place the cluster uses that it did not make
    /// (or that was tampered with): left exactly as found.
    #[error("refusing {path}: {reason}; the private cluster only uses what it made itself, so remove it (stopping any server in it) and run again")]
    Refused { path: PathBuf, reason: String },
    #[error("the private cluster's socket folder {path} is not valid UTF-8, which a database URL cannot carry; choose another folder")]
    NotUtf8 { path: PathBuf },
}

/// Options for a private cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Folder holding `data/`, the socket, the password file and the log.
    pub dir: PathBuf,
    /// Throw-away clusters (tests) skip fsync; the demo's keeps it.
    pub durable: bool,
    pub max_connections: u32,
}

/// A running private cluster. Its `Debug` shows no password.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    bindir: PathBuf,
    data: PathBuf,
    socket_dir: PathBuf,
    run_as: Option<User>,
    password: Secret,
    /// The server, when this process started it: reaped after a stop.
    server: Mutex<Option<Child>>,
    /// Whether this process started it (and so may stop it).
    pub started_here: bool,
}

/// Finds the installed server binaries (`initdb`, `pg_ctl`, `postgres`):
/// `$BATCHONCE_PG_BINDIR` if it is set (an explicit choice is final, with
/// no search behind it), otherwise `pg_config --bindir`, then the highest
/// `/usr/lib/postgresql/<major>/bin`.
pub fn find_bindir() -> Result<PathBuf, EmbeddedError> {
    let has_server = |d: &Path| d.join("initdb").is_file() && d.join("pg_ctl").is_file();
    // An explicit choice is final: no search behind the operator's back.
    if let Some(d) = std::env::var_os("BATCHONCE_PG_BINDIR") {
        let d = PathBuf::from(d);
        return if has_server(&d) {
            Ok(d)
        } else {
            Err(EmbeddedError::NotInstalled)
        };
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let d = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_server(&d) {
            return Ok(d);
        }
    }
    // Debian keeps the server binaries off PATH, one folder per major version.
    let mut found: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            has_server(&bin).then_some((major, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .map(|(_, b)| b)
        .ok_or(EmbeddedError::NotInstalled)
}

impl Cluster {
    /// Starts the cluster in `opts.dir`, creating it on first use, or attaches
    /// to it if it is already running. Safe to call from several threads and
    /// processes at once: a lock file serializes them.
    ///
    /// - **It picks the folder.** Only the parent of `opts.dir` is resolved
    ///   (and created if missing), so a symlink in the folder's own name is
    ///   seen, not followed. As root, everything runs as the `postgres`
    ///   user; if `postgres` cannot reach the folder (a private home such as
    ///   `/root`), the cluster moves to [`relocation_for`]. [`Cluster::dir`]
    ///   reports where it ended up.
    /// - **It verifies the folder** (`verified::ensure_dir`) and serializes
    ///   starters with an `flock` on `<dir>/lock`.
    /// - **It verifies the socket folder** ([`socket_dir_for`]).
    /// - **It reads the password** from `<dir>/pgpass` ([`PASSWORD_FILE`],
    ///   libpq's password-file format). If the file is missing, the cluster
    ///   is new, half-made, or from an earlier version with trust
    ///   authentication; then `initialise` stops any server in `data/`,
    ///   deletes `data/` and runs `initdb --auth=scram-sha-256` with a new
    ///   random password (`secret::Secret`). `initdb` reads the password
    ///   from a 0600 file owned by the server's user, removed right after.
    ///   `pgpass` is written last, so its presence means that the cluster is
    ///   complete.
    /// - **It starts `postgres` directly** if the server is not running,
    ///   and otherwise attaches to it. The server gets
    ///   `listen_addresses=''`, `unix_socket_permissions=0700`, the socket
    ///   folder, `max_connections` and, for tests, `fsync=off`. It runs in a
    ///   process group of its own, with an empty environment plus `LC_ALL`,
    ///   `PATH` and `TZ`. Start-up waits until `postmaster.pid` (of our own
    ///   child's pid) says `ready`.
    pub fn start(opts: &ClusterOptions) -> Result<Self, EmbeddedError> {
        let bindir = find_bindir()?;
        // PostgreSQL refuses to run as root; as root we run it as `postgres`.
        let me = Uid::effective();
        let run_as = if me.is_root() {
            Some(
                User::from_name("postgres")
                    .ok()
                    .flatten()
                    .ok_or(EmbeddedError::NoPostgresUser)?,
            )
        } else {
            None
        };
        let access = Access {
            owners: match &run_as {
                Some(u) => vec![me, u.uid],
                None => vec![me],
            },
            hand_to: run_as.as_ref().map(|u| (u.uid, u.gid)),
        };
        let mut path = absolute(&opts.dir)?;
        // As root the server runs as `postgres`, which must be able to reach
        // the folder; a project under a private home (/root) cannot host it,
        // so the cluster moves to a folder named after the project under /tmp.
        if run_as.is_some() && !reachable_by_others(&path) {
            path = relocation_for(&path);
        }
        let dir = verified::ensure_dir(None, &path, &access)?;
        let lock_file = dir
            .open("lock", Open::Create, &[me])?
            .ok_or_else(|| verified_missing(&dir.path.join("lock")))?;
        let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| EmbeddedError::Io {
                path: dir.path.join("lock"),
                source: e.into(),
            })?;

        let socket_dir = socket_dir_for(&dir.path);
        if socket_dir.to_str().is_none() {
            return Err(EmbeddedError::NotUtf8 { path: socket_dir });
        }
        if socket_dir.parent() == Some(dir.path.as_path()) {
            verified::ensure_dir(Some(&dir), Path::new("sock"), &access)?;
        } else {
            verified::ensure_dir(None, &socket_dir, &access)?;
        }
        let mut cluster = Self {
            dir: dir.path.clone(),
            bindir,
            data: dir.path.join("data"),
            socket_dir,
            run_as,
            // Set just below, once the lock is held and `data` examined.
            password: Secret::default(),
            server: Mutex::new(None),
            started_here: false,
        };
        cluster.password = match cluster.existing_password(&dir, me)? {
            Some(p) => p,
            None => cluster.initialise(&dir)?,
        };
        if !cluster.is_running() {
            let child = cluster.launch(&dir, opts, me)?;
            cluster.server = Mutex::new(Some(child));
            cluster.started_here = true;
        }
        Ok(cluster)
    }

    /// The password of a cluster this version made, if there is one: a data
    /// folder and the password file written after `initdb` succeeded.
    fn existing_password(&self, dir: &Dir, me: Uid) -> Result<Option<Secret>, EmbeddedError> {
        let Some(text) = dir.read(PASSWORD_FILE, &[me])? else {
            return Ok(None);
        };
        if !self.data.join("PG_VERSION").exists() {
            return Ok(None);
        }
        Secret::from_pgpass(&text)
            .map(Some)
            .ok_or_else(|| EmbeddedError::Refused {
                path: dir.path.join(PASSWORD_FILE),
                reason: "it is not a password file written by batchonce".into(),
            })
    }

    /// Makes a new cluster. Whatever is in `data` goes first: an `initdb`
    /// that was interrupted, or a cluster of an earlier version, which let
    /// every local user in as superuser (trust authentication), so nothing
    /// in it can be trusted; it is stopped first if it is running.
    fn initialise(&self, dir: &Dir) -> Result<Secret, EmbeddedError> {
        if self.is_running() {
            self.stop_with(false)?;
        }
        dir.remove(PASSWORD_FILE)?;
        dir.remove_tree("data")?;
        let password = Secret::generate();
        let server_user = self.run_as.as_ref().map(|u| (u.uid, u.gid));
        dir.write(
            INITDB_PASSWORD_FILE,
            password.expose().as_bytes(),
            server_user,
        )?;
        let mut pwfile = OsString::from("--pwfile=");
        pwfile.push(dir.path.join(INITDB_PASSWORD_FILE));
        let out = self.pg(&dir.path, "initdb", |c| {
            c.arg("-D")
                .arg(&self.data)
                .args(["-U", "postgres", "--auth=scram-sha-256"])
                .arg(pwfile)
                .args(["-E", "UTF8", "--locale=C", "--no-instructions"])
        });
        dir.remove(INITDB_PASSWORD_FILE)?;
        check("initdb", out?)?;
        // Written last: its presence says the cluster is complete and ours.
        dir.write(PASSWORD_FILE, password.pgpass().as_bytes(), None)?;
        Ok(password)
    }

    /// Starts `postgres` itself rather than through `pg_ctl start`, which
    /// hands its data and log paths to `/bin/sh`. The settings are separate
    /// arguments, so a path with spaces, quotes or `$(...)` is only a path.
    fn launch(&self, dir: &Dir, opts: &ClusterOptions, me: Uid) -> Result<Child, EmbeddedError> {
        let log_path = dir.path.join("server.log");
        let mut owners = vec![me];
        owners.extend(self.run_as.as_ref().map(|u| u.uid));
        let log = dir
            .open("server.log", Open::Append, &owners)?
            .ok_or_else(|| verified_missing(&log_path))?;
        let log_err = log.try_clone().map_err(|e| EmbeddedError::Io {
            path: log_path.clone(),
            source: e,
        })?;
        let mut settings = vec![
            "listen_addresses=".to_owned(),
            "unix_socket_permissions=0700".to_owned(),
            format!("max_connections={}", opts.max_connections),
            // Commit times let an operator (and the test suite's oracle) tell
            // when a row was committed rather than when its transaction
            // began, which is what decides whether a write beat a takeover.
            "track_commit_timestamp=on".to_owned(),
        ];
        if !opts.durable {
            settings.extend(
                [
                    "fsync=off",
                    "synchronous_commit=off",
                    "full_page_writes=off",
                ]
                .map(String::from),
            );
        }
        let mut cmd = Command::new(self.bindir.join("postgres"));
        cmd.arg("-D")
            .arg(&self.data)
            .arg("-c")
            .arg(socket_setting(&self.socket_dir));
        for s in &settings {
            cmd.arg("-c").arg(s);
        }
        self.prepare(&mut cmd, &dir.path);
        cmd.stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            // Out of our process group, as `pg_ctl` would do: a Ctrl-C on
            // the demo does not take the shared server down with it.
            .process_group(0);
        let mut child = cmd.spawn().map_err(|e| EmbeddedError::Command {
            what: "postgres".into(),
            detail: e.to_string(),
        })?;
        match wait_ready(&mut child, &self.data) {
            Ok(()) => Ok(child),
            Err(detail) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(EmbeddedError::Command {
                    what: "postgres start".into(),
                    detail: format!("{detail} (see {})", log_path.display()),
                })
            }
        }
    }

    fn is_running(&self) -> bool {
        self.data.join("postmaster.pid").exists()
            && self
                .pg(&self.data, "pg_ctl", |c| {
                    c.arg("status").arg("-D").arg(&self.data)
                })
                .map(|o| o.status.success())
                .unwrap_or(false)
    }

    /// Stops the cluster (fast shutdown); its data stays for the next run.
    pub fn stop(&self) -> Result<(), EmbeddedError> {
        self.stop_with(false)
    }

    /// Stops the cluster: `immediate` aborts without a checkpoint, as a
    /// crash would (the next start recovers from the WAL); otherwise a fast
    /// shutdown that disconnects every session cleanly. The fault suite
    /// restarts a cluster both ways in the middle of a workload. A server
    /// this process started is its child, and is reaped after a stop.
    pub fn stop_with(&self, immediate: bool) -> Result<(), EmbeddedError> {
        let mode = if immediate { "immediate" } else { "fast" };
        // `pg_ctl stop` signals the server and waits for it; no shell.
        let out = self.pg(&self.data, "pg_ctl", |c| {
            c.arg("stop")
                .args(["-m", mode, "-w"])
                .arg("-D")
                .arg(&self.data)
        })?;
        check("pg_ctl stop", out)?;
        // The server this process started is its child: reap it.
        if let Ok(mut server) = self.server.lock() {
            if let Some(mut child) = server.take() {
                let _ = child.wait();
            }
        }
        Ok(())
    }

    /// The folder holding the data, socket and log (after any relocation).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The folder of the server's unix socket.
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// The URL of a database on this cluster (over the unix socket), with
    /// the password: for connections of this user and its child processes.
    /// Print it only through `db::redact`. Percent-encoded as both sqlx and
    /// libpq decode it (a space is `%20`, never `+`); a socket folder that
    /// is not UTF-8 is refused at start. `Cluster`'s `Debug` shows
    /// `Secret(***)`.
    pub fn url(&self, database: &str) -> String {
        // `start` refused a socket folder that is not UTF-8.
        let socket = self.socket_dir.to_string_lossy();
        format!(
            "postgres://postgres:{}@localhost/{}?host={}",
            encode(self.password.expose(), false),
            encode(database, false),
            encode(&socket, true)
        )
    }

    /// Sets up a child process: as the server's user when we are root, in
    /// `cwd`, with none of our environment (no `PGPASSWORD`, no
    /// `DATABASE_URL`: the server's tools need no password of ours).
    fn prepare(&self, cmd: &mut Command, cwd: &Path) {
        cmd.current_dir(cwd).env_clear().env("LC_ALL", "C");
        for keep in ["PATH", "TZ"] {
            if let Some(v) = std::env::var_os(keep) {
                cmd.env(keep, v);
            }
        }
        if let Some(u) = &self.run_as {
            cmd.uid(u.uid.as_raw()).gid(u.gid.as_raw());
        }
    }

    fn pg(
        &self,
        cwd: &Path,
        program: &str,
        args: impl FnOnce(&mut Command) -> &mut Command,
    ) -> Result<Output, EmbeddedError> {
        let mut cmd = Command::new(self.bindir.join(program));
        args(&mut cmd);
        self.prepare(&mut cmd, cwd);
        cmd.stdin(Stdio::null())
            .output()
            .map_err(|e| EmbeddedError::Command {
                what: program.to_owned(),
                detail: e.to_string(),
            })
    }
}

fn verified_missing(path: &Path) -> EmbeddedError {
    EmbeddedError::Refused {
        path: path.to_owned(),
        reason: "it vanished while the cluster was being prepared".into(),
    }
}

/// `dir` as an absolute path: its parent (created if missing) resolved, its
/// last component kept as it is, so a symlink there is seen, not followed.
fn absolute(dir: &Path) -> Result<PathBuf, EmbeddedError> {
    let name = dir.file_name().ok_or_else(|| EmbeddedError::Refused {
        path: dir.to_owned(),
        reason: "it does not end in a folder name".into(),
    })?;
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let io = |source| EmbeddedError::Io {
        path: parent.to_owned(),
        source,
    };
    fs::create_dir_all(parent).map_err(io)?;
    Ok(fs::canonicalize(parent).map_err(io)?.join(name))
}

/// Whether every folder above `dir` lets other users pass through.
fn reachable_by_others(dir: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    dir.ancestors().skip(1).all(|a| {
        fs::metadata(a)
            .map(|m| m.permissions().mode() & 0o001 != 0)
            .unwrap_or(false)
    })
}

/// Where root's cluster for the absolute folder `dir` goes when `postgres`
/// cannot reach `dir`: `/tmp/batchonce-pg-<16 hex>`, named after `dir` so the
/// same project finds it again. Anyone can predict the name, which is why
/// `Cluster::start` only takes a folder there that root or `postgres` owns,
/// writable by nobody else, and never a symlink.
pub fn relocation_for(dir: &Path) -> PathBuf {
    PathBuf::from(format!("/tmp/batchonce-pg-{:016x}", fnv1a(dir)))
}

/// Where the socket of the cluster in the absolute folder `dir` lives:
/// `<dir>/sock`, or, when that path is too long for a unix socket (about 107
/// bytes), `/tmp/batchonce-sock-<16 hex>` named after `dir`, verified as
/// [`relocation_for`] says. Both `/tmp` names are the FNV-1a hash of the
/// folder's path, stable across Rust toolchains.
pub fn socket_dir_for(dir: &Path) -> PathBuf {
    let inside = dir.join("sock");
    if inside.as_os_str().len() + "/.s.PGSQL.5432".len() < 100 {
        return inside;
    }
    PathBuf::from(format!("/tmp/batchonce-sock-{:016x}", fnv1a(dir)))
}

/// FNV-1a of a path: stable across Rust releases (std's hasher is not), so
/// the same project finds the same relocated cluster with any toolchain.
fn fnv1a(path: &Path) -> u64 {
    crate::key::fnv1a64(path.as_os_str().as_bytes())
}

/// `unix_socket_directories=<dir>` as one argument: the value is a list, so
/// the folder is double-quoted with its double quotes doubled, and a comma
/// or a space in it stays part of the name.
fn socket_setting(dir: &Path) -> OsString {
    let mut value = b"unix_socket_directories=\"".to_vec();
    for &b in dir.as_os_str().as_bytes() {
        if b == b'"' {
            value.push(b'"');
        }
        value.push(b);
    }
    value.push(b'"');
    std::ffi::OsStr::from_bytes(&value).to_owned()
}

/// Percent-encodes all but unreserved characters (and `/` in a socket
/// path), as both sqlx and libpq decode it: a space is `%20`, never `+`.
fn encode(text: &str, path: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for &b in text.as_bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (path && b == b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Waits until the server we spawned says it accepts connections: the
/// status line of `postmaster.pid` (line 8 since PostgreSQL 10) reads
/// `ready`, in the file of our own child's pid.
fn wait_ready(child: &mut Child, data: &Path) -> Result<(), String> {
    let deadline = Instant::now() + START_TIMEOUT;
    let pid_file = data.join("postmaster.pid");
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Err(format!("the server exited ({status})")),
            Ok(None) => {}
            Err(e) => return Err(e.to_string()),
        }
        if let Ok(text) = fs::read_to_string(&pid_file) {
            let lines: Vec<&str> = text.lines().collect();
            let ours = lines.first().and_then(|l| l.trim().parse::<u32>().ok()) == Some(child.id());
            if ours && lines.get(7).is_some_and(|s| s.trim() == "ready") {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "not accepting connections after {}s",
                START_TIMEOUT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn check(what: &str, out: Output) -> Result<(), EmbeddedError> {
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr);
    let detail = text
        .lines()
        .chain(String::from_utf8_lossy(&out.stdout).lines())
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or("no output")
        .to_owned();
    Err(EmbeddedError::Command {
        what: what.to_owned(),
        detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_setting_quotes_the_folder_as_one_list_element() {
        let s = socket_setting(Path::new("/t/a b,c\"d$(x)`y`'z'"));
        assert_eq!(
            s.to_str().unwrap(),
            "unix_socket_directories=\"/t/a b,c\"\"d$(x)`y`'z'\""
        );
    }

    #[test]
    fn urls_encode_the_socket_path_for_sqlx_and_libpq() {
        assert_eq!(encode("/t/a b/$(x)'", true), "/t/a%20b/%24%28x%29%27");
        assert_eq!(encode("a/b", false), "a%2Fb");
        let url = format!(
            "postgres://postgres:{}@localhost/db?host={}",
            "s3cretAbC",
            encode("/t/a b&c=d/sock", true)
        );
        let opts: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
        assert_eq!(
            opts.get_socket().map(|p| p.to_path_buf()),
            Some(PathBuf::from("/t/a b&c=d/sock"))
        );
        let shown = crate::db::redact(&url);
        assert!(!shown.contains("s3cretAbC"), "{shown}");
    }
}
