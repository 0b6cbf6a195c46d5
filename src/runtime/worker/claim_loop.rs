//! The worker's claim loop: runs claimed and waiting for a slot (the local
//! queue), at most [`CLAIMS_IN_FLIGHT`] claims out at once, and the run
//! tasks it starts. Invariant: a run it claimed is either started, or given
//! back (released) when the worker stops; a claim that ends in any way gives
//! back only the slots it asked for.

use super::*;

/// The claim loop's state: the runs claimed and waiting for a slot, the
/// claims out, and the run tasks.
pub(super) struct ClaimLoop {
    shared: Arc<Shared>,
    specs: Arc<[ClaimSpec]>,
    wake: Arc<Notify>,
    /// The execution slots (`--concurrency`).
    permits: Arc<Semaphore>,
    pub(super) tasks: JoinSet<()>,
    backoff: Backoff,
    local: LocalQueue,
    /// A claim runs as a task of its own, so runs already claimed keep
    /// starting from the local queue while it is out, and a second may go
    /// out while the first is on the server.
    claims: JoinSet<ClaimResult>,
    /// What each claim out has asked for, by task, so that a claim that ends
    /// in any way (a panic included) gives back only its own.
    wants: HashMap<tokio::task::Id, usize>,
    claim_not_before: Instant,
    /// Set when a claim found fewer due runs than it asked for: the next one
    /// waits for a reason to look again (a notification, the poll interval,
    /// a slot given back), or an idle worker would claim in a tight loop.
    drained: bool,
}

impl ClaimLoop {
    /// A loop with every slot free and nothing claimed.
    pub(super) fn new(shared: Arc<Shared>, specs: Arc<[ClaimSpec]>, wake: Arc<Notify>) -> Self {
        let opts = &shared.opts;
        ClaimLoop {
            permits: Arc::new(Semaphore::new(opts.concurrency.max(1) as usize)),
            tasks: JoinSet::new(),
            backoff: Backoff::new(),
            local: LocalQueue::new(opts.prefetch as usize, opts.concurrency.max(1) as usize),
            claims: JoinSet::new(),
            wants: HashMap::new(),
            claim_not_before: Instant::now(),
            drained: false,
            shared,
            specs,
            wake,
        }
    }

    /// Claims and starts runs until `shutdown` fires.
    pub(super) async fn run(&mut self) {
        while !self.shared.signals.shutdown.is_cancelled() {
            // Let run tasks that are ready give their slots back first, so one
            // claim takes them all rather than one each.
            tokio::task::yield_now().await;
            while let Some(done) = self.tasks.try_join_next() {
                log_task_end(done);
            }
            let now = Instant::now();
            self.start_queued(now);
            self.send_claim(now);
            self.wait().await;
        }
    }

    /// Releases the queued runs past their deadline, and starts queued runs
    /// while execution slots are free.
    fn start_queued(&mut self, now: Instant) {
        let (shared, local, tasks) = (&self.shared, &mut self.local, &mut self.tasks);
        let overdue = local.take_overdue(now);
        if !overdue.is_empty() {
            tasks.spawn(release_queued(shared.clone(), overdue));
        }
        while local.len() > 0 {
            let Ok(permit) = self.permits.clone().try_acquire_owned() else {
                break;
            };
            if let Some(q) = local.pop(now) {
                tasks.spawn(execute(shared.clone(), q.lease, permit, q.claim_sent));
            }
        }
    }

    /// Sends a claim if there is room for one, and runs to ask for.
    fn send_claim(&mut self, now: Instant) {
        let (local, wants) = (&mut self.local, &mut self.wants);
        if self.claims.len() < CLAIMS_IN_FLIGHT && !self.drained && now >= self.claim_not_before {
            // Room for the free slots and for the queue's target; a claim
            // only for the queue waits until it is half empty, so claims
            // stay large.
            let free = self.permits.available_permits();
            let target = local.target(now);
            let requested: usize = wants.values().sum();
            let want = (free + target).saturating_sub(local.len() + requested);
            if want > 0 && (free > requested || (local.len() + requested) * 2 <= target) {
                let pool = self.shared.pool.clone();
                let worker_id = self.shared.opts.worker_id.clone();
                let specs = self.specs.clone();
                let task = self.claims.spawn(async move {
                    // Before the statement: the leases it grants last at
                    // least their ttl from here.
                    let sent = Instant::now();
                    let r = queue::claim(&pool, &worker_id, &specs, want as u32, Clock::Db).await;
                    (sent, r)
                });
                wants.insert(task.id(), want);
            }
        }
    }

    /// Waits for a reason to look again: a signal, a notification, a slot
    /// given back, the poll interval, a queued run's deadline, the end of a
    /// claim's backoff, a claim's result or a run task's end.
    async fn wait(&mut self) {
        let Self {
            shared,
            specs,
            wake,
            tasks,
            backoff,
            local,
            claims,
            wants,
            claim_not_before,
            drained,
            ..
        } = self;
        let (opts, signals) = (&shared.opts, &shared.signals);
        let next_deadline = local
            .next_deadline()
            .unwrap_or_else(|| Instant::now() + opts.poll_interval);
        let waiting = claims.is_empty() && *claim_not_before > Instant::now();
        tokio::select! {
            _ = signals.shutdown.cancelled() => {}
            _ = wake.notified() => *drained = false,
            _ = shared.slot_freed.notified() => *drained = false,
            _ = tokio::time::sleep(opts.poll_interval) => *drained = false,
            _ = tokio::time::sleep_until(next_deadline.into()), if local.len() > 0 => {}
            _ = tokio::time::sleep_until((*claim_not_before).into()), if waiting => {}
            Some(done) = claims.join_next_with_id(), if !claims.is_empty() => {
                let id = match &done {
                    Ok((id, _)) => *id,
                    Err(e) => e.id(),
                };
                let want = wants.remove(&id).unwrap_or(0);
                match done {
                    Ok((_, (sent, Ok(leases)))) => {
                        backoff.reset();
                        *drained = leases.len() < want;
                        queue_claimed(local, specs, leases, sent);
                    }
                    Ok((_, (_, Err(e)))) => {
                        let delay = backoff.next();
                        warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "claim failed; retrying");
                        *claim_not_before = Instant::now() + delay;
                    }
                    Err(e) => error!(error = %e, "claim task ended abnormally"),
                }
            }
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                *drained = false;
                log_task_end(done);
            }
        }
    }

    /// After the loop: waits for the claims still out and releases what
    /// they return, with everything queued.
    pub(super) async fn give_back(&mut self) {
        let (local, specs) = (&mut self.local, &self.specs);
        // A claim still out may commit leases: wait for it (it is one statement)
        // and give back, with everything queued, what it returns.
        while let Some(done) = self.claims.join_next().await {
            if let Ok((sent, Ok(leases))) = done {
                queue_claimed(local, specs, leases, sent);
            }
        }
        let queued = local.take_all();
        if !queued.is_empty() {
            self.tasks
                .spawn(release_queued(self.shared.clone(), queued));
        }
    }
}
