//! batchonce: scheduled business batch jobs that run exactly once per business
//! key, coordinated only through PostgreSQL. This crate is the engine (queue,
//! worker runtime, job API, database bootstrap, command line); it knows no job
//! kind. A binary registers its job kinds in a [`job::Registry`] and calls
//! [`cli::main`].
//!
//! Declares the modules and re-exports the API that job kinds use: `Job`, `JobContext`, `JobDemo`,
//! `JobError`, `Outcome`, `Registry`, `Verification`, `Clock`, `Config`, `JobConfig`, `JobKey` and
//! `JobName`. `schedule`, `producer`, `worker_registry`, `telemetry`, `exporter`, `command` and
//! `roles` are public modules, like every other module except `demo` and `preflight`, which are
//! private. `testing` exists only with the `testing` feature.

pub mod cli;
pub mod clock;
pub mod command;
pub mod config;
pub mod context;
pub mod db;
mod demo;
pub mod embedded;
pub mod exporter;
pub mod job;
pub mod key;
mod preflight;
pub mod producer;
pub mod queue;
pub mod roles;
pub mod schedule;
pub mod supervisor;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
pub mod text;
pub mod worker;
pub mod worker_registry;

pub use clock::Clock;
pub use config::{Config, JobConfig};
pub use job::{Job, JobContext, JobDemo, JobError, Outcome, Registry, Verification};
pub use key::{JobKey, JobName};
