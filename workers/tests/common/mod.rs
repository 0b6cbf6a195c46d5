//! Helpers shared by the process tests of several files. Not every file
//! that includes this module uses every helper, hence the `dead_code`
//! allowances.

use std::path::Path;
use std::process::Command;

use std::time::Duration;

use batchonce::config::Config;
use batchonce::runtime::worker::{self, Shutdown, WorkerOptions};
use batchonce::testing::{wait_for_status, TestDb};
use batchonce::Registry;
use batchonce_workers::settlement;
use chrono::NaiveDate;
use sqlx::PgPool;

#[allow(dead_code)]
pub mod deploy;
#[allow(dead_code)]
pub mod logins;
#[allow(dead_code)]
pub mod oracle;
#[allow(dead_code)]
pub mod process;
#[allow(dead_code)]
pub mod prometheus;
#[allow(unused_imports)]
pub use oracle::items_outside_their_lease;
#[allow(unused_imports)]
pub use process::{
    batchonce, free_port, http_get, http_status, ok, signal_and_wait, spawn_worker, stop,
    wait_exit, worker, BIN,
};

/// Runs `bin --config <a file holding text> args` against a database that
/// cannot be reached (the config must be refused before any connection)
/// and checks the contract: exit 1, one error line, naming `want`. Returns
/// the error text for further checks.
#[allow(dead_code)]
pub fn config_refused(bin: &str, dir: &Path, text: &str, args: &[&str], want: &str) -> String {
    let cfg = dir.join("bad.toml");
    std::fs::write(&cfg, text).unwrap();
    let out = Command::new(bin)
        .env("DATABASE_URL", "postgres://127.0.0.1:1/none")
        .arg("--config")
        .arg(&cfg)
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{text}: {err}");
    assert!(err.contains(want), "{text}: {err}");
    err
}

/// Seeds `n` orders (ids `first_id + 1 ..= first_id + n`, 13 merchants)
/// paid evenly over `date` in Seoul, the settlement workload of the fault,
/// PgBouncer and many-hosts tests.
#[allow(dead_code)]
pub async fn seed_orders(pool: &PgPool, date: NaiveDate, first_id: i64, n: i64) {
    let (start, end) = settlement::day_bounds(date, chrono_tz::Asia::Seoul);
    sqlx::query(
        "INSERT INTO orders (order_id, merchant_id, amount_minor, paid_at) \
         SELECT $1 + g, 1 + g % 13, 100 + (g * 7919) % 100000, $2 + ($3 - $2) * ((g - 1)::float8 / $4) \
         FROM generate_series(1, $4) g",
    )
    .bind(first_id)
    .bind(start)
    .bind(end)
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

/// A configuration file that declares the three bundled kinds with their
/// defaults, for tests that exercise them without a file of their own:
/// only declared jobs exist, so a command without a file runs nothing.
#[allow(dead_code)]
pub fn samples_config() -> &'static Path {
    static PATH: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let p = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("samples-{}.toml", std::process::id()));
        std::fs::write(
            &p,
            "[jobs.daily-settlement]\n[jobs.notification-send]\n[jobs.inventory-sync]\n",
        )
        .unwrap();
        p
    })
}

/// Sends SIGTERM and waits, at most 30 s, for the process to exit: a
/// process that ignores it fails the test instead of hanging it.
#[allow(dead_code)]
pub fn sigterm_and_wait(child: &mut std::process::Child) {
    signal_and_wait(
        child,
        nix::sys::signal::Signal::SIGTERM,
        Duration::from_secs(30),
    );
}

/// In-process workers of one registry and configuration.
#[allow(dead_code)]
pub struct Workers {
    signals: Shutdown,
    handles: Vec<tokio::task::JoinHandle<()>>,
}

#[allow(dead_code)]
impl Workers {
    /// Workers `ids`, each at concurrency 2.
    pub fn start(
        db: &TestDb,
        registry: impl Fn() -> Registry,
        config: &Config,
        ids: &[&str],
    ) -> Self {
        Self::start_with(db, registry, config, ids, 2)
    }

    /// Workers `ids`, each at `concurrency`.
    pub fn start_with(
        db: &TestDb,
        registry: impl Fn() -> Registry,
        config: &Config,
        ids: &[&str],
        concurrency: u32,
    ) -> Self {
        let signals = Shutdown::default();
        let handles = ids
            .iter()
            .map(|id| {
                let mut opts = WorkerOptions::new(*id);
                opts.poll_interval = Duration::from_millis(100);
                opts.concurrency = concurrency;
                tokio::spawn(worker::run(
                    registry(),
                    config.clone(),
                    db.pool.clone(),
                    db.pool.clone(),
                    opts,
                    signals.clone(),
                ))
            })
            .collect();
        Self { signals, handles }
    }

    /// Waits until run `key` is in one of `states`, then stops the workers.
    pub async fn stop_when(self, db: &TestDb, key: &str, states: &[&str]) {
        wait_for_status(&db.pool, Some(key), states, Duration::from_secs(60)).await;
        self.stop().await;
    }

    pub async fn stop(self) {
        self.signals.shutdown.cancel();
        for h in self.handles {
            h.await.unwrap();
        }
    }
}
