//! Sessions that hold the locks others wait for.
//!
//! A fenced transaction keeps its run row locked `FOR KEY SHARE` while its
//! statements run, and every takeover (release, recovery, `runs fail`)
//! changes the lease token, which takes `FOR UPDATE` (a trigger, migration
//! 20261207000001), so it waits for that lock. When a
//! handler's statement itself waits on a lock that another session holds
//! (an operator's `psql` holding summary rows), everything behind the run
//! waits with it. This module gives each party a way out:
//!
//! - **The worker** records the server session of every open fenced
//!   transaction ([`FenceSessions`], filled by [`super::FencedTx::track`]).
//!   Dropping an abandoned handler does not stop its statement on the
//!   server, so the worker ends those sessions itself ([`terminate_own`])
//!   and its release can take the row.
//! - **An operator action** waits a bounded time for the run's row
//!   (`lock_timeout`), watches from a second connection which sessions block
//!   it (`pg_blocking_pids`), names them when it gives up, and, asked to,
//!   writes an audit row, terminates them and tries once more ([`act`]).
//! - **`runs stale`** reports a lease owner's session that waits on a lock,
//!   and who it waits for ([`lock_wait`]).
//!
//! Sessions are named by pid and transaction start (`xact_start`) together,
//! so a pid the server has since given to another session, or a session
//! that has moved on to another transaction, is never terminated.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};

use super::{ActionOutcome, OperatorRequest, QueueError, Refused};
use crate::clock::Clock;

/// One server session in one transaction: the backend's pid and the start
/// of its transaction (`now()` in it, `pg_stat_activity.xact_start`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionTx {
    pub pid: i32,
    pub xact_start: DateTime<Utc>,
}

/// The open fenced transactions of one run, for the worker to end if it
/// abandons the run's handler.
#[derive(Debug, Clone, Default)]
pub struct FenceSessions(Arc<Mutex<Vec<SessionTx>>>);

impl FenceSessions {
    /// The sessions open now. Take it before dropping the handler: dropping
    /// removes them, while their statements may still run on the server.
    pub fn snapshot(&self) -> Vec<SessionTx> {
        self.lock().clone()
    }

    pub(super) fn add(&self, s: SessionTx) -> Tracked {
        self.lock().push(s);
        Tracked {
            set: self.clone(),
            session: s,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<SessionTx>> {
        // A poisoned lock only means a panic elsewhere; the list stays usable.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Keeps a session in its [`FenceSessions`] until dropped, which happens
/// when its fenced transaction commits, rolls back or is dropped.
#[derive(Debug)]
pub struct Tracked {
    set: FenceSessions,
    session: SessionTx,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut v = self.set.lock();
        if let Some(i) = v.iter().position(|s| *s == self.session) {
            v.swap_remove(i);
        }
    }
}

/// One of the worker's own sessions it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub pid: i32,
    /// `Lock/transactionid` and the like, when it was waiting.
    pub waiting_on: Option<String>,
}

/// Terminates those of `sessions` that are still in the transaction
/// recorded (a worker's abandoned fenced transactions, whose statements
/// may still run and lock on the server). Terminating sessions of one's own
/// role needs no privilege. Returns the sessions ended.
pub async fn terminate_own(
    pool: &PgPool,
    sessions: &[SessionTx],
) -> Result<Vec<Ended>, QueueError> {
    if sessions.is_empty() {
        return Ok(Vec::new());
    }
    let pids: Vec<i32> = sessions.iter().map(|s| s.pid).collect();
    let starts: Vec<DateTime<Utc>> = sessions.iter().map(|s| s.xact_start).collect();
    let mut stmt = crate::db::statement(pool).await?;
    // MATERIALIZED: the filter is decided before pg_terminate_backend is
    // called, never pushed below the join onto every session of the server.
    let rows = crate::db::query(
        r#"
        WITH target AS MATERIALIZED (
            SELECT a.pid, a.wait_event_type || '/' || a.wait_event AS waiting_on
            FROM pg_stat_activity a
            JOIN unnest($1::int4[], $2::timestamptz[]) AS t(pid, xact_start)
              ON a.pid = t.pid AND a.xact_start = t.xact_start
            WHERE a.pid <> pg_backend_pid()
        )
        SELECT pid, waiting_on FROM target WHERE pg_terminate_backend(pid)
        "#,
    )
    .bind(&pids)
    .bind(&starts)
    .fetch_all(stmt.conn())
    .await?;
    stmt.done().await?;
    rows.iter()
        .map(|r| {
            Ok(Ended {
                pid: r.try_get("pid")?,
                waiting_on: r.try_get("waiting_on")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(QueueError::from)
}

/// A server session as `pg_stat_activity` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Session {
    pub pid: i32,
    /// The worker id, for a worker's session.
    pub application_name: String,
    pub user: Option<String>,
    pub backend_type: Option<String>,
    /// `active`, `idle in transaction`, …
    pub state: Option<String>,
    pub xact_start: Option<DateTime<Utc>>,
    /// How long it has been in its current transaction.
    pub xact_age_seconds: Option<f64>,
    pub query_start: Option<DateTime<Utc>>,
    pub query_age_seconds: Option<f64>,
    /// What it waits for now (`Lock`/`transactionid`, `Client`/`ClientRead`).
    pub wait_event_type: Option<String>,
    pub wait_event: Option<String>,
    /// The sessions it waits for, if it waits on a lock.
    pub blocking_pids: Vec<i32>,
    /// The start of its current (or last) statement.
    pub query: Option<String>,
}

impl Session {
    fn from_row(r: &PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            pid: r.try_get("pid")?,
            application_name: r
                .try_get::<Option<String>, _>("application_name")?
                .unwrap_or_default(),
            user: r.try_get("usename")?,
            backend_type: r.try_get("backend_type")?,
            state: r.try_get("state")?,
            xact_start: r.try_get("xact_start")?,
            xact_age_seconds: r.try_get("xact_age")?,
            query_start: r.try_get("query_start")?,
            query_age_seconds: r.try_get("query_age")?,
            wait_event_type: r.try_get("wait_event_type")?,
            wait_event: r.try_get("wait_event")?,
            blocking_pids: r.try_get("blocking_pids")?,
            query: r.try_get("query")?,
        })
    }

    /// `session PID (APPLICATION_NAME)`.
    pub fn name(&self) -> String {
        format!("session {} ({})", self.pid, self.application_name)
    }

    /// One line for a person: who it is, what it does, what it waits for.
    pub fn describe(&self) -> String {
        let secs = |s: Option<f64>| s.map_or("?".to_owned(), |s| format!("{s:.1}s"));
        let mut line = format!(
            "{}: user {}, {}",
            self.name(),
            self.user.as_deref().unwrap_or("?"),
            self.state.as_deref().unwrap_or("state unknown")
        );
        if self.xact_start.is_some() {
            line.push_str(&format!(
                ", in its transaction for {}",
                secs(self.xact_age_seconds)
            ));
        }
        if self.query_start.is_some() {
            line.push_str(&format!(
                ", statement started {} ago",
                secs(self.query_age_seconds)
            ));
        }
        match (&self.wait_event_type, &self.wait_event) {
            (Some(t), Some(e)) if t == "Lock" => {
                line.push_str(&format!(", waiting on a lock ({e})"));
                if !self.blocking_pids.is_empty() {
                    let pids: Vec<String> =
                        self.blocking_pids.iter().map(|p| p.to_string()).collect();
                    line.push_str(&format!(" held by session {}", pids.join(", ")));
                }
            }
            (Some(t), Some(e)) => line.push_str(&format!(", waiting for {t}/{e}")),
            _ => {}
        }
        line
    }
}

/// A session that blocks another, with the sessions that block it in turn.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Blocker {
    #[serde(flatten)]
    pub session: Session,
    pub blocked_by: Vec<Session>,
}

const SESSION_COLUMNS: &str = "a.pid, a.application_name, a.usename::text AS usename, \
    a.backend_type, a.state, a.xact_start, \
    extract(epoch FROM clock_timestamp() - a.xact_start)::float8 AS xact_age, a.query_start, \
    extract(epoch FROM clock_timestamp() - a.query_start)::float8 AS query_age, \
    a.wait_event_type, a.wait_event, pg_blocking_pids(a.pid) AS blocking_pids, \
    left(a.query, 200) AS query";

/// The sessions that `pg_blocking_pids` names for session `pid` now, each
/// with the sessions that block it in turn, as `pg_stat_activity` shows
/// them (the query cut to its first 200 characters).
pub async fn blockers_of(pool: &PgPool, pid: i32) -> Result<Vec<Blocker>, QueueError> {
    let sql = format!(
        r#"
        WITH direct AS (SELECT DISTINCT unnest(pg_blocking_pids($1)) AS pid),
        behind AS (
            SELECT DISTINCT d.pid AS of, unnest(pg_blocking_pids(d.pid)) AS pid FROM direct d
        )
        SELECT NULL::int4 AS of, {SESSION_COLUMNS}
        FROM pg_stat_activity a JOIN direct d ON a.pid = d.pid
        UNION ALL
        SELECT b.of, {SESSION_COLUMNS}
        FROM pg_stat_activity a JOIN behind b ON a.pid = b.pid
        "#
    );
    let mut stmt = crate::db::statement(pool).await?;
    let rows = crate::db::query(&sql)
        .bind(pid)
        .fetch_all(stmt.conn())
        .await?;
    stmt.done().await?;
    let mut direct: Vec<Blocker> = Vec::new();
    let mut behind: Vec<(i32, Session)> = Vec::new();
    for r in &rows {
        let of: Option<i32> = r.try_get("of")?;
        let s = Session::from_row(r)?;
        match of {
            None => direct.push(Blocker {
                session: s,
                blocked_by: Vec::new(),
            }),
            Some(of) => behind.push((of, s)),
        }
    }
    for (of, s) in behind {
        if let Some(b) = direct.iter_mut().find(|b| b.session.pid == of) {
            b.blocked_by.push(s);
        }
    }
    direct.sort_by_key(|b| b.session.pid);
    Ok(direct)
}

/// A lease owner's session that waits on a lock, for `runs stale`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LockWait {
    /// The waiting session (its `application_name` is the lease owner).
    pub pid: i32,
    pub wait_event_type: Option<String>,
    pub wait_event: Option<String>,
    /// Whether it is known to work on this run: its transaction holds the
    /// run's row (the row's `xmax` is its transaction id), or the owner
    /// holds no other run. When false, the owner's waiting session may be
    /// working on another of its runs (`--concurrency` > 1).
    pub for_this_run: bool,
    /// Since its waiting statement started.
    pub waiting_seconds: Option<f64>,
    /// Who it waits for.
    pub blockers: Vec<Blocker>,
}

/// The session of `owner` that waits on a lock, if any: preferably one
/// known to work on run `key`, else the one that has waited longest.
///
/// Which session holds a row lock shows only in the row's `xmax`: the
/// transaction id of its one locker, or, once a heartbeat has also locked
/// the row (`FOR NO KEY UPDATE`, which a fenced transaction's `FOR KEY
/// SHARE` lets through), a multixact, which SQL cannot tell from a
/// transaction id without `pageinspect`. So the owner holding no other run
/// counts as proof too.
pub async fn lock_wait(
    pool: &PgPool,
    key: &str,
    owner: &str,
) -> Result<Option<LockWait>, QueueError> {
    let mut stmt = crate::db::statement(pool).await?;
    let row = crate::db::query(
        r#"
        SELECT a.pid, a.wait_event_type, a.wait_event,
               (COALESCE(a.backend_xid = (SELECT r.xmax FROM batch_job_run r
                                          WHERE r.job_key = $1), false)
                OR (SELECT count(*) FROM batch_job_running l
                    JOIN batch_job_run r ON r.job_key = l.job_key
                    WHERE r.lease_owner = $2 AND r.status = 'RUNNING') = 1) AS for_this_run,
               extract(epoch FROM clock_timestamp() - a.query_start)::float8 AS waiting
        FROM pg_stat_activity a
        WHERE a.application_name = $2 AND a.datname = current_database()
          AND a.wait_event_type = 'Lock'
        ORDER BY for_this_run DESC, a.query_start
        LIMIT 1
        "#,
    )
    .bind(key)
    .bind(owner)
    .fetch_optional(stmt.conn())
    .await?;
    stmt.done().await?;
    let Some(row) = row else { return Ok(None) };
    let pid: i32 = row.try_get("pid")?;
    Ok(Some(LockWait {
        pid,
        wait_event_type: row.try_get("wait_event_type")?,
        wait_event: row.try_get("wait_event")?,
        for_this_run: row.try_get("for_this_run")?,
        waiting_seconds: row.try_get("waiting")?,
        blockers: blockers_of(pool, pid).await?,
    }))
}

/// How an operator action deals with a locked run.
#[derive(Debug, Clone, Copy)]
pub struct ActOptions {
    /// How long to wait for the run's row before naming who holds it.
    pub lock_timeout: Duration,
    /// If the row stays locked: audit, terminate the sessions that hold it,
    /// and try once more.
    pub terminate_blocker: bool,
    /// Check only, change nothing (and terminate nothing).
    pub dry_run: bool,
}

/// What an action did, with the sessions it terminated on the way.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ActReport {
    #[serde(flatten)]
    pub outcome: ActionOutcome,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub terminated: Vec<Session>,
}

/// The run's row stayed locked for the whole `lock_timeout`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Blocked {
    pub action: &'static str,
    pub job_key: String,
    pub lock_timeout_seconds: f64,
    /// The sessions that held the row, as last seen while waiting.
    pub blockers: Vec<Blocker>,
    /// Sessions terminated before the last try (`--terminate-blocker`).
    pub terminated: Vec<Session>,
}

impl std::fmt::Display for Blocked {
    /// One line: what gave up, who holds the row, what to do.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: gave up after {} waiting for the run's row",
            self.action,
            self.job_key,
            humantime::format_duration(Duration::from_secs_f64(self.lock_timeout_seconds))
        )?;
        if !self.terminated.is_empty() {
            let names: Vec<String> = self.terminated.iter().map(Session::name).collect();
            write!(f, " even after terminating {}", names.join(", "))?;
        }
        if self.blockers.is_empty() {
            return write!(
                f,
                "; the session that held it ended before it could be named: try again"
            );
        }
        let names: Vec<String> = self
            .blockers
            .iter()
            .map(|b| {
                let s = &b.session;
                let age = s
                    .xact_age_seconds
                    .map(|a| format!(", in its transaction for {a:.0}s"))
                    .unwrap_or_default();
                let waits = if b.blocked_by.is_empty() {
                    String::new()
                } else {
                    let behind: Vec<String> = b.blocked_by.iter().map(Session::name).collect();
                    format!(", itself waiting for {}", behind.join(", "))
                };
                format!(
                    "{}, {}{age}{waits}",
                    s.name(),
                    s.state.as_deref().unwrap_or("state unknown")
                )
            })
            .collect();
        write!(f, "; it is held by {}", names.join(" and "))?;
        if self.terminated.is_empty() {
            write!(
                f,
                "; add --terminate-blocker to end that session (audited) and try once more"
            )?;
        }
        Ok(())
    }
}

impl Blocked {
    /// The indented detail block printed under the error line.
    pub fn detail(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for b in &self.blockers {
            lines.push(format!("  {}", b.session.describe()));
            for s in &b.blocked_by {
                lines.push(format!("    {}", s.describe()));
            }
        }
        lines
    }
}

/// Why an operator action did not apply.
#[derive(Debug, thiserror::Error)]
pub enum ActError {
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error("{0}")]
    Blocked(Box<Blocked>),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

/// `runs fail|rerun|skip`: [`super::apply_action`] (or, dry, the preview)
/// waiting at most `lock_timeout` for the run's row. If it gives up, the
/// error names the sessions that held the row, as a second connection saw
/// them (`pg_blocking_pids`) while the action waited.
///
/// With `terminate_blocker`, unless the action would be refused anyway, it
/// tries once more and, as soon as that try waits for one of the same
/// sessions (pid and transaction), commits a `terminate-blocker` audit row
/// naming them and terminates them. The action is then already queued for
/// the row, so PostgreSQL gives the row to it before anything the ended
/// session's worker does next (its handler fails and would finish the
/// attempt): the action meets the state it checked, not a retry's.
///
/// The action's transaction first sets `lock_timeout` and reads
/// `pg_backend_pid()`; while it runs, [`blockers_of`] is asked about that
/// pid every [`WATCH_EVERY`] on a second connection. A lock timeout
/// (SQLSTATE 55P03) becomes [`ActError::Blocked`] with the last sessions
/// seen. The termination itself is [`terminate_audited`]'s.
pub async fn act(
    pool: &PgPool,
    req: &OperatorRequest,
    clock: Clock,
    opts: ActOptions,
) -> Result<ActReport, ActError> {
    act_from(pool, req, clock, opts, None).await
}

/// [`act`] from somewhere other than the command line (the console): the
/// audit row records `origin`'s remote address, and the action applies only
/// to the state `origin` previewed.
pub async fn act_from(
    pool: &PgPool,
    req: &OperatorRequest,
    clock: Clock,
    opts: ActOptions,
    origin: Option<&super::Origin>,
) -> Result<ActReport, ActError> {
    let blocked = |blockers, terminated| {
        ActError::Blocked(Box::new(Blocked {
            action: req.action.as_str(),
            job_key: req.key.to_string(),
            lock_timeout_seconds: opts.lock_timeout.as_secs_f64(),
            blockers,
            terminated,
        }))
    };
    let blockers = match attempt(pool, req, clock, opts, &[], origin).await?.0 {
        Attempt::Done(outcome) => {
            return Ok(ActReport {
                outcome,
                terminated: Vec::new(),
            })
        }
        Attempt::Refused(r) => return Err(r.into()),
        Attempt::Blocked(b) => b,
    };
    if !opts.terminate_blocker || opts.dry_run || blockers.is_empty() {
        return Err(blocked(blockers, Vec::new()));
    }
    // Ending a session only to be refused would help nobody: check the
    // state first, without waiting for the row.
    let mut tx = pool.begin().await.map_err(QueueError::from)?;
    let check = super::actions::check_action(&mut tx, req, clock, false).await?;
    tx.rollback().await.map_err(QueueError::from)?;
    if let Err(refused) = check {
        return Err(refused.into());
    }
    // Only client sessions: a process of PostgreSQL's own is never ended.
    let targets: Vec<Session> = blockers
        .iter()
        .map(|b| b.session.clone())
        .filter(|s| s.backend_type.as_deref() == Some("client backend"))
        .collect();
    if targets.is_empty() {
        return Err(QueueError::Invalid(format!(
            "{} {}: the sessions that hold the run's row are not client sessions, so they are not terminated: {}",
            req.action.as_str(),
            req.key,
            blockers
                .iter()
                .map(|b| b.session.describe())
                .collect::<Vec<_>>()
                .join("; ")
        ))
        .into());
    }
    let (outcome, terminated) = attempt(pool, req, clock, opts, &targets, origin).await?;
    match outcome {
        Attempt::Done(outcome) => Ok(ActReport {
            outcome,
            terminated,
        }),
        Attempt::Refused(r) => Err(r.into()),
        Attempt::Blocked(b) => Err(blocked(b, terminated)),
    }
}

enum Attempt {
    Done(ActionOutcome),
    Refused(Refused),
    Blocked(Vec<Blocker>),
}

/// How often a waiting action looks at who blocks it.
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// One try of the action, in a transaction with `lock_timeout` set, watched
/// from a second connection. If it waits for any of `end` (the same pid in
/// the same transaction), those are ended, audited first, and the action
/// takes the row when they are gone. Returns the sessions ended too.
async fn attempt(
    pool: &PgPool,
    req: &OperatorRequest,
    clock: Clock,
    opts: ActOptions,
    end: &[Session],
    origin: Option<&super::Origin>,
) -> Result<(Attempt, Vec<Session>), QueueError> {
    let mut tx = pool.begin().await?;
    if let Some(o) = origin {
        // The stamp trigger copies it into the audit row's `remote_addr`;
        // local to this transaction, so no other action inherits it.
        crate::db::query("SELECT set_config('batchonce.remote_addr', $1, true)")
            .bind(crate::text::truncate(&o.remote_addr))
            .execute(&mut *tx)
            .await?;
    }
    let expected = origin.and_then(|o| o.expected_before);
    // For this transaction only, so it holds through PgBouncer too, whose
    // server connection stays the same for one transaction (and so does
    // the pid).
    let (pid, _): (i32, String) =
        crate::db::query_as("SELECT pg_backend_pid(), set_config('lock_timeout', $1, true)")
            .bind(format!("{}ms", opts.lock_timeout.as_millis().max(1)))
            .fetch_one(&mut *tx)
            .await?;
    let action = async move {
        if opts.dry_run {
            super::preview_action_in(tx, req, clock).await
        } else {
            super::apply_action_in(pool, tx, req, clock, expected).await
        }
    };
    tokio::pin!(action);
    // Most actions never wait: the first look comes after half a period.
    let mut watch =
        tokio::time::interval_at(tokio::time::Instant::now() + WATCH_EVERY / 2, WATCH_EVERY);
    let mut seen = Vec::new();
    let mut ended: Option<Vec<Session>> = None;
    let result = loop {
        tokio::select! {
            r = &mut action => break r,
            _ = watch.tick() => {
                // A look that fails is no reason to fail the action; the
                // last sessions seen are kept.
                let Ok(now) = blockers_of(pool, pid).await else { continue };
                if ended.is_none() {
                    let due: Vec<&Session> = end
                        .iter()
                        .filter(|e| now.iter().any(|b| same_transaction(&b.session, e)))
                        .collect();
                    if !due.is_empty() {
                        ended = Some(terminate_audited(pool, req, opts, pid, &due, origin).await?);
                    }
                }
                if !now.is_empty() {
                    seen = now;
                }
            }
        }
    };
    let ended = ended.unwrap_or_default();
    match result {
        Ok(Ok(outcome)) => Ok((Attempt::Done(outcome), ended)),
        Ok(Err(refused)) => Ok((Attempt::Refused(refused), ended)),
        Err(QueueError::Database(e)) if sqlstate(&e) == Some("55P03") => {
            Ok((Attempt::Blocked(seen), ended))
        }
        Err(e) => Err(e),
    }
}

fn same_transaction(a: &Session, b: &Session) -> bool {
    a.pid == b.pid && a.xact_start == b.xact_start
}

fn sqlstate(e: &sqlx::Error) -> Option<&str> {
    match e {
        sqlx::Error::Database(db) => match db.code() {
            Some(std::borrow::Cow::Borrowed(c)) => Some(c),
            _ => None,
        },
        _ => None,
    }
}

/// Commits a `terminate-blocker` audit row naming `targets`, then
/// terminates those still in the transaction they were seen in, while the
/// action (session `action`) waits for the row. Returns the sessions
/// terminated.
///
/// The audit row's `detail` describes the sessions and its
/// `target_pids`/`target_xact_starts` name them
/// (`batchonce_operator_audit_terminate_sessions`, which accepts only
/// sessions holding an open fence of the run, `batch_fence_held`). In a
/// second transaction it takes the row `FOR NO KEY UPDATE` (compatible
/// with the fence's `FOR KEY SHARE`), has the database end them
/// (`batchonce_operator_terminate(audit id)`: only sessions that the
/// committed row names, still in that transaction and holding the fence;
/// the operator has no `pg_signal_backend`; a refusal, SQLSTATE 42501, is
/// one clear error), and rolls back once they are gone and their worker's
/// next statement waits behind it or the action, or after 1 s, clearing the
/// `pg_stat_activity` snapshot (`pg_stat_clear_snapshot()`) before each
/// look. Without that hold, a statement that arrived between the session's
/// death and the woken action's re-lock needed no wait and took the row
/// first: the worker's finish of its failed handler, a retry that left the
/// run PENDING.
async fn terminate_audited(
    pool: &PgPool,
    req: &OperatorRequest,
    opts: ActOptions,
    action: i32,
    targets: &[&Session],
    origin: Option<&super::Origin>,
) -> Result<Vec<Session>, QueueError> {
    let detail = crate::text::truncate(&printable(&format!(
        "terminated {}, which held the run's row, so that {} could proceed",
        targets
            .iter()
            .map(|s| s.describe())
            .collect::<Vec<_>>()
            .join("; "),
        req.action.as_str()
    )));
    let mut tx = pool.begin().await?;
    // The row's other lockers are the action (waiting) and the session to
    // end: the audit row's foreign key check shares the lock with the
    // latter, but is bounded all the same.
    crate::db::query(
        "SELECT set_config('lock_timeout', $1, true), \
                set_config('batchonce.remote_addr', COALESCE($2, ''), true)",
    )
    .bind(format!("{}ms", opts.lock_timeout.as_millis().max(1)))
    .bind(origin.map(|o| crate::text::truncate(&o.remote_addr)))
    .execute(&mut *tx)
    .await?;
    // The run's status before and after: this row changes no state. A
    // database function: the operator role writes no audit row directly.
    // It names each session by pid and transaction start, and accepts only
    // sessions that hold an open fence of this run in that transaction.
    let pids: Vec<i32> = targets.iter().map(|s| s.pid).collect();
    let starts: Vec<Option<DateTime<Utc>>> = targets.iter().map(|s| s.xact_start).collect();
    let audit: i64 = crate::db::query_scalar(
        "SELECT batchonce_operator_audit_terminate_sessions($1, $2, $3, $4, $5, $6)",
    )
    .bind(req.key.as_str())
    .bind(req.operator.as_str())
    .bind(req.reason.as_str())
    .bind(&detail)
    .bind(&pids)
    .bind(&starts)
    .fetch_one(&mut *tx)
    .await
    .map_err(refused_termination)?;
    tx.commit().await?;
    let names: Vec<&str> = targets
        .iter()
        .map(|s| s.application_name.as_str())
        .collect();
    // The action has been waiting for the row, so PostgreSQL gives it the
    // row before any later waiter. But a statement that arrives once the
    // ended session is gone, and before the woken action has locked the
    // row, finds no live locker, needs no wait and takes the row at once:
    // the ended session's worker failing its attempt (a retry would leave
    // the run PENDING, and a plain `fail` would be refused). So this
    // transaction takes the row first, FOR NO KEY UPDATE: that shares it
    // with the ended session's FOR KEY SHARE (no wait) and makes every
    // later writer wait, hence queue behind the action. It lets go once
    // the ended sessions are gone and their worker waits behind it or the
    // action (whose tuple lock it queues for), or after its lock timeout (1 to 5 s).
    let mut tx = pool.begin().await?;
    crate::db::query("SELECT set_config('lock_timeout', $1, true)")
        .bind(format!("{}ms", opts.lock_timeout.as_millis().max(1)))
        .execute(&mut *tx)
        .await?;
    crate::db::query("SELECT batchonce_operator_hold_row($1)")
        .bind(req.key.as_str())
        .execute(&mut *tx)
        .await?;
    // The database ends only the sessions the committed audit row names
    // that still hold the run's fence in the transaction named.
    let ended: Vec<i32> =
        crate::db::query_scalar("SELECT pid FROM batchonce_operator_terminate($1) AS t(pid)")
            .bind(audit)
            .fetch_all(&mut *tx)
            .await
            .map_err(refused_termination)?;
    // Long enough for a loaded worker to notice its ended session and send
    // its next statement; bounded by the action's own lock timeout.
    let until = tokio::time::Instant::now()
        + opts
            .lock_timeout
            .clamp(Duration::from_secs(1), Duration::from_secs(5));
    loop {
        // pg_stat_activity is read once per transaction unless told again.
        crate::db::query("SELECT pg_stat_clear_snapshot()")
            .execute(&mut *tx)
            .await?;
        let settled: bool = crate::db::query_scalar(
            "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = ANY($1)) \
                AND EXISTS (SELECT 1 FROM pg_stat_activity a \
                            WHERE a.application_name = ANY($2) \
                              AND pg_blocking_pids(a.pid) && ARRAY[pg_backend_pid(), $3])",
        )
        .bind(&ended)
        .bind(&names)
        .bind(action)
        .fetch_one(&mut *tx)
        .await?;
        if settled || tokio::time::Instant::now() >= until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tx.rollback().await?;
    Ok(targets
        .iter()
        .filter(|s| ended.contains(&s.pid))
        .map(|s| (*s).clone())
        .collect())
}

/// A refusal of the database's termination rules (SQLSTATE 42501) as one
/// clear error; other errors pass through.
fn refused_termination(e: sqlx::Error) -> QueueError {
    if sqlstate(&e) == Some("42501") {
        let msg = match &e {
            sqlx::Error::Database(db) => db.message().to_owned(),
            other => other.to_string(),
        };
        QueueError::Invalid(format!("--terminate-blocker {msg}"))
    } else {
        e.into()
    }
}

/// Replaces what the audit table refuses (control and formatting
/// characters, which a role name may hold) with `?`.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| {
            if crate::text::Unprintable::of(c).is_some() {
                '?'
            } else {
                c
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tracked_session_leaves_the_set_when_dropped() {
        let set = FenceSessions::default();
        let a = SessionTx {
            pid: 1,
            xact_start: Utc::now(),
        };
        let b = SessionTx { pid: 2, ..a };
        let ta = set.add(a);
        let tb = set.add(b);
        assert_eq!(set.snapshot(), vec![a, b]);
        drop(ta);
        assert_eq!(set.snapshot(), vec![b]);
        drop(tb);
        assert!(set.snapshot().is_empty());
    }

    #[test]
    fn audit_details_are_printable() {
        assert_eq!(printable("ab\u{202E}c\nd"), "ab?c?d");
    }
}
