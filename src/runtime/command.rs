//! Command jobs: a job declared in `batchonce.toml` with `command = [...]`
//! runs that program as its handler, so a batch script in any language runs
//! exactly once per key without being rewritten. What the program sees (its
//! environment, the exit codes, timeout, shutdown, lease loss, output) is
//! the contract of `docs/command-jobs.md`.
//!
//! This module owns the program's attempt: its environment (built by
//! [`environment`], so the worker's secrets stay in the worker), its output
//! (every line into the worker's logs, `forward`), the exit-code contract
//! (`map_exit`), the timeout, and when its process group is stopped.
//! [`register_commands`] adds a [`CommandJob`] for every configured command
//! job; a `CommandJob`'s `default_config()` is the job's parsed
//! configuration, and it has no migrations and no demo.
//!
//! Invariants:
//!
//! - The program runs under a supervisor ([`crate::runtime::supervisor`])
//!   that this module keeps renewing from the lease's confirmed extensions
//!   (`program_deadline`), so it is killed before the lease can expire even
//!   if this worker cannot act.
//! - A lost lease SIGKILLs the program's group at once; a timeout or a
//!   shutdown sends SIGTERM, then SIGKILL after `kill_grace`; on exit,
//!   whatever was left in the group is killed.
//! - With `run_as_user` (and `run_as_group`), the account is resolved before
//!   anything starts ([`isolation::resolve`]). A user that does not exist,
//!   root, the worker's own user, or a worker without the privilege to switch
//!   is `Fatal`, and the program never starts, as the worker's user or any
//!   other. The supervisor switches the program's process
//!   (`supervisor::command_as`); a switch that fails, or a working directory
//!   the user cannot search, fails the spawn, `Fatal` with the user named.
//! - The worker cannot see the program's database writes: the program fences
//!   them itself with `batchonce_fence` and reports its items with
//!   `batchonce_progress`. Its lease is extended by the worker's heartbeat,
//!   which the program's fence (`FOR KEY SHARE`) does not block, so a program
//!   that keeps each fenced transaction shorter than the lease keeps its
//!   lease however long it runs (`workers/tests/command_lease.rs`).

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::{CommandSpec, Config, JobConfig};
use crate::key::JobName;
pub use crate::runtime::command_env::{
    environment, environment_as, run_variables, worker_environment, EnvError, BASE_ENV,
};
use crate::runtime::isolation::{self, Account};
use crate::runtime::job::{Job, JobContext, JobError, LeaseRenewal, Outcome, Registry};
use crate::runtime::supervisor::{self, Ending, StartError, Supervised};

/// Lines of output kept for the run's error text.
const TAIL_LINES: usize = 8;
/// Longest output line logged; longer lines are cut on a char boundary.
const MAX_LINE_BYTES: usize = 16 * 1024;

/// A job kind whose handler is an external program.
#[derive(Debug, Clone)]
pub struct CommandJob {
    name: JobName,
    config: JobConfig,
}

impl CommandJob {
    /// `config.command` must be set.
    pub fn new(name: JobName, config: JobConfig) -> Self {
        Self { name, config }
    }
}

/// Adds a [`CommandJob`] for every job of the configuration that declares a
/// command and is not a built-in kind.
pub fn register_commands(mut registry: Registry, config: &Config) -> Registry {
    for (name, cfg) in &config.jobs {
        if cfg.command.is_some() && registry.get(name).is_none() {
            registry = registry.register(CommandJob::new(name.clone(), cfg.clone()));
        }
    }
    registry
}

#[async_trait]
impl Job for CommandJob {
    fn name(&self) -> JobName {
        self.name.clone()
    }

    fn default_config(&self) -> JobConfig {
        self.config.clone()
    }

    async fn run(&self, ctx: &JobContext) -> Result<Outcome, JobError> {
        let spec = ctx.config.command.as_ref().ok_or_else(|| {
            JobError::Fatal(format!("job {} has no `command` configured", ctx.job))
        })?;
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let outcome = run_command(spec, ctx, tail.clone()).await;
        record_attempt(ctx, &tail).await;
        outcome
    }
}

/// Keeps the program's last lines on its attempt (what `runs show` prints
/// for every attempt, successful ones included), and counts the items the
/// program reported with `batchonce_progress` in the worker's metrics. A
/// failure here changes nothing about the run: it is logged and left.
async fn record_attempt(ctx: &JobContext, tail: &Mutex<VecDeque<String>>) {
    let text = {
        let t = lock(tail);
        (!t.is_empty()).then(|| t.iter().map(String::as_str).collect::<Vec<_>>().join("\n"))
    };
    match crate::queue::record_output(ctx.pool(), &ctx.key, ctx.lease_token, text.as_deref()).await
    {
        Ok((processed, failed)) => {
            let job = ctx.job.to_string();
            metrics::counter!(crate::telemetry::ITEMS_PROCESSED, "job" => job.clone())
                .increment(processed.max(0) as u64);
            metrics::counter!(crate::telemetry::ITEMS_FAILED, "job" => job)
                .increment(failed.max(0) as u64);
        }
        Err(e) => {
            warn!(job_key = %ctx.key, attempt = ctx.attempt, error = %e,
                  "could not record the program's output on its attempt");
        }
    }
}

/// The supervisor's deadline for a lease renewal: a quarter of the ttl
/// before the earliest expiry, so the program is dead before another worker
/// can take the run over. A healthy worker renews every third of the ttl.
fn program_deadline(renewal: LeaseRenewal) -> Instant {
    renewal.expires_no_earlier_than() - renewal.ttl / 4
}

/// One attempt of the program, under a supervisor.
///
/// `supervisor::command` re-invokes the worker's own image with the
/// program's argv, in `working_dir` if set, with stdout and stderr piped to
/// the worker; `Supervised::start` sends the program's environment and the
/// first deadline and waits for its pid. The program runs directly (no
/// shell), with stdin from `/dev/null`, in its own process group. Every
/// lease renewal the context publishes becomes a new deadline
/// ([`program_deadline`]) for as long as the program runs, `kill_grace`
/// included. Dropping the `Supervised` handle (the handler returns, panics
/// or is aborted by the worker) sends `kill`, closes the socket, and
/// SIGKILLs the group from the worker too. `database_url_env` naming a
/// variable that is unset or blank (`EnvError::DatabaseUrlUnset`) is
/// `Fatal` before anything starts.
///
/// The handler then waits for the program's end, for `timeout`, or for
/// cancellation:
/// - on exit, the real status (code or signal) goes to [`map_exit`];
/// - if the supervisor reports `expired` (no renewal came in time), the
///   attempt is `Retryable` (`` `x` was killed by the supervisor: the worker
///   stopped renewing its lease… ``); if the supervisor vanished without a
///   report, the worker SIGKILLs the group and the attempt is `Retryable`;
/// - on timeout, [`terminate`], and the attempt is `Retryable`;
/// - on cancellation with `ctx.is_lease_lost()`, SIGKILL to the group at
///   once and `LeaseLost`; on cancellation by a shutdown, [`terminate`] and
///   `Cancelled`, which the worker turns into a release.
///
/// A supervisor that does not report `started` within
/// `supervisor::START_TIMEOUT` (5 s), or exits first, fails the attempt
/// with a retryable error naming the likely cause: a binary that runs the
/// worker without calling `supervisor::run_if_invoked()`.
async fn run_command(
    spec: &CommandSpec,
    ctx: &JobContext,
    tail: Arc<Mutex<VecDeque<String>>>,
) -> Result<Outcome, JobError> {
    let program = &spec.argv[0];
    // Resolved first, like the environment below: a user that does not
    // exist here, or a worker that may not switch to it, is a problem
    // another attempt would meet again, and the program must never run as
    // the worker's user instead.
    let account = match &spec.run_as_user {
        Some(user) => Some(account(user, spec.run_as_group.as_deref()).await?),
        None => None,
    };
    // A missing database URL is a configuration problem too.
    let env = environment_as(
        spec,
        run_variables(ctx),
        &worker_environment(),
        account.as_ref(),
    )
    .map_err(|e| JobError::Fatal(e.to_string()))?;
    let mut cmd = supervisor::command_as(
        supervisor::own_executable(),
        &spec.argv,
        account.as_ref().map(|a| &a.switch),
    );
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if let Some(dir) = &spec.working_dir {
        // Checked here: a missing directory would otherwise be reported by
        // spawn as the program not being found.
        if !dir.is_dir() {
            return Err(JobError::Fatal(format!(
                "working_dir {} does not exist or is not a directory",
                dir.display()
            )));
        }
        cmd.current_dir(dir);
    }
    let mut renewals = ctx.lease_renewals();
    let deadline = program_deadline(*renewals.borrow_and_update());
    if deadline <= Instant::now() {
        return Err(JobError::Retryable(format!(
            "the lease was too close to its end to start `{program}`"
        )));
    }
    // The supervisor stands between the worker and the program: it kills
    // the program's group when the renewals below stop, even if this
    // process is stopped and cannot act.
    let mut sup =
        Supervised::spawn(cmd).map_err(|e| JobError::Retryable(format!("`{program}`: {e}")))?;
    let last_stdout = Arc::new(Mutex::new(None::<String>));
    let (stdout, stderr) = sup.take_output();
    let out = forward(
        stdout,
        "stdout",
        ctx,
        tail.clone(),
        Some(last_stdout.clone()),
    );
    let err = forward(stderr, "stderr", ctx, tail.clone(), None);
    let pid = match sup.start(env, deadline).await {
        Ok(pid) => pid,
        Err(e) => {
            // What the supervisor (or whatever answered) printed explains it.
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                let _ = tokio::join!(out, err);
            })
            .await;
            return Err(start_error(program, e, &tail, spec.run_as_user.as_deref()));
        }
    };
    info!(job_key = %ctx.key, attempt = ctx.attempt, pid, supervisor = sup.id(),
          // The arguments as a JSON array: unambiguous, and no Rust syntax.
          command = %serde_json::to_string(&spec.argv).unwrap_or_default(),
          "command started");

    enum Stop {
        TimedOut,
        Cancelled,
    }
    let timeout = tokio::time::sleep(spec.timeout);
    tokio::pin!(timeout);
    let stop = async {
        tokio::select! {
            _ = &mut timeout => Stop::TimedOut,
            _ = ctx.cancelled() => Stop::Cancelled,
        }
    };
    let ending = match supervise_until(&mut sup, &mut renewals, stop).await {
        Ok(ending) => ending,
        Err(Stop::Cancelled) if ctx.is_lease_lost() => {
            // Another worker may own the run already: no grace period. The
            // handle's drop closes the socket and kills the group as well.
            sup.kill();
            warn!(job_key = %ctx.key, pid, "command killed: lease lost");
            return Err(JobError::LeaseLost);
        }
        Err(stop) => {
            terminate(&mut sup, &mut renewals, spec.kill_grace).await;
            sup.reap().await;
            let _ = tokio::join!(out, err);
            if matches!(stop, Stop::Cancelled) {
                warn!(job_key = %ctx.key, pid, "command stopped: shutdown");
                return Err(JobError::Cancelled);
            }
            return Err(JobError::Retryable(with_tail(
                format!(
                    "`{program}` timed out after {}; its process group was stopped",
                    humantime::format_duration(spec.timeout)
                ),
                &tail,
            )));
        }
    };
    // The supervisor has killed whatever the program left in its group.
    sup.reap().await;
    let _ = tokio::join!(out, err);
    match ending {
        Ending::Exited(status) => {
            let outcome = map_exit(spec, program, status, &tail, &last_stdout);
            info!(job_key = %ctx.key, attempt = ctx.attempt, pid, status = %status, "command ended");
            outcome
        }
        Ending::Expired => {
            warn!(job_key = %ctx.key, pid, outcome = "lease_lost",
                  "command killed by its supervisor: no lease renewal in time");
            // The lease could not be confirmed in time: a lost lease, whether
            // or not the database still shows it when the worker resumes.
            metrics::counter!(crate::telemetry::LEASES_LOST, "job" => ctx.job.to_string())
                .increment(1);
            Err(JobError::Retryable(with_tail(
                format!(
                    "`{program}` was killed by the supervisor: the worker stopped renewing its \
                     lease, so the program was stopped before the lease could expire"
                ),
                &tail,
            )))
        }
        Ending::Vanished => Err(JobError::Retryable(with_tail(
            format!("the supervisor of `{program}` died; the program was killed with it"),
            &tail,
        ))),
    }
}

/// Passes lease renewals on to the supervisor until the program ends
/// (`Ok`) or `stop` resolves first (`Err`).
async fn supervise_until<S>(
    sup: &mut Supervised,
    renewals: &mut watch::Receiver<LeaseRenewal>,
    stop: impl std::future::Future<Output = S>,
) -> Result<Ending, S> {
    tokio::pin!(stop);
    // Once the worker stops publishing, the last deadline stands.
    let mut renewing = true;
    loop {
        enum Event<S> {
            Ended(Ending),
            Renewed(bool),
            Stopped(S),
        }
        let event = tokio::select! {
            ending = sup.ending() => Event::Ended(ending),
            changed = renewals.changed(), if renewing => Event::Renewed(changed.is_ok()),
            s = &mut stop => Event::Stopped(s),
        };
        match event {
            Event::Ended(ending) => return Ok(ending),
            Event::Renewed(true) => {
                sup.renew_until(program_deadline(*renewals.borrow_and_update()));
            }
            Event::Renewed(false) => renewing = false,
            Event::Stopped(s) => return Err(s),
        }
    }
}

/// SIGTERM to the group, then SIGKILL after `grace` if the program is still
/// there; the supervisor then kills what is left of the group. Renewals go
/// on meanwhile, so the grace period is not cut short by the deadline.
async fn terminate(
    sup: &mut Supervised,
    renewals: &mut watch::Receiver<LeaseRenewal>,
    grace: Duration,
) {
    sup.term();
    if supervise_until(sup, renewals, tokio::time::sleep(grace))
        .await
        .is_err()
    {
        sup.kill();
        let _ = supervise_until(sup, renewals, std::future::pending::<()>()).await;
    }
}

/// The exit-code contract of `docs/command-jobs.md`: 0 is `Succeeded`;
/// `skipped_exit_code` is `Skipped`, with the last stdout line as the
/// reason (a generic one if that line is blank or there is none); a code in
/// `fatal_exit_codes` is `Fatal`; any other code, or a death by signal, is
/// `Retryable`. The supervisor has already killed what was left in the
/// group.
fn map_exit(
    spec: &CommandSpec,
    program: &str,
    status: std::process::ExitStatus,
    tail: &Mutex<VecDeque<String>>,
    last_stdout: &Mutex<Option<String>>,
) -> Result<Outcome, JobError> {
    use std::os::unix::process::ExitStatusExt as _;
    match status.code() {
        Some(0) => Ok(Outcome::Succeeded),
        Some(c) if c == spec.skipped_exit_code => {
            let said = lock(last_stdout).clone().filter(|l| !l.trim().is_empty());
            Ok(Outcome::Skipped(said.unwrap_or_else(|| {
                format!("`{program}` exited {c}: nothing to do")
            })))
        }
        Some(c) if spec.fatal_exit_codes.contains(&c) => Err(JobError::Fatal(with_tail(
            format!("`{program}` exited {c} (a fatal exit code: not retried)"),
            tail,
        ))),
        Some(c) => Err(JobError::Retryable(with_tail(
            format!("`{program}` exited {c}"),
            tail,
        ))),
        None => {
            let sig = status
                .signal()
                .and_then(|s| Signal::try_from(s).ok())
                .map_or_else(|| "a signal".to_owned(), |s| s.as_str().to_owned());
            Err(JobError::Retryable(with_tail(
                format!("`{program}` was killed by {sig}"),
                tail,
            )))
        }
    }
}

fn start_error(
    program: &str,
    e: StartError,
    tail: &Mutex<VecDeque<String>>,
    user: Option<&str>,
) -> JobError {
    match (e, user) {
        (StartError::Program(e), Some(user)) => as_user_error(program, user, e),
        (StartError::Program(e), None) => spawn_error(program, e),
        (e, _) => JobError::Retryable(with_tail(format!("cannot start `{program}`: {e}"), tail)),
    }
}

/// The account of `run_as_user`, looked up off the runtime's threads (the
/// user database may be a network service).
async fn account(user: &str, group: Option<&str>) -> Result<Account, JobError> {
    let (user, group) = (user.to_owned(), group.map(str::to_owned));
    match tokio::task::spawn_blocking(move || isolation::resolve(&user, group.as_deref())).await {
        Ok(Ok(account)) => Ok(account),
        Ok(Err(e)) => Err(JobError::Fatal(e.to_string())),
        Err(e) => Err(JobError::Retryable(format!(
            "looking up run_as_user failed: {e}"
        ))),
    }
}

/// A program that could not start as `run_as_user`: the switch, a working
/// directory the user cannot search, or a program it cannot execute. Each
/// would fail again; none ran the program as the worker's user.
fn as_user_error(program: &str, user: &str, e: std::io::Error) -> JobError {
    use std::io::ErrorKind;
    // EPERM is the switch refused (EACCES a path the user cannot reach);
    // both are `PermissionDenied` to std.
    if e.raw_os_error() == Some(nix::libc::EPERM) {
        return JobError::Fatal(format!(
            "cannot start `{program}` as user {user}: the worker could not switch to that user \
             ({e}); the program was not started"
        ));
    }
    match e.kind() {
        ErrorKind::PermissionDenied => JobError::Fatal(format!(
            "cannot start `{program}` as user {user}: permission denied (can {user} search the \
             working directory and every folder above it, and execute the program?)"
        )),
        ErrorKind::NotFound => spawn_error(program, e),
        _ => JobError::Fatal(format!(
            "cannot start `{program}` as user {user}: {e}; the program was not started"
        )),
    }
}

/// A program that is not found or not executable is `Fatal`, since
/// another attempt would find the same, and any other spawn error is
/// `Retryable`. The supervisor reports the program's spawn error with its
/// errno, so the mapping is the same as when the worker spawned the
/// program itself.
fn spawn_error(program: &str, e: std::io::Error) -> JobError {
    use std::io::ErrorKind;
    match e.kind() {
        // Another attempt finds the same missing or unusable program.
        ErrorKind::NotFound => JobError::Fatal(format!(
            "cannot start `{program}`: not found (is it installed and on the worker's PATH?)"
        )),
        ErrorKind::PermissionDenied => JobError::Fatal(format!(
            "cannot start `{program}`: permission denied (is it executable?)"
        )),
        _ => JobError::Retryable(format!("cannot start `{program}`: {e}")),
    }
}

/// Logs every line of one output stream as an info event `command output`
/// (`job_key`, `attempt`, `stream`, `line`), read with [`read_line_capped`],
/// and keeps the last [`TAIL_LINES`], which [`with_tail`] appends to a
/// failure's error message (`last output: …`), and the last stdout line,
/// the reason of a skip. `command started` and `command ended` frame the
/// output.
fn forward(
    stream: Option<impl AsyncRead + Unpin + Send + 'static>,
    name: &'static str,
    ctx: &JobContext,
    tail: Arc<Mutex<VecDeque<String>>>,
    last: Option<Arc<Mutex<Option<String>>>>,
) -> tokio::task::JoinHandle<()> {
    let key = ctx.key.to_string();
    let attempt = ctx.attempt;
    tokio::spawn(async move {
        let Some(stream) = stream else { return };
        let mut reader = BufReader::new(stream);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match read_line_capped(&mut reader, &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let line = String::from_utf8_lossy(&buf);
            let line = line.trim_end_matches(['\n', '\r']).to_owned();
            info!(job_key = %key, attempt, stream = name, line = %line, "command output");
            if let Some(last) = &last {
                *lock(last) = Some(line.clone());
            }
            let mut t = lock(&tail);
            if t.len() == TAIL_LINES {
                t.pop_front();
            }
            t.push_back(format!("{name}: {line}"));
        }
    })
}

/// Reads one line, keeping at most [`MAX_LINE_BYTES`] of it (cut on a char
/// boundary) and discarding the rest, so a program printing without
/// newlines cannot make the worker's memory grow.
async fn read_line_capped(
    reader: &mut (impl AsyncBufReadExt + Unpin),
    buf: &mut Vec<u8>,
) -> std::io::Result<usize> {
    let mut total = 0;
    loop {
        let chunk = reader.fill_buf().await?;
        if chunk.is_empty() {
            break;
        }
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        let room = MAX_LINE_BYTES.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..take.min(room)]);
        reader.consume(take);
        total += take;
        if done {
            break;
        }
    }
    if buf.len() >= MAX_LINE_BYTES {
        // Back to the last complete UTF-8 character.
        let valid = match std::str::from_utf8(buf) {
            Ok(_) => buf.len(),
            Err(e) => e.valid_up_to(),
        };
        buf.truncate(valid);
    }
    Ok(total)
}

fn with_tail(message: String, tail: &Mutex<VecDeque<String>>) -> String {
    let t = lock(tail);
    if t.is_empty() {
        return message;
    }
    let lines: Vec<&str> = t.iter().map(String::as_str).collect();
    crate::text::truncate(&format!("{message}; last output: {}", lines.join(" | ")))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panicking log forwarder leaves valid data behind.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn long_lines_are_cut_on_a_char_boundary() {
        let mut text = "가".repeat(MAX_LINE_BYTES);
        text.push_str("\nnext\n");
        let mut r = BufReader::new(text.as_bytes());
        let mut buf = Vec::new();
        let n = read_line_capped(&mut r, &mut buf).await.unwrap();
        assert_eq!(n, "가".len() * MAX_LINE_BYTES + 1);
        assert!(buf.len() <= MAX_LINE_BYTES);
        assert!(std::str::from_utf8(&buf).is_ok());
        buf.clear();
        read_line_capped(&mut r, &mut buf).await.unwrap();
        assert_eq!(buf, b"next\n");
    }

    #[test]
    fn exit_codes_map_to_outcomes() {
        use std::os::unix::process::ExitStatusExt as _;
        let spec = CommandSpec::new(vec!["x".into()]);
        let tail = Mutex::new(VecDeque::from(vec!["stderr: boom".to_owned()]));
        let last = Mutex::new(Some("no orders today".to_owned()));
        let code = |c: i32| std::process::ExitStatus::from_raw(c << 8);
        assert_eq!(
            map_exit(&spec, "x", code(0), &tail, &last).unwrap(),
            Outcome::Succeeded
        );
        assert_eq!(
            map_exit(&spec, "x", code(3), &tail, &last).unwrap(),
            Outcome::Skipped("no orders today".into())
        );
        for c in [2, 126, 127] {
            assert!(matches!(
                map_exit(&spec, "x", code(c), &tail, &last),
                Err(JobError::Fatal(m)) if m.contains("boom")
            ));
        }
        for c in [1, 4, 75, 255] {
            assert!(matches!(
                map_exit(&spec, "x", code(c), &tail, &last),
                Err(JobError::Retryable(_))
            ));
        }
        // Killed by SIGKILL (raw status 9).
        assert!(matches!(
            map_exit(&spec, "x", std::process::ExitStatus::from_raw(9), &tail, &last),
            Err(JobError::Retryable(m)) if m.contains("SIGKILL")
        ));
    }
}
