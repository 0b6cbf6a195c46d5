//! batchonce: scheduled business batch jobs that run exactly once per business
//! key, coordinated only through PostgreSQL. This crate is the engine; it
//! knows no job kind. A binary registers its job kinds in a
//! [`runtime::job::Registry`] and calls [`cli::main`].
//!
//! The layers, from the bottom up. A module imports only from its own layer
//! or the ones below it; each folder's `mod.rs` says what its layer owns and
//! what it must never do.
//!
//! 1. Foundations: `key` (job and key names), `clock` (the database clock,
//!    injectable in tests), `db` (connections, migrations, statements),
//!    `text` (printable text and truncation), `telemetry` (logs and metric
//!    names), `schedule` (cron firings and business periods, pure).
//! 2. `config/`: what the operator declares (`batchonce.toml`) and the run
//!    context a run is frozen with when it is enqueued.
//! 3. `queue/`: every statement on the run and attempt tables.
//! 4. `runtime/`: the producer, the worker, the job API, command jobs and the
//!    process registry.
//! 5. `console/`: the operator's web console.
//! 6. `ops/`: demo (which can leave the console running), preflight, roles,
//!    exporter and the embedded cluster.
//! 7. `cli/`: the command line, one file per command group.
//!
//! The API a job kind uses is re-exported here: `Job`, `JobContext`,
//! `JobDemo`, `JobError`, `Outcome`, `Registry`, `Verification`, `Clock`,
//! `Config`, `JobConfig`, `JobKey` and `JobName`. `testing` exists only with
//! the `testing` feature.

pub mod clock;
pub mod db;
pub mod key;
pub mod schedule;
pub mod telemetry;
pub mod text;

pub mod config;

pub mod queue;

pub mod runtime;

pub mod console;

pub mod ops;

pub mod cli;

#[cfg(feature = "testing")]
pub mod testing;

pub use clock::Clock;
pub use config::{Config, JobConfig};
pub use key::{JobKey, JobName, Scope};
pub use runtime::job::{Job, JobContext, JobDemo, JobError, Outcome, Registry, Verification};
