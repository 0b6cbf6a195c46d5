//! apalis on batchonce: an [apalis](https://docs.rs/apalis-core/1.0.0) backend
//! whose tasks are batchonce runs, so an apalis worker and its tower
//! middleware run each business key once, write through the lease-token
//! fence, and retry as the run's stored policies say.
//!
//! What this crate owns: the adapter between apalis's `Backend` and
//! batchonce's worker runtime, and nothing else. It never claims, heartbeats,
//! fences or finishes a run itself. [`BatchonceBackend`] runs the engine's
//! own worker (`batchonce::runtime::worker::run`) with one job whose handler
//! hands each leased run to apalis as a task and waits for apalis's verdict;
//! heartbeats, self-fencing, lease-expiry recovery, batched finishes, the
//! release on shutdown, metrics and the process registry are the native
//! worker's, shared rather than copied.
//!
//! - `backend.rs`: [`BatchonceBackend`], apalis's `Backend` and
//!   `BackendConfig`: starts the native worker when the apalis worker
//!   starts, yields its runs as tasks, and stops it when apalis shuts down.
//! - `layer.rs`: the layer the backend puts outside the user's middleware;
//!   it turns the handler's result into the run's finish (success,
//!   [`AbortError`](apalis_core::error::AbortError) as fatal,
//!   [`RetryAfterError`](apalis_core::error::RetryAfterError) as a retry
//!   after its delay, any other error as a retry after the job's backoff)
//!   and drops the handler when its lease is lost.
//! - `lease.rs`: [`RunLease`], what a handler receives: the run's key,
//!   context and fenced transactions, and [`Skip`].
//! - `sink.rs`: [`Enqueuer`], enqueueing over `queue::enqueue`, where a
//!   duplicate key is success, reported as such.
//!
//! What it must never do: return an error from `poll_next` or `poll_ready`
//! (apalis ends the worker on the first one, so a database restart would
//! end it), retry inside one lease (apalis's own retry layer does that, and
//! ignores `RetryAfterError`'s delay), or write after a lost lease.

mod backend;
mod layer;
mod lease;
mod sink;

pub use backend::{BackendError, BatchonceBackend};
pub use layer::{FenceLayer, FenceService};
pub use lease::{RunLease, Skip};
pub use sink::{EnqueueError, Enqueuer};
