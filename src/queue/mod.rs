//! The queue layer: every statement on `batch_job_run` and
//! `batch_job_attempt`, and the writes to `batch_operator_action` and
//! `batch_job_declared`. Nothing outside this folder writes those tables; the
//! runtime, the operator tools and the command line call these functions.
//! The states and transitions of a run are in `docs/state_machine.md`.
//!
//! Invariants:
//!
//! - Every state change is one conditional statement whose `WHERE` names the
//!   state it expects (and, for a worker, its lease token), so two actors
//!   racing on one run can never both win.
//! - All times come from the [`Clock`](crate::clock::Clock), which is the
//!   database's `now()` outside tests.
//! - This layer never reads a configuration file to decide about a run
//!   already enqueued (every policy it applies is the one stored with the
//!   run), never sleeps or retries on its own (the caller owns timing; see
//!   [`QueueError::is_transient`]), and never knows a job kind.
//!
//! The files, one concern each (each file's own documentation says more):
//! `enqueue.rs` inserting runs; `lease.rs` claim, heartbeat and the fenced
//! transaction; `finish.rs` ending attempts, backoff, lease-expiry recovery;
//! `actions.rs` the audited operator actions; `archive.rs` retention;
//! `blockers.rs` sessions that hold locks others wait for, and the way
//! through them; `operator_enqueue.rs` an operator's audited enqueue of
//! missing periods; `declared.rs` the jobs `migrate` declares; `expected.rs`
//! the periods a stored schedule made due; `health.rs` each job's health, the
//! one answer of the console's overview and `status`; `context.rs` the
//! run-context columns; `pause.rs` paused jobs; `partitions.rs` partitioned
//! runs; `runs.rs` `runs list`, `runs show` and a run's operator history;
//! `scopes.rs` scope counts of a scoped job's period; `search.rs` the
//! console's run lists and audit log; `views.rs` `status`, `stale_runs` and
//! the exporter's `gauges`, which share one SQL rule for what is stale.

mod actions;
mod archive;
pub mod blockers;
pub mod context;
mod declared;
mod enqueue;
mod expected;
mod finish;
mod health;
mod lease;
mod operator_enqueue;
mod partitions;
pub mod pause;
mod runs;
mod scopes;
mod search;
mod views;

pub use actions::{
    apply_action, preview_action, Action, ActionOutcome, OperatorRequest, Origin, Refused, Remedy,
};
pub(crate) use actions::{apply_action_in, preview_action_in};
pub use archive::{
    archive, archive_batch, preview as preview_archive, show_archived, ArchiveError,
    ArchiveRefused, ArchiveRequest, Archived, ArchivedJob, ARCHIVED_SQLSTATE, MAX_ARCHIVE_BATCH,
};
pub use declared::{
    config_from_declared, declare, declared_job, declared_jobs, declared_settings, not_as_declared,
    Declared, DeclaredJob,
};
pub use enqueue::{
    count_scopes, delete_preflight_run, enqueue, may_choose_clock, EnqueueReport, NewRun,
    PREFLIGHT_JOB,
};
pub use expected::{
    DuePeriod, Expected, FirstPeriod, SettingsSource, Window, LOOKBACK_DAYS,
    LOOKBACK_DAYS_SUB_DAILY,
};
pub use finish::{
    backoff_delay, finish, finish_many, finish_many_detailed, finish_many_within, fold_tally,
    record_output, recover_expired, AttemptCounts, Finish, Finished, Recovered, MAX_FINISH_BATCH,
    MAX_OUTPUT_CHARS,
};
pub use health::{
    job_health, job_schedule, periods_without_runs, why_missing, Banner, Health, JobHealth,
    JobSchedule, Missing, MissingPeriod, Producers, ScheduleInfo, MAX_CHECKED_PERIODS,
    MISSING_LISTED, OVERDUE_AFTER,
};
pub use lease::{
    begin_fenced, claim, heartbeat, ClaimSpec, Fence, FencedTx, HeartbeatReport, HeldLease, Lease,
    MIN_FENCED_IDLE,
};
pub use operator_enqueue::{
    existing_runs, job_known, operator_enqueue, OperatorEnqueued, MAX_OPERATOR_ENQUEUE,
};
pub use partitions::{is_waiting, partitions, Step, WAITING_YEAR};
pub use pause::{paused_jobs, Paused};
pub use runs::{actions, list_runs, show_run, ActionView, AttemptView, RunView};
pub use scopes::{scope_periods, ScopePeriod, ScopeState, MAX_PERIODS, NAMED as NAMED_SCOPES};
pub use search::{
    audit_log, database_now, latest_runs, recent_runs, search_runs, AuditFilter, AuditRow,
    RecentRun, RunCursor, RunFilter, RECENT_RUNS,
};
pub use views::{
    gauges, registry_problems, stale_runs, status, Conclusion, JobGauges, QueueStatus,
    RegistryProblem, StaleBrief, StaleRun, StatusCount, CONFIG_PROBLEM, WORKER_PROBLEM,
};

/// The channel `enqueue` notifies so idle workers wake at once.
pub const NOTIFY_CHANNEL: &str = "batchonce_run";
/// Largest payload stored, in bytes of its JSON text (the schema's CHECK).
pub const MAX_PAYLOAD_BYTES: usize = 65_536;

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The caller's lease token no longer owns the run: another worker or an
    /// operator took it over. Nothing was written.
    #[error("lease lost on {0}: the run was taken over; nothing was written")]
    LeaseLost(String),
    #[error("{0}")]
    Invalid(String),
    /// A transient database failure reported on behalf of a batched
    /// statement (the worker's completer), where the original error cannot be
    /// handed to every caller.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

impl QueueError {
    /// Whether retrying the same call later may succeed (connection trouble,
    /// a restarting server, shutdown, serialization failures, deadlocks).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Database(e) => is_transient(e),
            Self::Unavailable(_) => true,
            _ => false,
        }
    }
}

/// Connection-level trouble and server restarts, as opposed to bad SQL or data.
pub fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => {
            let code = db.code();
            let code = code.as_deref().unwrap_or("");
            // 08: connection exception, 57P: operator intervention (shutdown),
            // 40001/40P01: serialization failure and deadlock, 53: resources.
            code.starts_with("08")
                || code.starts_with("57P")
                || code.starts_with("53")
                || code == "40001"
                || code == "40P01"
        }
        _ => false,
    }
}

/// The states of a run (`docs/state_machine.md`). The database stores each
/// as its upper-case name (`batch_job_run.status`, a `varchar` the schema's
/// CHECK limits to these five); [`Display`](std::fmt::Display), serde and
/// sqlx all use that text, so the command line, the JSON and the console
/// print exactly what is stored.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "UPPERCASE")]
pub enum RunStatus {
    Pending,
    Running,
    Succeeded,
    Failed,
    Skipped,
}

impl RunStatus {
    pub const ALL: [RunStatus; 5] = [
        Self::Pending,
        Self::Running,
        Self::Succeeded,
        Self::Failed,
        Self::Skipped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Running => "RUNNING",
            Self::Succeeded => "SUCCEEDED",
            Self::Failed => "FAILED",
            Self::Skipped => "SKIPPED",
        }
    }

    /// An operator's spelling, in any case (`--status failed`); the
    /// database's text is parsed exactly, by [`FromStr`](std::str::FromStr).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s))
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Skipped)
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, so that `{:<10}` aligns a status as it aligns a string.
        f.pad(self.as_str())
    }
}

/// Text that names no run state: a row the schema's CHECK should have
/// refused, or a state of a newer release.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown run status {0:?} (expected PENDING, RUNNING, SUCCEEDED, FAILED or SKIPPED)")]
pub struct UnknownStatus(pub String);

impl std::str::FromStr for RunStatus {
    type Err = UnknownStatus;

    /// The stored text, exactly (upper case).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

// By hand rather than `#[derive(sqlx::Type)]`: the derive would declare a
// type of its own name, which sqlx's type check refuses for a `varchar` or
// `text` column; this accepts every column `&str` does and decodes through
// `FromStr`, so an unknown state is a decode error, never a default.
impl sqlx::Type<sqlx::Postgres> for RunStatus {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <&str as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for RunStatus {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let text = <&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?;
        Ok(text.parse()?)
    }
}

impl sqlx::Encode<'_, sqlx::Postgres> for RunStatus {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        <&str as sqlx::Encode<sqlx::Postgres>>::encode(self.as_str(), buf)
    }
}

impl sqlx::postgres::PgHasArrayType for RunStatus {
    fn array_type_info() -> sqlx::postgres::PgTypeInfo {
        <&str as sqlx::postgres::PgHasArrayType>::array_type_info()
    }

    fn array_compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <&str as sqlx::postgres::PgHasArrayType>::array_compatible(ty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip() {
        for s in RunStatus::ALL {
            assert_eq!(RunStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(RunStatus::parse("failed"), Some(RunStatus::Failed));
        assert_eq!(RunStatus::parse("DONE"), None);
    }

    #[test]
    fn statuses_round_trip_through_text_and_json() {
        for s in RunStatus::ALL {
            assert_eq!(s.to_string().parse::<RunStatus>(), Ok(s));
            let json = serde_json::to_value(s).unwrap();
            assert_eq!(json, serde_json::json!(s.as_str()));
            assert_eq!(serde_json::from_value::<RunStatus>(json).unwrap(), s);
        }
        // Widths align a status as they align its text (`demo`'s table).
        assert_eq!(format!("[{:<9}]", RunStatus::Failed), "[FAILED   ]");
        // The stored text is exact: only an operator's spelling may differ.
        assert!("failed".parse::<RunStatus>().is_err());
        let err = "DONE".parse::<RunStatus>().unwrap_err();
        assert!(err.to_string().contains("\"DONE\""), "{err}");
    }
}
