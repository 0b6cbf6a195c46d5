//! Partitioned runs (migration `20261204000002_partitions.sql`): which step
//! of a run a lease is for, and the read view of a parent's partitions.
//!
//! A job with `partitions = N` is enqueued as one parent run and N partition
//! runs (keys `<parent>.p1` … `<parent>.pN`), which the database inserts
//! together, so the partitioning is fixed with the run. Each partition is
//! claimed, heartbeated, fenced, retried and recovered like any run, by the
//! statements in `lease.rs` and `finish.rs`; its token fences only its own
//! writes. A trigger keeps the parent in step: it waits (PENDING, due at
//! [`WAITING_YEAR`]-12-31) while partitions are unfinished, is FAILED as soon as one is
//! FAILED, and becomes due when all have succeeded, when its claim runs the
//! job's final step once. An operator action on the parent reaches its
//! partitions (`batchonce_operator_apply`); a rerun re-runs only the FAILED
//! or SKIPPED ones. Which partition an item belongs to is
//! `batchonce_partition(item_key, N)` in SQL (MD5-based, the same everywhere).

use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};

use super::runs::{run_from_row, RunView, RUN_COLUMNS};
use super::{context, QueueError, RunStatus};
use crate::key::JobKey;

/// When a partitioned parent is due while its partitions are unfinished:
/// never in practice, and a date every reader can decode.
pub const WAITING_YEAR: i32 = 9999;

/// Whether a run is a parent waiting for its partitions.
pub fn is_waiting(run: &RunView) -> bool {
    use chrono::Datelike;
    matches!(run.step, Step::Final { .. })
        && run.status == RunStatus::Pending
        && run.next_run_at.year() >= WAITING_YEAR
}

/// What one claimed run asks of its handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "step", rename_all = "lowercase")]
pub enum Step {
    /// A run that is not partitioned: all of its work.
    Whole,
    /// Partition `no` (1-based) of `count`: the items for which
    /// `batchonce_partition(item_key, count) = no`, and nothing else.
    Partition { no: u16, count: u16 },
    /// The final step of a partitioned run, once every partition succeeded
    /// (a summary over all of them, for example).
    Final { count: u16 },
}

impl Step {
    /// The step of a row that selects `partition_no` and `partition_count`.
    pub(crate) fn from_row(row: &PgRow) -> Result<Self, QueueError> {
        let no: Option<i32> = row.try_get("partition_no")?;
        let count: Option<i32> = row.try_get("partition_count")?;
        let bad = || QueueError::Invalid(format!("invalid partition {no:?} of {count:?}"));
        let count = count
            .map(|c| u16::try_from(c).map_err(|_| bad()))
            .transpose()?;
        Ok(match (no, count) {
            (None, None) => Step::Whole,
            (None, Some(count)) => Step::Final { count },
            (Some(no), Some(count)) => Step::Partition {
                no: u16::try_from(no).map_err(|_| bad())?,
                count,
            },
            (Some(_), None) => return Err(bad()),
        })
    }

    /// The environment a command job's program gets for this step:
    /// `BATCHONCE_STEP` (`whole`, `partition` or `final`), and for a
    /// partitioned run `BATCHONCE_PARTITIONS`, and `BATCHONCE_PARTITION` for
    /// a partition.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        match *self {
            Step::Whole => vec![("BATCHONCE_STEP", "whole".into())],
            Step::Partition { no, count } => vec![
                ("BATCHONCE_STEP", "partition".into()),
                ("BATCHONCE_PARTITION", no.to_string()),
                ("BATCHONCE_PARTITIONS", count.to_string()),
            ],
            Step::Final { count } => vec![
                ("BATCHONCE_STEP", "final".into()),
                ("BATCHONCE_PARTITIONS", count.to_string()),
            ],
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Whole => f.write_str("whole run"),
            Step::Partition { no, count } => write!(f, "partition {no} of {count}"),
            Step::Final { count } => write!(f, "final step after {count} partitions"),
        }
    }
}

/// The partitions of a parent run, in partition order (none for a run that
/// is not partitioned).
pub async fn partitions(pool: &PgPool, parent: &JobKey) -> Result<Vec<RunView>, QueueError> {
    let sql = format!(
        "SELECT {RUN_COLUMNS}, {} FROM batch_job_run r WHERE r.partition_of = $1 \
         ORDER BY r.partition_no",
        context::COLUMNS
    );
    let mut stmt = crate::db::statement(pool).await?;
    let rows = crate::db::query(&sql)
        .bind(parent.as_str())
        .fetch_all(stmt.conn())
        .await?;
    stmt.done().await?;
    rows.iter().map(run_from_row).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_name_themselves_for_programs_and_people() {
        let p = Step::Partition { no: 2, count: 4 };
        assert_eq!(p.to_string(), "partition 2 of 4");
        assert!(p.env().contains(&("BATCHONCE_PARTITION", "2".into())));
        assert!(Step::Final { count: 4 }
            .env()
            .contains(&("BATCHONCE_STEP", "final".into())));
        assert_eq!(Step::Whole.env().len(), 1);
    }
}
