//! `dispatch`: one short match that hands each top-level command to its
//! handler, and the handlers of the short commands that have no file of
//! their own (`demo`, `exporter`, `console`, `preflight`, `roles`, `status`).
//!
//! Before any command runs, `--pgbouncer` is refused for `migrate`, `roles`,
//! `preflight` and `demo` and otherwise passed to `db::set_transaction_pooler`
//! before anything connects, and the configuration's command jobs are added
//! to the registry (`command::register_commands`), so every command knows
//! them.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};

use super::process::{spawn_metrics, spawn_signal_handler};
use super::runs::runs_command;
use super::schema::unless_unmigrated;
use super::{load_config, require_url, Cli, Command, ConsoleArgs};
use crate::config::Config;
use crate::db;
use crate::runtime::job::Registry;
use crate::runtime::worker::Shutdown;

/// Runs the command `cli` names, once the configuration is loaded and the
/// registry holds only the jobs it declares: one handler per command.
pub(super) async fn dispatch(cli: Cli, registry: Registry) -> anyhow::Result<ExitCode> {
    if cli.pgbouncer {
        refuse_pgbouncer(&cli.command)?;
        db::set_transaction_pooler(true);
    }
    let mut config = load_config(&cli, &registry)?;
    if matches!(cli.command, Command::Demo { .. }) {
        // The bundled kinds are samples: the demo declares them for itself.
        config = config.declare_all(&registry.default_configs());
    }
    // Jobs of the user's own (`command = [...]`) join the built-in kinds;
    // then only what the configuration declares exists for this process.
    let known = crate::runtime::command::register_commands(registry, &config);
    let registry = known.only(config.jobs.keys());
    match &cli.command {
        Command::Demo { console } => demo(&cli, &registry, &config, *console).await,
        Command::Migrate { contract } => {
            super::migrate::migrate(&cli, &registry, &known, &config, *contract).await
        }
        Command::Enqueue(args) => super::enqueue::enqueue(&cli, &registry, &config, args).await,
        Command::Exporter {
            interval,
            metrics_addr,
        } => exporter(&cli, config, *interval, *metrics_addr).await,
        Command::Console(args) => console(&cli, args).await,
        Command::Produce {
            once,
            interval,
            now,
            metrics_addr,
        } => super::produce::produce(&cli, config, *once, *interval, *now, *metrics_addr).await,
        Command::Preflight { processes } => preflight(&cli, &registry, *processes).await,
        Command::PreflightRacer { key, start_at_ms } => {
            let url = require_url(&cli)?;
            crate::ops::preflight::race(url, key, *start_at_ms).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Worker(args) => super::worker::worker(&cli, registry, config, args).await,
        Command::Runs { command } => {
            let pool = db::connect(require_url(&cli)?, "batchonce-runs", 2).await?;
            match runs_command(&pool, &registry, &config, command, cli.json).await {
                Ok(code) => Ok(code),
                Err(e) => Err(unless_unmigrated(&pool, &registry, e).await),
            }
        }
        Command::Jobs { command } => {
            let pool = db::connect(require_url(&cli)?, "batchonce-jobs", 2).await?;
            match super::jobs::jobs_command(&pool, command, cli.json).await {
                Ok(code) => Ok(code),
                Err(e) => Err(unless_unmigrated(&pool, &registry, e).await),
            }
        }
        Command::Roles {
            prefix,
            schema,
            apply,
            keep_direct_writes,
        } => roles(&cli, &registry, prefix, schema, *apply, *keep_direct_writes).await,
        Command::Status => status(&cli, &registry).await,
    }
}

/// Under `--pgbouncer`, the commands that need a session of their own:
/// sqlx's migrator holds an advisory lock for the whole migration, `roles`
/// and `preflight` check the real server, and `demo` starts its own
/// database.
fn refuse_pgbouncer(command: &Command) -> anyhow::Result<()> {
    let direct = match command {
        Command::Migrate { .. } => Some("migrate"),
        Command::Roles { .. } => Some("roles"),
        Command::Preflight { .. } | Command::PreflightRacer { .. } => Some("preflight"),
        Command::Demo { .. } => Some("demo"),
        _ => None,
    };
    if let Some(name) = direct {
        bail!("`{name}` needs a direct connection to PostgreSQL: run it without --pgbouncer (and BATCHONCE_PGBOUNCER), with a URL to the server itself");
    }
    Ok(())
}

/// `demo`: the whole system on the embedded database; exit 1 if a check
/// failed.
async fn demo(
    cli: &Cli,
    registry: &Registry,
    config: &Config,
    console: Option<std::net::SocketAddr>,
) -> anyhow::Result<ExitCode> {
    let ok = crate::ops::demo::run(registry, cli.database_url.as_deref(), config, console).await?;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `exporter`: publishes the database-derived gauges until a signal.
async fn exporter(
    cli: &Cli,
    config: Config,
    interval: Duration,
    metrics_addr: std::net::SocketAddr,
) -> anyhow::Result<ExitCode> {
    let url = require_url(cli)?;
    let pool = db::connect_lazy(url, "batchonce-exporter", 2)?;
    let signals = Shutdown::default();
    spawn_signal_handler(signals.clone())?;
    let server = spawn_metrics(metrics_addr, &pool, &signals);
    crate::ops::exporter::run(pool, config, interval, signals.shutdown.clone()).await;
    let _ = server.await;
    Ok(ExitCode::SUCCESS)
}

/// `console`: prints a password's hash (`--hash-password`), or serves the
/// web console until a signal.
async fn console(cli: &Cli, args: &ConsoleArgs) -> anyhow::Result<ExitCode> {
    let ConsoleArgs {
        listen,
        users,
        proxy_user_header,
        proxy_secret_env,
        secure_cookies,
        no_secure_cookies,
        trusted_proxy,
        hash_password,
    } = args;
    if *hash_password {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .context("cannot read the password from standard input")?;
        let password = line.trim_end_matches(['\n', '\r']);
        if password.chars().count() < 8 {
            bail!("the password is shorter than 8 characters");
        }
        println!("{}", crate::console::auth::hash_password(password)?);
        return Ok(ExitCode::SUCCESS);
    }
    let users = match users {
        Some(path) => crate::console::auth::Users::load(path)?,
        None => crate::console::auth::Users::from_hashes(&[]),
    };
    let proxy = match (proxy_user_header, proxy_secret_env) {
        (Some(header), Some(var)) => {
            let secret = std::env::var(var).unwrap_or_default();
            if secret.chars().count() < 16 {
                bail!(
                    "--proxy-secret-env {var}: the variable is unset or shorter than 16 characters"
                );
            }
            let header = header.to_ascii_lowercase();
            if axum::http::HeaderName::from_bytes(header.as_bytes()).is_err() {
                bail!("--proxy-user-header {header:?} is not a header name");
            }
            Some(crate::console::ProxyAuth {
                user_header: header,
                secret,
            })
        }
        _ => None,
    };
    let mut opts = crate::console::ConsoleOptions::new(*listen, users);
    opts.proxy = proxy;
    opts.trusted_proxies = trusted_proxy.clone();
    opts.secure_cookies = match (*secure_cookies, *no_secure_cookies) {
        (true, _) => Some(true),
        (_, true) => Some(false),
        _ => None,
    };
    if !listen.ip().is_loopback() && !opts.secure() {
        tracing::warn!(%listen, "the console listens beyond loopback with --no-secure-cookies: its session cookie may travel over plain HTTP");
    }
    let url = require_url(cli)?;
    let pool = db::connect_lazy(url, "batchonce-console", 4)?;
    let signals = Shutdown::default();
    spawn_signal_handler(signals.clone())?;
    crate::console::serve(pool, opts, signals.shutdown.clone()).await?;
    Ok(ExitCode::SUCCESS)
}

/// `preflight`: racing processes on a scratch key; exit 1 unless exactly
/// one won.
async fn preflight(cli: &Cli, registry: &Registry, processes: u32) -> anyhow::Result<ExitCode> {
    let url = require_url(cli)?;
    let ok = crate::ops::preflight::run(url, registry, processes).await?;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `roles`: prints the roles' SQL, or applies it with `--apply`.
async fn roles(
    cli: &Cli,
    registry: &Registry,
    prefix: &str,
    schema: &str,
    apply: bool,
    keep_direct_writes: bool,
) -> anyhow::Result<ExitCode> {
    let tables = registry.output_tables();
    let opts = crate::ops::roles::RolesOptions {
        output_tables: &tables,
        keep_direct_writes,
    };
    if apply {
        let pool = db::connect(require_url(cli)?, "batchonce-roles", 1).await?;
        crate::ops::roles::apply(&pool, prefix, &opts).await?;
        println!(
            "roles {prefix}_migrator, {prefix}_producer, {prefix}_worker, {prefix}_operator, {prefix}_readonly, {prefix}_program and {prefix}_console are in place{}",
            if keep_direct_writes { ", with the previous release's direct writes kept" } else { "" }
        );
    } else {
        print!(
            "{}",
            crate::ops::roles::sql(prefix, schema, &opts).map_err(|e| anyhow!(e))?
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `status`: counts per job and status, the oldest pending run, stale runs.
async fn status(cli: &Cli, registry: &Registry) -> anyhow::Result<ExitCode> {
    let pool = db::connect(require_url(cli)?, "batchonce-status", 2).await?;
    match super::status::status_output(&pool, cli.json).await {
        Ok(text) => {
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Err(unless_unmigrated(&pool, registry, e).await),
    }
}
