//! What each top-level command does: the long-running processes (worker,
//! producer, exporter) with their signals and metrics server, and the short
//! commands other than `runs`.
//!
//! Before any command runs, `--pgbouncer` is refused for `migrate`, `roles`,
//! `preflight` and `demo` and otherwise passed to `db::set_transaction_pooler`
//! before anything connects, and the configuration's command jobs are added
//! to the registry (`command::register_commands`), so every command knows
//! them. The worker logs its `connection budget`: the main pool of
//! `--max-connections`, one more connection for heartbeats alone (so a
//! small main pool slows handlers but never delays a heartbeat), and one for
//! LISTEN with `--listen-url`.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use serde_json::json;

use super::runs::runs_command;
use super::{load_config, require_url, served_jobs, validate_worker_id, Cli, Command};
use crate::clock::Clock;
use crate::config::Config;
use crate::db;
use crate::key::{parse_date, JobKey};
use crate::queue;
use crate::runtime::job::Registry;
use crate::runtime::producer;
use crate::runtime::worker::{self, Shutdown, WorkerOptions};

pub(super) async fn dispatch(cli: Cli, registry: Registry) -> anyhow::Result<ExitCode> {
    if cli.pgbouncer {
        // These need a session of their own: sqlx's migrator holds an
        // advisory lock for the whole migration, `roles` and `preflight`
        // check the real server, and `demo` starts its own database.
        let direct = match &cli.command {
            Command::Migrate => Some("migrate"),
            Command::Roles { .. } => Some("roles"),
            Command::Preflight { .. } | Command::PreflightRacer { .. } => Some("preflight"),
            Command::Demo { .. } => Some("demo"),
            _ => None,
        };
        if let Some(name) = direct {
            bail!("`{name}` needs a direct connection to PostgreSQL: run it without --pgbouncer (and BATCHONCE_PGBOUNCER), with a URL to the server itself");
        }
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
        Command::Demo { console } => {
            let ok =
                crate::ops::demo::run(&registry, cli.database_url.as_deref(), &config, *console)
                    .await?;
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
            // The file's jobs become the declared set, which a producer's
            // enqueue must match. Without a file, nothing is declared or
            // undeclared: a migrate run only for the schema stops no job.
            let declared = if super::config_file_given(&cli) {
                Some(
                    queue::declare(&pool, &config.jobs)
                        .await
                        .context("recording the declared jobs failed")?,
                )
            } else {
                None
            };
            if cli.json {
                println!(
                    "{}",
                    json!({"migrated": true, "migrations": n,
                           "contexts_frozen": frozen, "contexts_left": left,
                           "jobs_declared": declared.as_ref().map(|d| &d.jobs),
                           "jobs_undeclared": declared.as_ref().map(|d| &d.removed)})
                );
            } else {
                println!("migrations applied ({n} known)");
                match &declared {
                    Some(d) => {
                        println!(
                            "jobs declared from {}: {}",
                            config.origin,
                            if d.jobs.is_empty() {
                                "none".to_owned()
                            } else {
                                d.jobs.join(", ")
                            }
                        );
                        if !d.removed.is_empty() {
                            println!("no longer declared: {}", d.removed.join(", "));
                        }
                    }
                    None => println!(
                        "declared jobs unchanged (no configuration file: give --config to declare the file's jobs)"
                    ),
                }
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
            scope,
            all_scopes,
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
            let runs =
                super::keys::scoped_runs(&job, &cfg, &periods, scope, *all_scopes, &config.origin)?;
            let pool = db::connect(require_url(&cli)?, "batchonce-enqueue", 2).await?;
            let report = queue::enqueue(&pool, &runs, Clock::Db)
                .await
                .context("enqueue failed")?;
            // A scope query's keys are known once the statement has run; a
            // scoped run shares its template's calendar reason.
            let reasons: std::collections::HashMap<&str, Option<&str>> = runs
                .iter()
                .map(|r| (r.key.as_str(), r.skip_reason.as_deref()))
                .collect();
            let mut results: Vec<(&JobKey, bool)> = report
                .enqueued
                .iter()
                .map(|k| (k, true))
                .chain(report.duplicates.iter().map(|k| (k, false)))
                .collect();
            results.sort();
            for (key, inserted) in results {
                let unscoped = key.unscoped();
                let reason = reasons
                    .get(key.as_str())
                    .or_else(|| reasons.get(unscoped.as_str()))
                    .copied()
                    .flatten();
                let result = match (inserted, reason) {
                    (false, _) => "duplicate",
                    (true, None) => "enqueued",
                    (true, Some(_)) => "skipped",
                };
                if cli.json {
                    println!(
                        "{}",
                        json!({"result": result, "job_key": key.as_str(), "reason": reason})
                    );
                } else if result == "skipped" {
                    println!("skipped {key} ({})", reason.unwrap_or(""));
                } else {
                    println!("{result} {key}");
                }
            }
            for (template, id) in &report.invalid {
                let id = crate::key::shown(id);
                if cli.json {
                    println!(
                        "{}",
                        json!({"result": "invalid", "job_key": template.as_str(), "scope": id})
                    );
                } else {
                    eprintln!(
                        "invalid scope {id:?} from the scope query of {template}: not enqueued (a scope is 1-36 lowercase letters, digits and single dashes, and the key at most 120 characters)"
                    );
                }
            }
            if report.invalid.is_empty() {
                Ok(ExitCode::SUCCESS)
            } else {
                Ok(ExitCode::FAILURE)
            }
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
            crate::ops::exporter::run(pool, config, *interval, signals.shutdown.clone()).await;
            let _ = server.await;
            Ok(ExitCode::SUCCESS)
        }
        Command::Console {
            listen,
            users,
            proxy_user_header,
            proxy_secret_env,
            secure_cookies,
            no_secure_cookies,
            trusted_proxy,
            hash_password,
        } => {
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
                        bail!("--proxy-secret-env {var}: the variable is unset or shorter than 16 characters");
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
            let url = require_url(&cli)?;
            let pool = db::connect_lazy(url, "batchonce-console", 4)?;
            let signals = Shutdown::default();
            spawn_signal_handler(signals.clone())?;
            crate::console::serve(pool, opts, signals.shutdown.clone()).await?;
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
                let report = producer::tick(&pool, &config, clock)
                    .await
                    .context("producer tick failed")?;
                // Registered once it has ticked, as live as three of its
                // timer's periods (`--interval`), so the console tells
                // when the timer stopped firing.
                producer::register(
                    &pool,
                    &config,
                    &id,
                    producer::once_live_for(&config, *interval),
                )
                .await;
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
                interval_ms = interval.unwrap_or(producer::DEFAULT_INTERVAL).as_millis() as u64,
                "producer started"
            );
            let id = format!("producer-{}", default_worker_id());
            let interval = interval.unwrap_or(producer::DEFAULT_INTERVAL);
            producer::run(pool, config, clock, interval, id, signals.shutdown.clone()).await;
            let _ = server.await;
            tracing::info!("producer stopped");
            Ok(ExitCode::SUCCESS)
        }
        Command::Preflight { processes } => {
            let url = require_url(&cli)?;
            let ok = crate::ops::preflight::run(url, &registry, *processes).await?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::PreflightRacer { key, start_at_ms } => {
            let url = require_url(&cli)?;
            crate::ops::preflight::race(url, key, *start_at_ms).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Worker {
            concurrency,
            prefetch,
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
            opts.prefetch = *prefetch;
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
        } => {
            let tables = registry.output_tables();
            let opts = crate::ops::roles::RolesOptions {
                output_tables: &tables,
                keep_direct_writes: *keep_direct_writes,
            };
            if *apply {
                let pool = db::connect(require_url(&cli)?, "batchonce-roles", 1).await?;
                crate::ops::roles::apply(&pool, prefix, &opts).await?;
                println!(
                    "roles {prefix}_migrator, {prefix}_producer, {prefix}_worker, {prefix}_operator, {prefix}_readonly, {prefix}_program and {prefix}_console are in place{}",
                    if *keep_direct_writes { ", with the previous release's direct writes kept" } else { "" }
                );
            } else {
                print!(
                    "{}",
                    crate::ops::roles::sql(prefix, schema, &opts).map_err(|e| anyhow!(e))?
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Status => {
            let pool = db::connect(require_url(&cli)?, "batchonce-status", 2).await?;
            match super::status::status_output(&pool, cli.json).await {
                Ok(text) => {
                    print!("{text}");
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => Err(unless_unmigrated(&pool, &registry, e).await),
            }
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
        let period = run.key.period();
        match crate::config::context::RunContext::for_key(cfg, run.business_date, period) {
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

/// The error of a command that needs the schema, on a database where
/// migrations are pending (`pending` is not empty).
fn not_migrated(pending: &[i64]) -> String {
    format!(
        "the database is not migrated ({} migrations pending, first {}): run `batchonce migrate`",
        pending.len(),
        pending.first().copied().unwrap_or_default()
    )
}

/// `err`, or, when the database has pending migrations (which is why a
/// table or column would be missing), the message that says to run
/// `migrate`. Asked only after a failure, so that commands keep working
/// on a database a newer release has migrated further.
async fn unless_unmigrated(
    pool: &sqlx::PgPool,
    registry: &Registry,
    err: anyhow::Error,
) -> anyhow::Error {
    // Bad input is reported as it is, whatever the schema.
    if !err.chain().any(|c| c.is::<sqlx::Error>()) {
        return err;
    }
    match db::pending_migrations(pool, &registry.migrations()).await {
        Ok(pending) if !pending.is_empty() => anyhow!(not_migrated(&pending)),
        _ => err,
    }
}

/// Waits for the database to be reachable (a worker may start before it),
/// then refuses to run against a schema that is not migrated: claims would
/// fail forever. Returns false if a signal arrived while waiting (the
/// worker then exits 0). Transient errors are retried with a backoff from
/// 200 ms doubling to 10 s; a pending migration fails with one line,
/// `` the database is not migrated (N migrations pending, first V): run
/// `batchonce migrate` ``.
async fn wait_for_schema(
    pool: &sqlx::PgPool,
    registry: &Registry,
    signals: &Shutdown,
) -> anyhow::Result<bool> {
    let mut delay = Duration::from_millis(200);
    loop {
        match db::pending_migrations(pool, &registry.migrations()).await {
            Ok(pending) if pending.is_empty() => return Ok(true),
            Ok(pending) => bail!(not_migrated(&pending)),
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
/// answers. A task runs `SELECT 1` on the command's pool every 10 s while
/// it succeeds and every second while it fails. The worker starts this
/// before [`wait_for_schema`], so `/healthz` answers while it waits.
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

/// SIGTERM/SIGINT start a graceful shutdown; a second one logs `second
/// signal: exiting now; …` and exits at once, with status 128 + the
/// signal's number, without releasing anything: whoever signals twice wants
/// the process gone, and the leases expire and are recovered as after a
/// crash.
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
