//! Read views of scoped runs (migration `20261204000003_scopes.sql`): how
//! many scopes of a job's period are in each state, and which. `status`, the
//! console and the exporter read them; nothing here writes.
//!
//! A scoped job's period is one run per scope (`<job>:<period>@<scope>`). A
//! view groups those runs by job and period (the key before the `@`), counts
//! each state and names the first [`NAMED`] scopes of each state in order,
//! so a period of 10,000 scopes reads as one line and the few that need
//! attention. A scoped run's partitions are not counted: the run counts
//! once, as a partitioned run does everywhere else.

use chrono::NaiveDate;
use sqlx::{PgPool, Row};

use super::{QueueError, RunStatus};
use crate::key::JobName;

/// How many scopes of one state a view names; the rest are counted.
pub const NAMED: usize = 10;

/// How many periods one view lists at most, whatever the number of jobs.
pub const MAX_PERIODS: i64 = 20;

/// One period of a scoped job: its scopes' runs per state.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ScopePeriod {
    pub job_name: String,
    /// The period's key without a scope, e.g. `daily-settlement:2026-09-15`.
    pub period_key: String,
    pub business_date: NaiveDate,
    /// Scoped runs of the period.
    pub scopes: i64,
    /// Every state (zeros included), in the order of [`RunStatus::ALL`].
    pub states: Vec<ScopeState>,
}

/// The scopes of a period in one state.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ScopeState {
    pub status: RunStatus,
    pub count: i64,
    /// The first [`NAMED`] of them, in order; `count` says how many more.
    pub named: Vec<String>,
}

impl ScopePeriod {
    /// The scopes in `status`.
    pub fn state(&self, status: RunStatus) -> Option<&ScopeState> {
        self.states.iter().find(|s| s.status == status)
    }

    /// Scopes not done: neither SUCCEEDED nor SKIPPED.
    pub fn open(&self) -> i64 {
        self.states
            .iter()
            .filter(|s| !matches!(s.status, RunStatus::Succeeded | RunStatus::Skipped))
            .map(|s| s.count)
            .sum()
    }
}

/// The periods of scoped jobs (of `job`, or of every job) an operator needs:
/// the `newest` periods of each job, and every older one with a scope not
/// done (PENDING, RUNNING or FAILED), newest first within a job, at most
/// [`MAX_PERIODS`] in all.
pub async fn scope_periods(
    pool: &PgPool,
    job: Option<&JobName>,
    newest: i64,
) -> Result<Vec<ScopePeriod>, QueueError> {
    let mut stmt = crate::db::statement(pool).await?;
    let rows = crate::db::query(
        r#"
        -- The scoped jobs: a loose scan of the scoped runs' index, one
        -- probe per job.
        WITH RECURSIVE scoped_jobs AS (
            SELECT min(r.job_name)::text AS job_name FROM batch_job_run r
            WHERE r.scope IS NOT NULL AND ($1::text IS NULL OR r.job_name = $1)
            UNION ALL
            SELECT (SELECT min(r.job_name)::text FROM batch_job_run r
                    WHERE r.scope IS NOT NULL AND r.job_name > j.job_name
                      AND ($1::text IS NULL OR r.job_name = $1))
            FROM scoped_jobs j WHERE j.job_name IS NOT NULL
        ),
        -- Each job's newest $2 periods, newest first, one probe each
        -- through the scoped runs' index.
        periods AS (
            SELECT j.job_name, (SELECT max(r.period_start) FROM batch_job_run r
                                WHERE r.job_name = j.job_name AND r.scope IS NOT NULL) AS ps,
                   1 AS n
            FROM scoped_jobs j WHERE j.job_name IS NOT NULL
            UNION ALL
            SELECT x.job_name, (SELECT max(r.period_start) FROM batch_job_run r
                                WHERE r.job_name = x.job_name AND r.scope IS NOT NULL
                                  AND r.period_start < x.ps),
                   x.n + 1
            FROM periods x WHERE x.ps IS NOT NULL AND x.n < $2
        ),
        -- Older periods with scopes not done, from the lists of open runs.
        open_periods AS (
            SELECT r.job_name::text AS job_name, r.period_start AS ps
            FROM batch_job_run r
            WHERE r.job_key = ANY (ARRAY(
                    SELECT d.job_key FROM batch_job_due d WHERE d.scoped
                    UNION SELECT l.job_key FROM batch_job_running l))
              AND r.scope IS NOT NULL AND r.partition_of IS NULL
              AND r.status IN ('PENDING', 'RUNNING')
              AND ($1::text IS NULL OR r.job_name = $1)
            UNION
            SELECT x.job_name::text, x.period_start FROM batch_job_failed x
            WHERE x.scoped AND NOT x.part AND ($1::text IS NULL OR x.job_name = $1)
        ), chosen AS (
            SELECT job_name, ps FROM (
                SELECT job_name, ps FROM periods WHERE ps IS NOT NULL
                UNION SELECT job_name, ps FROM open_periods) c
            ORDER BY job_name, ps DESC
            LIMIT $3
        )
        -- Each chosen period's runs through the scoped runs' index; OFFSET 0
        -- keeps the subquery from being merged into a join (which hashed
        -- every scoped run of the ledger).
        SELECT c.job_name, r.period_key, r.business_date, r.status, count(*) AS n,
               (array_agg(r.scope::text ORDER BY r.scope))[1:$4] AS named
        FROM chosen c CROSS JOIN LATERAL (
            SELECT split_part(r.job_key, '@', 1) AS period_key, r.business_date,
                   r.status, r.scope
            FROM batch_job_run r
            WHERE r.job_name = c.job_name AND r.period_start = c.ps
              AND r.scope IS NOT NULL AND r.partition_of IS NULL OFFSET 0) r
        GROUP BY c.job_name, c.ps, r.period_key, r.business_date, r.status
        ORDER BY c.job_name, c.ps DESC, r.period_key
        "#,
    )
    .bind(job.map(JobName::as_str))
    .bind(newest.max(1))
    .bind(MAX_PERIODS)
    .bind(NAMED as i32)
    .fetch_all(stmt.conn())
    .await?;
    stmt.done().await?;
    let mut out: Vec<ScopePeriod> = Vec::new();
    for r in &rows {
        let job_name: String = r.try_get("job_name")?;
        let period_key: String = r.try_get("period_key")?;
        let state = ScopeState {
            status: r.try_get("status")?,
            count: r.try_get("n")?,
            named: r
                .try_get::<Option<Vec<String>>, _>("named")?
                .unwrap_or_default(),
        };
        match out.last_mut() {
            Some(p) if p.job_name == job_name && p.period_key == period_key => {
                p.scopes += state.count;
                p.states.push(state);
            }
            _ => out.push(ScopePeriod {
                job_name,
                period_key,
                business_date: r.try_get("business_date")?,
                scopes: state.count,
                states: vec![state],
            }),
        }
    }
    // Every state, zeros included and in one order, so a reader (and a
    // table) never has to ask whether a missing state means none.
    for p in &mut out {
        let mut states = Vec::with_capacity(RunStatus::ALL.len());
        for st in RunStatus::ALL {
            let found = p.states.iter().position(|s| s.status == st);
            states.push(match found {
                Some(i) => p.states.swap_remove(i),
                None => ScopeState {
                    status: st,
                    count: 0,
                    named: Vec::new(),
                },
            });
        }
        p.states = states;
    }
    Ok(out)
}
