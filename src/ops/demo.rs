//! `batchonce demo`: the whole system on one machine. It starts (or reuses)
//! the private cluster unless a URL is given, makes a fresh `batchonce_demo`
//! database, seeds every demo-capable job kind, enqueues the last three
//! business dates twice, runs two real worker processes, SIGKILLs one while it
//! holds a lease mid-run, lets the other recover and finish, and checks the
//! output against the source.
//!
//! `batchonce demo`. It starts or reuses the private cluster in `$BATCHONCE_HOME/pg` (default
//! `.batchonce/pg`, possibly relocated by `src/ops/embedded/`), or uses `DATABASE_URL`. It prints where
//! the cluster's password file is, never the password. It then runs these steps:
//!
//! 1. It re-creates the `batchonce_demo` database and migrates it.
//! 2. It writes `.batchonce/demo.toml`. That file holds the configured policies with a 3 s lease,
//!    25-item chunks, a 40 ms pause, a 1 s backoff, a 5 s backoff cap and `max_attempts` of at least
//!    3, so the killed run gets its second attempt. Each demo-capable kind's `JobDemo::prepare`
//!    adjusts its table first (`notification-send` sets `sender = "outbox"` with `outbox_dir` in
//!    `.batchonce/outbox`), and the file carries `max_item_failures` and the kinds' own options.
//!    Command jobs of the user's file are left out: they have no demo.
//! 3. It seeds each demo-capable kind for the periods its `JobDemo::periods` gives, by default the
//!    three business dates before today, where today is taken from the database clock in the kind's
//!    time zone. With the bundled kinds that is nine runs: three dates each of `daily-settlement` and
//!    `notification-send`, and the last three quarter-hours of `inventory-sync`.
//! 4. It enqueues the runs twice, keyed by `producer::runs_for_periods` exactly as the producer
//!    keys them, but without calendar skips.
//! 5. It spawns two `worker` processes from its own executable, each with `--metrics-addr
//!    127.0.0.1:0` so they never compete for a port (the bound address is logged).
//! 6. It SIGKILLs the holder of a run that has at least 50 items written, whatever its kind.
//! 7. It waits for every run to reach a terminal state, within 45 s.
//! 8. It SIGTERMs the remaining worker and expects exit 0.
//! 9. It verifies each run through `JobDemo::verify` with its key and date, and requires the killed
//!    run to have taken exactly 2 attempts.
//!
//! With `--console` it then declares the demo's jobs (as `migrate` would, so the console can
//! enqueue missing periods), serves the console with a one-time login, and prints how another
//! terminal reaches the demo's database and starts a worker on it: an `export` of `PGPASSFILE`
//! (the cluster's own 0600 password file, or one written 0600 in the demo's folder for a
//! `DATABASE_URL` with a password) and of `DATABASE_URL` without its password, and the
//! `worker --config` command line with the demo's configuration file.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sqlx::PgPool;
use tokio::process::{Child, Command};

use crate::clock::Clock;
use crate::config::{Config, JobConfig};
use crate::db;
use crate::ops::embedded::{Cluster, ClusterOptions};
use crate::queue::{self, NewRun, RunStatus};
use crate::runtime::job::Registry;

const DEMO_DB: &str = "batchonce_demo";
const WORKERS: usize = 2;

fn home() -> PathBuf {
    std::env::var_os("BATCHONCE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(".batchonce"))
}

/// The demo's settings: short leases and small, paced chunks, so a crash
/// mid-run and its recovery happen within seconds.
fn demo_config(cfg: &JobConfig) -> JobConfig {
    JobConfig {
        lease_ttl: Duration::from_secs(3),
        stale_after: Duration::from_secs(60),
        chunk_size: 25,
        chunk_pause: Duration::from_millis(40),
        backoff: Duration::from_secs(1),
        backoff_max: Duration::from_secs(5),
        // The killed run needs a second attempt whatever the file says.
        max_attempts: cfg.max_attempts.max(3),
        ..cfg.clone()
    }
}

fn config_toml(config: &Config) -> String {
    let mut s = String::from("# Written by `batchonce demo` for its worker processes.\n");
    // Command jobs of the user's file have no demo and stay out of it.
    for (name, c) in config.jobs.iter().filter(|(_, c)| c.command.is_none()) {
        s.push_str(&format!(
            "\n[jobs.{name}]\ntimezone = \"{}\"\nmax_attempts = {}\nlease_ttl = \"{}ms\"\n\
             stale_after = \"{}s\"\nchunk_size = {}\nbackoff = \"{}ms\"\nbackoff_max = \"{}ms\"\n\
             chunk_pause = \"{}ms\"\non_lease_expiry = \"{}\"\n",
            c.timezone.name(),
            c.max_attempts,
            c.lease_ttl.as_millis(),
            c.stale_after.as_secs(),
            c.chunk_size,
            c.backoff.as_millis(),
            c.backoff_max.as_millis(),
            c.chunk_pause.as_millis(),
            c.on_lease_expiry.as_str(),
        ));
        if let Some(n) = c.max_item_failures {
            s.push_str(&format!("max_item_failures = {n}\n"));
        }
        for (k, v) in &c.options.values {
            s.push_str(&format!("{k} = {v}\n"));
        }
    }
    s
}

pub async fn run(
    registry: &Registry,
    url: Option<&str>,
    config: &Config,
    console: Option<std::net::SocketAddr>,
) -> anyhow::Result<bool> {
    let started = Instant::now();
    let home = home();
    std::fs::create_dir_all(&home).with_context(|| format!("cannot create {}", home.display()))?;
    let mut cluster = None;
    let server_url = match url {
        Some(u) => {
            println!("database: {} (DATABASE_URL)", db::redact(u));
            u.to_owned()
        }
        None => {
            let opts = ClusterOptions {
                dir: home.join("pg"),
                durable: true,
                max_connections: 100,
            };
            let c = tokio::task::spawn_blocking(move || Cluster::start(&opts))
                .await
                .context("cluster start panicked")??;
            // Where the password is, never the password itself.
            println!(
                "database: private PostgreSQL cluster in {} ({}; only this user can connect, password in {})",
                c.dir().display(),
                if c.started_here {
                    "started"
                } else {
                    "already running"
                },
                c.dir().join(crate::ops::embedded::PASSWORD_FILE).display()
            );
            let u = c.url("postgres");
            cluster = Some(c);
            u
        }
    };
    let pgpass = cluster
        .as_ref()
        .map(|c| c.dir().join(crate::ops::embedded::PASSWORD_FILE));
    let result = run_on(
        registry,
        &server_url,
        config,
        &home,
        started,
        console.map(|addr| (addr, pgpass)),
    )
    .await;
    if let Some(c) = cluster.filter(|c| c.started_here) {
        let _ = tokio::task::spawn_blocking(move || c.stop()).await;
    }
    result
}

/// The demo on the server at `server_url`: a fresh database, the runs
/// enqueued twice, two workers of which one is killed mid-run, then every
/// run checked. Returns whether every check passed.
async fn run_on(
    registry: &Registry,
    server_url: &str,
    config: &Config,
    home: &std::path::Path,
    started: Instant,
    console: Option<(std::net::SocketAddr, Option<PathBuf>)>,
) -> anyhow::Result<bool> {
    let (url, pool) = fresh_database(registry, server_url).await?;
    let (demo_cfg, cfg_path) = write_config(registry, config, home)?;
    let runs = seed_and_enqueue(registry, &pool, &demo_cfg).await?;
    let mut workers = start_workers(home, &cfg_path, &url)?;
    let killed = kill_one_and_wait(&pool, &mut workers, &runs, &demo_cfg).await?;
    let mut ok = stop_workers(&mut workers).await;
    ok &= verify(registry, &pool, &runs, &demo_cfg, killed.as_ref()).await?;
    if killed.is_none() {
        ok = false;
        println!("no worker was killed mid-run (the runs finished too fast to catch one)");
    }
    println!();
    println!(
        "demo {} in {:.1}s",
        if ok {
            "passed: every key ran exactly once, nothing lost"
        } else {
            "FAILED"
        },
        started.elapsed().as_secs_f64()
    );
    if let Some((addr, pgpass)) = console {
        let reach = Reach {
            url: &url,
            config: &cfg_path,
            home,
            pgpass: pgpass.as_deref(),
        };
        serve_console(&pool, &demo_cfg, addr, &reach).await?;
    }
    Ok(ok)
}

/// Drops and creates the demo database, so the demo always shows a first
/// run, and migrates it. Returns its URL and a pool on it.
async fn fresh_database(registry: &Registry, server_url: &str) -> anyhow::Result<(String, PgPool)> {
    // A fresh database each time, so the demo always shows a first run.
    let admin = db::connect(server_url, "batchonce-demo", 2).await?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {DEMO_DB} WITH (FORCE)"))
        .execute(&admin)
        .await
        .context("cannot drop the previous demo database")?;
    sqlx::query(&format!("CREATE DATABASE {DEMO_DB}"))
        .execute(&admin)
        .await
        .context("cannot create the demo database")?;
    admin.close().await;
    let url = db::with_database(server_url, DEMO_DB)?;
    let pool = db::connect(&url, "batchonce-demo", 4).await?;
    db::migrate(&pool, &registry.migrations()).await?;
    println!("migrated database {DEMO_DB}");
    Ok((url, pool))
}

/// The demo's configuration (every job's, shortened for the demo), written
/// to `demo.toml` in `home` for the workers. Returns it and the file's path.
fn write_config(
    registry: &Registry,
    config: &Config,
    home: &std::path::Path,
) -> anyhow::Result<(Config, PathBuf)> {
    let mut demo_cfg = config.clone();
    for (name, c) in demo_cfg.jobs.iter_mut() {
        *c = demo_config(c);
        if let Some(demo) = registry.get(name).and_then(|j| j.demo()) {
            demo.prepare(c, home);
        }
    }
    let cfg_path = home.join("demo.toml");
    std::fs::write(&cfg_path, config_toml(&demo_cfg))
        .with_context(|| format!("cannot write {}", cfg_path.display()))?;
    Ok((demo_cfg, cfg_path))
}

/// Seeds every demo job's data and enqueues its runs twice (the second
/// time, every run is a duplicate). Returns the runs.
async fn seed_and_enqueue(
    registry: &Registry,
    pool: &PgPool,
    demo_cfg: &Config,
) -> anyhow::Result<Vec<NewRun>> {
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
    let mut runs = Vec::new();
    for job in registry.jobs() {
        let Some(demo) = job.demo() else { continue };
        let name = job.name();
        let cfg = demo_cfg.job(&name).cloned().unwrap_or_default();
        let periods = demo.periods(&cfg, now);
        let mut dates: Vec<_> = periods.iter().map(|p| p.date).collect();
        dates.dedup();
        let seeded = demo.seed(pool, &cfg, &dates).await?;
        println!(
            "seeded {name}: {seeded} (time zone {})",
            cfg.timezone.name()
        );
        // Keyed as the producer keys them; the demo ignores skip calendars.
        runs.extend(
            crate::runtime::producer::runs_for_periods(&name, &cfg, &periods)?
                .into_iter()
                .map(|r| NewRun {
                    skip_reason: None,
                    ..r
                }),
        );
    }
    if runs.is_empty() {
        bail!("no registered job kind supports the demo");
    }
    for round in ["first", "second"] {
        let report = queue::enqueue(pool, &runs, Clock::Db).await?;
        println!("enqueue ({round} time):");
        for k in &report.enqueued {
            println!("  enqueued  {k}");
        }
        for k in &report.duplicates {
            println!("  duplicate {k}");
        }
    }
    Ok(runs)
}

/// Starts the demo's worker processes, each logging to a file of its own
/// in `home`.
fn start_workers(
    home: &std::path::Path,
    cfg_path: &std::path::Path,
    url: &str,
) -> anyhow::Result<Vec<(String, Option<Child>)>> {
    let exe = std::env::current_exe().context("cannot find the batchonce binary")?;
    let mut workers: Vec<(String, Option<Child>)> = Vec::new();
    for i in 1..=WORKERS {
        let id = format!("demo-worker-{i}");
        let log = home.join(format!("{id}.log"));
        let log_file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let child = Command::new(&exe)
            .arg("--config")
            .arg(cfg_path)
            .args([
                "--log-format",
                "json",
                "worker",
                "--concurrency",
                "1",
                "--grace",
                "5s",
            ])
            .args(["--poll-interval", "500ms", "--worker-id", &id])
            // Each worker serves its metrics on a port of its own choosing,
            // so the two never compete for the default one.
            .args(["--metrics-addr", "127.0.0.1:0"])
            .env("DATABASE_URL", url)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start a worker process")?;
        println!(
            "started {id} (pid {}), log {}",
            child.id().unwrap_or(0),
            log.display()
        );
        workers.push((id, Some(child)));
    }
    Ok(workers)
}

/// Waits (at most 45 s) for the runs to end, SIGKILLing whichever worker
/// first holds a lease a few chunks into a run. Returns the killed worker
/// and the run it held.
async fn kill_one_and_wait(
    pool: &PgPool,
    workers: &mut [(String, Option<Child>)],
    runs: &[NewRun],
    demo_cfg: &Config,
) -> anyhow::Result<Option<(String, String)>> {
    // SIGKILL whichever worker first holds a lease a few chunks into a run.
    let mut killed: Option<(String, String)> = None;
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        if Instant::now() > deadline {
            println!("timed out waiting for the runs to finish");
            break;
        }
        let all = queue::list_runs(pool, None, None, None, 1000).await?;
        if killed.is_none() {
            if let Some(r) = all
                .iter()
                .find(|r| r.status == RunStatus::Running && r.processed_count >= 50)
            {
                let owner = r.lease_owner.clone().unwrap_or_default();
                if let Some((_, slot)) = workers.iter_mut().find(|(id, _)| *id == owner) {
                    if let Some(mut child) = slot.take() {
                        if let Some(pid) = child.id() {
                            kill(Pid::from_raw(pid as i32), Signal::SIGKILL)
                                .context("cannot SIGKILL the worker")?;
                        }
                        let _ = child.wait().await;
                        println!(
                            "SIGKILLed {owner} while it held {} at {} items (lease_ttl {}s: the other worker takes over when it expires)",
                            r.job_key,
                            r.processed_count,
                            runs.iter()
                                .find(|n| n.key.as_str() == r.job_key)
                                .and_then(|n| demo_cfg.job(&n.job))
                                .map(|c| c.lease_ttl.as_secs())
                                .unwrap_or(0)
                        );
                        killed = Some((owner, r.job_key.clone()));
                    }
                }
            }
        }
        let ours = all
            .iter()
            .filter(|r| runs.iter().any(|n| n.key.as_str() == r.job_key));
        if ours.clone().all(|r| r.status.is_terminal()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(killed)
}

/// Stops the workers still running with SIGTERM; false if one did not exit
/// 0 within 15 s.
async fn stop_workers(workers: &mut [(String, Option<Child>)]) -> bool {
    let mut ok = true;
    for (id, slot) in workers.iter_mut() {
        if let Some(mut child) = slot.take() {
            if let Some(pid) = child.id() {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            }
            let status = tokio::time::timeout(Duration::from_secs(15), child.wait()).await;
            match status {
                Ok(Ok(s)) if s.success() => println!("stopped {id} with SIGTERM: exit 0"),
                Ok(Ok(s)) => {
                    ok = false;
                    println!("stopped {id} with SIGTERM: {s} (expected exit 0)");
                }
                _ => {
                    ok = false;
                    println!("{id} did not stop within 15s of SIGTERM");
                }
            }
        }
    }
    ok
}

/// Prints every run's check (status, items, duplicates, and the killed
/// run's two attempts); false if one failed.
async fn verify(
    registry: &Registry,
    pool: &PgPool,
    runs: &[NewRun],
    demo_cfg: &Config,
    killed: Option<&(String, String)>,
) -> anyhow::Result<bool> {
    let mut ok = true;
    println!();
    println!(
        "{:<32} {:<10} {:>8} {:>7} {:>5}  CHECK",
        "KEY", "STATUS", "ATTEMPTS", "ITEMS", "DUPS"
    );
    for run in runs {
        let job = registry
            .get(&run.job)
            .and_then(|j| j.demo().map(|d| (j, d)));
        let Some((_, demo)) = job else { continue };
        let cfg = demo_cfg.job(&run.job).cloned().unwrap_or_default();
        let (view, attempts) = queue::show_run(pool, &run.key)
            .await?
            .context("a demo run disappeared")?;
        let v = demo.verify(pool, &cfg, &run.key, run.business_date).await?;
        let run_ok = view.status == RunStatus::Succeeded && v.ok && v.duplicates == 0;
        ok &= run_ok;
        println!(
            "{:<32} {:<10} {:>8} {:>7} {:>5}  {} {}",
            view.job_key,
            view.status,
            view.attempts,
            v.items,
            v.duplicates,
            if run_ok { "ok" } else { "FAILED" },
            v.detail
        );
        if killed.is_some_and(|(_, k)| *k == view.job_key) {
            for a in &attempts {
                println!(
                    "    attempt {} by {}: {} ({} items)",
                    a.attempt,
                    a.worker_id,
                    a.outcome.as_deref().unwrap_or("running"),
                    a.processed_count
                );
            }
            if view.attempts != 2 {
                ok = false;
                println!("    expected 2 attempts for the killed run");
            }
        }
    }
    Ok(ok)
}

/// What another terminal needs to reach the demo: its database's URL, the
/// demo's configuration file, its folder, and the private cluster's
/// password file (when the demo started or attached to one).
struct Reach<'a> {
    url: &'a str,
    config: &'a std::path::Path,
    home: &'a std::path::Path,
    pgpass: Option<&'a std::path::Path>,
}

/// `s` quoted for a POSIX shell: one word, whatever it holds.
fn sh(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The lines that let another terminal use the demo's database: an
/// `export` of `DATABASE_URL` without its password, with `PGPASSFILE`
/// naming a 0600 file that holds it (the cluster's own, or one written in
/// the demo's folder), so no password is printed; and a worker's command.
fn reach_lines(r: &Reach) -> anyhow::Result<Vec<String>> {
    let mut u = url::Url::parse(r.url).context("the demo's database URL")?;
    let password = u.password().map(percent_decode).or_else(|| {
        u.query_pairs()
            .find(|(k, _)| k == "password")
            .map(|(_, v)| v.into_owned())
    });
    let mut export = String::from("export");
    if let Some(password) = password {
        // Setting a password only fails for URLs that cannot have one.
        let _ = u.set_password(None);
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .filter(|(k, _)| k != "password")
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        u.set_query(None);
        if !pairs.is_empty() {
            u.query_pairs_mut().extend_pairs(&pairs);
        }
        let file = match r.pgpass {
            Some(f) => f.to_path_buf(),
            None => write_pgpass(r.home, &percent_decode(u.username()), &password)?,
        };
        let file = std::path::absolute(&file).unwrap_or(file);
        export.push_str(&format!(" PGPASSFILE={}", sh(&file.to_string_lossy())));
    }
    export.push_str(&format!(" DATABASE_URL={}", sh(u.as_str())));
    let exe = std::env::current_exe().context("cannot find the batchonce binary")?;
    let config = std::path::absolute(r.config).unwrap_or_else(|_| r.config.to_path_buf());
    Ok(vec![
        export,
        format!(
            "{} worker --config {}",
            sh(&exe.to_string_lossy()),
            sh(&config.to_string_lossy())
        ),
    ])
}

/// A URL's user-info part decoded (`%XX` to its byte; `+` stays `+`).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A libpq password file (`PGPASSFILE`) for the demo's database, 0600 in the
/// demo's folder, for a `DATABASE_URL` that came with a password.
fn write_pgpass(home: &std::path::Path, user: &str, password: &str) -> anyhow::Result<PathBuf> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let esc = |s: &str| s.replace('\\', "\\\\").replace(':', "\\:");
    let path = home.join("demo.pgpass");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    // A file that existed keeps its mode through `open`: make it 0600.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    writeln!(f, "*:*:{DEMO_DB}:{}:{}", esc(user), esc(password))?;
    Ok(path)
}

/// Leaves the console running on the demo's data until Ctrl-C, with a
/// one-time operator login printed here, and how to reach the demo's
/// database and run a worker on it from another terminal. The demo's
/// configuration is recorded as a producer's, so the calendars show what the
/// schedules expected, and declared, so the console can enqueue missing
/// periods.
async fn serve_console(
    pool: &sqlx::PgPool,
    cfg: &Config,
    addr: std::net::SocketAddr,
    reach: &Reach<'_>,
) -> anyhow::Result<()> {
    use crate::console::auth::{hash_password, random_token, Role, Users};
    use crate::runtime::worker_registry;
    const EVERY: std::time::Duration = std::time::Duration::from_secs(10);
    let live_for = EVERY * 3 + std::time::Duration::from_secs(10);
    let jobs: Vec<(crate::key::JobName, &JobConfig)> =
        cfg.jobs.iter().map(|(n, c)| (n.clone(), c)).collect();
    // The jobs of demo.toml, declared as `migrate` declares a file's.
    let declared: std::collections::BTreeMap<crate::key::JobName, JobConfig> = cfg
        .jobs
        .iter()
        .filter(|(_, c)| c.command.is_none())
        .map(|(n, c)| (n.clone(), c.clone()))
        .collect();
    queue::declare(pool, &declared).await?;
    let lines = reach_lines(reach)?;
    worker_registry::register_process(
        pool,
        "demo-producer",
        worker_registry::Role::Producer,
        env!("CARGO_PKG_VERSION"),
        live_for,
        &jobs,
    )
    .await?;
    // 24 hex digits of the system's randomness: shown once, never stored.
    let password = random_token()[..24].to_owned();
    let hash = tokio::task::spawn_blocking(move || hash_password(&password).map(|h| (h, password)))
        .await
        .context("hashing panicked")??;
    // Printed on a terminal, the password signs in one browser once; a
    // second use (a scrollback, a shared screen) finds it spent.
    let users = Users::one_time(&[("demo", Role::Operator, hash.0)]);
    let stop = tokio_util::sync::CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_signal.cancel();
    });
    let (touching, alive) = (pool.clone(), stop.clone());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(EVERY) => {}
                _ = alive.cancelled() => return,
            }
            let version = env!("CARGO_PKG_VERSION");
            if let Err(e) =
                worker_registry::touch(&touching, "demo-producer", version, live_for).await
            {
                tracing::warn!(error = %e, "could not refresh the demo producer's registration");
            }
        }
    });
    println!();
    println!(
        "console: http://{addr}/  (sign in as demo, password {}, valid for one sign-in)",
        hash.1
    );
    if !addr.ip().is_loopback() {
        // Beyond loopback its cookies are `Secure`: a browser keeps them
        // only over HTTPS.
        println!(
            "         beyond loopback: reach it through an HTTPS proxy (its cookies are Secure)"
        );
    }
    println!("         from another terminal, the demo's database (no password printed; PGPASSFILE holds it):");
    println!("           {}", lines[0]);
    println!("         and a worker on it:");
    println!("           {}", lines[1]);
    println!("         Ctrl-C stops it");
    // Secure cookies follow the address: off on loopback (the demo's
    // default), where the browser reaches it without TLS.
    let opts = crate::console::ConsoleOptions::new(addr, users);
    crate::console::serve(pool.clone(), opts, stop).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_terminal_gets_the_url_without_its_password_and_a_password_file() {
        let home = std::env::temp_dir().join(format!("bo-demo-reach-{}", std::process::id()));
        std::fs::create_dir_all(&home).unwrap();
        let cfg = home.join("demo.toml");
        // The private cluster's URL: its own password file is named.
        let cluster_file = home.join("pg-pgpass");
        let lines = reach_lines(&Reach {
            url: "postgres://postgres:s3cretAbC@localhost/batchonce_demo?host=%2Ft%2Fa%20b",
            config: &cfg,
            home: &home,
            pgpass: Some(&cluster_file),
        })
        .unwrap();
        assert!(!lines.concat().contains("s3cretAbC"), "{lines:?}");
        assert_eq!(
            lines[0],
            format!(
                "export PGPASSFILE='{}' DATABASE_URL='postgres://postgres@localhost/batchonce_demo?host=%2Ft%2Fa+b'",
                cluster_file.display()
            )
        );
        assert!(
            lines[1].ends_with(&format!(" worker --config '{}'", cfg.display())),
            "{lines:?}"
        );
        // A URL of the user's with a password: a 0600 file in the demo's folder.
        let lines = reach_lines(&Reach {
            url: "postgres://al%3Aice:p%40ss:w+rd@db.example:5433/batchonce_demo",
            config: &cfg,
            home: &home,
            pgpass: None,
        })
        .unwrap();
        let file = home.join("demo.pgpass");
        assert_eq!(
            lines[0],
            format!(
                "export PGPASSFILE='{}' DATABASE_URL='postgres://al%3Aice@db.example:5433/batchonce_demo'",
                file.display()
            )
        );
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            "*:*:batchonce_demo:al\\:ice:p@ss\\:w+rd\n"
        );
        // Without a password there is nothing to hide.
        let lines = reach_lines(&Reach {
            url: "postgres://me@db.example/batchonce_demo",
            config: &cfg,
            home: &home,
            pgpass: None,
        })
        .unwrap();
        assert_eq!(
            lines[0],
            "export DATABASE_URL='postgres://me@db.example/batchonce_demo'"
        );
        assert_eq!(sh("a'b $(x)"), "'a'\\''b $(x)'");
        let _ = std::fs::remove_dir_all(&home);
    }
}
