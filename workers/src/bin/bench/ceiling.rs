//! The `ceiling` scenario of `batchonce-bench` (issue 25): how fast any
//! drain that keeps a permanent run ledger could go here, measured at the
//! SQL level so that no worker process is in the figures.
//!
//! Every variant drains the same number of runs with the same client: `clients`
//! connections, each claiming 64 runs in one statement and finishing them in a
//! second, fenced by the token the claim returned, until nothing is left. Only
//! the statements differ:
//!
//! - `bare`: the drain scenario's bare queue (a three-column table).
//! - `bare-history`: the same with an attempt row inserted at the claim and
//!   closed at the finish.
//! - `engine`: this release's own statements, `batchonce_claim3` and
//!   `batchonce_finish`, on `batch_job_run` (the worker's SQL without the worker).
//! - `ledger-once`: a probe of the design the issue suggests, built for the
//!   measurement and dropped after it: a narrow table of claimable runs holds
//!   the lease (token, owner, attempt), the claim reads the run's row for its
//!   context but does not write it, and the finish deletes the lease, writes
//!   the ledger row once (its final state) and inserts the attempt row once.
//!   Nothing else (no heartbeat, no recovery, no partitions) is in it, so it is
//!   an upper bound for such a design, not a design.
//! - `ledger-once-without-ledger`: `ledger-once` whose finish does not write the
//!   ledger row: what that one permanent write costs.
//!
//! Ratios are to `bare` of the same run and the same client count; at full
//! size each figure is the median of three interleaved rounds.

use std::time::Instant;

use anyhow::bail;
use serde_json::json;
use sqlx::PgPool;

use super::{count, noop_runs, reset, Size};
use batchonce::queue;
use batchonce::Clock;

/// Runs per claim, as a worker with free slots and an earned queue claims.
const BATCH: i64 = 64;

struct Variant {
    name: &'static str,
    /// Creates what the variant needs and fills it with `$n` claimable runs;
    /// the engine's runs are enqueued before, for every variant but the bare ones.
    setup: &'static str,
    /// Binds the batch size and returns `(key, token)` rows.
    claim: &'static str,
    /// Binds the keys and tokens the claim returned.
    finish: &'static str,
    /// Counts the runs the variant finished.
    done: &'static str,
}

const BARE_SETUP: &str = "DROP TABLE IF EXISTS bench_h; DROP TABLE IF EXISTS bench_q; \
     CREATE TABLE bench_q (id bigint PRIMARY KEY, state text NOT NULL, token bigint); \
     CREATE INDEX bench_q_pending ON bench_q (id) WHERE state = 'pending'; \
     CREATE TABLE bench_h (id bigint NOT NULL REFERENCES bench_q (id), token bigint NOT NULL, \
         started_at timestamptz NOT NULL, finished_at timestamptz, outcome text, \
         PRIMARY KEY (id, token)); \
     CREATE SEQUENCE IF NOT EXISTS bench_q_token; \
     INSERT INTO bench_q SELECT g, 'pending', NULL \
         FROM generate_series(1, (SELECT count(*) FROM batch_job_run WHERE job_name = 'bench-noop')) g; \
     ANALYZE bench_q;";

const LEDGER_ONCE_SETUP: &str = "DROP TABLE IF EXISTS bench_ready; \
     CREATE TABLE bench_ready (job_key varchar(120) PRIMARY KEY, job_name varchar(64) NOT NULL, \
         next_run_at timestamptz NOT NULL, token bigint, owner varchar(80), \
         attempt integer NOT NULL DEFAULT 0, started_at timestamptz); \
     CREATE INDEX bench_ready_claim ON bench_ready (next_run_at, job_key) WHERE token IS NULL; \
     INSERT INTO bench_ready (job_key, job_name, next_run_at) \
         SELECT job_key, job_name, next_run_at FROM batch_job_run \
         WHERE job_name = 'bench-noop' AND status = 'PENDING'; \
     ANALYZE bench_ready; ANALYZE batch_job_run;";

const LEDGER_ONCE_CLAIM: &str = "WITH picked AS ( \
         SELECT job_key FROM bench_ready \
         WHERE token IS NULL AND next_run_at <= now() AND job_name = 'bench-noop' \
         ORDER BY next_run_at, job_key LIMIT $1 FOR UPDATE SKIP LOCKED), \
     l AS (UPDATE bench_ready q SET token = batchonce_new_token(), owner = 'ceiling', \
             attempt = q.attempt + 1, started_at = now() \
           FROM picked WHERE q.job_key = picked.job_key RETURNING q.job_key, q.token) \
     SELECT l.job_key::text, l.token FROM l JOIN batch_job_run r ON r.job_key = l.job_key \
     WHERE r.payload IS NOT NULL";

fn variants() -> Vec<Variant> {
    vec![
        Variant {
            name: "bare",
            setup: BARE_SETUP,
            claim: "WITH c AS (SELECT id FROM bench_q WHERE state = 'pending' ORDER BY id \
                        LIMIT $1 FOR UPDATE SKIP LOCKED) \
                    UPDATE bench_q q SET state = 'running', token = nextval('bench_q_token') \
                    FROM c WHERE q.id = c.id RETURNING q.id::text, q.token",
            finish: "UPDATE bench_q q SET state = 'done' \
                     FROM unnest($1::text[]::bigint[], $2::bigint[]) AS u(id, token) \
                     WHERE q.id = u.id AND q.token = u.token AND q.state = 'running'",
            done: "SELECT count(*) FROM bench_q WHERE state = 'done'",
        },
        Variant {
            name: "bare-history",
            setup: BARE_SETUP,
            claim: "WITH c AS (SELECT id FROM bench_q WHERE state = 'pending' ORDER BY id \
                        LIMIT $1 FOR UPDATE SKIP LOCKED), \
                    u AS (UPDATE bench_q q SET state = 'running', token = nextval('bench_q_token') \
                          FROM c WHERE q.id = c.id RETURNING q.id, q.token), \
                    h AS (INSERT INTO bench_h (id, token, started_at) SELECT id, token, now() FROM u) \
                    SELECT id::text, token FROM u",
            finish: "WITH f AS (UPDATE bench_q q SET state = 'done' \
                         FROM unnest($1::text[]::bigint[], $2::bigint[]) AS u(id, token) \
                         WHERE q.id = u.id AND q.token = u.token AND q.state = 'running' \
                         RETURNING q.id, q.token) \
                     UPDATE bench_h h SET finished_at = now(), outcome = 'succeeded' FROM f \
                     WHERE h.id = f.id AND h.token = f.token",
            done: "SELECT count(*) FROM bench_h WHERE outcome = 'succeeded'",
        },
        Variant {
            name: "engine",
            setup: "ANALYZE batch_job_run;",
            claim: "SELECT job_key, lease_token FROM batchonce_claim3( \
                        ARRAY['bench-noop'], ARRAY[30::float8], $1, 'ceiling', now(), false)",
            finish: "SELECT count(*) FROM batchonce_finish($1, $2, \
                         array_fill('succeeded'::text, ARRAY[cardinality($1)]), \
                         array_fill(NULL::text, ARRAY[cardinality($1)]), \
                         array_fill(0::float8, ARRAY[cardinality($1)]), now())",
            done: "SELECT count(*) FROM batch_job_run \
                   WHERE job_name = 'bench-noop' AND status = 'SUCCEEDED'",
        },
        Variant {
            name: "ledger-once",
            setup: LEDGER_ONCE_SETUP,
            claim: LEDGER_ONCE_CLAIM,
            finish: "WITH f AS (SELECT * FROM unnest($1::text[], $2::bigint[]) AS f(job_key, token)), \
                     l AS (DELETE FROM bench_ready q USING f \
                           WHERE q.job_key = f.job_key AND q.token = f.token RETURNING q.*), \
                     u AS (UPDATE batch_job_run r SET status = 'SUCCEEDED', attempts = l.attempt, \
                               started_at = l.started_at, finished_at = now(), lease_token = l.token, \
                               lease_owner = l.owner \
                           FROM l WHERE r.job_key = l.job_key \
                           RETURNING r.job_key, l.token, l.attempt, l.owner, l.started_at) \
                     INSERT INTO batch_job_attempt (job_key, attempt, lease_token, worker_id, \
                         started_at, finished_at, outcome) \
                     SELECT job_key, attempt, token, owner, started_at, now(), 'succeeded' FROM u",
            done: "SELECT count(*) FROM batch_job_run \
                   WHERE job_name = 'bench-noop' AND status = 'SUCCEEDED'",
        },
        Variant {
            name: "ledger-once-without-ledger",
            setup: LEDGER_ONCE_SETUP,
            claim: LEDGER_ONCE_CLAIM,
            finish: "WITH f AS (SELECT * FROM unnest($1::text[], $2::bigint[]) AS f(job_key, token)), \
                     l AS (DELETE FROM bench_ready q USING f \
                           WHERE q.job_key = f.job_key AND q.token = f.token RETURNING q.*) \
                     INSERT INTO batch_job_attempt (job_key, attempt, lease_token, worker_id, \
                         started_at, finished_at, outcome) \
                     SELECT job_key, attempt, token, owner, started_at, now(), 'succeeded' FROM l",
            done: "SELECT count(*) FROM batch_job_attempt \
                   WHERE job_key LIKE 'bench-noop:%' AND outcome = 'succeeded'",
        },
    ]
}

/// Drains the variant's runs from `clients` connections; runs per second.
async fn drain_variant(pool: &PgPool, v: &Variant, n: usize, clients: u32) -> anyhow::Result<f64> {
    reset(pool).await?;
    queue::enqueue(pool, &noop_runs(n, 0), Clock::Db).await?;
    sqlx::raw_sql(v.setup).execute(pool).await?;
    sqlx::query("CHECKPOINT").execute(pool).await?;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let pool = pool.clone();
        let (claim, finish) = (v.claim, v.finish);
        tasks.spawn(async move {
            loop {
                let rows: Vec<(String, i64)> =
                    sqlx::query_as(claim).bind(BATCH).fetch_all(&pool).await?;
                if rows.is_empty() {
                    return Ok::<_, sqlx::Error>(());
                }
                let (keys, tokens): (Vec<String>, Vec<i64>) = rows.into_iter().unzip();
                sqlx::query(finish)
                    .bind(&keys)
                    .bind(&tokens)
                    .execute(&pool)
                    .await?;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let secs = started.elapsed().as_secs_f64();
    let done = count(pool, v.done).await?;
    if done != n as i64 {
        bail!("{}: finished {done} of {n} runs", v.name);
    }
    Ok(n as f64 / secs)
}

pub(super) async fn ceiling(pool: &PgPool, size: Size) -> anyhow::Result<serde_json::Value> {
    // Three interleaved rounds and their medians at full size: a variant
    // measured once, after the others, also measures their leftovers (dead
    // rows, a checkpoint, autovacuum), and runs here vary by a third.
    let (n, client_counts, rounds): (usize, &[u32], usize) = if size == Size::Full {
        (30_000, &[2, 8, 32], 3)
    } else {
        (300, &[2], 1)
    };
    let variants = variants();
    let mut results = Vec::new();
    for &clients in client_counts {
        let mut rates = vec![Vec::new(); variants.len()];
        for _ in 0..rounds {
            for (v, r) in variants.iter().zip(rates.iter_mut()) {
                r.push(drain_variant(pool, v, n, clients).await?);
            }
        }
        let medians: Vec<f64> = rates
            .iter_mut()
            .map(|r| {
                r.sort_by(f64::total_cmp);
                r[r.len() / 2]
            })
            .collect();
        let bare = medians[0];
        let row: serde_json::Map<String, serde_json::Value> = variants
            .iter()
            .zip(&medians)
            .map(|(v, rate)| {
                (
                    v.name.to_string(),
                    json!({ "runs_per_s": rate.round(), "ratio": (rate / bare * 100.0).round() / 100.0 }),
                )
            })
            .collect();
        eprintln!(
            "ceiling clients={clients} (median of {rounds}): {}",
            variants
                .iter()
                .zip(&medians)
                .map(|(v, rate)| format!("{} {rate:.0} runs/s ({:.2})", v.name, rate / bare))
                .collect::<Vec<_>>()
                .join(", ")
        );
        results.push(json!({ "clients": clients, "runs": n, "rounds": rounds, "variants": row }));
    }
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS bench_ready; DROP TABLE IF EXISTS bench_h; DROP TABLE IF EXISTS bench_q;",
    )
    .execute(pool)
    .await?;
    reset(pool).await?;
    Ok(json!({ "scenario": "ceiling", "results": results }))
}
