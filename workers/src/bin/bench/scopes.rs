//! The `scopes` scenario of `batchonce-bench` (issue 24): the producer with
//! 10,000 scopes. A table of sellers, `daily-settlement` scoped by
//! `scopes = { query = "SELECT 'seller-' || id FROM bench_sellers" }`, a daily
//! schedule whose one firing in the `catch_up` of one day lies about twelve
//! hours away from now (so exactly one period is due and both ticks see the
//! same one), and two ticks of `producer::tick`, the function
//! `batchonce produce --once` calls, on a pool opened as that command opens
//! it. The first tick must insert one run per seller and the second none,
//! each seller's key coming back as a duplicate; each tick must send exactly
//! one enqueue statement. The same is measured for a list of as many scopes
//! (`scopes = ["shop-1", …]`).
//!
//! Each tick is timed and its statements are counted. The count comes from
//! `pg_stat_statements` when the server has it loaded (server side: every
//! top-level statement the bench database executed), and always from sqlx's
//! own log of the statements this process executes (client side: sqlx emits
//! one `tracing` event of target `sqlx::query` per statement, which the
//! bench's own subscriber counts while a step runs; the bench's other
//! connections are idle then). Both counts are first checked on one known
//! statement. The private cluster's settings are fixed by
//! `batchonce::ops::embedded` and do not preload `pg_stat_statements`, so on
//! it the client-side count is the one reported. `pg_stat_database`'s
//! `xact_commit` was not used: a backend reports it up to seconds later, and
//! it counts every session of the database.
//!
//! Two baselines, in the same run: the same number of keys made by one bare
//! `INSERT … SELECT … ON CONFLICT DO NOTHING` from the same table into a
//! one-column key table (the house baseline, as in `enqueue`), and the
//! engine enqueuing the same scopes one statement each (what a loop of
//! `batchonce enqueue --scope` does, without the process starts), for the
//! day before so that every key is new.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use anyhow::{bail, Context};
use batchonce::config::Config;
use batchonce::queue;
use batchonce::runtime::producer::{self, JobTick};
use batchonce::{Clock, JobKey, JobName, Scope};
use chrono::{DateTime, Timelike, Utc};
use serde_json::json;
use sqlx::PgPool;

use crate::Size;

/// The target of the event sqlx logs for each statement it executes.
const SQLX_QUERY: &str = "sqlx::query";

/// What marks an enqueue statement: the engine's one insert of runs.
const ENQUEUE_FUNCTION: &str = "batchonce_enqueue2(";

/// Statements counted over one measured step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Statements {
    total: u64,
    /// Those that call the engine's insert of runs.
    enqueue: u64,
}

impl Statements {
    fn json(self) -> serde_json::Value {
        json!({ "total": self.total, "enqueue": self.enqueue })
    }
}

/// sqlx's statement events seen by [`StatementLog`] while a step is
/// measured, as counters.
#[derive(Default)]
struct Counts {
    /// Whether a step is being measured: sqlx builds and sends its events
    /// only then, so the other scenarios pay nothing for the subscriber.
    armed: AtomicBool,
    total: AtomicU64,
    enqueue: AtomicU64,
}

impl Counts {
    fn get(&self) -> Statements {
        Statements {
            total: self.total.load(Ordering::SeqCst),
            enqueue: self.enqueue.load(Ordering::SeqCst),
        }
    }
}

/// The process's `tracing` subscriber: it only counts sqlx's statement
/// events, and only while [`Counts::armed`]. It has to be the global
/// default, not one scoped to the measured future: with a single
/// subscriber registered, `tracing` asks the thread's current default
/// whether a callsite is of interest the first time it is reached, and
/// caches the answer, so a sqlx callsite first reached outside the scope
/// (by the bench's own set-up statements) stayed silent inside it.
struct StatementLog(Arc<Counts>);

/// Looks through an event's fields for the enqueue function's name: sqlx
/// puts the statement's first four words in `summary` and, when it is
/// longer, the whole statement in `db.statement`.
#[derive(Default)]
struct FindEnqueue(bool);

impl tracing::field::Visit for FindEnqueue {
    fn record_str(&mut self, _field: &tracing::field::Field, value: &str) {
        self.0 |= value.contains(ENQUEUE_FUNCTION);
    }

    fn record_debug(&mut self, _field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0 |= format!("{value:?}").contains(ENQUEUE_FUNCTION);
    }
}

impl tracing::Subscriber for StatementLog {
    fn register_callsite(
        &self,
        meta: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        // "Sometimes": `enabled` is asked at every statement, so that the
        // answer follows `armed`.
        if meta.target() == SQLX_QUERY {
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn enabled(&self, meta: &tracing::Metadata<'_>) -> bool {
        meta.target() == SQLX_QUERY && self.0.armed.load(Ordering::SeqCst)
    }

    fn new_span(&self, _span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        // No span is enabled (only sqlx's events are), so no id is ever
        // looked up; 0 is not a valid id, 1 is.
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _span: &tracing::span::Id, _values: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _span: &tracing::span::Id, _follows: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        if event.metadata().target() != SQLX_QUERY || !self.0.armed.load(Ordering::SeqCst) {
            return;
        }
        self.0.total.fetch_add(1, Ordering::SeqCst);
        let mut find = FindEnqueue::default();
        event.record(&mut find);
        if find.0 {
            self.0.enqueue.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn enter(&self, _span: &tracing::span::Id) {}

    fn exit(&self, _span: &tracing::span::Id) {}
}

/// The counters of the process's [`StatementLog`], installed as the global
/// subscriber on first use. `None` if another subscriber was installed
/// first (the bench installs none elsewhere).
fn statement_log() -> Option<Arc<Counts>> {
    static LOG: OnceLock<Option<Arc<Counts>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let counts = Arc::new(Counts::default());
        let set = tracing::dispatcher::set_global_default(tracing::Dispatch::new(StatementLog(
            counts.clone(),
        )));
        // Callsites reached before now had their interest decided without
        // this subscriber: decide again.
        tracing::callsite::rebuild_interest_cache();
        set.ok().map(|()| counts)
    })
    .clone()
}

/// Times steps and counts their statements on both sides (see the module's
/// doc for which count is reported).
struct Meter {
    counts: Arc<Counts>,
    /// Whether the server has `pg_stat_statements` loaded and the bench
    /// database has the extension.
    server: bool,
}

/// One measured step.
struct Measured<T> {
    value: T,
    ms: f64,
    client: Statements,
    server: Option<Statements>,
}

impl<T> Measured<T> {
    /// The count this scenario reports: the server's when it has one.
    fn statements(&self) -> Statements {
        self.server.unwrap_or(self.client)
    }

    /// The step's result apart from its figures.
    fn split(self) -> (T, Measured<()>) {
        let figures = Measured {
            value: (),
            ms: self.ms,
            client: self.client,
            server: self.server,
        };
        (self.value, figures)
    }
}

impl Meter {
    /// A meter whose counts are checked on one known statement of
    /// `producer_pool`.
    async fn new(pool: &PgPool, producer_pool: &PgPool) -> anyhow::Result<Self> {
        let counts = statement_log().context(
            "another tracing subscriber is installed, so sqlx's statements cannot be counted",
        )?;
        let loaded: bool = sqlx::query_scalar(
            "SELECT current_setting('shared_preload_libraries') ~ '(^|[ ,])pg_stat_statements([ ,]|$)'",
        )
        .fetch_one(pool)
        .await?;
        // The extension lives in the bench database, which is dropped at
        // the end; a server that refuses it (not a superuser) falls back to
        // the client-side count, which is exact for this process.
        let server = loaded
            && sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                .execute(pool)
                .await
                .is_ok();
        let meter = Self { counts, server };
        // A count that cannot see one statement proves nothing about a tick.
        let probe = meter
            .measure(pool, sqlx::query("SELECT 1").execute(producer_pool))
            .await?;
        probe.value?;
        let one = Statements {
            total: 1,
            enqueue: 0,
        };
        if probe.client != one || probe.server.is_some_and(|s| s != one) {
            bail!(
                "one statement was counted as {:?} by sqlx's log and {:?} by pg_stat_statements",
                probe.client,
                probe.server
            );
        }
        Ok(meter)
    }

    fn method(&self) -> &'static str {
        if self.server {
            "pg_stat_statements (top-level statements executed in the bench database)"
        } else {
            "sqlx's statement log of this process (pg_stat_statements is not loaded on this server)"
        }
    }

    /// The bench database's statements so far, by `pg_stat_statements`; the
    /// statements reading the view itself are left out, and the bench's
    /// other connections are idle while a step runs.
    async fn server_count(&self, pool: &PgPool) -> anyhow::Result<Option<Statements>> {
        if !self.server {
            return Ok(None);
        }
        let (total, enqueue): (i64, i64) = sqlx::query_as(
            "SELECT coalesce(sum(calls), 0)::bigint, \
                    coalesce(sum(calls) FILTER (WHERE query LIKE '%' || $1 || '%'), 0)::bigint \
             FROM pg_stat_statements \
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
               AND query NOT LIKE '%pg_stat_statements%'",
        )
        .bind(ENQUEUE_FUNCTION)
        .fetch_one(pool)
        .await?;
        Ok(Some(Statements {
            total: total.max(0) as u64,
            enqueue: enqueue.max(0) as u64,
        }))
    }

    /// Runs `step`, timing it and counting the statements it executes.
    async fn measure<F: Future>(
        &self,
        pool: &PgPool,
        step: F,
    ) -> anyhow::Result<Measured<F::Output>> {
        let server_before = self.server_count(pool).await?;
        let client_before = self.counts.get();
        self.counts.armed.store(true, Ordering::SeqCst);
        let t = Instant::now();
        let value = step.await;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        self.counts.armed.store(false, Ordering::SeqCst);
        let client_after = self.counts.get();
        let server_after = self.server_count(pool).await?;
        let delta = |a: Statements, b: Statements| Statements {
            total: a.total.saturating_sub(b.total),
            enqueue: a.enqueue.saturating_sub(b.enqueue),
        };
        Ok(Measured {
            value,
            ms,
            client: delta(client_after, client_before),
            server: server_after.zip(server_before).map(|(a, b)| delta(a, b)),
        })
    }
}

/// The configuration of the scoped job: a daily firing at `hour` UTC and a
/// `catch_up` of one day, so the window `(now - 1d, now]` holds exactly one
/// firing, hence one period.
fn config(hour: u32, scopes: &str) -> anyhow::Result<Config> {
    let text = format!(
        "[jobs.daily-settlement]\nschedule = \"0 {hour} * * *\"\ntimezone = \"UTC\"\n\
         catch_up = \"1d\"\nscopes = {scopes}\n"
    );
    let kinds = batchonce_workers::registry().default_configs();
    Ok(Config::parse(&text, "bench-scopes.toml", &kinds)?)
}

/// One tick's figures for the scoped job, checked against what it must do:
/// `want_new` runs inserted, `want_duplicates` keys found, no invalid
/// scope, and exactly one enqueue statement.
async fn tick(
    meter: &Meter,
    pool: &PgPool,
    producer_pool: &PgPool,
    config: &Config,
    (want_new, want_duplicates): (usize, usize),
) -> anyhow::Result<(JobTick, Measured<()>)> {
    let (report, measured) = meter
        .measure(pool, producer::tick(producer_pool, config, Clock::Db))
        .await?
        .split();
    let report = report.context("producer tick failed")?;
    let name = batchonce_workers::settlement::NAME;
    let Some(t) = report.into_iter().find(|t| t.job == name) else {
        bail!("the tick reported nothing for {name}");
    };
    if let Some(e) = &t.error {
        bail!("the tick of {name} failed: {e}");
    }
    if t.enqueued.len() != want_new || t.duplicates != want_duplicates || !t.skipped.is_empty() {
        bail!(
            "a tick enqueued {} runs, skipped {} and found {} duplicates; expected {want_new} and {want_duplicates} duplicates",
            t.enqueued.len(),
            t.skipped.len(),
            t.duplicates
        );
    }
    if !t.invalid_scopes.is_empty() {
        bail!(
            "the scope query returned invalid ids: {:?}",
            t.invalid_scopes
        );
    }
    if measured.statements().enqueue != 1 {
        bail!(
            "a tick sent {} enqueue statements of {} statements, not one ({})",
            measured.statements().enqueue,
            measured.statements().total,
            meter.method()
        );
    }
    Ok((t, measured))
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn tick_json(source: &str, which: &str, t: &JobTick, m: &Measured<()>) -> serde_json::Value {
    json!({
        "source": source,
        "tick": which,
        "enqueued": t.enqueued.len(),
        "duplicates": t.duplicates,
        "tick_ms": round1(m.ms),
        "statements": m.statements().json(),
        "client_statements": m.client.json(),
        "server_statements": m.server.map(Statements::json),
    })
}

/// The scenario: see the module's doc.
pub async fn scopes(pool: &PgPool, url: &str, size: Size) -> anyhow::Result<serde_json::Value> {
    let n: usize = if size == Size::Full { 10_000 } else { 100 };
    create_sellers(pool, n).await?;
    // The firing lies about twelve hours from the database's now, so both
    // ticks, a few seconds apart, see the same single period.
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
    let hour = (now.hour() + 12) % 24;
    let by_query = config(
        hour,
        "{ query = \"SELECT 'seller-' || id FROM bench_sellers\" }",
    )?;
    let list: Vec<String> = (1..=n).map(|i| format!("\"shop-{i}\"")).collect();
    let by_list = config(hour, &format!("[{}]", list.join(", ")))?;
    // The producer's own pool, opened as `batchonce produce --once` does.
    let producer_pool = batchonce::db::connect(url, "batchonce-producer", 2).await?;
    let meter = Meter::new(pool, &producer_pool).await?;

    let mut results = Vec::new();
    let (first, first_m) = tick(&meter, pool, &producer_pool, &by_query, (n, 0)).await?;
    let (second, second_m) = tick(&meter, pool, &producer_pool, &by_query, (0, n)).await?;
    results.push(tick_json("query", "first", &first, &first_m));
    results.push(tick_json("query", "second", &second, &second_m));
    let stored: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM batch_job_run \
         WHERE job_name = 'daily-settlement' AND scope LIKE 'seller-%' AND partition_of IS NULL",
    )
    .fetch_one(pool)
    .await?;
    if stored != n as i64 {
        bail!("{stored} scoped runs are stored, not {n}");
    }
    let (list_first, list_first_m) = tick(&meter, pool, &producer_pool, &by_list, (n, 0)).await?;
    let (list_second, list_second_m) = tick(&meter, pool, &producer_pool, &by_list, (0, n)).await?;
    results.push(tick_json("list", "first", &list_first, &list_first_m));
    results.push(tick_json("list", "second", &list_second, &list_second_m));

    // Baseline: the same keys by one bare INSERT … SELECT from the same
    // table, then again (all duplicates).
    let Some(first_key) = first.enqueued.first() else {
        bail!("the first tick returned no key");
    };
    let first_key = JobKey::parse(first_key)?;
    let template = first_key.unscoped().to_string();
    let (bare_ms, bare_again_ms) = bare_insert(pool, &template, n).await?;

    let per_key = per_key_enqueue(&meter, pool, &producer_pool, &by_query, &first_key, n).await?;
    producer_pool.close().await;

    let method = meter.method();
    let s = first_m.statements();
    eprintln!(
        "scopes {n} (query): first tick {:.1} ms, {} statements ({} enqueue), {} new; second tick {:.1} ms, \
         {} statements ({} enqueue), {} duplicates; bare INSERT {bare_ms:.1} ms (again {bare_again_ms:.1} ms), \
         ratio {:.2}; one statement per key {:.0} ms, {} statements, {:.1} x the first tick; statements counted by {method}",
        first_m.ms,
        s.total,
        s.enqueue,
        first.enqueued.len(),
        second_m.ms,
        second_m.statements().total,
        second_m.statements().enqueue,
        second.duplicates,
        bare_ms / first_m.ms,
        per_key.ms,
        per_key.statements().total,
        per_key.ms / first_m.ms,
    );
    eprintln!(
        "scopes {n} (list): first tick {:.1} ms, {} statements ({} enqueue); second tick {:.1} ms, {} statements ({} enqueue)",
        list_first_m.ms,
        list_first_m.statements().total,
        list_first_m.statements().enqueue,
        list_second_m.ms,
        list_second_m.statements().total,
        list_second_m.statements().enqueue,
    );
    // Leave the database as the other scenarios expect it.
    sqlx::raw_sql(
        "DELETE FROM batch_job_run WHERE job_name = 'daily-settlement' AND scope IS NOT NULL; \
         DROP TABLE bench_scope_keys; DROP TABLE bench_sellers",
    )
    .execute(pool)
    .await?;
    Ok(json!({
        "scenario": "scopes",
        "scopes": n,
        "statements_counted_by": method,
        "results": results,
        "baseline_ms": round1(bare_ms),
        "baseline_duplicates_ms": round1(bare_again_ms),
        "ratio_first": round2(bare_ms / first_m.ms),
        "ratio_second": round2(bare_again_ms / second_m.ms),
        "per_key": {
            "keys": n,
            "ms": round1(per_key.ms),
            "statements": per_key.statements().json(),
            "client_statements": per_key.client.json(),
            "server_statements": per_key.server.map(Statements::json),
        },
        "per_key_over_first_tick": round1(per_key.ms / first_m.ms),
    }))
}

/// The scenario's sellers: `n` rows of `bench_sellers`, and an empty
/// `bench_scope_keys` for the baseline.
async fn create_sellers(pool: &PgPool, n: usize) -> anyhow::Result<()> {
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS bench_sellers; DROP TABLE IF EXISTS bench_scope_keys; \
         CREATE TABLE bench_sellers (id bigint PRIMARY KEY); \
         CREATE TABLE bench_scope_keys (k text PRIMARY KEY)",
    )
    .execute(pool)
    .await?;
    sqlx::query("INSERT INTO bench_sellers SELECT generate_series(1, $1)")
        .bind(n as i64)
        .execute(pool)
        .await?;
    sqlx::query("ANALYZE bench_sellers").execute(pool).await?;
    Ok(())
}

/// Baseline: the same keys (under `template`) by one bare INSERT … SELECT
/// from the same table, then again (all duplicates). Returns both times in
/// milliseconds.
async fn bare_insert(pool: &PgPool, template: &str, n: usize) -> anyhow::Result<(f64, f64)> {
    let bare_sql = "INSERT INTO bench_scope_keys (k) \
                    SELECT $1 || '@' || s FROM (SELECT 'seller-' || id FROM bench_sellers) AS q(s) \
                    ON CONFLICT DO NOTHING";
    let t = Instant::now();
    let inserted = sqlx::query(bare_sql)
        .bind(template)
        .execute(pool)
        .await?
        .rows_affected();
    let bare_ms = t.elapsed().as_secs_f64() * 1000.0;
    let t = Instant::now();
    let again = sqlx::query(bare_sql)
        .bind(template)
        .execute(pool)
        .await?
        .rows_affected();
    let bare_again_ms = t.elapsed().as_secs_f64() * 1000.0;
    if inserted != n as u64 || again != 0 {
        bail!("the bare INSERT inserted {inserted}, then {again}");
    }
    Ok((bare_ms, bare_again_ms))
}

/// Baseline: the engine, one enqueue statement per scope, measured.
async fn per_key_enqueue(
    meter: &Meter,
    pool: &PgPool,
    producer_pool: &PgPool,
    by_query: &Config,
    first_key: &JobKey,
    n: usize,
) -> anyhow::Result<Measured<()>> {
    // Baseline: the engine, one enqueue statement per scope, for the day
    // before the tick's period, as `batchonce enqueue --scope` does it.
    let job = JobName::parse(batchonce_workers::settlement::NAME)?;
    let cfg = by_query
        .job(&job)
        .cloned()
        .context("the configuration has no daily-settlement")?;
    let day_before = batchonce::key::parse_date(first_key.period())?
        .pred_opt()
        .context("the tick's period has no day before")?;
    let periods = producer::periods_for_dates(&cfg, &[day_before]).map_err(anyhow::Error::msg)?;
    let scopes: Vec<Scope> = (1..=n)
        .map(|i| Scope::parse(&format!("seller-{i}")))
        .collect::<Result<_, _>>()?;
    let (per_key_new, per_key) = meter
        .measure(pool, async {
            let mut new = 0;
            for scope in &scopes {
                let runs =
                    producer::runs_for_scopes(&job, &cfg, &periods, std::slice::from_ref(scope))
                        .map_err(anyhow::Error::msg)?;
                new += queue::enqueue(producer_pool, &runs, Clock::Db)
                    .await?
                    .enqueued
                    .len();
            }
            Ok::<_, anyhow::Error>(new)
        })
        .await?
        .split();
    let per_key_new = per_key_new?;
    if per_key_new != n {
        bail!("one statement per key enqueued {per_key_new} of {n}");
    }
    Ok(per_key)
}
