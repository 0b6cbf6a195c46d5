//! Enqueueing runs: the only `INSERT` into `batch_job_run`, duplicates as
//! no-ops, and the one `DELETE` the queue knows (a `preflight` scratch run).
//!
//! - `enqueue` inserts many runs in one statement with `ON CONFLICT DO NOTHING`, each with its
//!   `RunContext` in the context columns, sends NOTIFY in the same transaction, and reports
//!   inserted and duplicate keys in input order. After the commit it adds one per key to
//!   `batchonce_runs_enqueued_total` or `batchonce_runs_deduplicated_total` (label `job`). A
//!   `NewRun` with a `skip_reason` (a period the business calendar skips) is inserted as SKIPPED,
//!   with the reason in `error_message` and `finished_at` set, instead of PENDING.
//!   `NewRun::new(key, date, cfg)` builds a pending run with the context `cfg` gives it.
//! - A `NewRun` with a `scope_query` is a template: the statement runs the query (as a subquery,
//!   each distinct query once) and enqueues the template's run once per scope it returns, keyed
//!   `<key>@<scope>`; ids that are not valid scopes, or that would make a key longer than 120
//!   characters, are reported in `EnqueueReport::invalid` and never inserted. It is still one
//!   statement, whatever the number of scopes.
//! - `delete_preflight_run` deletes one scratch run of `preflight` and its attempt rows in one
//!   transaction. It refuses any key whose job is not `PREFLIGHT_JOB` (`batchonce-preflight`), and
//!   its `DELETE` also names that job.

use std::collections::HashSet;
use std::sync::Arc;

use chrono::NaiveDate;
use sqlx::{PgPool, Row};

use super::{context, QueueError, MAX_PAYLOAD_BYTES};
use crate::clock::Clock;
use crate::config::context::RunContext;
use crate::key::{JobKey, JobName};
use crate::telemetry;
use crate::text::truncate;

/// A run to enqueue.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub key: JobKey,
    pub job: JobName,
    pub business_date: NaiveDate,
    pub max_attempts: u32,
    pub payload: serde_json::Value,
    /// Set for periods the business calendar skips: the run is recorded as
    /// SKIPPED with this reason instead of being queued.
    pub skip_reason: Option<String>,
    /// What defines the run, stored with it (see [`crate::config::context`]).
    pub context: RunContext,
    /// Partitions of the run (1: a whole run), fixed with it: the database
    /// inserts the partitions with the parent (`queue::partitions`).
    pub partitions: u16,
    /// A scoped job's scope query: this run is then a template, enqueued
    /// once per scope the query returns (see the module's doc).
    pub scope_query: Option<Arc<str>>,
}

impl NewRun {
    /// A pending run of `key` with the context `cfg` gives it (no payload,
    /// not skipped).
    pub fn new(
        key: JobKey,
        business_date: NaiveDate,
        cfg: &crate::config::JobConfig,
    ) -> Result<Self, crate::config::context::PeriodError> {
        let context = RunContext::for_key(cfg, business_date, key.period())?;
        let job = JobName::parse(key.job_name())
            .map_err(|_| crate::config::context::PeriodError(key.to_string()))?;
        Ok(Self {
            key,
            job,
            business_date,
            max_attempts: cfg.max_attempts,
            payload: serde_json::json!({}),
            skip_reason: None,
            context,
            partitions: cfg.partitions,
            scope_query: None,
        })
    }
}

/// What one enqueue statement did, key by key, in input order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EnqueueReport {
    pub enqueued: Vec<JobKey>,
    pub duplicates: Vec<JobKey>,
    /// Ids a scope query returned that are no valid scope (or make too long
    /// a key): `(template key, id as returned)`. Nothing was inserted for them.
    pub invalid: Vec<(JobKey, String)>,
}

/// Inserts many runs in one statement; existing keys are reported as
/// duplicates and left untouched. Notifies idle workers in the same
/// transaction, so the wake-up is sent only if the rows commit.
pub async fn enqueue(
    pool: &PgPool,
    runs: &[NewRun],
    clock: Clock,
) -> Result<EnqueueReport, QueueError> {
    let mut seen = HashSet::new();
    let mut keys = Vec::new();
    let mut names = Vec::new();
    let mut dates = Vec::new();
    let mut maxes = Vec::new();
    let mut payloads = Vec::new();
    let mut reasons: Vec<Option<String>> = Vec::new();
    let mut parts: Vec<i32> = Vec::new();
    let mut sources: Vec<Option<i32>> = Vec::new();
    let mut queries: Vec<&str> = Vec::new();
    let mut contexts = context::Arrays::default();
    let mut order = Vec::new();
    for r in runs {
        if r.key.job_name() != r.job.as_str() {
            return Err(QueueError::Invalid(format!(
                "job key {} does not belong to job {}",
                r.key, r.job
            )));
        }
        let size = r.payload.to_string().len();
        if size > MAX_PAYLOAD_BYTES {
            return Err(QueueError::Invalid(format!(
                "payload of {} is {size} bytes; the limit is {MAX_PAYLOAD_BYTES}",
                r.key
            )));
        }
        order.push(r.key.clone());
        // The same key twice in one call is one run: the second is a duplicate.
        if seen.insert(r.key.clone()) {
            keys.push(r.key.as_str().to_owned());
            names.push(r.job.as_str().to_owned());
            dates.push(r.business_date);
            maxes.push(r.max_attempts as i32);
            payloads.push(r.payload.clone());
            reasons.push(r.skip_reason.as_deref().map(truncate));
            parts.push(i32::from(r.partitions.clamp(1, crate::key::MAX_PARTITIONS)));
            contexts.push(&r.context);
            sources.push(r.scope_query.as_deref().map(|q| {
                let i = queries.iter().position(|x| *x == q).unwrap_or_else(|| {
                    queries.push(q);
                    queries.len() - 1
                });
                i as i32
            }));
        }
    }
    if keys.is_empty() {
        return Ok(EnqueueReport::default());
    }
    if !queries.is_empty() {
        let mut stmt = crate::db::statement(pool).await?;
        let sql = scoped_statement(&queries);
        let q = crate::db::query(&sql)
            .bind(&keys)
            .bind(&names)
            .bind(&dates)
            .bind(&maxes)
            .bind(&payloads)
            .bind(clock.bind())
            .bind(&reasons);
        let rows = contexts
            .bind(q)
            .bind(&parts)
            .bind(&sources)
            .fetch_all(stmt.conn())
            .await?;
        stmt.done().await?;
        let mut report = EnqueueReport::default();
        let mut reported = HashSet::new();
        for row in rows {
            let key: String = row.try_get("key")?;
            if !row.try_get::<bool, _>("ok")? {
                let template: String = row.try_get("k")?;
                let scope: String = row.try_get("scope")?;
                let template =
                    JobKey::parse(&template).map_err(|e| QueueError::Invalid(e.to_string()))?;
                report.invalid.push((template, scope));
                continue;
            }
            let key = JobKey::parse(&key).map_err(|e| QueueError::Invalid(e.to_string()))?;
            let job = key.job_name().to_owned();
            if row.try_get::<bool, _>("inserted")? && reported.insert(key.clone()) {
                metrics::counter!(telemetry::RUNS_ENQUEUED, "job" => job).increment(1);
                report.enqueued.push(key);
            } else {
                metrics::counter!(telemetry::RUNS_DEDUPLICATED, "job" => job).increment(1);
                report.duplicates.push(key);
            }
        }
        return Ok(report);
    }
    // The database function inserts PENDING runs, or SKIPPED ones with a
    // calendar reason, and nothing else (migration 20261203000004), with
    // their partitions (20261204000002); it notifies idle workers in the
    // same statement.
    let mut stmt = crate::db::statement(pool).await?;
    let q = crate::db::query(
        "SELECT k FROM batchonce_enqueue2($1, $2, $3, $4, $5, $6, $7, \
         $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20) AS k",
    )
    .bind(&keys)
    .bind(&names)
    .bind(&dates)
    .bind(&maxes)
    .bind(&payloads)
    .bind(clock.bind())
    .bind(&reasons);
    let inserted: Vec<String> = contexts
        .bind(q)
        .bind(&parts)
        .fetch_all(stmt.conn())
        .await?
        .iter()
        .map(|r| r.try_get("k"))
        .collect::<Result<_, _>>()?;
    stmt.done().await?;
    let inserted: HashSet<String> = inserted.into_iter().collect();
    let mut report = EnqueueReport::default();
    let mut reported = HashSet::new();
    for k in order {
        let job = k.job_name().to_owned();
        if inserted.contains(k.as_str()) && reported.insert(k.clone()) {
            metrics::counter!(telemetry::RUNS_ENQUEUED, "job" => job).increment(1);
            report.enqueued.push(k);
        } else {
            metrics::counter!(telemetry::RUNS_DEDUPLICATED, "job" => job).increment(1);
            report.duplicates.push(k);
        }
    }
    Ok(report)
}

/// The enqueue statement for runs of which some are scope templates: the
/// scope queries as subqueries (`$21` says which query, if any, each run
/// takes its scopes from), the runs expanded per scope, checked, and given
/// to `batchonce_enqueue2`; one row per expanded run says what happened.
/// The queries are the configuration's own SQL (a trusted operator's, like
/// a command job's program), checked to be one statement when it is read.
fn scoped_statement(queries: &[&str]) -> String {
    let mut sql = String::from("WITH ");
    for (i, q) in queries.iter().enumerate() {
        sql.push_str(&format!(
            "q{i} AS (SELECT DISTINCT (x)::text AS scope FROM ({q}\n) AS q(x)), "
        ));
    }
    let sets: Vec<String> = (0..queries.len())
        .map(|i| format!("SELECT {i} AS src, scope FROM q{i}"))
        .collect();
    sql.push_str(&format!("sc AS ({}), ", sets.join(" UNION ALL ")));
    let cols = [
        ("k", "text"),
        ("n", "text"),
        ("d", "date"),
        ("m", "int"),
        ("p", "jsonb"),
        ("why", "text"),
        ("tz", "text"),
        ("ps", "timestamptz"),
        ("pe", "timestamptz"),
        ("cov", "text"),
        ("ttl", "float8"),
        ("stale", "float8"),
        ("exp", "text"),
        ("chunk", "int"),
        ("bo", "float8"),
        ("bomax", "float8"),
        ("mif", "bigint"),
        ("budget", "int"),
        ("parts", "int"),
        ("src", "int"),
    ];
    // $6 is the enqueue's "now"; every other parameter is an array.
    let params: Vec<usize> = (1..=21).filter(|n| *n != 6).collect();
    let unnest: Vec<String> = params
        .iter()
        .zip(cols)
        .map(|(n, (_, t))| format!("${n}::{t}[]"))
        .collect();
    let names: Vec<&str> = cols.iter().map(|(c, _)| *c).collect();
    sql.push_str(&format!(
        "t AS (SELECT * FROM unnest({}) WITH ORDINALITY AS t({}, o)), ",
        unnest.join(", "),
        names.join(", ")
    ));
    // A scope must match the key rule (the schema's CHECK) and leave the
    // key, with a partition's `.p<n>`, within 120 characters.
    sql.push_str(
        "x AS MATERIALIZED (           SELECT t.*, CASE WHEN t.src IS NULL THEN t.k ELSE t.k || '@' || sc.scope END AS key,                   sc.scope,                   t.src IS NULL OR (sc.scope ~ '^[a-z0-9]+(-[a-z0-9]+)*$'                       AND char_length(sc.scope) <= 36                       AND char_length(t.k) + 1 + char_length(sc.scope)                           + CASE WHEN coalesce(t.parts, 1) > 1 THEN 5 ELSE 0 END <= 120) AS ok            FROM t LEFT JOIN sc ON sc.src = t.src            WHERE t.src IS NULL OR sc.scope IS NOT NULL), ",
    );
    // The valid rows in the order the function inserts them (the order of
    // the runs given, then by key, so racing producers lock keys in one
    // order), numbered once: each of the 19 arrays below is then a scan
    // sorted by an integer rather than another sort of every key's text.
    sql.push_str(
        "y AS MATERIALIZED (SELECT x.*, row_number() OVER (ORDER BY o, key) AS rn \
         FROM x WHERE ok), ",
    );
    let args: Vec<String> = names[..19]
        .iter()
        .map(|c| {
            let c = if *c == "k" { "key" } else { c };
            format!("ARRAY(SELECT {c} FROM y ORDER BY rn)")
        })
        .collect();
    // batchonce_enqueue2 takes "now" as its sixth argument.
    let mut call = args[..5].to_vec();
    call.push("$6::timestamptz".to_owned());
    call.extend_from_slice(&args[5..]);
    sql.push_str(&format!(
        "ins AS (SELECT e AS key FROM batchonce_enqueue2({}) AS e)          SELECT x.k, x.key, x.scope, x.ok, (i.key IS NOT NULL) AS inserted          FROM x LEFT JOIN ins i ON i.key = x.key ORDER BY x.o, x.key",
        call.join(", ")
    ));
    sql
}

/// Whether this login may stamp runs with an instant of its choosing: only
/// a member of the role that owns the engine's functions may
/// (`batchonce_now`, migration 20261208000001); any other login that names
/// one is refused with SQLSTATE 42501. A schema older than that function
/// lets every login.
pub async fn may_choose_clock(pool: &PgPool) -> Result<bool, QueueError> {
    let mut stmt = crate::db::statement(pool).await?;
    let mine = crate::db::query_scalar(
        "SELECT COALESCE((SELECT pg_has_role(session_user, p.proowner, 'MEMBER') FROM pg_proc p \
         WHERE p.oid = to_regprocedure('batchonce_now(timestamptz)')), true)",
    )
    .fetch_one(stmt.conn())
    .await?;
    stmt.done().await?;
    Ok(mine)
}

/// How many distinct ids a scope query returns now (the producer's check of
/// which job's query fails, `enqueue --all-scopes`'s preview).
pub async fn count_scopes(pool: &PgPool, query: &str) -> Result<i64, QueueError> {
    let sql =
        format!("SELECT count(*) FROM (SELECT DISTINCT (x)::text FROM ({query}\n) AS q(x)) s");
    let mut stmt = crate::db::statement(pool).await?;
    let n = crate::db::query_scalar(&sql).fetch_one(stmt.conn()).await?;
    stmt.done().await?;
    Ok(n)
}

/// The job name of `preflight`'s scratch runs; only these can be deleted.
pub const PREFLIGHT_JOB: &str = "batchonce-preflight";

/// Removes one scratch run of `preflight` and its attempts. Refuses any other
/// job: runs of real jobs are history and are never deleted.
pub async fn delete_preflight_run(pool: &PgPool, key: &JobKey) -> Result<u64, QueueError> {
    if key.job_name() != PREFLIGHT_JOB {
        return Err(QueueError::Invalid(format!(
            "{key} is not a preflight run; runs are never deleted"
        )));
    }
    let mut tx = pool.begin().await?;
    crate::db::query("DELETE FROM batch_job_attempt WHERE job_key = $1")
        .bind(key.as_str())
        .execute(&mut *tx)
        .await?;
    let n = crate::db::query("DELETE FROM batch_job_run WHERE job_key = $1 AND job_name = $2")
        .bind(key.as_str())
        .bind(PREFLIGHT_JOB)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    tx.commit().await?;
    Ok(n)
}
