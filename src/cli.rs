//! The command line (DESIGN.md §6). Parsing and output live here; every
//! command delegates to the queue, worker or demo modules. Errors are one line
//! on stderr and a non-zero exit.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::json;

use crate::clock::Clock;
use crate::config::{parse_duration, Config};
use crate::db;
use crate::job::Registry;
use crate::key::{parse_date, JobKey, JobName};
use crate::producer;
use crate::queue::{self, RunStatus};
use crate::text::{escape_for_terminal as esc, json_for_terminal};
use crate::worker::{self, Shutdown, WorkerOptions};

#[derive(Debug, Parser)]
#[command(
    name = "batchonce",
    version,
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
    Demo,
    /// Applies the migrations of the engine and of every job kind.
    Migrate,
    /// Enqueues the runs of a date or a range: prints `enqueued KEY`,
    /// `duplicate KEY` or `skipped KEY (reason)` per run.
    Enqueue {
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
    },
    /// The producer: enqueues every scheduled period, on a timer, until SIGTERM.
    Produce {
        /// One tick, then exit.
        #[arg(long)]
        once: bool,
        /// Time between ticks.
        #[arg(long, default_value = "15s", value_parser = duration_arg)]
        interval: Duration,
        /// Simulate this moment (RFC 3339) instead of the database clock.
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
        #[arg(long)]
        key: String,
        /// Unix time in milliseconds at which to start.
        #[arg(long)]
        start_at_ms: i64,
    },
    /// A worker process: leases and executes runs until SIGTERM/SIGINT.
    Worker {
        /// Runs executed at once.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
        concurrency: u32,
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
    },
    /// Publishes the database-derived gauges (one per deployment).
    Exporter {
        /// How often to read the database.
        #[arg(long, default_value = "15s", value_parser = duration_arg)]
        interval: Duration,
        /// Serve /metrics, /healthz and /readyz here.
        #[arg(long, default_value = "127.0.0.1:9464")]
        metrics_addr: std::net::SocketAddr,
    },
    /// Inspects runs.
    Runs {
        #[command(subcommand)]
        command: RunsCommand,
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
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10000))]
        limit: u32,
    },
    /// One run with its attempt and operator history.
    Show { key: String },
    /// RUNNING runs past their stale_after (or lease-expired under policy
    /// hold), with evidence and a conclusion: blocked, alive-slow, dead or
    /// unknown.
    Stale,
    /// Marks a stale or lease-expired run FAILED, fencing its holder.
    Fail(ActionArgs),
    /// Puts a FAILED run back to PENDING under the same key, budget renewed
    /// (a SUCCEEDED or SKIPPED run only with --force: a correction).
    Rerun(ActionArgs),
    /// Marks a PENDING or FAILED run SKIPPED.
    Skip(ActionArgs),
}

#[derive(Debug, clap::Args)]
struct ActionArgs {
    /// The run's job key.
    key: String,
    /// Why (recorded in the audit trail).
    #[arg(long)]
    reason: String,
    /// Who (recorded in the audit trail with the database session user).
    #[arg(long)]
    operator: String,
    /// Override the state checks (see each command).
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
pub fn main(registry: Registry) -> ExitCode {
    crate::supervisor::run_if_invoked();
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
            let line = crate::queue::truncate(joined.trim_start_matches("error: "));
            eprintln!("batchonce: error: {line} (see batchonce --help)");
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
            let msg = crate::queue::truncate(&msg.replace(['\n', '\r'], " "));
            eprintln!("batchonce: error: {}", esc(&msg));
            ExitCode::FAILURE
        }
    }
}

fn init_logging(cli: &Cli) {
    use tracing_subscriber::EnvFilter;
    let default = match cli.command {
        Command::Worker { .. }
        | Command::Exporter { .. }
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
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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

async fn dispatch(cli: Cli, registry: Registry) -> anyhow::Result<ExitCode> {
    if cli.pgbouncer {
        // These need a session of their own: sqlx's migrator holds an
        // advisory lock for the whole migration, `roles` and `preflight`
        // check the real server, and `demo` starts its own database.
        let direct = match &cli.command {
            Command::Migrate => Some("migrate"),
            Command::Roles { .. } => Some("roles"),
            Command::Preflight { .. } | Command::PreflightRacer { .. } => Some("preflight"),
            Command::Demo => Some("demo"),
            _ => None,
        };
        if let Some(name) = direct {
            bail!("`{name}` needs a direct connection to PostgreSQL: run it without --pgbouncer (and BATCHONCE_PGBOUNCER), with a URL to the server itself");
        }
        db::set_transaction_pooler(true);
    }
    let mut config = load_config(&cli, &registry)?;
    if matches!(cli.command, Command::Demo) {
        // The bundled kinds are samples: the demo declares them for itself.
        config = config.declare_all(&registry.default_configs());
    }
    // Jobs of the user's own (`command = [...]`) join the built-in kinds;
    // then only what the configuration declares exists for this process.
    let known = crate::command::register_commands(registry, &config);
    let registry = known.only(config.jobs.keys());
    match &cli.command {
        Command::Demo => {
            let ok = crate::demo::run(&registry, cli.database_url.as_deref(), &config).await?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Migrate => {
            let pool = db::connect(require_url(&cli)?, "batchonce-migrate", 2).await?;
            let kinds =
                db::kinds_to_migrate(&pool, &registry.migrations(), &known.migrations()).await?;
            db::migrate(&pool, &kinds).await?;
            let n = db::combined(&kinds).iter().count();
            let (frozen, left) = freeze_legacy_contexts(&pool, &config).await?;
            if cli.json {
                println!(
                    "{}",
                    json!({"migrated": true, "migrations": n,
                           "contexts_frozen": frozen, "contexts_left": left})
                );
            } else {
                println!("migrations applied ({n} known)");
                if frozen > 0 || left > 0 {
                    println!(
                        "runs enqueued by the previous release: froze the context of {frozen} \
                         from {}; {left} left for the workers that claim them",
                        config.origin
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Enqueue {
            job,
            date,
            from,
            to,
        } => {
            let job = registry.resolve(job).map_err(|e| anyhow!(e))?;
            let dates = match (date, from, to) {
                (Some(d), _, _) => vec![parse_date(d)?],
                (None, Some(f), Some(t)) => {
                    producer::date_range(parse_date(f)?, parse_date(t)?).map_err(|e| anyhow!(e))?
                }
                // clap requires --date or both --from and --to.
                _ => bail!("give --date, or --from and --to"),
            };
            let cfg = config.job(&job).cloned().unwrap_or_default();
            let periods = producer::periods_for_dates(&cfg, &dates).map_err(|e| anyhow!(e))?;
            let runs = producer::runs_for_periods(&job, &cfg, &periods)?;
            let pool = db::connect(require_url(&cli)?, "batchonce-enqueue", 2).await?;
            let report = queue::enqueue(&pool, &runs, Clock::Db)
                .await
                .context("enqueue failed")?;
            let inserted: std::collections::HashSet<&JobKey> = report.enqueued.iter().collect();
            for run in &runs {
                let result = match (inserted.contains(&run.key), &run.skip_reason) {
                    (false, _) => "duplicate",
                    (true, None) => "enqueued",
                    (true, Some(_)) => "skipped",
                };
                if cli.json {
                    println!(
                        "{}",
                        json!({"result": result, "job_key": run.key.as_str(), "reason": run.skip_reason})
                    );
                } else if result == "skipped" {
                    println!(
                        "skipped {} ({})",
                        run.key,
                        run.skip_reason.as_deref().unwrap_or("")
                    );
                } else {
                    println!("{result} {}", run.key);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Exporter {
            interval,
            metrics_addr,
        } => {
            let url = require_url(&cli)?;
            let pool = db::connect_lazy(url, "batchonce-exporter", 2)?;
            let signals = Shutdown::default();
            spawn_signal_handler(signals.clone())?;
            let server = spawn_metrics(*metrics_addr, &pool, &signals);
            crate::exporter::run(pool, config, *interval, signals.shutdown.clone()).await;
            let _ = server.await;
            Ok(ExitCode::SUCCESS)
        }
        Command::Produce {
            once,
            interval,
            now,
            metrics_addr,
        } => {
            let url = require_url(&cli)?;
            let clock = now.map(Clock::At).unwrap_or(Clock::Db);
            if *once {
                let pool = db::connect(url, "batchonce-producer", 2).await?;
                // One row per host for producers run by a timer, however
                // many times they run.
                let id = format!("producer-once-{}", host_name());
                producer::register(&pool, &config, &id, crate::worker_registry::ONE_SHOT_LIVE)
                    .await;
                let report = producer::tick(&pool, &config, clock)
                    .await
                    .context("producer tick failed")?;
                producer::log_tick(&report);
                if cli.json {
                    println!("{}", serde_json::to_string(&report)?);
                } else {
                    for t in &report {
                        for k in &t.enqueued {
                            println!("enqueued {k}");
                        }
                        for k in &t.skipped {
                            println!("skipped {k}");
                        }
                        println!(
                            "{}: {} enqueued, {} skipped, {} duplicate{}",
                            t.job,
                            t.enqueued.len(),
                            t.skipped.len(),
                            t.duplicates,
                            if t.truncated {
                                " (window truncated: shorten catch_up)"
                            } else {
                                ""
                            }
                        );
                    }
                    if report.is_empty() {
                        println!("no enabled job has a schedule");
                    }
                }
                return Ok(ExitCode::SUCCESS);
            }
            let pool = db::connect_lazy(url, "batchonce-producer", 2)?;
            let signals = Shutdown::default();
            spawn_signal_handler(signals.clone())?;
            let server = spawn_metrics(*metrics_addr, &pool, &signals);
            tracing::info!(
                interval_ms = interval.as_millis() as u64,
                "producer started"
            );
            let id = format!("producer-{}", default_worker_id());
            producer::run(pool, config, clock, *interval, id, signals.shutdown.clone()).await;
            let _ = server.await;
            tracing::info!("producer stopped");
            Ok(ExitCode::SUCCESS)
        }
        Command::Preflight { processes } => {
            let url = require_url(&cli)?;
            let ok = crate::preflight::run(url, &registry, *processes).await?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::PreflightRacer { key, start_at_ms } => {
            let url = require_url(&cli)?;
            crate::preflight::race(url, key, *start_at_ms).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Worker {
            concurrency,
            worker_id,
            grace,
            poll_interval,
            no_listen,
            listen_url,
            metrics_addr,
            max_connections,
            jobs,
        } => {
            let url = require_url(&cli)?;
            let worker_id = match worker_id {
                Some(id) => validate_worker_id(id)?,
                None => default_worker_id(),
            };
            let registry = served_jobs(registry, jobs, &config)?;
            // Handlers and claims share the main pool; heartbeats get their own.
            let max_ttl = config
                .jobs
                .values()
                .map(|c| c.lease_ttl)
                .max()
                .unwrap_or(Duration::from_secs(30));
            let idle_tx = (max_ttl * 2).max(Duration::from_secs(10));
            let size = max_connections.unwrap_or(concurrency + 3);
            let listen = !no_listen;
            if listen && listen_url.is_none() && cli.pgbouncer {
                bail!("--pgbouncer: PgBouncer in transaction mode cannot hold a LISTEN session; give --listen-url with a direct URL to PostgreSQL, or --no-listen to poll");
            }
            if size < 2 && listen && listen_url.is_none() {
                bail!("--max-connections 1 leaves no connection for claims once LISTEN holds one: give at least 2, add --listen-url, or add --no-listen");
            }
            let pool = db::connect_worker(url, &worker_id, size, idle_tx)?;
            let heartbeat_pool = db::connect_worker(url, &worker_id, 1, idle_tx)?;
            // The LISTEN session never goes through a pooler: its own
            // connection, outside the pool's budget.
            let listen_pool = match listen_url {
                Some(u) if listen => Some(db::connect_direct_lazy(u, &worker_id, 1)?),
                _ => None,
            };
            tracing::info!(
                pool = size,
                heartbeat = 1,
                listen = u8::from(listen_pool.is_some()),
                max_connections = size + 1 + u32::from(listen_pool.is_some()),
                pgbouncer = cli.pgbouncer,
                "connection budget"
            );
            let signals = Shutdown::default();
            spawn_signal_handler(signals.clone())?;
            let server = spawn_metrics(*metrics_addr, &pool, &signals);
            if !wait_for_schema(&pool, &registry, &signals).await? {
                let _ = server.await;
                return Ok(ExitCode::SUCCESS);
            }
            let mut opts = WorkerOptions::new(worker_id);
            opts.concurrency = *concurrency;
            opts.grace = *grace;
            opts.poll_interval = *poll_interval;
            opts.listen = listen;
            opts.listen_pool = listen_pool;
            worker::run(
                registry,
                config,
                pool,
                heartbeat_pool,
                opts,
                signals.clone(),
            )
            .await;
            // The worker returns only after a shutdown signal; stop serving too.
            signals.shutdown.cancel();
            let _ = server.await;
            Ok(ExitCode::SUCCESS)
        }
        Command::Runs { command } => {
            let pool = db::connect(require_url(&cli)?, "batchonce-runs", 2).await?;
            runs_command(&pool, &registry, &config, command, cli.json).await
        }
        Command::Roles {
            prefix,
            schema,
            apply,
            keep_direct_writes,
        } => {
            let tables = registry.output_tables();
            let opts = crate::roles::RolesOptions {
                output_tables: &tables,
                keep_direct_writes: *keep_direct_writes,
            };
            if *apply {
                let pool = db::connect(require_url(&cli)?, "batchonce-roles", 1).await?;
                crate::roles::apply(&pool, prefix, &opts).await?;
                println!(
                    "roles {prefix}_migrator, {prefix}_producer, {prefix}_worker, {prefix}_operator, {prefix}_readonly and {prefix}_program are in place{}",
                    if *keep_direct_writes { ", with the previous release's direct writes kept" } else { "" }
                );
            } else {
                print!(
                    "{}",
                    crate::roles::sql(prefix, schema, &opts).map_err(|e| anyhow!(e))?
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Status => {
            let pool = db::connect(require_url(&cli)?, "batchonce-status", 2).await?;
            let st = queue::status(&pool, Clock::Db).await?;
            let drift = crate::worker_registry::config_drift(&pool).await?;
            if cli.json {
                let mut v = serde_json::to_value(&st)?;
                v["config_drift"] = serde_json::to_value(&drift)?;
                println!("{}", json_for_terminal(&v)?);
            } else {
                println!("{:<28} {:<10} {:>8}", "JOB", "STATUS", "RUNS");
                for c in &st.counts {
                    println!(
                        "{:<28} {:<10} {:>8}",
                        esc(&c.job_name),
                        esc(&c.status),
                        c.runs
                    );
                }
                match st.oldest_pending_seconds {
                    Some(s) => println!("oldest due pending run: {s:.0}s"),
                    None => println!("oldest due pending run: none"),
                }
                println!("expired leases: {}", st.expired_leases);
                println!(
                    "stale runs: {}",
                    if st.stale.is_empty() {
                        "none".to_owned()
                    } else {
                        esc(&st
                            .stale
                            .iter()
                            .map(|s| format!("{} ({})", s.job_key, s.conclusion))
                            .collect::<Vec<_>>()
                            .join(", "))
                        .into_owned()
                    }
                );
                print_drift(&drift);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn runs_command(
    pool: &sqlx::PgPool,
    registry: &Registry,
    config: &Config,
    command: &RunsCommand,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    match command {
        RunsCommand::Stale => {
            let stale = queue::stale_runs(pool, Clock::Db).await?;
            let drift = crate::worker_registry::config_drift(pool).await?;
            if json_out {
                println!("{}", json_for_terminal(&stale)?);
                // Standard output stays the list scripts read.
                for d in &drift {
                    eprintln!(
                        "batchonce: warning: live processes run {} with {} different configurations (keys: {}); see `batchonce status`",
                        esc(&d.job_name),
                        distinct_fingerprints(d),
                        esc(&d.keys.join(", "))
                    );
                }
                return Ok(ExitCode::SUCCESS);
            }
            print_drift(&drift);
            if stale.is_empty() {
                println!("no stale runs");
            }
            let age = |a: Option<f64>| {
                a.map(|s| format!("{s:.0}s ago"))
                    .unwrap_or_else(|| "never".into())
            };
            for r in &stale {
                println!("{}  {}", esc(&r.job_key), esc(&r.conclusion));
                println!(
                    "  attempt {} by {}, running {:.0}s{}",
                    r.attempt,
                    esc(r.worker_id.as_deref().unwrap_or("?")),
                    r.running_seconds,
                    if r.lease_expired {
                        ", lease expired"
                    } else {
                        ""
                    }
                );
                println!(
                    "  last heartbeat {}; processed {} ({} since the last heartbeat)",
                    age(r.heartbeat_age_seconds),
                    r.processed_count,
                    if r.advanced_since_heartbeat {
                        "advancing"
                    } else {
                        "not advancing"
                    }
                );
                println!(
                    "  worker last seen {}; database session {}",
                    age(r.worker_last_seen_age_seconds),
                    if r.session_alive { "connected" } else { "gone" }
                );
                if let Some(w) = &r.lock_wait {
                    println!(
                        "  its session {} waits on a lock ({}) for {:.0}s{}, held by:",
                        w.pid,
                        esc(w.wait_event.as_deref().unwrap_or("?")),
                        w.waiting_seconds.unwrap_or(0.0),
                        if w.for_this_run {
                            ""
                        } else {
                            " (maybe for another of its runs)"
                        }
                    );
                    for b in &w.blockers {
                        println!("    {}", esc(&b.session.describe()));
                        for s in &b.blocked_by {
                            println!("      {}", esc(&s.describe()));
                        }
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        RunsCommand::Fail(a) | RunsCommand::Rerun(a) | RunsCommand::Skip(a) => {
            let action = match command {
                RunsCommand::Fail(_) => queue::Action::Fail,
                RunsCommand::Rerun(_) => queue::Action::Rerun,
                _ => queue::Action::Skip,
            };
            let key = JobKey::parse(&a.key)?;
            let operator = validate_operator(&a.operator)?;
            let reason = validate_reason(&a.reason)?;
            let cfg = JobName::parse(key.job_name())
                .ok()
                .and_then(|n| config.job(&n).cloned())
                .unwrap_or_default();
            let req = queue::OperatorRequest {
                action,
                key,
                operator,
                reason,
                force: a.force,
                // Only for a run that stores no policy: the engine's default,
                // as `runs stale` judges such a run.
                stale_after: crate::config::JobConfig::default().stale_after,
                max_attempts: cfg.max_attempts,
            };
            let opts = queue::blockers::ActOptions {
                lock_timeout: a.lock_timeout,
                terminate_blocker: a.terminate_blocker,
                dry_run: a.dry_run,
            };
            let report = match queue::blockers::act(pool, &req, Clock::Db, opts).await {
                Ok(r) => r,
                Err(queue::blockers::ActError::Blocked(b)) => return blocked(&b, json_out),
                Err(e) => return Err(e.into()),
            };
            let outcome = &report.outcome;
            if json_out {
                println!("{}", json_for_terminal(&report)?);
                return Ok(ExitCode::SUCCESS);
            }
            for s in &report.terminated {
                println!("terminated {} (audited)", esc(&s.describe()));
            }
            let (key, before, after) = (
                esc(&outcome.job_key),
                esc(&outcome.before),
                esc(&outcome.after),
            );
            if outcome.applied {
                println!("{} {key}: {before} -> {after} (audited)", outcome.action);
            } else {
                println!(
                    "dry run: {} {key} would change {before} -> {after}; nothing changed",
                    outcome.action
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        RunsCommand::List { status, job, limit } => {
            let status = match status {
                Some(s) => Some(RunStatus::parse(s).ok_or_else(|| {
                    anyhow!("unknown status {s:?} (expected PENDING, RUNNING, SUCCEEDED, FAILED or SKIPPED)")
                })?),
                None => None,
            };
            let runs = list_runs(pool, registry, status, job.as_deref(), *limit).await?;
            if json_out {
                println!("{}", json_for_terminal(&runs)?);
            } else {
                println!(
                    "{:<40} {:<10} {:>8} {:>10} {:>7}  {:<25} FINISHED",
                    "KEY", "STATUS", "ATTEMPTS", "PROCESSED", "FAILED", "STARTED"
                );
                for r in runs {
                    println!(
                        "{:<40} {:<10} {:>8} {:>10} {:>7}  {:<25} {}",
                        esc(&r.job_key),
                        esc(&r.status),
                        format!("{}/{}", r.attempts, r.max_attempts),
                        r.processed_count,
                        r.failed_count,
                        r.started_at
                            .map(|t| t.to_rfc3339())
                            .unwrap_or_else(|| "-".into()),
                        r.finished_at
                            .map(|t| t.to_rfc3339())
                            .unwrap_or_else(|| "-".into()),
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        RunsCommand::Show { key } => {
            let key = JobKey::parse(key)?;
            let Some((run, attempts)) = queue::show_run(pool, &key).await? else {
                bail!("no run with key {key}");
            };
            let actions = queue::actions(pool, &key).await?;
            if json_out {
                println!(
                    "{}",
                    json_for_terminal(
                        &json!({"run": run, "attempts": attempts, "operator_actions": actions})
                    )?
                );
            } else {
                println!("key:          {}", esc(&run.job_key));
                println!("job:          {}", esc(&run.job_name));
                println!("business date {}", run.business_date);
                println!("status:       {}", esc(&run.status));
                println!("attempts:     {}/{}", run.attempts, run.max_attempts);
                println!(
                    "processed:    {} (failed {})",
                    run.processed_count, run.failed_count
                );
                match &run.context {
                    Some(c) => {
                        println!(
                            "period:       {} .. {} ({}, {})",
                            c.period_start.to_rfc3339(),
                            c.period_end.to_rfc3339(),
                            c.timezone.name(),
                            c.covers.as_str()
                        );
                        println!(
                            "policies:     lease {}, stale after {}, on lease expiry {}, chunk {}, backoff {}..{}, {} attempts, item failures {}",
                            humantime::format_duration(c.lease_ttl),
                            humantime::format_duration(c.stale_after),
                            c.on_lease_expiry.as_str(),
                            c.chunk_size,
                            humantime::format_duration(c.backoff),
                            humantime::format_duration(c.backoff_max),
                            c.attempt_budget,
                            c.max_item_failures
                                .map_or_else(|| "unlimited".to_owned(), |n| n.to_string()),
                        );
                    }
                    None => println!(
                        "period:       not recorded (enqueued by a release before run contexts; the worker that claims it records it)"
                    ),
                }
                println!("enqueued at:  {}", run.enqueued_at.to_rfc3339());
                println!("next run at:  {}", run.next_run_at.to_rfc3339());
                match (&run.lease_owner, run.status.as_str()) {
                    (Some(o), "RUNNING") => println!(
                        "lease:        {} token {} expires {}",
                        esc(o),
                        run.lease_token.unwrap_or_default(),
                        run.lease_expires_at
                            .map(|t| t.to_rfc3339())
                            .unwrap_or_else(|| "-".into())
                    ),
                    (Some(o), _) => println!("last worker:  {}", esc(o)),
                    (None, _) => {}
                }

                if let Some(e) = &run.error_message {
                    println!("message:      {}", esc(e));
                }
                println!("attempts:");
                for a in attempts {
                    println!(
                        "  #{:<3} {:<24} token {:<6} {:<14} processed {:<6} failed {:<4} {} .. {}{}",
                        a.attempt,
                        esc(&a.worker_id),
                        a.lease_token,
                        esc(a.outcome.as_deref().unwrap_or("running")),
                        a.processed_count,
                        a.failed_count,
                        a.started_at.to_rfc3339(),
                        a.finished_at.map(|t| t.to_rfc3339()).unwrap_or_else(|| "-".into()),
                        a.error_message.map(|e| format!("  ({})", esc(&e))).unwrap_or_default(),
                    );
                }
                if !actions.is_empty() {
                    println!("operator actions:");
                    for a in actions {
                        println!(
                            "  {} {} by {} (session {}): {} -> {}: {}",
                            a.at.to_rfc3339(),
                            esc(&a.action),
                            esc(&a.operator),
                            esc(&a.session_user),
                            esc(&a.before_status),
                            esc(&a.after_status),
                            esc(&a.reason)
                        );
                        if let Some(d) = &a.detail {
                            println!("    {}", esc(d));
                        }
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// An operator action that gave up waiting for the run's row: one error
/// line and the sessions in detail on stderr, and with `--json` the same
/// as one object on stdout. Exit 1.
/// `runs list`: the runs of any job the database holds, whatever this
/// process's configuration declares. A name with no runs that the
/// configuration does not know either is most likely a typo: that is an
/// error naming the known jobs, rather than an empty list.
async fn list_runs(
    pool: &sqlx::PgPool,
    registry: &Registry,
    status: Option<RunStatus>,
    job: Option<&str>,
    limit: u32,
) -> anyhow::Result<Vec<queue::RunView>> {
    let name = job.map(JobName::parse).transpose()?;
    let runs = queue::list_runs(pool, status, name.as_ref(), limit).await?;
    if let (Some(j), true) = (job, runs.is_empty()) {
        if queue::list_runs(pool, None, name.as_ref(), 1)
            .await?
            .is_empty()
        {
            registry.resolve(j).map_err(|e| anyhow!(e))?;
        }
    }
    Ok(runs)
}

fn blocked(b: &queue::blockers::Blocked, json_out: bool) -> anyhow::Result<ExitCode> {
    let line = crate::queue::truncate(&b.to_string());
    eprintln!("batchonce: error: {}", esc(&line));
    if json_out {
        let mut v = serde_json::to_value(b)?;
        v["error"] = json!("blocked");
        v["message"] = json!(line);
        println!("{}", json_for_terminal(&v)?);
    } else {
        for l in b.detail() {
            eprintln!("{}", esc(&l));
        }
    }
    Ok(ExitCode::FAILURE)
}

fn distinct_fingerprints(d: &crate::worker_registry::ConfigDrift) -> usize {
    let mut f: Vec<&str> = d.processes.iter().map(|p| p.fingerprint.as_str()).collect();
    f.dedup();
    f.len()
}

/// Prints which live processes disagree about which jobs, and on which keys.
fn print_drift(drift: &[crate::worker_registry::ConfigDrift]) {
    if drift.is_empty() {
        println!("configuration drift: none (live processes agree)");
        return;
    }
    for d in drift {
        println!(
            "configuration drift: {} is run with {} different configurations; keys that differ: {}",
            esc(&d.job_name),
            distinct_fingerprints(d),
            esc(&d.keys.join(", "))
        );
        for p in &d.processes {
            println!(
                "  {}  {} {} on {}",
                esc(&p.fingerprint),
                esc(&p.role),
                esc(&p.process_id),
                esc(&p.host)
            );
        }
    }
}

/// Freezes, from `config`, the context of every live run the previous
/// release enqueued without one (docs/upgrading.md). Returns how many were
/// frozen and how many were left (jobs this configuration does not name,
/// which their workers freeze when they claim them).
async fn freeze_legacy_contexts(
    pool: &sqlx::PgPool,
    config: &Config,
) -> anyhow::Result<(u64, u64)> {
    let legacy = queue::context::legacy_runs(pool, i64::MAX).await?;
    let mut todo = Vec::new();
    let mut left = 0u64;
    for run in legacy {
        let Some(cfg) = config.job(&run.job) else {
            left += 1;
            continue;
        };
        let period = run.key.as_str().split_once(':').map_or("", |(_, p)| p);
        match crate::context::RunContext::for_key(cfg, run.business_date, period) {
            Ok(c) => todo.push((run.key, c)),
            Err(_) => left += 1,
        }
    }
    let mut frozen = 0;
    for chunk in todo.chunks(1000) {
        frozen += queue::context::freeze_legacy(pool, chunk).await?;
    }
    Ok((frozen, left))
}

/// Waits for the database to be reachable (a worker may start before it),
/// then refuses to run against a schema that is not migrated: claims would
/// fail forever. Returns false if a signal arrived while waiting.
async fn wait_for_schema(
    pool: &sqlx::PgPool,
    registry: &Registry,
    signals: &Shutdown,
) -> anyhow::Result<bool> {
    let mut delay = Duration::from_millis(200);
    loop {
        match db::pending_migrations(pool, &registry.migrations()).await {
            Ok(pending) if pending.is_empty() => return Ok(true),
            Ok(pending) => bail!(
                "the database is not migrated ({} migrations pending, first {}): run `batchonce migrate`",
                pending.len(),
                pending[0]
            ),
            Err(db::DbError::Sql(e)) if queue::is_transient(&e) => {
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64,
                    "database not reachable yet; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = signals.shutdown.cancelled() => return Ok(false),
                }
                delay = (delay * 2).min(Duration::from_secs(10));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The rule is `text::operator`'s, shared with any other entry point.
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

/// This host's name as ids use it: at most 40 of letters, digits, `-`,
/// `_` and `.`.
fn host_name() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "host".into());
    host.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(40)
        .collect()
}

fn default_worker_id() -> String {
    format!("{}-{}", host_name(), std::process::id())
}

/// Serves metrics until shutdown; `/readyz` turns ready once the database
/// answers.
fn spawn_metrics(
    addr: std::net::SocketAddr,
    pool: &sqlx::PgPool,
    signals: &Shutdown,
) -> tokio::task::JoinHandle<()> {
    let ready = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (pool, flag, stop) = (pool.clone(), ready.clone(), signals.shutdown.clone());
    tokio::spawn(async move {
        loop {
            // The simple protocol: one exchange, safe through any pooler.
            let ok = sqlx::raw_sql("SELECT 1").execute(&pool).await.is_ok();
            flag.store(ok, std::sync::atomic::Ordering::Relaxed);
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(if ok { 10 } else { 1 })) => {}
                _ = stop.cancelled() => return,
            }
        }
    });
    tokio::spawn(crate::telemetry::serve(
        addr,
        ready,
        signals.shutdown.clone(),
    ))
}

/// SIGTERM/SIGINT start a graceful shutdown; a second one exits at once,
/// with status 128 + the signal's number.
fn spawn_signal_handler(signals: Shutdown) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    tokio::spawn(async move {
        for n in 0..2 {
            let signo = tokio::select! {
                _ = term.recv() => 15,
                _ = int.recv() => 2,
            };
            if n == 0 {
                tracing::info!("signal received: graceful shutdown (send again to exit at once)");
                signals.shutdown.cancel();
            } else {
                // Whatever the shutdown is waiting for (a handler, a lock,
                // the database), the person who asked twice gets their
                // process back. Nothing is released: the database ends the
                // sessions as their sockets close, and the leases expire
                // and are recovered like a crashed worker's.
                tracing::warn!(
                    exit_status = 128 + signo,
                    "second signal: exiting now; leases still held are not released, they expire and are recovered"
                );
                std::process::exit(128 + signo);
            }
        }
    });
    Ok(())
}
