//! An in-process worker for the engine's tests: started on a test database
//! with a test's own registry and that registry's default configuration,
//! stopped through its `Shutdown`. Not every test crate that includes
//! `common` starts one, hence the `dead_code` allowance.
#![allow(dead_code)]

use batchonce::config::Config;
use batchonce::runtime::worker::{self, Shutdown, WorkerOptions};
use batchonce::testing::TestDb;
use batchonce::Registry;

/// A worker task and the signals that stop it.
pub struct Running {
    pub signals: Shutdown,
    pub handle: tokio::task::JoinHandle<()>,
}

/// Starts `worker::run` as the worker `id`; `configure` sets the options a
/// test cares about (concurrency, prefetch, poll interval, grace) on top of
/// `WorkerOptions::new`.
pub fn start(
    db: &TestDb,
    registry: Registry,
    id: &str,
    configure: impl FnOnce(&mut WorkerOptions),
) -> Running {
    let config = Config::defaults(&registry.default_configs());
    let mut opts = WorkerOptions::new(id);
    configure(&mut opts);
    let signals = Shutdown::default();
    let handle = tokio::spawn(worker::run(
        registry,
        config,
        db.pool.clone(),
        db.pool.clone(),
        opts,
        signals.clone(),
    ));
    Running { signals, handle }
}
