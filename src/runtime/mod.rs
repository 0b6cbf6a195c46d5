//! The runtime layer: the long-running processes and what they run. The
//! producer turns schedules into runs; the worker leases runs and executes
//! their handlers through the job API; command jobs run a program of the
//! operator's as a handler, under a supervisor that kills it before its
//! lease can expire; every process registers itself and its effective
//! configuration in the process registry.
//!
//! The files, one concern each:
//!
//! - `producer.rs`: schedule ticks and backfills into `queue::enqueue`.
//! - `worker/`: claiming, executing, heartbeating, finishing and shutting
//!   down (`mod.rs` the claim loop and one run's execution, `finish.rs` the
//!   batched finishes and the release, `loops.rs` the heartbeat, recovery
//!   and NOTIFY loops).
//! - `job.rs`: the job API a kind implements (`Job`) and receives
//!   (`JobContext`).
//! - `command.rs`: command jobs (exit codes, output, timeout, stopping);
//!   `command_env.rs` what their program receives in its environment.
//! - `supervisor.rs`: the process between a worker and a command job's
//!   program.
//! - `isolation.rs`: what a program can reach of the processes above it
//!   (non-dumpable processes, `run_as_user`).
//! - `worker_registry.rs`: `batch_worker` and `batch_process_config`.
//!
//! This layer must never write `batch_job_run` or `batch_job_attempt`
//! itself (it calls the queue), never decide a run's policies from its own
//! configuration once the run holds a context, and never know a job kind:
//! kinds arrive through a `job::Registry` built by the binary.

pub mod command;
pub mod command_env;
pub mod isolation;
pub mod job;
pub mod producer;
pub mod supervisor;
pub mod worker;
pub mod worker_registry;
