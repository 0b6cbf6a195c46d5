//! [`Enqueuer`]: enqueues runs of one job from an application, over
//! `queue::enqueue`. The key is the job and the business period, so pushing
//! the same date twice inserts one run; the second push is a success that
//! reports the key as a duplicate, never an error.
//!
//! apalis's `TaskSink` returns `()` and so cannot tell a duplicate from a
//! new run; this is why the sink is a type of its own.

use batchonce::config::context::PeriodError;
use batchonce::queue::{self, EnqueueReport, QueueError};
use batchonce::runtime::producer;
use batchonce::{Clock, JobConfig, JobName};
use chrono::NaiveDate;
use serde::Serialize;
use sqlx::PgPool;

/// Why nothing was enqueued.
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    #[error("{0}")]
    Invalid(String),
    #[error("the arguments do not encode as JSON: {0}")]
    Payload(#[from] serde_json::Error),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

impl From<PeriodError> for EnqueueError {
    fn from(e: PeriodError) -> Self {
        Self::Invalid(e.to_string())
    }
}

/// Enqueues the runs of one job (see the module documentation).
#[derive(Debug, Clone)]
pub struct Enqueuer {
    pool: PgPool,
    job: JobName,
    cfg: JobConfig,
}

impl Enqueuer {
    pub fn new(pool: PgPool, job: JobName, cfg: JobConfig) -> Self {
        Self { pool, job, cfg }
    }

    /// Enqueues the run (or, for a `covers = "firing"` job, the runs) of one
    /// business date with `args` as its payload, in one statement. The
    /// report lists the keys inserted and those that already existed
    /// (untouched: a run's payload is fixed when it is enqueued).
    pub async fn enqueue<A: Serialize>(
        &self,
        date: NaiveDate,
        args: &A,
    ) -> Result<EnqueueReport, EnqueueError> {
        // The key's rules (the date range among them) before anything else.
        batchonce::key::parse_date(&date.to_string())
            .map_err(|e| EnqueueError::Invalid(e.to_string()))?;
        let payload = serde_json::to_value(args)?;
        let periods =
            producer::periods_for_dates(&self.cfg, &[date]).map_err(EnqueueError::Invalid)?;
        let mut runs = producer::runs_for_periods(&self.job, &self.cfg, &periods)?;
        for run in &mut runs {
            run.payload = payload.clone();
        }
        Ok(queue::enqueue(&self.pool, &runs, Clock::Db).await?)
    }
}
