//! The operations layer: the tools around the engine that an operator runs
//! once or beside it, rather than the engine itself.
//!
//! - `contract.rs`: `batchonce migrate --contract`, which drops superseded functions.
//! - `demo.rs`: `batchonce demo`, the whole system on one machine, checked.
//! - `preflight.rs`: `batchonce preflight`, the pre-deploy race check.
//! - `roles.rs`: `batchonce roles`, least-privilege database roles.
//! - `exporter.rs`: `batchonce exporter`, the database-derived gauges.
//! - `embedded/`: the private PostgreSQL cluster of the demo and the tests.
//!
//! These tools read the queue's views and call its functions; they must
//! never write a job table with their own SQL (the one deletion, of a
//! `preflight` scratch run, is the queue's `delete_preflight_run`), and the
//! embedded cluster must never be used for production data.

pub mod contract;
pub(crate) mod demo;
pub mod embedded;
pub mod exporter;
pub(crate) mod preflight;
pub mod roles;
