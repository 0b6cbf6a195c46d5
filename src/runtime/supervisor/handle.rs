//! The worker's end of a command job's supervisor (see
//! [`crate::runtime::supervisor`]): the command that starts it, and the
//! [`Supervised`] handle that sends the program's environment and deadlines
//! and reads how the program ended.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::{Child, ChildStderr, ChildStdout};

use super::{Control, Report, MARKER, START_TIMEOUT};
use crate::runtime::isolation::Switch;

/// The executable the worker starts as the supervisor: the image it runs.
pub fn own_executable() -> &'static Path {
    Path::new("/proc/self/exe")
}

/// The command that runs `argv` under a supervisor started from `exe`
/// (normally [`own_executable`]). Set its working directory and output,
/// then hand it to [`Supervised::spawn`]; the program's environment goes
/// to [`Supervised::start`]. The supervisor itself runs with an empty
/// environment: it reads none, and the worker's holds its secrets.
pub fn command(exe: &Path, argv: &[String]) -> std::process::Command {
    command_as(exe, argv, None)
}

/// [`command`], with the program run as `switch`'s identity if given
/// (`run_as_user`).
pub fn command_as(exe: &Path, argv: &[String], switch: Option<&Switch>) -> std::process::Command {
    let mut cmd = std::process::Command::new(exe);
    cmd.env_clear();
    if exe == own_executable() {
        // So that `ps` shows the worker's name rather than the /proc path.
        if let Some(arg0) = std::env::args_os().next() {
            cmd.arg0(arg0);
        }
    }
    cmd.arg(MARKER);
    if let Some(s) = switch {
        cmd.arg("--as").arg(s.arg());
    }
    cmd.arg("--").args(argv);
    cmd
}

/// Why the supervisor did not start the program.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot start the supervisor: {0}")]
    Spawn(std::io::Error),
    /// The program itself could not be started (not found, not executable).
    #[error("{0}")]
    Program(std::io::Error),
    #[error(
        "the supervisor {0} (a binary of your own that runs the worker must call \
         `batchonce::runtime::supervisor::run_if_invoked()` first thing in `main`)"
    )]
    NotASupervisor(String),
    #[error("the lease deadline passed before the program could start")]
    Expired,
}

/// How a supervised program ended.
#[derive(Debug)]
pub enum Ending {
    /// It exited or was killed by a signal; the real status.
    Exited(ExitStatus),
    /// The supervisor killed it: the deadline passed without a renewal.
    Expired,
    /// The supervisor went away without a report (it was SIGKILLed); the
    /// kernel killed the program, but not necessarily the rest of its group.
    Vanished,
}

/// The worker's handle on a supervisor. Dropping it before the program has
/// ended kills the program's group: `kill`, end of file, and SIGKILL from
/// here too in case the supervisor cannot act.
pub struct Supervised {
    child: Child,
    writer: Option<OwnedWriteHalf>,
    reports: Lines<BufReader<OwnedReadHalf>>,
    /// Control bytes the socket did not take yet; never a partial line.
    outbox: Vec<u8>,
    group: Option<Pid>,
    ended: bool,
}

impl Supervised {
    /// Starts the supervisor of [`command`]; its stdin becomes the control
    /// socket. Must run inside a tokio runtime.
    pub fn spawn(mut cmd: std::process::Command) -> Result<Self, StartError> {
        let (ours, theirs) = StdUnixStream::pair().map_err(StartError::Spawn)?;
        ours.set_nonblocking(true).map_err(StartError::Spawn)?;
        cmd.stdin(Stdio::from(OwnedFd::from(theirs)));
        let mut cmd = tokio::process::Command::from(cmd);
        let child = cmd.spawn().map_err(StartError::Spawn)?;
        // Our copy of the supervisor's end must close, or its death would
        // never reach us as end of file.
        drop(cmd);
        let (reader, writer) = tokio::net::UnixStream::from_std(ours)
            .map_err(StartError::Spawn)?
            .into_split();
        Ok(Self {
            child,
            writer: Some(writer),
            reports: BufReader::new(reader).lines(),
            outbox: Vec::new(),
            group: None,
            ended: false,
        })
    }

    /// The supervisor's pid, while it runs.
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// The supervisor's stdout and stderr, if they were piped: the
    /// program's output and the supervisor's own messages.
    pub fn take_output(&mut self) -> (Option<ChildStdout>, Option<ChildStderr>) {
        (self.child.stdout.take(), self.child.stderr.take())
    }

    /// Sends the program's environment and its first deadline, and waits
    /// (at most [`START_TIMEOUT`]) until the supervisor reports the
    /// program's pid, which is also its process group.
    pub async fn start(
        &mut self,
        env: Vec<(String, String)>,
        deadline: Instant,
    ) -> Result<u32, StartError> {
        let give_up = tokio::time::Instant::now() + START_TIMEOUT;
        if let Some(w) = &mut self.writer {
            // A failed write means the supervisor is gone, and one that
            // does not finish means it does not read: what follows reports
            // either with the better message.
            let line = Control::Env(env).line();
            let _ = tokio::time::timeout_at(give_up, w.write_all(line.as_bytes())).await;
        }
        self.renew_until(deadline);
        let reports = &mut self.reports;
        let first = async {
            let Ok(Some(line)) = reports.next_line().await else {
                return Err(StartError::NotASupervisor(
                    "exited before starting the program".into(),
                ));
            };
            match Report::parse(&line) {
                Some(Report::Started(pid)) => Ok(pid),
                Some(Report::Failed { errno: 0, message }) => {
                    Err(StartError::Program(std::io::Error::other(message)))
                }
                Some(Report::Failed { errno, .. }) => Err(StartError::Program(
                    std::io::Error::from_raw_os_error(errno),
                )),
                Some(Report::Expired) => Err(StartError::Expired),
                _ => Err(StartError::NotASupervisor(format!(
                    "answered {:?} instead of `started`",
                    crate::text::truncate(&line)
                ))),
            }
        };
        match tokio::time::timeout_at(give_up, first).await {
            Ok(Ok(pid)) => {
                self.group = Some(Pid::from_raw(pid as i32));
                Ok(pid)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => {
                let _ = self.child.start_kill();
                Err(StartError::NotASupervisor(format!(
                    "did not report the program started within {}s",
                    START_TIMEOUT.as_secs()
                )))
            }
        }
    }

    /// Moves the deadline to `deadline`, or kills the program if it has
    /// passed already.
    pub fn renew_until(&mut self, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left < Duration::from_millis(1) {
            self.kill();
        } else if self.outbox.is_empty() {
            // With bytes still waiting the supervisor is not reading; a
            // renewal dropped then only brings the kill forward.
            self.send(&Control::Renew(left));
        }
    }

    /// SIGTERM to the program's group.
    pub fn term(&mut self) {
        self.send(&Control::Term);
    }

    /// SIGKILL to the program's group.
    pub fn kill(&mut self) {
        self.send(&Control::Kill);
    }

    /// Waits for the program's end. Cancel-safe: a report read is never
    /// lost when the future is dropped.
    pub async fn ending(&mut self) -> Ending {
        loop {
            let Ok(Some(line)) = self.reports.next_line().await else {
                // The kernel killed the program with its supervisor, but
                // not the rest of its group, which may hold the output
                // pipes open.
                if let Some(group) = self.group.filter(|_| !self.ended) {
                    let _ = killpg(group, Signal::SIGKILL);
                }
                return Ending::Vanished;
            };
            let ending = match Report::parse(&line) {
                Some(Report::Exited(code)) => Ending::Exited(ExitStatus::from_raw(code << 8)),
                Some(Report::Signalled(n)) => Ending::Exited(ExitStatus::from_raw(n)),
                Some(Report::Expired) => Ending::Expired,
                _ => continue,
            };
            self.ended = true;
            return ending;
        }
    }

    /// Waits (briefly) for the supervisor to exit after its last report.
    pub async fn reap(&mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await;
    }

    fn send(&mut self, c: &Control) {
        self.outbox.extend_from_slice(c.line().as_bytes());
        let Some(w) = &self.writer else {
            self.outbox.clear();
            return;
        };
        while !self.outbox.is_empty() {
            match w.try_write(&self.outbox) {
                Ok(0) => break,
                Ok(n) => {
                    self.outbox.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                // The supervisor is gone.
                Err(_) => self.outbox.clear(),
            }
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        self.kill();
        // End of file: the supervisor kills the group even if the line
        // above was not taken.
        self.writer = None;
        if let Some(group) = self.group {
            // In case the supervisor itself cannot act. ESRCH (the group
            // is gone already) is fine.
            let _ = killpg(group, Signal::SIGKILL);
        }
    }
}
