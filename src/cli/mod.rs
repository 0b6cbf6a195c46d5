//! The command-line layer, the top of the engine: the arguments (clap
//! derive), [`main`], logging and the one-line errors. Every command
//! delegates to the queue, runtime or ops layers. The commands and their
//! flags are described in `docs/cli.md` and the generated
//! `docs/cli-reference.md`.
//!
//! `mod.rs` holds the arguments, `main`, logging and the usage-error line;
//! `commands.rs` the dispatch, one handler per command, and the short
//! commands; `migrate.rs`, `enqueue.rs`, `produce.rs` and `worker.rs` one
//! command each; `process.rs` what long-running processes share (signals,
//! metrics server, ids) and `schema.rs` the "not migrated" checks; `runs.rs`
//! and `jobs.rs` their subcommands; `status.rs` `status`; `watch.rs` `runs
//! watch`; `keys.rs` the date hint for keys; `print.rs` the shared output
//! (`Table`, columns as wide as their widest cell in terminal columns).
//!
//! Invariants:
//!
//! - This layer never holds SQL of its own or decides about a run: what it
//!   prints comes from the queue's views, and what it changes goes through
//!   the queue's functions.
//! - Every error is one bounded line on stderr, `batchonce: error: …`, and a
//!   non-zero exit: 2 for a usage error, 1 otherwise. [`EXIT_FOUND`] (3)
//!   means a command worked and found what it was asked to look for.
//! - Stored text is printed, never obeyed. Every print path that shows
//!   stored text (`runs show`, `runs list`, `runs stale`, `status`, the
//!   configuration drift, the operator actions' results and the blocker
//!   messages) passes each stored string through `text::escape_for_terminal`
//!   (imported as `esc`), and their `--json` output goes through
//!   `text::json_for_terminal` (`workers/tests/terminal.rs`).
//! - Lease and retry times are compared with the database's `now()` of the
//!   same read (`RunView::read_at`), never the host's clock.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail};
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

use crate::config::{parse_duration, Config};
use crate::runtime::job::Registry;
use crate::text::escape_for_terminal as esc;

mod commands;
mod enqueue;
mod jobs;
mod keys;
mod migrate;
mod print;
mod process;
mod produce;
mod runs;
mod schema;
mod status;
mod watch;
mod worker;

use commands::dispatch;
pub use status::status_output;

#[derive(Debug, Parser)]
#[command(
    name = "batchonce",
    // `batchonce 0.2.0 (commit 1a2b3c4d5e6f)`: the release and the commit it
    // was built from (build.rs), so a bug report names both.
    version = env!("BATCHONCE_VERSION_LINE"),
    about = "Scheduled business batch jobs, exactly once per business key, on PostgreSQL."
)]
struct Cli {
    /// PostgreSQL URL (or DATABASE_URL). Only `demo` works without one.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,
    /// Configuration file (or BATCHONCE_CONFIG); default ./batchonce.toml if present.
    #[arg(long, env = "BATCHONCE_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long, global = true)]
    json: bool,
    /// Log format on stderr; JSON by default when stderr is not a terminal.
    #[arg(long, global = true, value_enum)]
    log_format: Option<LogFormat>,
    /// The database URL goes through PgBouncer in transaction pooling mode
    /// (or BATCHONCE_PGBOUNCER=true): no prepared statements are kept, every
    /// statement runs in its own transaction and no session setting is sent.
    #[arg(long, env = "BATCHONCE_PGBOUNCER", global = true)]
    pgbouncer: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The whole system on one machine, on the embedded default database.
    Demo {
        /// Then leave the console running on the demo's data, here
        /// (default 127.0.0.1:8470), with a one-time login printed.
        #[arg(long, num_args = 0..=1, default_missing_value = "127.0.0.1:8470")]
        console: Option<std::net::SocketAddr>,
    },
    /// Applies the migrations of the engine and of every declared job kind, and records the
    /// file's jobs, the only ones a producer login may enqueue (no file: the record is kept).
    Migrate {
        /// Then drop the SQL functions only earlier releases call (the contract step, once every
        /// process runs this release); refused while a process of an earlier release is live.
        #[arg(long)]
        contract: bool,
    },
    /// Enqueues the runs of a date or a range: prints `enqueued KEY`,
    /// `duplicate KEY` or `skipped KEY (reason)` per run. A scoped job
    /// needs --scope or --all-scopes.
    Enqueue(EnqueueArgs),
    /// The producer: enqueues every scheduled period, on a timer, until SIGTERM.
    Produce {
        /// One tick, then exit.
        #[arg(long)]
        once: bool,
        /// Time between ticks (default 15s). With --once: the period of the timer that runs it;
        /// the producer counts as live for three of them (without it, for three of the shortest
        /// time between two firings of its jobs' schedules).
        #[arg(long, value_parser = duration_arg)]
        interval: Option<Duration>,
        /// Simulate this moment (RFC 3339) instead of the database clock: it decides which
        /// periods are due. The runs are stamped with it only under the schema owner's login (tests);
        /// under any other login they are stamped with the database clock.
        #[arg(long, value_parser = instant_arg)]
        now: Option<chrono::DateTime<chrono::Utc>>,
        /// Serve /metrics, /healthz and /readyz here (not with --once).
        #[arg(long, default_value = "127.0.0.1:9464")]
        metrics_addr: std::net::SocketAddr,
    },
    /// Pre-deploy check: processes race for one scratch key; exactly one must win.
    Preflight {
        /// Racing processes.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..=64))]
        processes: u32,
    },
    /// One racer of `preflight` (internal).
    #[command(hide = true)]
    PreflightRacer {
        /// The scratch key to race for.
        #[arg(long)]
        key: String,
        /// Unix time in milliseconds at which to start.
        #[arg(long)]
        start_at_ms: i64,
    },
    /// A worker process: leases and executes runs until SIGTERM/SIGINT.
    Worker(WorkerArgs),
    /// Publishes the database-derived gauges (one per deployment).
    Exporter {
        /// How often to read the database.
        #[arg(long, default_value = "15s", value_parser = duration_arg)]
        interval: Duration,
        /// Serve /metrics, /healthz and /readyz here.
        #[arg(long, default_value = "127.0.0.1:9464")]
        metrics_addr: std::net::SocketAddr,
    },
    /// Serves the operator's web console: every job's business dates at a
    /// glance, runs, stale runs, the audit log and workers; operators fail,
    /// re-run and skip runs with a reason, audited as on the command line.
    Console(ConsoleArgs),
    /// Inspects runs.
    Runs {
        #[command(subcommand)]
        command: RunsCommand,
    },
    /// Pauses and resumes jobs, and lists the paused ones.
    Jobs {
        #[command(subcommand)]
        command: jobs::JobsCommand,
    },
    /// Counts per job and status, oldest pending run, stale runs.
    Status,
    /// Prints (or applies) SQL for least-privilege roles: migrator,
    /// producer, worker, operator, read-only.
    Roles {
        /// Role names are PREFIX_migrator, PREFIX_producer, ...
        #[arg(long, default_value = "batchonce")]
        prefix: String,
        /// The schema the tables are in (when printing).
        #[arg(long, default_value = "public")]
        schema: String,
        /// Applies the SQL on DATABASE_URL (as a role with CREATEROLE that
        /// owns the tables) instead of printing it.
        #[arg(long)]
        apply: bool,
        /// During a rolling upgrade: also keep the direct writes the
        /// previous release's processes need; apply again without it once
        /// they are all gone (docs/upgrading.md).
        #[arg(long)]
        keep_direct_writes: bool,
    },
}

// `enqueue`'s arguments (enqueue.rs).
#[derive(Debug, clap::Args)]
struct EnqueueArgs {
    /// Job name, e.g. daily-settlement.
    job: String,
    /// Business date, YYYY-MM-DD.
    #[arg(long, required_unless_present = "from", conflicts_with_all = ["from", "to"])]
    date: Option<String>,
    /// Backfill: first business date of an inclusive range (at most 366 days).
    #[arg(long, requires = "to")]
    from: Option<String>,
    /// Backfill: last business date of the range.
    #[arg(long, requires = "from")]
    to: Option<String>,
    /// A scoped job's scopes to enqueue, e.g. seller-4711 (repeat it, or separate by commas).
    #[arg(long, value_delimiter = ',', conflicts_with = "all_scopes")]
    scope: Vec<String>,
    /// Every scope the job's `scopes` lists or its scope query returns now.
    #[arg(long)]
    all_scopes: bool,
}

// `worker`'s arguments (worker.rs).
#[derive(Debug, clap::Args)]
struct WorkerArgs {
    /// Runs executed at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    concurrency: u32,
    /// Most runs claimed ahead of a free slot (0: claim only for free
    /// slots). Only as many as the worker started in the last 50 ms are
    /// claimed ahead, and one not started within 1 s (or a quarter of
    /// its lease) is released for any worker.
    #[arg(long, default_value_t = crate::runtime::worker::DEFAULT_PREFETCH, value_parser = clap::value_parser!(u32).range(0..=10000))]
    prefetch: u32,
    /// Worker id (default: <host>-<pid>); also the database application_name.
    #[arg(long)]
    worker_id: Option<String>,
    /// After SIGTERM, how long handlers may take to reach a chunk boundary.
    #[arg(long, default_value = "20s", value_parser = duration_arg)]
    grace: Duration,
    /// How often to look for due runs without a notification.
    #[arg(long, default_value = "2s", value_parser = duration_arg)]
    poll_interval: Duration,
    /// Do not LISTEN for enqueue notifications (poll only).
    #[arg(long, conflicts_with = "listen_url")]
    no_listen: bool,
    /// LISTEN on a connection of its own to this URL (or
    /// BATCHONCE_LISTEN_URL) instead of one from the pool: a direct URL
    /// to PostgreSQL when DATABASE_URL goes through PgBouncer, which
    /// cannot hold a LISTEN session.
    #[arg(long, env = "BATCHONCE_LISTEN_URL", hide_env_values = true)]
    listen_url: Option<String>,
    /// Serve /metrics, /healthz and /readyz here.
    #[arg(long, default_value = "127.0.0.1:9464")]
    metrics_addr: std::net::SocketAddr,
    /// Connections for claims and handlers (default: concurrency + 3).
    /// Heartbeats use one more connection of their own, so a pool
    /// smaller than the concurrency slows handlers but never the leases.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    max_connections: Option<u32>,
    /// Serve only these declared jobs, comma-separated (default: every
    /// job the configuration declares), e.g. `--jobs daily-settlement`.
    #[arg(long, value_delimiter = ',')]
    jobs: Vec<String>,
}

// `console`'s arguments (commands.rs).
#[derive(Debug, clap::Args)]
struct ConsoleArgs {
    /// Where to listen; loopback unless told otherwise.
    #[arg(long, default_value = "127.0.0.1:8470")]
    listen: std::net::SocketAddr,
    /// The users file (or BATCHONCE_CONSOLE_USERS): TOML `[[user]]`
    /// entries with `name`, `role` (viewer or operator) and
    /// `password_hash` (from `--hash-password`).
    #[arg(long, env = "BATCHONCE_CONSOLE_USERS")]
    users: Option<PathBuf>,
    /// Sign users in from this header, set by a trusted reverse proxy;
    /// needs --proxy-secret-env. The user must be in the users file,
    /// which gives the role.
    #[arg(long, requires = "proxy_secret_env")]
    proxy_user_header: Option<String>,
    /// The environment variable holding the secret the proxy sends in
    /// `X-Batchonce-Proxy-Secret` (at least 16 characters).
    #[arg(long, requires = "proxy_user_header")]
    proxy_secret_env: Option<String>,
    /// Mark cookies `Secure`, so browsers send them only over HTTPS:
    /// the default unless --listen is a loopback address.
    #[arg(long, conflicts_with = "no_secure_cookies")]
    secure_cookies: bool,
    /// Do not mark cookies `Secure` even beyond loopback: only for a
    /// console that browsers reach over plain HTTP on a trusted
    /// network.
    #[arg(long)]
    no_secure_cookies: bool,
    /// A reverse proxy (an address or a range, e.g. 10.0.0.0/8;
    /// repeat or separate with commas) whose `X-Forwarded-For` names
    /// the client: the sign-in limit and the audit then use the
    /// right-most address it reports that is not itself a trusted
    /// proxy. From any other peer the header is ignored.
    #[arg(long, value_delimiter = ',', value_parser = trusted_proxy_arg)]
    trusted_proxy: Vec<crate::console::client_addr::Cidr>,
    /// Print an argon2id hash of the password read from standard input
    /// (one line), for the users file, and exit.
    #[arg(long)]
    hash_password: bool,
}

/// The exit status of a command that worked and found what the caller
/// asked it to look for: `runs stale --fail-if-dead` that found a dead
/// run, `runs watch` whose run ended FAILED. 1 stays "error" (nothing
/// could be checked) and 2 "usage error", so a script can tell them apart.
pub const EXIT_FOUND: u8 = 3;

// Each action's `after_help` gives the states it allows and an example;
// `workers/tests/cli_ux.rs` parses them.
#[derive(Debug, Subcommand)]
enum RunsCommand {
    /// Lists runs, newest business date first.
    List {
        /// PENDING, RUNNING, SUCCEEDED, FAILED or SKIPPED.
        #[arg(long)]
        status: Option<String>,
        /// Only this job.
        #[arg(long)]
        job: Option<String>,
        /// Only the runs of this scope (`…@<scope>`), across periods.
        #[arg(long)]
        scope: Option<String>,
        /// At most this many runs (1-10000).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10000))]
        limit: u32,
    },
    /// One run with its attempt and operator history.
    Show {
        /// The run's job key, e.g. daily-settlement:2026-09-15.
        key: String,
    },
    /// RUNNING runs past their stale_after (or lease-expired under policy
    /// hold), with evidence and a conclusion: blocked, alive-slow, dead or
    /// unknown.
    #[command(after_help = "\
Exit status: 0, or 3 with --fail-if-dead when a run is concluded dead; 1 on an error.

Example (cron, or a monitoring check):
  batchonce runs stale --fail-if-dead || page-the-operator")]
    Stale {
        /// Exit with status 3 (not 1, which means an error) when a run is
        /// concluded dead, after printing the list as usual.
        #[arg(long)]
        fail_if_dead: bool,
    },
    /// Follows one run until it ends: items, rate, attempt and lease left,
    /// on one live line on a terminal, one plain line per interval
    /// otherwise.
    #[command(after_help = "\
Exit status: 0 when the run ends SUCCEEDED or SKIPPED, 3 when it ends FAILED, 1 on an error.
A run that is already finished prints one line and exits the same way.

Example:
  batchonce runs watch daily-settlement:2026-09-15 --interval 5s")]
    Watch {
        /// The run's job key, e.g. daily-settlement:2026-09-15.
        key: String,
        /// Time between two looks at the run.
        #[arg(long, default_value = "2s", value_parser = duration_arg)]
        interval: Duration,
    },
    /// Marks a stale or lease-expired run FAILED, fencing its holder.
    #[command(after_help = "\
Allowed from: RUNNING, if its lease has expired or it started more than stale_after ago.
With --force: any RUNNING run, or a PENDING one.
Becomes: FAILED. The holder gets a new lease token, so it can no longer commit,
and its attempt is closed as operator_failed. Check `batchonce runs stale` first.

Example:
  batchonce runs fail daily-settlement:2026-09-15 --operator alice \\
    --reason \"host settle-a lost power; worker gone\" --dry-run")]
    Fail(ActionArgs),
    /// Puts a FAILED run back to PENDING under the same key, budget renewed
    /// (a SUCCEEDED or SKIPPED run only with --force: a correction).
    #[command(after_help = "\
Allowed from: FAILED.
With --force: also SUCCEEDED or SKIPPED (a correction: the handler runs again under the same key).
Becomes: PENDING, due at once, with the attempt budget renewed.

Example:
  batchonce runs rerun daily-settlement:2026-09-15 --operator alice \\
    --reason \"re-run after the host loss\"")]
    Rerun(ActionArgs),
    /// Marks a PENDING or FAILED run SKIPPED.
    #[command(after_help = "\
Allowed from: PENDING or FAILED (--force changes nothing).
Becomes: SKIPPED: no worker runs it.

Example:
  batchonce runs skip daily-settlement:2026-09-15 --operator alice \\
    --reason \"enqueued by mistake; no settlement on this date\"")]
    Skip(ActionArgs),
    /// Moves finished runs (SUCCEEDED or SKIPPED) of business dates before
    /// --before, with their attempts, to the archive tables, in audited
    /// batches. Off by default: only this command archives.
    #[command(after_help = "\
Archived: SUCCEEDED and SKIPPED runs whose business date is before --before (a date
in the past by the database clock); a partitioned run only once it and all its
partitions are finished. PENDING, RUNNING and FAILED runs stay. Each batch is one
transaction with one audit row per job; an interrupted archive leaves every run
either live or archived. An archived key still refuses a second enqueue, and
`runs show KEY` still shows it. Item tables are never touched.

Example:
  batchonce runs archive --before 2024-01-01 --operator alice \\
    --reason \"keep two years live (ticket OPS-88)\" --dry-run")]
    Archive(ArchiveArgs),
}

#[derive(Debug, clap::Args)]
struct ArchiveArgs {
    /// Archive runs whose business date is before this date (YYYY-MM-DD), which must be in the past.
    #[arg(long)]
    before: String,
    /// Why (recorded in the audit trail).
    #[arg(long)]
    reason: String,
    /// Who (recorded in the audit trail with the database session user).
    #[arg(long)]
    operator: String,
    /// Only this job's runs (default: every job's).
    #[arg(long)]
    job: Option<String>,
    /// Runs per transaction (a partitioned run counts once).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    batch: u32,
    /// Count what would be archived and change nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Debug, clap::Args)]
struct ActionArgs {
    /// The run's job key, e.g. daily-settlement:2026-09-15.
    key: String,
    /// Why (recorded in the audit trail).
    #[arg(long)]
    reason: String,
    /// Who (recorded in the audit trail with the database session user).
    #[arg(long)]
    operator: String,
    /// Allow the further states listed under "With --force" below.
    #[arg(long)]
    force: bool,
    /// Show what would change and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// How long to wait for the run's row, which another session (a
    /// worker's open chunk) may hold, before giving up and naming it.
    #[arg(long, default_value = "5s", value_parser = duration_arg)]
    lock_timeout: Duration,
    /// If the row stays locked: record it in the audit trail, terminate the
    /// sessions that hold it (pg_terminate_backend) and try once more.
    #[arg(long, conflicts_with = "dry_run")]
    terminate_blocker: bool,
}

fn duration_arg(s: &str) -> Result<Duration, String> {
    parse_duration(s)
}

fn trusted_proxy_arg(s: &str) -> Result<crate::console::client_addr::Cidr, String> {
    crate::console::client_addr::Cidr::parse(s)
}

fn instant_arg(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    let t = chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|_| {
            format!("invalid instant {s:?}: expected RFC 3339, e.g. 2026-09-15T01:00:00+09:00")
        })?;
    // The same range as every business date, so the producer plans only
    // dates that `enqueue` accepts.
    crate::key::check_instant(t).map_err(|e| e.to_string())
}

/// Runs the command line with the given job kinds; the `batchonce` binary's
/// whole `main`.
///
/// Before parsing anything it calls `supervisor::run_if_invoked()`, which
/// turns the process into a command job's supervisor when its first
/// argument is `__batchonce-supervise`. It then sets up logging
/// ([`init_logging`]) and loads the configuration against the registry's
/// default configs. Every error becomes one `batchonce: error: …` line: its
/// causes are joined, line breaks become spaces, `text::truncate` cuts it
/// to 1,000 characters (so an error that quotes a huge input stays one
/// bounded line), and `text::escape_for_terminal` escapes what a terminal
/// would act on. A clap usage error is reduced to its first paragraph on
/// one line, cut the same way, and followed by `(see batchonce SUB --help)`
/// for the deepest subcommand the arguments name ([`help_command`]).
pub fn main(registry: Registry) -> ExitCode {
    crate::runtime::supervisor::run_if_invoked();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                    ExitCode::from(2)
                } else {
                    ExitCode::SUCCESS
                };
            }
            // clap's own message, without the usage block: one line.
            let text = e.render().to_string();
            let first_paragraph: Vec<&str> = text
                .trim_start()
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let joined = first_paragraph.join(" ");
            let line = crate::text::truncate(joined.trim_start_matches("error: "));
            let help = help_command(std::env::args_os().skip(1));
            eprintln!("batchonce: error: {line} (see {help})");
            return ExitCode::from(2);
        }
    };
    init_logging(&cli);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("batchonce: error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(dispatch(cli, registry));
    // Background tasks (the metrics server, pools) must not log after the
    // final error line: an operator reads the last line first.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(code) => code,
        Err(e) => {
            // Library errors already carry their cause's text; add a cause
            // only when it says something new.
            let mut msg = e.to_string();
            for cause in e.chain().skip(1) {
                let c = cause.to_string();
                if !msg.contains(&c) {
                    msg.push_str(": ");
                    msg.push_str(&c);
                }
            }
            // One line, and bounded: an error may quote a huge input, and
            // stored text (a database's message) is shown, never obeyed.
            let msg = crate::text::truncate(&msg.replace(['\n', '\r'], " "));
            eprintln!("batchonce: error: {}", esc(&msg));
            ExitCode::FAILURE
        }
    }
}

/// The command tree of the command line, for tests and generated docs.
pub fn command() -> clap::Command {
    Cli::command()
}

/// `batchonce SUB SUB --help` for the deepest subcommand that `args` name,
/// so that a usage error points at the help that lists the options it is
/// about. Options are stepped over with their values, so that
/// `--config runs` does not count as the `runs` subcommand.
fn help_command(args: impl IntoIterator<Item = std::ffi::OsString>) -> String {
    let mut cmd = Cli::command();
    // Building propagates the global options to every subcommand.
    cmd.build();
    let mut path = vec![cmd.get_name().to_owned()];
    let mut current = &cmd;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let Some(arg) = arg.to_str() else { continue };
        if arg == "--" {
            break;
        }
        let option = if let Some(long) = arg.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, _)) => (n, true),
                None => (long, false),
            };
            Some((
                current.get_arguments().find(|a| a.get_long() == Some(name)),
                inline,
            ))
        } else if let Some(short) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
            // `-x` or `-xVALUE`: only the first letter names the option.
            let c = short.chars().next();
            let inline = short.chars().count() > 1;
            Some((current.get_arguments().find(|a| a.get_short() == c), inline))
        } else {
            None
        };
        match option {
            Some((Some(a), false)) if a.get_action().takes_values() => {
                args.next();
            }
            Some(_) => {}
            None => {
                if let Some(sub) = current.find_subcommand(arg) {
                    path.push(sub.get_name().to_owned());
                    current = sub;
                }
            }
        }
    }
    format!("{} --help", path.join(" "))
}

/// tracing on stderr: JSON when stderr is not a terminal (or with
/// `--log-format json`), colour in text only when stderr is a terminal and
/// `NO_COLOR` is unset. `RUST_LOG` wins over the default level: `info` for
/// the long-running commands, `warn` otherwise.
fn init_logging(cli: &Cli) {
    use tracing_subscriber::EnvFilter;
    let default = match cli.command {
        Command::Worker(_)
        | Command::Exporter { .. }
        | Command::Console(_)
        | Command::Produce { once: false, .. } => "info",
        // Short commands report their own errors; sqlx's warning that a
        // statement was slow (an operator action waiting for a row) would
        // only come first.
        _ => "warn,sqlx::query=error",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let json = match cli.log_format {
        Some(LogFormat::Json) => true,
        Some(LogFormat::Text) => false,
        None => !std::io::stderr().is_terminal(),
    };
    // Colour only for a person at a terminal: escape codes in a file or a
    // log collector are noise, and NO_COLOR (no-color.org) turns them off.
    let colour = !json
        && std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    if json {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init();
    } else {
        builder.init();
    }
}

/// Whether a configuration file is read (`--config`, or `batchonce.toml`
/// here), the rule of [`load_config`]: `migrate` declares jobs only then.
fn config_file_given(cli: &Cli) -> bool {
    cli.config.is_some() || Path::new("batchonce.toml").is_file()
}

fn load_config(cli: &Cli, registry: &Registry) -> anyhow::Result<Config> {
    let kinds = registry.default_configs();
    match &cli.config {
        Some(path) => Ok(Config::load(path, &kinds)?),
        None if Path::new("batchonce.toml").is_file() => {
            Ok(Config::load(Path::new("batchonce.toml"), &kinds)?)
        }
        None => Ok(Config::empty()),
    }
}

/// The jobs a worker serves: those `--jobs` names (each must be declared),
/// or every declared job. A worker with nothing to serve is an error, not an
/// idle process that looks healthy.
fn served_jobs(registry: Registry, only: &[String], config: &Config) -> anyhow::Result<Registry> {
    let registry = if only.is_empty() {
        registry
    } else {
        let mut names = Vec::new();
        for j in only {
            names.push(
                registry
                    .resolve(j.trim())
                    .map_err(|e| anyhow!("--jobs: {e}"))?,
            );
        }
        registry.only(&names)
    };
    if registry.names().next().is_none() {
        bail!(
            "no job to serve: no job is declared ({}); declare each job it should run in a [jobs.<name>] table of batchonce.toml",
            config.origin
        );
    }
    Ok(registry)
}

fn require_url(cli: &Cli) -> anyhow::Result<&str> {
    match cli.database_url.as_deref() {
        Some(u) if !u.trim().is_empty() => Ok(u),
        _ => bail!(
            "no database: set DATABASE_URL or pass --database-url (only `demo` starts its own)"
        ),
    }
}

/// The rule is `text::operator`'s, shared with any other entry point; the
/// error is prefixed with the flag (`invalid --operator: …`), as is
/// [`validate_reason`]'s with `text::reason`.
fn validate_operator(s: &str) -> anyhow::Result<String> {
    crate::text::operator(s).map_err(|e| anyhow!("invalid --operator: {e}"))
}

/// The rule is `text::reason`'s, shared with any other entry point.
fn validate_reason(s: &str) -> anyhow::Result<String> {
    crate::text::reason(s).map_err(|e| anyhow!("invalid --reason: {e}"))
}

fn validate_worker_id(id: &str) -> anyhow::Result<String> {
    if id.is_empty()
        || id.len() > 63
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        bail!("invalid worker id {id:?}: use 1-63 letters, digits, '-', '_' or '.'");
    }
    Ok(id.to_owned())
}

#[cfg(test)]
mod console_flag_tests {
    use super::*;

    fn console(args: &[&str]) -> Result<Command, clap::Error> {
        let mut argv = vec!["batchonce", "console"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).map(|c| c.command)
    }

    #[test]
    fn secure_cookies_and_trusted_proxies_parse() {
        let Ok(Command::Console(ConsoleArgs {
            secure_cookies,
            no_secure_cookies,
            trusted_proxy,
            ..
        })) = console(&["--no-secure-cookies", "--trusted-proxy", "10.0.0.0/8,::1"])
        else {
            panic!("console flags refused");
        };
        assert!(!secure_cookies && no_secure_cookies);
        assert_eq!(trusted_proxy.len(), 2);
        // One or the other, and only ranges.
        assert!(console(&["--secure-cookies", "--no-secure-cookies"]).is_err());
        let e = console(&["--trusted-proxy", "10.0.0.0/33"]).err().unwrap();
        assert!(e.to_string().contains("not an address range"), "{e}");
    }
}
