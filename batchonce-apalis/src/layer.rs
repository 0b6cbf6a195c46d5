//! [`FenceLayer`]: the middleware the backend puts outside the user's, so it
//! sees the handler's final result (after a timeout layer, for example) and
//! turns it into the run's finish, which the native worker writes through
//! the lease-token fence:
//!
//! | handler result | the run |
//! |---|---|
//! | `Ok(_)` | SUCCEEDED |
//! | [`Skip`] | SKIPPED with its reason |
//! | `AbortError` | FAILED at once |
//! | `RetryAfterError(d)` | PENDING again `d` later (FAILED when its attempts are used up) |
//! | a `JobError` | as for a native kind (`Cancelled` on a shutdown releases the run without using an attempt) |
//! | any other error, a panic | PENDING again after the job's backoff |
//!
//! The handler runs in a task of its own, so a panic is contained and the
//! handler can be dropped: when the native worker stops waiting for the
//! verdict (the lease was lost, or the grace after a shutdown ran out), the
//! layer drops the handler at once, which rolls back its open fenced
//! transaction; nothing more is written for that attempt.

use std::task::{Context, Poll};

use apalis_core::error::{AbortError, BoxDynError, RetryAfterError};
use apalis_core::layers::{Layer, Service};
use apalis_core::task::Task;
use batchonce::{JobError, Outcome};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use crate::lease::{Reply, Skip, Verdict};

/// See the module documentation; the backend supplies it.
#[derive(Debug, Clone, Copy, Default)]
pub struct FenceLayer;

impl<S> Layer<S> for FenceLayer {
    type Service = FenceService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FenceService { inner }
    }
}

/// The service of [`FenceLayer`].
#[derive(Debug, Clone)]
pub struct FenceService<S> {
    inner: S,
}

/// Why the layer returned without the handler's own result.
#[derive(Debug, thiserror::Error)]
pub enum Stopped {
    /// The run was given back or taken over before the handler started.
    #[error("the run is no longer this worker's; the handler was not started")]
    NotStarted,
    /// The lease was lost or the shutdown's grace ran out: the handler was
    /// dropped and nothing more is written for this attempt.
    #[error("the handler was dropped: its lease was lost or the shutdown grace ran out")]
    Dropped,
}

impl<S, Args, Res> Service<Task<Args>> for FenceService<S>
where
    S: Service<Task<Args>, Response = Res>,
    S::Error: Into<BoxDynError> + Send + 'static,
    S::Future: Send + 'static,
    Res: Send + 'static,
{
    type Response = Res;
    type Error = BoxDynError;
    type Future = BoxFuture<'static, Result<Res, BoxDynError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, task: Task<Args>) -> Self::Future {
        let reply = task.data().get::<Reply>().and_then(Reply::take);
        let Some(mut reply) = reply else {
            return async { Err(Box::new(Stopped::NotStarted) as BoxDynError) }.boxed();
        };
        let mut handle = tokio::spawn(self.inner.call(task));
        async move {
            let joined = tokio::select! {
                r = &mut handle => r,
                _ = reply.closed() => {
                    handle.abort();
                    let _ = handle.await;
                    return Err(Box::new(Stopped::Dropped) as BoxDynError);
                }
            };
            let (verdict, result) = match joined {
                Ok(Ok(res)) => (Ok(Outcome::Succeeded), Ok(res)),
                Ok(Err(e)) => {
                    let e: BoxDynError = e.into();
                    (verdict_of(&e), Err(e))
                }
                Err(join) => {
                    let message = format!("handler panicked: {join}");
                    (
                        Err(JobError::Retryable(message.clone())),
                        Err(message.into()),
                    )
                }
            };
            // The native worker may have stopped waiting meanwhile; then
            // nothing is written, which is what a lost lease asks.
            let _ = reply.send(verdict);
            result
        }
        .boxed()
    }
}

/// The run's verdict for a handler error: the first error in its `source`
/// chain that says what to do, and otherwise a retry after the backoff.
pub(crate) fn verdict_of(e: &BoxDynError) -> Verdict {
    let message = e.to_string();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e.as_ref());
    while let Some(err) = cur {
        if let Some(skip) = err.downcast_ref::<Skip>() {
            return Ok(Outcome::Skipped(skip.0.clone()));
        }
        if err.downcast_ref::<AbortError>().is_some() {
            return Err(JobError::Fatal(message));
        }
        if let Some(r) = err.downcast_ref::<RetryAfterError>() {
            return Err(JobError::RetryAfter {
                error: message,
                delay: r.get_duration(),
            });
        }
        if let Some(j) = err.downcast_ref::<JobError>() {
            return Err(match j {
                JobError::Retryable(m) => JobError::Retryable(m.clone()),
                JobError::RetryAfter { error, delay } => JobError::RetryAfter {
                    error: error.clone(),
                    delay: *delay,
                },
                JobError::Fatal(m) => JobError::Fatal(m.clone()),
                JobError::LeaseLost => JobError::LeaseLost,
                JobError::Cancelled => JobError::Cancelled,
            });
        }
        cur = err.source();
    }
    Err(JobError::Retryable(message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn each_error_maps_to_its_finish() {
        let boxed = |e: BoxDynError| e;
        assert!(matches!(
            verdict_of(&boxed(Box::new(AbortError::new("bad data")))),
            Err(JobError::Fatal(_))
        ));
        assert!(matches!(
            verdict_of(&boxed(Box::new(RetryAfterError::new("busy", Duration::from_secs(7))))),
            Err(JobError::RetryAfter { delay, .. }) if delay == Duration::from_secs(7)
        ));
        assert!(matches!(
            verdict_of(&boxed(Box::new(Skip("no orders".into())))),
            Ok(Outcome::Skipped(r)) if r == "no orders"
        ));
        assert!(matches!(
            verdict_of(&boxed(Box::new(JobError::Cancelled))),
            Err(JobError::Cancelled)
        ));
        assert!(matches!(
            verdict_of(&boxed("connection reset".into())),
            Err(JobError::Retryable(m)) if m == "connection reset"
        ));
    }

    #[test]
    fn a_wrapped_abort_is_still_fatal() {
        #[derive(Debug, thiserror::Error)]
        #[error("while settling: {0}")]
        struct Wrapper(#[source] AbortError);
        let e: BoxDynError = Box::new(Wrapper(AbortError::new("negative amount")));
        assert!(matches!(verdict_of(&e), Err(JobError::Fatal(_))));
    }
}
