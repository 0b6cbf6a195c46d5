//! [`BatchonceBackend`]: apalis's `Backend` over batchonce's worker runtime.
//!
//! When the apalis worker first polls it, the backend starts the engine's
//! worker (`runtime::worker::run`) on pools of its own, with one job: a
//! bridge whose handler turns each leased run into an apalis task (the
//! payload decoded as `Args`, a [`RunLease`] and a reply slot in its data)
//! and waits for the verdict the [`FenceLayer`] sends back. So the native
//! worker claims (at most `concurrency` runs at once), heartbeats,
//! self-fences, recovers expired leases, writes finishes in batches and
//! releases on shutdown, exactly as it does for native kinds, and its
//! transient database errors never reach apalis.
//!
//! apalis has no shutdown hook: a watcher polls the worker context's
//! `is_shutting_down()` and fires the native worker's shutdown, which stops
//! claims and cancels every handler's [`RunLease`]; after `grace` the native
//! worker abandons what still runs and releases it. `poll_close` waits for
//! the native worker to end (bounded by `grace` plus its `ABORT_BOUND`).

use std::future::Future;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use apalis_core::backend::finalize::Ephemeral;
use apalis_core::backend::{Backend, BackendConfig};
use apalis_core::task::builder::TaskBuilder;
use apalis_core::task::task_id::TaskId;
use apalis_core::task::Task;
use apalis_core::worker::context::WorkerContext;
use async_trait::async_trait;
use batchonce::runtime::worker::{self, Shutdown, WorkerOptions};
use batchonce::{db, Config, Job, JobConfig, JobContext, JobError, JobName, Outcome, Registry};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::layer::FenceLayer;
use crate::lease::{Reply, RunLease};
use crate::sink::Enqueuer;

/// Why a backend could not be built. The backend itself never returns an
/// error to apalis once it runs (apalis would end the worker).
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Db(#[from] db::DbError),
    #[error("{0}")]
    Invalid(String),
}

#[derive(Debug, Clone)]
struct Settings {
    url: String,
    job: JobName,
    cfg: JobConfig,
    concurrency: u32,
    grace: Duration,
    poll_interval: Duration,
    listen: bool,
}

struct Started<Args> {
    tasks: mpsc::UnboundedReceiver<Task<Args>>,
    native: Option<JoinHandle<()>>,
    signals: Shutdown,
}

/// An apalis backend whose tasks are the runs of one batchonce job. Each
/// clone is a separate worker (`Monitor::register` clones it): it starts
/// its own native worker and registers it in `batch_worker` as
/// `<apalis worker name>-<pid>` (and `-<n>` after the first in a process).
pub struct BatchonceBackend<Args> {
    settings: Arc<Settings>,
    started: Option<Started<Args>>,
    _args: PhantomData<fn() -> Args>,
}

impl<Args> Clone for BatchonceBackend<Args> {
    fn clone(&self) -> Self {
        Self {
            settings: self.settings.clone(),
            started: None,
            _args: PhantomData,
        }
    }
}

impl<Args> std::fmt::Debug for BatchonceBackend<Args> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchonceBackend")
            .field("job", &self.settings.job)
            .field("url", &db::redact(&self.settings.url))
            .field("started", &self.started.is_some())
            .finish()
    }
}

impl<Args> BatchonceBackend<Args> {
    /// A backend for the runs of `job`, on the database at `url`, with the
    /// job's configuration (time zone, schedule, lease, backoff, attempts):
    /// the same `JobConfig` the producer and `batchonce.toml` give it. Runs
    /// keep the policies they were enqueued with.
    pub fn new(url: &str, job: JobName, cfg: JobConfig) -> Result<Self, BackendError> {
        db::options(url, "batchonce-apalis")?;
        Ok(Self {
            settings: Arc::new(Settings {
                url: url.to_owned(),
                job,
                cfg,
                concurrency: 4,
                grace: Duration::from_secs(20),
                poll_interval: Duration::from_secs(2),
                listen: true,
            }),
            started: None,
            _args: PhantomData,
        })
    }

    fn with(mut self, f: impl FnOnce(&mut Settings)) -> Self {
        f(Arc::make_mut(&mut self.settings));
        self
    }

    /// Runs held and executed at once (default 4).
    pub fn concurrency(self, n: u32) -> Self {
        self.with(|s| s.concurrency = n.max(1))
    }

    /// After apalis begins to shut down, how long handlers may take to
    /// return before they are dropped and their runs released (default 20 s).
    pub fn grace(self, d: Duration) -> Self {
        self.with(|s| s.grace = d)
    }

    /// How often to look for due runs without a NOTIFY (default 2 s).
    pub fn poll_interval(self, d: Duration) -> Self {
        self.with(|s| s.poll_interval = d)
    }

    /// Polls only, without a LISTEN session (behind a transaction pooler).
    pub fn no_listen(self) -> Self {
        self.with(|s| s.listen = false)
    }

    /// Enqueues runs of this backend's job, on a pool of its own.
    pub fn enqueuer(&self) -> Result<Enqueuer, BackendError> {
        let pool = db::connect_lazy(&self.settings.url, "batchonce-apalis-enqueue", 2)?;
        Ok(Enqueuer::new(
            pool,
            self.settings.job.clone(),
            self.settings.cfg.clone(),
        ))
    }
}

impl<Args: DeserializeOwned + Send + Sync + 'static> BatchonceBackend<Args> {
    fn start(&mut self, worker: &WorkerContext) -> Result<(), BackendError> {
        let s = &self.settings;
        // Several backends of one process (a `Monitor` registering clones)
        // each need a worker id of their own in `batch_worker`.
        static STARTED: AtomicU32 = AtomicU32::new(0);
        let worker_id = match STARTED.fetch_add(1, Ordering::Relaxed) {
            0 => format!("{}-{}", worker.name(), std::process::id()),
            n => format!("{}-{}-{n}", worker.name(), std::process::id()),
        };
        // Like `batchonce worker`: a transaction left idle past twice the
        // lease is ended by the server, so its row locks cannot outlive it.
        let idle_tx = (s.cfg.lease_ttl * 2).max(Duration::from_secs(10));
        let pool = db::connect_worker(&s.url, &worker_id, s.concurrency + 3, idle_tx)?;
        let heartbeat_pool = db::connect_worker(&s.url, &worker_id, 1, idle_tx)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let registry = Registry::new().register(Bridge::<Args> {
            name: s.job.clone(),
            cfg: s.cfg.clone(),
            tasks: tx,
        });
        let mut config = Config::empty();
        config.origin = "batchonce-apalis".into();
        config.jobs.insert(s.job.clone(), s.cfg.clone());
        let mut opts = WorkerOptions::new(worker_id);
        opts.concurrency = s.concurrency;
        opts.grace = s.grace;
        opts.poll_interval = s.poll_interval;
        opts.listen = s.listen;
        let signals = Shutdown::default();
        let native = tokio::spawn(worker::run(
            registry,
            config,
            pool,
            heartbeat_pool,
            opts,
            signals.clone(),
        ));
        // apalis says it is shutting down only through the worker context.
        let (w, shutdown) = (worker.clone(), signals.shutdown.clone());
        tokio::spawn(async move {
            while !shutdown.is_cancelled() {
                if w.is_shutting_down() {
                    shutdown.cancel();
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        self.started = Some(Started {
            tasks: rx,
            native: Some(native),
            signals,
        });
        Ok(())
    }
}

impl<Args: DeserializeOwned + Send + Sync + 'static> Backend for BatchonceBackend<Args> {
    type Task = Task<Args>;
    /// Never returned to apalis: connection trouble is the native worker's
    /// to retry, and an error here would end the apalis worker.
    type Error = BackendError;

    fn poll_ready(
        &mut self,
        _cx: &mut Context<'_>,
        _worker: &WorkerContext,
    ) -> Poll<Result<(), Self::Error>> {
        // The native worker bounds the runs in flight (`concurrency`).
        Poll::Ready(Ok(()))
    }

    fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
        worker: &WorkerContext,
    ) -> Poll<Option<Result<Self::Task, Self::Error>>> {
        if self.started.is_none() {
            if let Err(e) = self.start(worker) {
                // Only a malformed URL reaches here (`new` checked it), so
                // this is a programming error, not a transient one.
                return Poll::Ready(Some(Err(e)));
            }
        }
        match self.started.as_mut() {
            Some(s) => s.tasks.poll_recv(cx).map(|t| t.map(Ok)),
            None => Poll::Ready(None),
        }
    }

    fn poll_close(
        &mut self,
        cx: &mut Context<'_>,
        _worker: &WorkerContext,
    ) -> Poll<Result<(), Self::Error>> {
        let Some(s) = self.started.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        s.signals.shutdown.cancel();
        if let Some(native) = s.native.as_mut() {
            match std::pin::Pin::new(native).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(r) => {
                    if let Err(e) = r {
                        tracing::error!(error = %e, "the batchonce worker task ended abnormally");
                    }
                    s.native = None;
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<Args: DeserializeOwned + Send + Sync + 'static> BackendConfig for BatchonceBackend<Args> {
    type Args = Args;
    type Id = String;
    type Kind = Ephemeral;
    type Config = JobConfig;
    type Layer = FenceLayer;

    fn config(&self) -> &Self::Config {
        &self.settings.cfg
    }

    fn middleware(&mut self, _worker: &mut WorkerContext) -> Self::Layer {
        FenceLayer
    }
}

/// The native worker's handler for the job: hands the run to apalis and
/// waits for the layer's verdict.
struct Bridge<Args> {
    name: JobName,
    cfg: JobConfig,
    tasks: mpsc::UnboundedSender<Task<Args>>,
}

#[async_trait]
impl<Args: DeserializeOwned + Send + Sync + 'static> Job for Bridge<Args> {
    fn name(&self) -> JobName {
        self.name.clone()
    }

    fn default_config(&self) -> JobConfig {
        self.cfg.clone()
    }

    async fn run(&self, ctx: &JobContext) -> Result<Outcome, JobError> {
        let args: Args = serde_json::from_value(ctx.payload.clone()).map_err(|e| {
            JobError::Fatal(format!(
                "the run's payload does not decode as the handler's arguments: {e}"
            ))
        })?;
        let (tx, mut rx) = oneshot::channel();
        let reply = Reply(Arc::new(Mutex::new(Some(tx))));
        let task = TaskBuilder::new(args)
            // One id per lease: apalis may refuse a task id it has seen.
            // Every claim numbers a new attempt, so the attempt names the
            // lease; the token, a capability, never leaves the context.
            .task_id(TaskId::from_string(format!("{}@{}", ctx.key, ctx.attempt)))
            // apalis adds one when the handler starts, so it sees our attempt.
            .attempt(ctx.attempt.saturating_sub(1).max(0) as usize)
            .max_attempts(ctx.config.max_attempts as usize)
            .data(RunLease(Arc::new(ctx.clone())))
            .data(reply.clone())
            .build();
        if self.tasks.send(task).is_err() {
            // The apalis worker is gone: give the run back.
            return Err(JobError::Cancelled);
        }
        tokio::select! {
            verdict = &mut rx => verdict.unwrap_or(Err(JobError::Cancelled)),
            _ = ctx.cancelled() => {
                // Shut down before apalis took the task: take the reply slot
                // back so the layer never starts the handler, and release.
                if reply.take().is_some() {
                    Err(JobError::Cancelled)
                } else {
                    rx.await.unwrap_or(Err(JobError::Cancelled))
                }
            }
        }
    }
}
