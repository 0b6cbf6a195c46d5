//! `batchonce preflight`, the seed article's pre-deploy check: several
//! processes race at the same instant to enqueue and claim one scratch key
//! against the configured database, and the check passes only if exactly one
//! enqueues and exactly one claims. It also checks that migrations are
//! current and that the database clock is sane, then removes its scratch run.
//!
//! `batchonce preflight`, private and called only from `src/cli/`. `run` checks that no migration
//! is pending and that the database clock is sane: two readings of `clock_timestamp()` must not go
//! backwards, and the first must be within 30 s of this host's clock. With a migration pending it
//! fails without racing. Otherwise it starts `--processes` copies of its own executable as the
//! hidden `preflight-racer` command. `race` connects, sleeps until a start instant 1.5 s after
//! launch, enqueues the scratch key `batchonce-preflight:<unix ms>` through `queue::enqueue`, tries
//! `queue::claim` once, and prints `{"enqueued": …, "claimed": …}`. The check passes only if
//! exactly one racer enqueued, exactly one claimed and none failed. `run` then removes the scratch
//! run through `queue::delete_preflight_run` and prints what it verified. A racer that exits
//! non-zero or prints no JSON counts as failed and the scratch run is still removed. The race has
//! one deadline of 60 s for all racers together. If it passes, the racers' `Child` handles are
//! dropped, which kills them (`kill_on_drop`); `run` then waits 2 s, so that a statement a racer
//! had already sent can finish in the database, before it removes the scratch run and returns the
//! error `the racers did not finish within 60s (scratch run removed: N)`. A racer that cannot be
//! awaited counts as failed (`FAIL a racer could not be awaited: …`).
//!
//! It also warns, one `warn` line each and without failing, when `PUBLIC` or a role other than
//! the migrator (the owner of `batch_job_run`, or a member of it) or a superuser may `CREATE` in the
//! schema (`create_warnings`): a function or operator planted there can run as the migrator inside
//! the engine's functions. `batchonce roles --apply` takes that privilege away.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use serde_json::json;
use tokio::process::Command;

use crate::clock::Clock;
use crate::db;
use crate::key::{JobKey, JobName};
use crate::queue::{self, ClaimSpec, NewRun, PREFLIGHT_JOB};
use crate::runtime::job::Registry;

/// Largest tolerated difference between this host's clock and the database's.
const MAX_SKEW: Duration = Duration::from_secs(30);

pub async fn run(url: &str, registry: &Registry, processes: u32) -> anyhow::Result<bool> {
    println!("preflight against {}", db::redact(url));
    let pool = db::connect(url, "batchonce-preflight", 2).await?;
    let mut ok = true;

    let pending = db::pending_migrations(&pool, &registry.migrations()).await?;
    if pending.is_empty() {
        let n = db::combined(&registry.migrations()).iter().count();
        println!("ok    migrations current ({n} applied)");
    } else {
        ok = false;
        println!(
            "FAIL  {} migrations pending: run `batchonce migrate`",
            pending.len()
        );
    }

    for line in create_warnings(&pool).await? {
        println!("{line}");
    }

    let db_now: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&pool)
        .await?;
    let local = Utc::now();
    let skew = (db_now - local).num_milliseconds().abs();
    let later: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&pool)
        .await?;
    if later < db_now {
        ok = false;
        println!("FAIL  database clock went backwards ({db_now} then {later})");
    } else if skew as u128 > MAX_SKEW.as_millis() {
        ok = false;
        println!(
            "FAIL  database clock differs from this host's by {:.1}s (limit {}s); fix NTP before deploying",
            skew as f64 / 1000.0,
            MAX_SKEW.as_secs()
        );
    } else {
        println!(
            "ok    database clock sane (this host differs by {:.3}s)",
            skew as f64 / 1000.0
        );
    }
    if !pending.is_empty() {
        println!("skipped the race: the schema is not current");
        return Ok(false);
    }

    let key = JobKey::parse(&format!(
        "{PREFLIGHT_JOB}:{}",
        Utc::now().timestamp_millis()
    ))?;
    let start_at = Utc::now().timestamp_millis() + 1500;
    let exe = std::env::current_exe().context("cannot find the batchonce binary")?;
    let mut children = Vec::new();
    for _ in 0..processes {
        children.push(
            Command::new(&exe)
                .args(["preflight-racer", "--key", key.as_str()])
                .args(["--start-at-ms", &start_at.to_string()])
                .env("DATABASE_URL", url)
                .env("RUST_LOG", "error")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .context("cannot start a racer process")?,
        );
    }
    // One deadline for the whole race. On a timeout the racers are dropped,
    // which kills them (kill_on_drop), before the scratch run is removed.
    let outputs = tokio::time::timeout(Duration::from_secs(60), async {
        let mut outs = Vec::new();
        for c in children {
            outs.push(c.wait_with_output().await);
        }
        outs
    })
    .await;
    let Ok(outputs) = outputs else {
        // The racers are killed on drop; give a statement already inside the
        // database a moment to finish before removing the scratch run.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let removed = queue::delete_preflight_run(&pool, &key).await;
        bail!(
            "the racers did not finish within 60s (scratch run removed: {})",
            removed
                .map(|n| n.to_string())
                .unwrap_or_else(|e| e.to_string())
        );
    };
    let mut enqueued = 0;
    let mut claimed = 0;
    let mut failed = 0;
    for out in outputs {
        let out = match out {
            Ok(out) => out,
            Err(e) => {
                failed += 1;
                println!("FAIL  a racer could not be awaited: {e}");
                continue;
            }
        };
        let v: Option<serde_json::Value> = serde_json::from_slice(&out.stdout).ok();
        match v {
            Some(v) if out.status.success() => {
                enqueued += usize::from(v["enqueued"] == true);
                claimed += usize::from(v["claimed"] == true);
            }
            _ => {
                failed += 1;
                let err = String::from_utf8_lossy(&out.stderr);
                println!("FAIL  a racer failed: {}", err.trim());
            }
        }
    }
    let removed = queue::delete_preflight_run(&pool, &key).await?;
    if failed == 0 && enqueued == 1 && claimed == 1 {
        println!("ok    {processes} processes raced for {key}: 1 enqueued ({} duplicates), 1 claimed ({} found it taken)",
            processes - 1, processes - 1);
    } else {
        ok = false;
        println!("FAIL  {processes} processes raced for {key}: {enqueued} enqueued, {claimed} claimed, {failed} failed (expected exactly 1 and 1)");
    }
    println!("ok    scratch run removed ({removed} row)");
    println!(
        "{}",
        if ok {
            "preflight passed"
        } else {
            "preflight FAILED"
        }
    );
    Ok(ok)
}

/// One line for `PUBLIC` and for each role that may `CREATE` in the
/// session's schema though it is neither the migrator (the owner of
/// `batch_job_run`, or the session's login before `migrate`), a member of
/// it, nor a superuser. The schema's owner counts too (for
/// `pg_database_owner`, the database's owner).
async fn create_warnings(pool: &sqlx::PgPool) -> Result<Vec<String>, sqlx::Error> {
    let (schema, holders): (String, Vec<String>) = sqlx::query_as(
        "WITH s AS (
             SELECT n.nspname, n.nspowner, coalesce(n.nspacl, acldefault('n', n.nspowner)) AS acl
             FROM pg_namespace n WHERE n.oid = current_schema()::regnamespace),
         migrator AS (
             SELECT coalesce((SELECT c.relowner FROM pg_class c
                              WHERE c.oid = to_regclass('batch_job_run')),
                             (SELECT r.oid FROM pg_roles r WHERE r.rolname = current_user)) AS oid),
         holders AS (
             SELECT CASE WHEN a.grantee = 'pg_database_owner'::regrole
                         THEN (SELECT d.datdba FROM pg_database d
                               WHERE d.datname = current_database())
                         ELSE a.grantee END AS grantee
             FROM s, aclexplode(s.acl) a
             WHERE a.privilege_type = 'CREATE')
         SELECT (SELECT nspname FROM s),
                coalesce(array_agg(DISTINCT CASE WHEN h.grantee = 0 THEN 'PUBLIC'
                                                 ELSE h.grantee::regrole::text END)
                         FILTER (WHERE h.grantee IS NOT NULL), '{}')
         FROM holders h, migrator m
         WHERE CASE WHEN h.grantee = 0 THEN true
                    ELSE NOT (pg_has_role(h.grantee, m.oid, 'MEMBER')
                              OR coalesce((SELECT r.rolsuper FROM pg_roles r
                                           WHERE r.oid = h.grantee), false)) END",
    )
    .fetch_one(pool)
    .await?;
    let schema = crate::text::escape_for_terminal(&schema).into_owned();
    let mut holders = holders;
    // PUBLIC first: it is every role's privilege at once.
    holders.sort_by_key(|h| h != "PUBLIC");
    Ok(holders
        .iter()
        .map(|h| {
            let who = crate::text::escape_for_terminal(h);
            format!(
                "warn  {who} may CREATE in schema {schema}: a function or operator planted there can run as the migrator inside the engine's functions; run `batchonce roles --apply` as the administrator (or REVOKE CREATE ON SCHEMA {schema} FROM {who})"
            )
        })
        .collect())
}

/// One racer: connects first, waits for the common start instant, then
/// enqueues and claims the scratch key, and prints what it won as JSON.
pub async fn race(url: &str, key: &str, start_at_ms: i64) -> anyhow::Result<()> {
    let key = JobKey::parse(key)?;
    if key.job_name() != PREFLIGHT_JOB {
        bail!("preflight-racer only races {PREFLIGHT_JOB} keys");
    }
    let job = JobName::parse(PREFLIGHT_JOB)?;
    let worker = format!("preflight-{}", std::process::id());
    let pool = db::connect(url, &worker, 1).await?;
    sqlx::query("SELECT 1").execute(&pool).await?;
    let wait = start_at_ms - Utc::now().timestamp_millis();
    if wait > 0 {
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    }
    let business_date = Utc::now().date_naive();
    let cfg = crate::config::JobConfig {
        max_attempts: 1,
        lease_ttl: Duration::from_secs(60),
        ..Default::default()
    };
    let run = NewRun {
        key: key.clone(),
        job: job.clone(),
        business_date,
        max_attempts: 1,
        payload: json!({}),
        skip_reason: None,
        partitions: 1,
        scope_query: None,
        context: crate::config::context::RunContext::new(
            &cfg,
            &crate::schedule::Period::day(business_date),
        )?,
    };
    let report = queue::enqueue(&pool, &[run], Clock::Db).await?;
    let spec = [ClaimSpec {
        job,
        lease_ttl: Duration::from_secs(60),
    }];
    let leases = queue::claim(&pool, &worker, &spec, 1, Clock::Db).await?;
    println!(
        "{}",
        json!({"enqueued": !report.enqueued.is_empty(), "claimed": !leases.is_empty()})
    );
    Ok(())
}
