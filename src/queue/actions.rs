//! Operator actions (`fail`, `rerun`, `skip`): each one transaction that
//! locks the run, checks its state, writes the new state conditionally and
//! the audit row in `batch_operator_action`.
//!
//! - `Action` (`Fail`, `Rerun`, `Skip`) and `OperatorRequest` describe an operator action.
//!   `Action::allowed(force)` gives the states it may start from: fail RUNNING, or with force
//!   RUNNING or PENDING; rerun FAILED, or with force FAILED, SUCCEEDED or SKIPPED; skip PENDING or
//!   FAILED, whatever the force. A RUNNING run can be failed without force only if its lease has
//!   expired or it started more than the request's `stale_after` ago.
//! - `apply_action` runs one transaction. `check_action` locks the run with `SELECT … FOR UPDATE`
//!   and checks the state, returning `Refused` (`<action> refused for KEY: it is STATUS …`) on a
//!   mismatch. Then one conditional `UPDATE … WHERE job_key = $1 AND status = ANY(allowed)` writes
//!   the new state. `fail` draws a new token when the run was RUNNING, which fences the holder, and
//!   closes the open attempt as `operator_failed`. `rerun` sets PENDING, `next_run_at = now` and
//!   `max_attempts = LEAST(attempts + the job's max_attempts, 1000)`, so the budget is renewed and
//!   attempt numbers stay unique. Every action clears `lease_expires_at` and writes `error_message`
//!   (`failed by operator O: R`, `re-run by operator O: R`, `skipped by operator O: R`). Last, the
//!   audit row goes into `batch_operator_action` (operator, action, key, reason, before and after
//!   status; `session_user_name` takes its default, `session_user`). Because of the row lock, of
//!   two operators acting at once the second waits and is checked against the first one's result,
//!   so the same action never applies twice. `preview_action` (`--dry-run`) runs `check_action` and
//!   rolls back. `blockers::act_from` (the console) records the operator's remote address and
//!   refuses a run that left the previewed state (`Origin`). `apply_action_in` and `preview_action_in` do the
//!   same in a transaction the caller
//!   opened, which is how `blockers::act` sets a lock timeout; `check_action(…, lock: false)` reads
//!   the row without locking it.

use std::time::Duration;

use sqlx::{PgConnection, PgPool, Postgres, Transaction};

use super::{QueueError, RunStatus};
use crate::clock::Clock;
use crate::key::JobKey;
use crate::text::truncate;

/// An operator action (`docs/state_machine.md`, "Operator transitions";
/// how to use them: `docs/operations.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// RUNNING (stale or lease-expired; any with force) or PENDING with
    /// force → FAILED, fencing the holder.
    Fail,
    /// FAILED (SUCCEEDED or SKIPPED with force) → PENDING, budget renewed.
    Rerun,
    /// PENDING or FAILED → SKIPPED.
    Skip,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fail => "fail",
            Self::Rerun => "rerun",
            Self::Skip => "skip",
        }
    }

    fn allowed(self, force: bool) -> &'static [RunStatus] {
        use RunStatus::*;
        match (self, force) {
            (Self::Fail, false) => &[Running],
            (Self::Fail, true) => &[Running, Pending],
            (Self::Rerun, false) => &[Failed],
            (Self::Rerun, true) => &[Failed, Succeeded, Skipped],
            (Self::Skip, _) => &[Pending, Failed],
        }
    }

    fn target(self) -> RunStatus {
        match self {
            Self::Fail => RunStatus::Failed,
            Self::Rerun => RunStatus::Pending,
            Self::Skip => RunStatus::Skipped,
        }
    }
}

/// An operator's request.
#[derive(Debug, Clone)]
pub struct OperatorRequest {
    pub action: Action,
    pub key: JobKey,
    pub operator: String,
    pub reason: String,
    pub force: bool,
    /// For `fail`: the job's `stale_after` (a RUNNING run must be older, or
    /// its lease expired, unless forced). The run's own stored value wins;
    /// this serves only runs the previous release enqueued without one.
    pub stale_after: Duration,
    /// For `rerun`: attempts granted anew. The run's own stored budget wins;
    /// this serves only runs without one.
    pub max_attempts: u32,
}

/// What an action did (or, on a dry run, would do).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ActionOutcome {
    pub job_key: String,
    pub action: String,
    pub before: RunStatus,
    pub after: RunStatus,
    pub applied: bool,
}

/// Why an action was refused: the run's current state, for the operator.
/// Its text ends with what to do on the command line ([`Remedy`]); the
/// console says the same in its own words from `remedy`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{action} refused for {key}: it is {status}{detail}{}", remedy.command_line())]
pub struct Refused {
    pub action: &'static str,
    pub key: String,
    pub status: RunStatus,
    pub detail: String,
    /// What would let the action through, if anything.
    pub remedy: Remedy,
}

impl Refused {
    /// The refusal without the command line's remedy: what the console
    /// shows before its own words for the remedy.
    pub fn without_remedy(&self) -> String {
        format!(
            "{} refused for {}: it is {}{}",
            self.action, self.key, self.status, self.detail
        )
    }
}

/// What would let a refused action through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remedy {
    /// Nothing the operator can add: the state does not allow the action.
    None,
    /// Re-running a SUCCEEDED or SKIPPED run is a correction, made with force.
    ForceCorrection,
    /// Failing a run that has not started needs force.
    ForceNotStarted,
    /// A RUNNING run with a live lease: check whether it is stale, or force.
    CheckStaleOrForce,
}

impl Remedy {
    /// The remedy in the command line's words (with its flags).
    pub fn command_line(self) -> &'static str {
        match self {
            Self::None => "",
            Self::ForceCorrection => "; re-running it is a correction: add --force",
            Self::ForceNotStarted => "; add --force to fail a run that has not started",
            Self::CheckStaleOrForce => "; check `runs stale`, or add --force",
        }
    }
}

/// Checks an action against the run's current state without writing.
pub async fn preview_action(
    pool: &PgPool,
    req: &OperatorRequest,
    clock: Clock,
) -> Result<Result<ActionOutcome, Refused>, QueueError> {
    preview_action_in(pool.begin().await?, req, clock).await
}

/// [`preview_action`] in a transaction the caller opened (and may have set
/// a `lock_timeout` in).
pub(crate) async fn preview_action_in(
    mut tx: Transaction<'static, Postgres>,
    req: &OperatorRequest,
    clock: Clock,
) -> Result<Result<ActionOutcome, Refused>, QueueError> {
    let r = check_action(&mut tx, req, clock, true).await?;
    tx.rollback().await?;
    Ok(r.map(|before| ActionOutcome {
        job_key: req.key.to_string(),
        action: req.action.as_str().into(),
        before,
        after: req.action.target(),
        applied: false,
    }))
}

/// Checks an action against the run, locking its row `FOR UPDATE` when
/// `lock` (to act on it), or reading it without waiting for anyone (to see
/// whether the action would be refused anyway).
pub(super) async fn check_action(
    tx: &mut PgConnection,
    req: &OperatorRequest,
    clock: Clock,
    lock: bool,
) -> Result<Result<RunStatus, Refused>, QueueError> {
    // A database function: the operator role cannot lock the row itself.
    let row: Option<(RunStatus, bool)> =
        crate::db::query_as("SELECT status, stale FROM batchonce_operator_check($1, $2, $3, $4)")
            .bind(req.key.as_str())
            .bind(req.stale_after.as_secs_f64())
            .bind(clock.bind())
            .bind(lock)
            .fetch_optional(&mut *tx)
            .await?;
    let Some((status, stale)) = row else {
        return Err(QueueError::Invalid(format!("no run with key {}", req.key)));
    };
    let refuse = |detail: String, remedy: Remedy| Refused {
        action: req.action.as_str(),
        key: req.key.to_string(),
        status,
        detail,
        remedy,
    };
    let allowed = req.action.allowed(req.force);
    if !allowed.contains(&status) {
        let remedy = match (req.action, status) {
            (Action::Rerun, RunStatus::Succeeded | RunStatus::Skipped) => Remedy::ForceCorrection,
            (Action::Fail, RunStatus::Pending) => Remedy::ForceNotStarted,
            _ => Remedy::None,
        };
        let names: Vec<&str> = allowed.iter().map(|s| s.as_str()).collect();
        return Ok(Err(refuse(
            format!(" (allowed from {})", names.join(" or ")),
            remedy,
        )));
    }
    if req.action == Action::Fail && status == RunStatus::Running && !stale && !req.force {
        return Ok(Err(refuse(
            " with a live lease and not past stale_after".into(),
            Remedy::CheckStaleOrForce,
        )));
    }
    Ok(Ok(status))
}

/// Applies an operator action: one conditional UPDATE of the run plus its
/// audit row, in one transaction. Of two operators acting at once, exactly
/// one succeeds; the other is refused with the state the first left.
pub async fn apply_action(
    pool: &PgPool,
    req: &OperatorRequest,
    clock: Clock,
) -> Result<Result<ActionOutcome, Refused>, QueueError> {
    apply_action_in(pool, pool.begin().await?, req, clock, None).await
}

/// Where an action comes from when it is not the command line
/// (`blockers::act_from`).
#[derive(Debug, Clone)]
pub struct Origin {
    /// The operator's remote address, recorded in the audit row's
    /// `remote_addr` (the stamp trigger reads it from a setting local to the
    /// action's transaction, so no caller can write the column itself).
    pub remote_addr: String,
    /// The state the operator's preview showed: the action applies only if
    /// the run is still in it, so a confirmation never applies to a run
    /// another operator changed in between.
    pub expected_before: Option<RunStatus>,
}

/// [`apply_action`] in a transaction the caller opened (and may have set a
/// `lock_timeout` in).
pub(crate) async fn apply_action_in(
    pool: &PgPool,
    mut tx: Transaction<'static, Postgres>,
    req: &OperatorRequest,
    clock: Clock,
    expected_before: Option<RunStatus>,
) -> Result<Result<ActionOutcome, Refused>, QueueError> {
    let before = match check_action(&mut tx, req, clock, true).await? {
        Ok(b) => b,
        Err(refused) => return Ok(Err(refused)),
    };
    if let Some(expected) = expected_before.filter(|e| *e != before) {
        tx.rollback().await?;
        return Ok(Err(Refused {
            action: req.action.as_str(),
            key: req.key.to_string(),
            status: before,
            detail: format!(" now, not {expected} as when the action was previewed; look again"),
            remedy: Remedy::None,
        }));
    }
    let allowed: Vec<&str> = req
        .action
        .allowed(req.force)
        .iter()
        .map(|s| s.as_str())
        .collect();
    let message = truncate(&format!(
        "{} by operator {}: {}",
        match req.action {
            Action::Fail => "failed",
            Action::Rerun => "re-run",
            Action::Skip => "skipped",
        },
        req.operator,
        req.reason
    ));
    // check_action locked the row, so this cannot miss; the function's
    // WHERE repeats the expected state all the same. The new state, the
    // closed attempt and the audit row are one call of a database function
    // (migration 20261203000004): the operator role can change a run no
    // other way, and the audit row's time and session are the database's.
    let updated: Option<String> = crate::db::query_scalar(
        "SELECT batchonce_operator_apply($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(req.key.as_str())
    .bind(req.action.as_str())
    .bind(&allowed)
    .bind(req.action.target().as_str())
    .bind(&message)
    .bind(clock.bind())
    .bind(req.max_attempts as i32)
    .bind(req.operator.as_str())
    .bind(req.reason.as_str())
    .bind(before.as_str())
    .fetch_one(&mut *tx)
    .await?;
    if updated.is_none() {
        tx.rollback().await?;
        let mut stmt = crate::db::statement(pool).await?;
        let status: RunStatus =
            crate::db::query_scalar("SELECT status FROM batch_job_run WHERE job_key = $1")
                .bind(req.key.as_str())
                .fetch_one(stmt.conn())
                .await?;
        stmt.done().await?;
        return Ok(Err(Refused {
            action: req.action.as_str(),
            key: req.key.to_string(),
            status,
            detail: " (another action changed it first)".into(),
            remedy: Remedy::None,
        }));
    }
    tx.commit().await?;
    Ok(Ok(ActionOutcome {
        job_key: req.key.to_string(),
        action: req.action.as_str().into(),
        before,
        after: req.action.target(),
        applied: true,
    }))
}
