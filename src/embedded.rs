//! The private PostgreSQL cluster that `demo` and the tests use when no
//! `DATABASE_URL` is given: started from the PostgreSQL binaries installed on
//! the machine, with its data and unix socket under a project folder, no TCP
//! port, and reused on the next run.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nix::unistd::{Uid, User};

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
}

/// Options for a private cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Folder holding `data/`, the socket and the server log.
    pub dir: PathBuf,
    /// Throw-away clusters (tests) skip fsync; the demo's keeps it.
    pub durable: bool,
    pub max_connections: u32,
}

/// A running private cluster.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    bindir: PathBuf,
    data: PathBuf,
    socket_dir: PathBuf,
    run_as: Option<User>,
    /// Whether this process started it (and so may stop it).
    pub started_here: bool,
}

/// Finds the installed server binaries (`initdb`, `pg_ctl`, `postgres`).
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
    pub fn start(opts: &ClusterOptions) -> Result<Self, EmbeddedError> {
        let bindir = find_bindir()?;
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| EmbeddedError::Io { path, source }
        };
        fs::create_dir_all(&opts.dir).map_err(io(&opts.dir))?;
        let mut dir = fs::canonicalize(&opts.dir).map_err(io(&opts.dir))?;
        // As root the server runs as `postgres`, which must be able to reach
        // the folder; a project under a private home (/root) cannot host it,
        // so the cluster moves to a folder named after the project under /tmp.
        if Uid::effective().is_root() && !reachable_by_others(&dir) {
            dir = relocated(&dir);
            fs::create_dir_all(&dir).map_err(io(&dir))?;
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).map_err(io(&dir))?;
        }
        let lock_path = dir.join("lock");
        let lock_file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| EmbeddedError::Io {
                path: lock_path.clone(),
                source: e.into(),
            })?;

        // PostgreSQL refuses to run as root; as root we run it as `postgres`.
        let run_as = if Uid::effective().is_root() {
            Some(
                User::from_name("postgres")
                    .ok()
                    .flatten()
                    .ok_or(EmbeddedError::NoPostgresUser)?,
            )
        } else {
            None
        };
        let data = dir.join("data");
        let socket_dir = socket_dir_for(&dir);
        fs::create_dir_all(&socket_dir).map_err(io(&socket_dir))?;
        let mut cluster = Self {
            dir: dir.clone(),
            bindir,
            data,
            socket_dir,
            run_as,
            started_here: false,
        };
        if let Some(u) = &cluster.run_as {
            for d in [&dir, &cluster.socket_dir] {
                if d.starts_with("/tmp") {
                    check_owner(d, &[0, u.uid.as_raw()])?;
                }
                nix::unistd::chown(d, Some(u.uid), Some(u.gid)).map_err(|e| EmbeddedError::Io {
                    path: d.clone(),
                    source: e.into(),
                })?;
            }
        }
        if !cluster.data.join("PG_VERSION").exists() {
            cluster.init(&dir)?;
        }
        if !cluster.is_running() {
            cluster.launch(&dir, opts)?;
            cluster.started_here = true;
        }
        Ok(cluster)
    }

    fn init(&self, dir: &Path) -> Result<(), EmbeddedError> {
        // A half-made data folder from an interrupted initdb would block it.
        let _ = fs::remove_dir_all(&self.data);
        let out = self.pg(dir, "initdb", |c| {
            c.arg("-D")
                .arg(&self.data)
                .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"])
                .arg("--no-instructions")
        })?;
        check("initdb", out)
    }

    fn launch(&self, dir: &Path, opts: &ClusterOptions) -> Result<(), EmbeddedError> {
        let log = dir.join("server.log");
        let mut server_opts = format!(
            "-c listen_addresses='' -k {} -c max_connections={}",
            self.socket_dir.display(),
            opts.max_connections
        );
        if !opts.durable {
            server_opts.push_str(" -c fsync=off -c synchronous_commit=off -c full_page_writes=off");
        }
        let out = self.pg(dir, "pg_ctl", |c| {
            c.arg("start")
                .arg("-w")
                .args(["-t", "60"])
                .arg("-D")
                .arg(&self.data)
                .arg("-l")
                .arg(&log)
                .arg("-o")
                .arg(&server_opts)
        })?;
        check("pg_ctl start", out).map_err(|e| match e {
            EmbeddedError::Command { what, detail } => EmbeddedError::Command {
                what,
                detail: format!("{detail} (see {})", log.display()),
            },
            other => other,
        })
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
    /// shutdown that disconnects every session cleanly.
    pub fn stop_with(&self, immediate: bool) -> Result<(), EmbeddedError> {
        let mode = if immediate { "immediate" } else { "fast" };
        let out = self.pg(&self.data, "pg_ctl", |c| {
            c.arg("stop")
                .args(["-m", mode, "-w"])
                .arg("-D")
                .arg(&self.data)
        })?;
        check("pg_ctl stop", out)
    }

    /// The folder holding the data, socket and log (after any relocation).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The URL of a database on this cluster (over the unix socket).
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@localhost/{database}?host={}",
            self.socket_dir.display()
        )
    }

    fn pg(
        &self,
        cwd: &Path,
        program: &str,
        args: impl FnOnce(&mut Command) -> &mut Command,
    ) -> Result<Output, EmbeddedError> {
        let mut cmd = Command::new(self.bindir.join(program));
        args(&mut cmd);
        cmd.current_dir(cwd).env_remove("PGDATA").env("LC_ALL", "C");
        if let Some(u) = &self.run_as {
            cmd.uid(u.uid.as_raw()).gid(u.gid.as_raw());
        }
        cmd.output().map_err(|e| EmbeddedError::Command {
            what: program.to_owned(),
            detail: e.to_string(),
        })
    }
}

/// Whether every folder above `dir` lets other users pass through.
fn reachable_by_others(dir: &Path) -> bool {
    dir.ancestors().skip(1).all(|a| {
        fs::metadata(a)
            .map(|m| m.permissions().mode() & 0o001 != 0)
            .unwrap_or(false)
    })
}

fn relocated(dir: &Path) -> PathBuf {
    PathBuf::from(format!("/tmp/batchonce-pg-{:016x}", fnv1a(dir)))
}

/// FNV-1a of a path: stable across Rust releases (std's hasher is not), so
/// the same project finds the same relocated cluster with any toolchain.
fn fnv1a(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    crate::key::fnv1a64(path.as_os_str().as_bytes())
}

/// A folder under /tmp that root is about to hand to `postgres` must not have
/// been made by someone else first (the names are predictable).
fn check_owner(dir: &Path, allowed: &[u32]) -> Result<(), EmbeddedError> {
    use std::os::unix::fs::MetadataExt;
    match fs::metadata(dir) {
        Ok(m) if !allowed.contains(&m.uid()) => Err(EmbeddedError::Io {
            path: dir.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "owned by uid {}, not by root or postgres; remove it",
                    m.uid()
                ),
            ),
        }),
        _ => Ok(()),
    }
}

/// Unix socket paths are limited to about 107 bytes; a deep project folder
/// gets its socket under /tmp instead, named after the folder.
fn socket_dir_for(dir: &Path) -> PathBuf {
    let inside = dir.join("sock");
    if inside.as_os_str().len() + "/.s.PGSQL.5432".len() < 100 {
        return inside;
    }
    let p = PathBuf::from(format!("/tmp/batchonce-sock-{:016x}", fnv1a(dir)));
    let _ = fs::create_dir_all(&p)
        .and_then(|_| fs::set_permissions(&p, fs::Permissions::from_mode(0o755)));
    p
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
