//! The supervisor of a command job's program: a small process between the
//! worker and the program. It owns the program's process group and kills it
//! when the worker stops renewing a deadline, so the program is gone before
//! its lease can expire even when the worker cannot act (SIGSTOP, a
//! debugger, a wedged runtime). It is the worker's own executable started
//! again with the hidden first argument [`MARKER`], which
//! [`run_if_invoked`] recognises.
//!
//! This module owns both ends and the line protocol between them. The
//! supervisor's stdin is one end of a Unix socket pair whose other end the
//! worker's [`Supervised`] holds:
//!
//! - worker to supervisor: `env <json>` (the program's whole environment,
//!   before the first renewal; it holds credentials, so no message ever
//!   repeats an unreadable line, only its first word and length),
//!   `renew <ms>` (the deadline becomes now + ms on the supervisor's
//!   monotonic clock; the first one starts the program),
//!   `term` (SIGTERM to the group) and `kill` (SIGKILL to the group). End of
//!   file, when the worker dies or drops its handle, is SIGKILL to the group.
//! - supervisor to worker: `started <pid>` or `failed <errno> <message>`,
//!   then, once the program has ended and whatever was left in its group has
//!   been SIGKILLed, one of `exit <code>`, `signal <n>` or `expired` (killed
//!   because the deadline passed).
//!
//! The supervisor itself starts with an empty environment: it needs none,
//! and the worker's holds secrets (its database URL, tokens). The program
//! gets exactly the variables of the `env` line, nothing inherited.
//!
//! The program runs in a process group of its own, with stdin from
//! `/dev/null`, the supervisor's stdout and stderr (the worker's capture
//! pipes), the signal mask the supervisor inherited, and
//! `PR_SET_PDEATHSIG = SIGKILL` tied to the supervisor. The supervisor
//! blocks SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGTSTP: it acts only on its
//! socket and its deadline, so a terminal's ^C or a service manager's
//! SIGTERM does not skip the worker's `kill_grace`, and ^Z, which stops the
//! worker, does not stop the supervisor. Only SIGKILL ends it early, and the
//! kernel then kills the program.
//!
//! A binary that runs the worker without [`crate::cli::main`] must call
//! [`run_if_invoked`] first thing in its `main`; otherwise its command jobs
//! fail with a retryable error that says so. The worker starts
//! `/proc/self/exe`, the image it is running, so a binary replaced on disk
//! by a deploy still speaks the same protocol.
//!
//! Limits: the deadline is on `CLOCK_MONOTONIC`, which does not count
//! system suspend. A host or cgroup frozen as a whole freezes the supervisor
//! with the program; on thaw the program may run briefly before the
//! supervisor, whose deadline has passed, kills it.

use std::ffi::{OsStr, OsString};
use std::io::{BufRead as _, Write as _};
use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::fs::FileTypeExt as _;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, SigSet, SigmaskHow, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::{Child, ChildStderr, ChildStdout};

/// The first argument that makes the executable a supervisor.
pub const MARKER: &str = "__batchonce-supervise";

/// How long the worker waits for `started` before it gives up.
pub const START_TIMEOUT: Duration = Duration::from_secs(5);

/// Signals the supervisor never acts on (see the module documentation).
const BLOCKED: [Signal; 5] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGTSTP,
];

/// A line from the worker to the supervisor. Its `Debug` shows the names
/// of an environment's variables, never their values.
#[derive(Clone, PartialEq, Eq)]
pub enum Control {
    Env(Vec<(String, String)>),
    Renew(Duration),
    Term,
    Kill,
}

impl Control {
    pub fn line(&self) -> String {
        match self {
            // Built as a value so that serialising cannot fail; JSON keeps
            // newlines in values on one line.
            Control::Env(vars) => {
                let pairs = vars
                    .iter()
                    .map(|(k, v)| Value::Array(vec![k.clone().into(), v.clone().into()]))
                    .collect();
                format!("env {}\n", Value::Array(pairs))
            }
            Control::Renew(d) => format!("renew {}\n", d.as_millis()),
            Control::Term => "term\n".into(),
            Control::Kill => "kill\n".into(),
        }
    }

    pub fn parse(line: &str) -> Option<Self> {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match (word, rest) {
            ("env", json) => serde_json::from_str(json).ok().map(Control::Env),
            ("renew", ms) => ms
                .parse()
                .ok()
                .map(|ms| Control::Renew(Duration::from_millis(ms))),
            ("term", "") => Some(Control::Term),
            ("kill", "") => Some(Control::Kill),
            _ => None,
        }
    }
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Control::Env(vars) => f
                .debug_tuple("Env")
                .field(&vars.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>())
                .finish(),
            Control::Renew(d) => f.debug_tuple("Renew").field(d).finish(),
            Control::Term => f.write_str("Term"),
            Control::Kill => f.write_str("Kill"),
        }
    }
}

/// An unreadable control line as messages name it: its first word, if that
/// is a short lowercase word, and its length. Never its content, since an
/// `env` line carries the program's credentials.
pub fn describe_line(line: &str) -> String {
    let word = line.split(' ').next().unwrap_or_default();
    if !word.is_empty() && word.len() <= 8 && word.bytes().all(|b| b.is_ascii_lowercase()) {
        format!("`{word} …` ({} bytes)", line.len())
    } else {
        format!("of {} bytes", line.len())
    }
}

/// A line from the supervisor to the worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    Started(u32),
    Failed { errno: i32, message: String },
    Exited(i32),
    Signalled(i32),
    Expired,
}

impl Report {
    pub fn line(&self) -> String {
        match self {
            Report::Started(pid) => format!("started {pid}\n"),
            Report::Failed { errno, message } => {
                format!("failed {errno} {}\n", message.replace(['\n', '\r'], " "))
            }
            Report::Exited(code) => format!("exit {code}\n"),
            Report::Signalled(n) => format!("signal {n}\n"),
            Report::Expired => "expired\n".into(),
        }
    }

    pub fn parse(line: &str) -> Option<Self> {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match (word, rest) {
            ("started", pid) => pid.parse().ok().map(Report::Started),
            ("failed", rest) => {
                let (errno, message) = rest.split_once(' ').unwrap_or((rest, ""));
                Some(Report::Failed {
                    errno: errno.parse().ok()?,
                    message: message.to_owned(),
                })
            }
            ("exit", code) => code
                .parse()
                .ok()
                .filter(|c| (0..=255).contains(c))
                .map(Report::Exited),
            ("signal", n) => n
                .parse()
                .ok()
                .filter(|n| (1..=127).contains(n))
                .map(Report::Signalled),
            ("expired", "") => Some(Report::Expired),
            _ => None,
        }
    }
}

/// Why the supervisor process could not do its work.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("usage: {MARKER} -- PROGRAM [ARGS...] (started by the worker, not by hand)")]
    Usage,
    #[error("stdin is not the worker's control socket")]
    NotASocket,
    #[error("control socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("signal mask: {0}")]
    Signals(#[from] nix::Error),
}

/// If this process was started as a supervisor, runs it and exits;
/// otherwise returns at once. Call it first thing in `main`.
pub fn run_if_invoked() {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(OsStr::new(MARKER)) {
        return;
    }
    let code = match supervise(args.collect()) {
        Ok(()) => 0,
        Err(e) => {
            say(&format!("{e}"));
            2
        }
    };
    std::process::exit(code);
}

/// What the supervisor's main loop waits for.
enum Event {
    /// A control line, with when it was read.
    Control(Instant, Control),
    Malformed(String),
    Eof,
    Exited(std::io::Result<ExitStatus>),
}

fn supervise(args: Vec<OsString>) -> Result<(), SupervisorError> {
    let (program, program_args) = match args.split_first() {
        Some((dashes, rest)) if dashes == "--" => {
            rest.split_first().ok_or(SupervisorError::Usage)?
        }
        _ => return Err(SupervisorError::Usage),
    };
    let mut socket = control_socket()?;
    // Blocked before any thread starts, so every thread inherits the mask.
    let inherited = SigSet::thread_get_mask()?;
    let mut blocked = SigSet::empty();
    for s in BLOCKED {
        blocked.add(s);
    }
    blocked.thread_block()?;

    let (events, rx) = mpsc::channel();
    let reader = socket.try_clone()?;
    let tx = events.clone();
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || read_control(reader, tx))?;

    // Nothing starts without a deadline: wait for the first renewal.
    let mut env = Vec::new();
    let first = loop {
        match rx.recv() {
            Ok(Event::Control(_, Control::Env(vars))) => env = vars,
            Ok(Event::Control(at, Control::Renew(d))) => break at + d,
            Ok(Event::Malformed(line)) => {
                let message = format!("unreadable control line {}", describe_line(&line));
                report(
                    &mut socket,
                    &Report::Failed {
                        errno: nix::libc::EINVAL,
                        message,
                    },
                );
                return Ok(());
            }
            // The worker gave up before the program started.
            _ => return Ok(()),
        }
    };
    if first <= Instant::now() {
        report(&mut socket, &Report::Expired);
        return Ok(());
    }

    let mut cmd = std::process::Command::new(program);
    // Exactly the worker's list: the supervisor's own environment is empty
    // anyway, and cleared here so that no later change can leak one. The
    // program is looked up on the list's PATH (the C library's default
    // path without one).
    cmd.args(program_args)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        // A group of its own, so every signal reaches everything the
        // program starts.
        .process_group(0);
    let supervisor = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec and calls
    // only async-signal-safe functions: sigprocmask, prctl and getppid.
    unsafe {
        cmd.pre_exec(move || prepare_program(&inherited, supervisor));
    }
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(0);
            let message = e.to_string();
            report(&mut socket, &Report::Failed { errno, message });
            return Ok(());
        }
    };
    let pid = child.id();
    let group = Pid::from_raw(pid as i32);
    report(&mut socket, &Report::Started(pid));
    let waiter = std::thread::Builder::new()
        .name("wait".into())
        .spawn(move || {
            let _ = events.send(Event::Exited(child.wait()));
        });
    if let Err(e) = waiter {
        let _ = killpg(group, Signal::SIGKILL);
        return Err(e.into());
    }

    // `None` once the deadline has passed or the worker is gone: from then
    // on only the program's end is awaited.
    let mut deadline = Some(first);
    let mut expired = false;
    let status = loop {
        let event = match deadline {
            Some(d) => match rx.recv_timeout(d.saturating_duration_since(Instant::now())) {
                Ok(e) => e,
                Err(RecvTimeoutError::Timeout) => {
                    let _ = killpg(group, Signal::SIGKILL);
                    say(&format!(
                        "the worker stopped renewing its lease; \
                         killed the program's process group ({pid})"
                    ));
                    expired = true;
                    deadline = None;
                    continue;
                }
                // The waiter holds a sender until it reports the exit.
                Err(RecvTimeoutError::Disconnected) => break None,
            },
            None => match rx.recv() {
                Ok(e) => e,
                Err(_) => break None,
            },
        };
        match event {
            Event::Control(at, Control::Renew(d)) if !expired => deadline = Some(at + d),
            Event::Control(_, Control::Term) => {
                let _ = killpg(group, Signal::SIGTERM);
            }
            Event::Control(_, Control::Kill) => {
                let _ = killpg(group, Signal::SIGKILL);
            }
            Event::Control(..) => {}
            Event::Malformed(line) => {
                // A worker this supervisor cannot understand renews nothing.
                say(&format!(
                    "unreadable control line {}; killing the program",
                    describe_line(&line)
                ));
                let _ = killpg(group, Signal::SIGKILL);
            }
            Event::Eof => {
                let _ = killpg(group, Signal::SIGKILL);
                deadline = None;
            }
            Event::Exited(status) => break Some(status),
        }
    };
    // Whatever the program left in its group must not outlive it.
    let _ = killpg(group, Signal::SIGKILL);
    let status = match status {
        Some(Ok(status)) => status,
        Some(Err(e)) => return Err(e.into()),
        None => return Ok(()),
    };
    let last = match (status.code(), status.signal()) {
        (Some(code), _) => Report::Exited(code),
        (None, Some(9)) if expired => Report::Expired,
        (None, signal) => Report::Signalled(signal.unwrap_or(9)),
    };
    report(&mut socket, &last);
    Ok(())
}

/// The worker's end of the socket pair, from stdin (a copy with
/// close-on-exec, which the program does not inherit).
fn control_socket() -> Result<StdUnixStream, SupervisorError> {
    let fd = std::io::stdin().as_fd().try_clone_to_owned()?;
    let file = std::fs::File::from(fd);
    if !file.metadata()?.file_type().is_socket() {
        return Err(SupervisorError::NotASocket);
    }
    Ok(StdUnixStream::from(OwnedFd::from(file)))
}

/// Reads control lines until end of file; a read error counts as the end.
fn read_control(stream: StdUnixStream, tx: mpsc::Sender<Event>) {
    let mut lines = std::io::BufReader::new(stream).lines();
    loop {
        let event = match lines.next() {
            Some(Ok(line)) => match Control::parse(&line) {
                Some(c) => Event::Control(Instant::now(), c),
                None => Event::Malformed(line),
            },
            Some(Err(_)) | None => Event::Eof,
        };
        let eof = matches!(event, Event::Eof);
        if tx.send(event).is_err() || eof {
            return;
        }
    }
}

/// One line on stderr, which is the job's output in the worker's log.
/// Unlike `eprintln!`, a closed stderr (the worker is gone) is no panic.
fn say(message: &str) {
    let _ = writeln!(std::io::stderr(), "batchonce supervisor: {message}");
}

/// Writes one report; a worker that is gone reads nothing, so errors are
/// ignored.
fn report(socket: &mut StdUnixStream, r: &Report) {
    let _ = socket.write_all(r.line().as_bytes());
}

/// Runs in the program's process before exec: the signal mask the
/// supervisor inherited, and SIGKILL from the kernel when the supervisor
/// dies. Failing here fails the spawn, so a supervisor that died between
/// fork and `prctl` never leaves the program running unwatched.
fn prepare_program(mask: &SigSet, supervisor: Pid) -> std::io::Result<()> {
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(mask), None)?;
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    if nix::unistd::getppid() != supervisor {
        return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH));
    }
    Ok(())
}

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
    let mut cmd = std::process::Command::new(exe);
    cmd.env_clear();
    if exe == own_executable() {
        // So that `ps` shows the worker's name rather than the /proc path.
        if let Some(arg0) = std::env::args_os().next() {
            cmd.arg0(arg0);
        }
    }
    cmd.arg(MARKER).arg("--").args(argv);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_lines_round_trip() {
        for c in [
            Control::Env(vec![
                ("A".into(), "x y\nz".into()),
                ("B".into(), "\"q\"".into()),
            ]),
            Control::Env(vec![]),
            Control::Renew(Duration::from_millis(1500)),
            Control::Term,
            Control::Kill,
        ] {
            let line = c.line();
            assert_eq!(line.matches('\n').count(), 1, "{line:?}");
            assert_eq!(Control::parse(line.trim_end_matches('\n')), Some(c));
        }
        for bad in [
            "",
            "renew",
            "renew -1",
            "renew 1.5",
            "kill now",
            "env {",
            "stop",
        ] {
            assert_eq!(Control::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn environment_values_never_show_in_messages() {
        let secret = "postgres://u:pw-secret@db/batch";
        let env = Control::Env(vec![("DATABASE_URL".into(), secret.into())]);
        assert_eq!(format!("{env:?}"), "Env([\"DATABASE_URL\"])");
        // A line cut short (or otherwise unreadable) is named, not quoted.
        let line = env.line();
        let cut = &line[..line.len() - 4];
        assert_eq!(Control::parse(cut), None);
        let said = describe_line(cut);
        assert!(
            !said.contains("pw-secret") && !said.contains("DATABASE"),
            "{said}"
        );
        assert_eq!(said, format!("`env …` ({} bytes)", cut.len()));
        assert_eq!(describe_line("\u{1b}[2J junk"), "of 9 bytes");
    }

    #[test]
    fn report_lines_round_trip() {
        for r in [
            Report::Started(4242),
            Report::Failed {
                errno: 2,
                message: "No such file or directory (os error 2)".into(),
            },
            Report::Exited(0),
            Report::Exited(255),
            Report::Signalled(9),
            Report::Expired,
        ] {
            assert_eq!(Report::parse(r.line().trim_end_matches('\n')), Some(r));
        }
        let multi = Report::Failed {
            errno: 0,
            message: "two\nlines".into(),
        };
        assert_eq!(multi.line(), "failed 0 two lines\n");
        for bad in [
            "exit 256",
            "exit -1",
            "signal 0",
            "started x",
            "expired now",
            "ok",
        ] {
            assert_eq!(Report::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_process_not_started_as_a_supervisor_is_left_alone() {
        // The test binary's own arguments do not carry the marker.
        run_if_invoked();
    }
}
