//! What an apalis handler receives of its run: [`RunLease`], the engine's
//! `JobContext` for this attempt (key, business date, attempt, lease token,
//! the run context it was enqueued with, fenced transactions, progress and
//! the cancellation that a shutdown or a lost lease fires), taken from the
//! task by apalis's extractor mechanism; and [`Skip`], the error that ends
//! a run as SKIPPED.

use std::ops::Deref;
use std::sync::{Arc, Mutex};

use apalis_core::task::data::MissingDataError;
use apalis_core::task::from_request::FromRequest;
use apalis_core::task::Task;
use batchonce::{JobContext, JobError, Outcome};
use tokio::sync::oneshot;

/// The run behind an apalis task. Write through [`JobContext::fenced`] and
/// [`JobContext::commit`]; between chunks, stop when
/// [`JobContext::is_cancelled`] says so and return
/// `JobError::Cancelled`, which releases the run without using an attempt
/// on a shutdown.
#[derive(Debug, Clone)]
pub struct RunLease(pub(crate) Arc<JobContext>);

impl Deref for RunLease {
    type Target = JobContext;

    fn deref(&self) -> &JobContext {
        &self.0
    }
}

impl<Args: Sync> FromRequest<Task<Args>> for RunLease {
    type Error = MissingDataError;

    async fn from_request(task: &Task<Args>) -> Result<Self, Self::Error> {
        task.data().get_checked::<RunLease>().cloned()
    }
}

/// Where the handler's verdict goes: the native worker's handler waits on
/// the other end. It is taken once, by the layer.
#[derive(Debug, Clone)]
pub(crate) struct Reply(pub(crate) Arc<Mutex<Option<oneshot::Sender<Verdict>>>>);

pub(crate) type Verdict = Result<Outcome, JobError>;

impl Reply {
    pub(crate) fn take(&self) -> Option<oneshot::Sender<Verdict>> {
        // A poisoned lock only means another thread panicked while holding
        // it; the value inside is still a plain Option.
        match self.0.lock() {
            Ok(mut g) => g.take(),
            Err(p) => p.into_inner().take(),
        }
    }
}

/// Returned (boxed) by a handler, ends the run as SKIPPED with this reason:
/// nothing to do for the period.
#[derive(Debug, thiserror::Error)]
#[error("skipped: {0}")]
pub struct Skip(pub String);
