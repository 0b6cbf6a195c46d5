//! The supervisor of a command job's program: a small process between the
//! worker and the program. It owns the program's process group and kills it
//! when the worker stops renewing a deadline, so the program is gone before
//! its lease can expire even when the worker cannot act (SIGSTOP, a
//! debugger, a wedged runtime). It is the worker's own executable started
//! again with the hidden first argument [`MARKER`], which
//! [`run_if_invoked`] recognises.
//!
//! This module owns both ends (the supervisor here, the worker's
//! [`Supervised`] in `handle.rs`) and the line protocol between them on a
//! Unix socket pair that is the supervisor's stdin (`protocol.rs`, where
//! each line is described).
//!
//! Invariants:
//!
//! - The supervisor SIGKILLs the program's group when the deadline passes,
//!   on `kill`, on end of file (the worker died or dropped its handle) and,
//!   before its last report, after the program has ended.
//! - It acts only on its socket and its deadline: it blocks the signals of
//!   `BLOCKED`, so only SIGKILL ends it early, and the kernel then kills
//!   the program (`PR_SET_PDEATHSIG`).
//! - The supervisor starts with an empty environment: it needs none, and the
//!   worker's holds secrets (its database URL, tokens). Like every batchonce
//!   process it is non-dumpable. The program gets exactly the variables of
//!   the `env` line, and no message ever quotes that line.
//! - A binary that runs the worker without [`crate::cli::main`] must call
//!   [`run_if_invoked`] first thing in its `main`; otherwise its command jobs
//!   fail with a retryable error that says so. The worker starts
//!   `/proc/self/exe`, the image it is running, so a binary replaced on disk
//!   by a deploy still speaks the same protocol.
//!
//! Limits: the deadline is on `CLOCK_MONOTONIC`, which does not count
//! system suspend. A host or cgroup frozen as a whole freezes the supervisor
//! with the program; on thaw the program may run briefly before the
//! supervisor, whose deadline has passed, kills it.

mod handle;
mod protocol;

use std::ffi::{OsStr, OsString};
use std::io::{BufRead as _, Write as _};
use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::fs::FileTypeExt as _;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::process::{ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, SigSet, SigmaskHow, Signal};
use nix::unistd::Pid;

use crate::runtime::isolation::{self, Switch};

pub use handle::{command, command_as, own_executable, Ending, StartError, Supervised};
pub use protocol::{describe_line, Control, Report};

/// The first argument that makes the executable a supervisor.
pub const MARKER: &str = "__batchonce-supervise";

/// How long the worker waits for `started` before it gives up.
pub const START_TIMEOUT: Duration = Duration::from_secs(5);

/// Signals the supervisor blocks and never acts on: a terminal's ^C or a
/// service manager's SIGTERM must not skip the worker's `kill_grace`, and
/// ^Z, which stops the worker, must not stop the supervisor. The program
/// inherits the supervisor's signal mask as it was before this.
const BLOCKED: [Signal; 5] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGTSTP,
];

/// Why the supervisor process could not do its work.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error(
        "usage: {MARKER} [--as UID:GID:GROUPS] -- PROGRAM [ARGS...] (started by the worker, not by hand)"
    )]
    Usage,
    #[error("stdin is not the worker's control socket")]
    NotASocket,
    #[error("control socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("signal mask: {0}")]
    Signals(#[from] nix::Error),
}

/// Makes this process non-dumpable (see [`crate::runtime::isolation`]);
/// then, if it was started as a supervisor, runs it and exits, and
/// otherwise returns. Call it first thing in `main`, so that the worker's
/// secrets are never readable through `/proc` by a program of its user.
pub fn run_if_invoked() {
    if let Err(e) = crate::runtime::isolation::make_non_dumpable() {
        // A process whose secrets any program of its user could read is
        // not started at all.
        let _ = writeln!(
            std::io::stderr(),
            "batchonce: cannot make this process non-dumpable (prctl PR_SET_DUMPABLE): {e}"
        );
        std::process::exit(1);
    }
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

/// The supervisor: reads its arguments, waits for the first renewal, starts
/// the program and kills its group once the worker stops renewing, then
/// reports how it ended.
fn supervise(args: Vec<OsString>) -> Result<(), SupervisorError> {
    let (switch, program, program_args) = parse_args(&args)?;
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

    let Some((first, env)) = first_renewal(&rx, &mut socket) else {
        return Ok(());
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
    // only async-signal-safe functions: sigprocmask, the system calls of
    // `Switch::apply`, access, prctl and getppid. It allocates nothing.
    unsafe {
        cmd.pre_exec(move || prepare_program(&inherited, switch.as_ref(), supervisor));
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

    let (status, expired) = watch_program(&rx, first, group, pid);
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

/// `[--as UID:GID:GROUPS] -- PROGRAM ARGS...`: the identity the program
/// runs as, the program and its arguments.
fn parse_args(
    args: &[OsString],
) -> Result<(Option<Switch>, &OsString, &[OsString]), SupervisorError> {
    // `--as UID:GID:GROUPS`: the identity the program runs as.
    let (switch, args) = match args.split_first() {
        Some((flag, rest)) if flag == "--as" => {
            let (spec, rest) = rest.split_first().ok_or(SupervisorError::Usage)?;
            let switch = spec
                .to_str()
                .and_then(Switch::parse)
                .ok_or(SupervisorError::Usage)?;
            (Some(switch), rest)
        }
        _ => (None, args),
    };
    let (program, program_args) = match args.split_first() {
        Some((dashes, rest)) if dashes == "--" => {
            rest.split_first().ok_or(SupervisorError::Usage)?
        }
        _ => return Err(SupervisorError::Usage),
    };
    Ok((switch, program, program_args))
}

/// Waits for the first renewal, keeping the environment sent before it:
/// nothing starts without a deadline. `None` (reported to the worker when
/// it is a malformed line) when the worker gave up first.
fn first_renewal(
    rx: &mpsc::Receiver<Event>,
    socket: &mut StdUnixStream,
) -> Option<(Instant, Vec<(String, String)>)> {
    let mut env = Vec::new();
    loop {
        match rx.recv() {
            Ok(Event::Control(_, Control::Env(vars))) => env = vars,
            Ok(Event::Control(at, Control::Renew(d))) => return Some((at + d, env)),
            Ok(Event::Malformed(line)) => {
                let message = format!("unreadable control line {}", describe_line(&line));
                report(
                    socket,
                    &Report::Failed {
                        errno: nix::libc::EINVAL,
                        message,
                    },
                );
                return None;
            }
            // The worker gave up before the program started.
            _ => return None,
        }
    }
}

/// Renews the program's deadline on each renewal and kills its group when
/// the deadline passes, the worker asks, says something unreadable or goes
/// away; returns once the program has exited (`None`: its exit is not
/// known) and whether its lease expired.
fn watch_program(
    rx: &mpsc::Receiver<Event>,
    first: Instant,
    group: Pid,
    pid: u32,
) -> (Option<std::io::Result<ExitStatus>>, bool) {
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
    (status, expired)
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

/// The program itself runs in a process group of its own, with stdin from
/// `/dev/null` and the supervisor's stdout and stderr (the worker's capture
/// pipes); with `--as UID:GID:GROUPS` (a job's `run_as_user`) it switches
/// identity here (see [`crate::runtime::isolation`]).
///
/// Runs in the program's process before exec: the signal mask the
/// supervisor inherited, the identity of `run_as_user` if the job names
/// one (and then a working directory that identity can search), otherwise
/// none of the worker's inheritable or ambient capabilities, and
/// SIGKILL from the kernel when the supervisor dies, set last because a
/// change of identity clears it. Failing here fails the spawn, so neither
/// a failed switch nor a supervisor that died between fork and `prctl`
/// ever leaves a program running.
fn prepare_program(mask: &SigSet, switch: Option<&Switch>, supervisor: Pid) -> std::io::Result<()> {
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(mask), None)?;
    match switch {
        Some(switch) => {
            switch.apply()?;
            nix::unistd::access(".", nix::unistd::AccessFlags::X_OK)?;
        }
        None => isolation::clear_inherited_capabilities()?,
    }
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    if nix::unistd::getppid() != supervisor {
        return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_not_started_as_a_supervisor_is_left_alone() {
        // The test binary's own arguments do not carry the marker.
        run_if_invoked();
    }
}
