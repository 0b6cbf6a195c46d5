//! `batchonce migrate`: applies the engine's and the declared kinds'
//! migrations, records the file's jobs as the declared set, and freezes the
//! context of the runs the previous release enqueued without one; with
//! `--contract`, drops the SQL functions only earlier releases call.

use std::process::ExitCode;

use anyhow::Context;
use serde_json::json;

use super::{require_url, Cli};
use crate::config::Config;
use crate::db;
use crate::queue;
use crate::runtime::job::Registry;

/// `migrate`: the migrations of the engine and of `registry`'s kinds (and
/// `known`'s, which the configuration's command jobs add), then the
/// declared jobs and the previous release's contexts.
pub(super) async fn migrate(
    cli: &Cli,
    registry: &Registry,
    known: &Registry,
    config: &Config,
    contract: bool,
) -> anyhow::Result<ExitCode> {
    let pool = db::connect(require_url(cli)?, "batchonce-migrate", 2).await?;
    let kinds = db::kinds_to_migrate(&pool, &registry.migrations(), &known.migrations()).await?;
    db::migrate(&pool, &kinds).await?;
    let n = db::combined(&kinds).iter().count();
    let (frozen, left) = freeze_legacy_contexts(&pool, config).await?;
    // The file's jobs become the declared set, which a producer's
    // enqueue must match. Without a file, nothing is declared or
    // undeclared: a migrate run only for the schema stops no job.
    let declared = if super::config_file_given(cli) {
        Some(
            queue::declare(&pool, &config.jobs)
                .await
                .context("recording the declared jobs failed")?,
        )
    } else {
        None
    };
    // After the migrations, which the contract's release needs;
    // a refusal leaves them applied.
    let contracted = if contract {
        Some(crate::ops::contract::run(&pool).await?)
    } else {
        None
    };
    if cli.json {
        println!(
            "{}",
            json!({"migrated": true, "migrations": n,
                   "contexts_frozen": frozen, "contexts_left": left,
                   "jobs_declared": declared.as_ref().map(|d| &d.jobs),
                   "jobs_undeclared": declared.as_ref().map(|d| &d.removed),
                   "contract": contracted})
        );
    } else {
        println!("migrations applied ({n} known)");
        match &declared {
            Some(d) => {
                println!(
                    "jobs declared from {}: {}",
                    config.origin,
                    if d.jobs.is_empty() {
                        "none".to_owned()
                    } else {
                        d.jobs.join(", ")
                    }
                );
                if !d.removed.is_empty() {
                    println!("no longer declared: {}", d.removed.join(", "));
                }
            }
            None => println!(
                "declared jobs unchanged (no configuration file: give --config to declare the file's jobs)"
            ),
        }
        if frozen > 0 || left > 0 {
            println!(
                "runs enqueued by the previous release: froze the context of {frozen} \
                 from {}; {left} left for the workers that claim them",
                config.origin
            );
        }
        if let Some(c) = &contracted {
            print_contract(c);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Freezes, from `config`, the context of every live run the previous
/// release enqueued without one (docs/upgrading.md). Returns how many were
/// frozen and how many were left (jobs this configuration does not name,
/// which their workers freeze when they claim them).
async fn freeze_legacy_contexts(
    pool: &sqlx::PgPool,
    config: &Config,
) -> anyhow::Result<(u64, u64)> {
    let legacy = queue::context::legacy_runs(pool, i64::MAX).await?;
    let mut todo = Vec::new();
    let mut left = 0u64;
    for run in legacy {
        let Some(cfg) = config.job(&run.job) else {
            left += 1;
            continue;
        };
        let period = run.key.period();
        match crate::config::context::RunContext::for_key(cfg, run.business_date, period) {
            Ok(c) => todo.push((run.key, c)),
            Err(_) => left += 1,
        }
    }
    let mut frozen = 0;
    for chunk in todo.chunks(1000) {
        frozen += queue::context::freeze_legacy(pool, chunk).await?;
    }
    Ok((frozen, left))
}

/// The text report of `migrate --contract`: one line per function dropped.
fn print_contract(c: &crate::ops::contract::Contracted) {
    if c.dropped.is_empty() {
        println!(
            "contract {}: nothing left to drop ({} functions dropped before)",
            c.release,
            c.already_gone.len()
        );
    }
    for f in &c.dropped {
        println!("contract {}: dropped {f}", c.release);
    }
}
