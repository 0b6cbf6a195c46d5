//! `batchonce enqueue`: the runs of one date or a range, for one job and,
//! for a scoped job, the scopes asked for; one line per run.

use std::process::ExitCode;

use anyhow::{anyhow, bail, Context};
use serde_json::json;

use super::{require_url, Cli, EnqueueArgs};
use crate::clock::Clock;
use crate::config::Config;
use crate::db;
use crate::key::{parse_date, JobKey};
use crate::queue;
use crate::runtime::job::Registry;
use crate::runtime::producer;

/// `enqueue`: resolves the job, builds its runs, enqueues them and prints
/// each one's result; exit 1 when a scope query returned an invalid scope.
pub(super) async fn enqueue(
    cli: &Cli,
    registry: &Registry,
    config: &Config,
    args: &EnqueueArgs,
) -> anyhow::Result<ExitCode> {
    let EnqueueArgs {
        job,
        date,
        from,
        to,
        scope,
        all_scopes,
    } = args;
    let job = registry.resolve(job).map_err(|e| anyhow!(e))?;
    let dates = match (date, from, to) {
        (Some(d), _, _) => vec![parse_date(d)?],
        (None, Some(f), Some(t)) => {
            producer::date_range(parse_date(f)?, parse_date(t)?).map_err(|e| anyhow!(e))?
        }
        // clap requires --date or both --from and --to.
        _ => bail!("give --date, or --from and --to"),
    };
    let cfg = config.job(&job).cloned().unwrap_or_default();
    let periods = producer::periods_for_dates(&cfg, &dates).map_err(|e| anyhow!(e))?;
    let runs = super::keys::scoped_runs(&job, &cfg, &periods, scope, *all_scopes, &config.origin)?;
    let pool = db::connect(require_url(cli)?, "batchonce-enqueue", 2).await?;
    let report = queue::enqueue(&pool, &runs, Clock::Db)
        .await
        .context("enqueue failed")?;
    // A scope query's keys are known once the statement has run; a
    // scoped run shares its template's calendar reason.
    let reasons: std::collections::HashMap<&str, Option<&str>> = runs
        .iter()
        .map(|r| (r.key.as_str(), r.skip_reason.as_deref()))
        .collect();
    let mut results: Vec<(&JobKey, bool)> = report
        .enqueued
        .iter()
        .map(|k| (k, true))
        .chain(report.duplicates.iter().map(|k| (k, false)))
        .collect();
    results.sort();
    for (key, inserted) in results {
        let unscoped = key.unscoped();
        let reason = reasons
            .get(key.as_str())
            .or_else(|| reasons.get(unscoped.as_str()))
            .copied()
            .flatten();
        let result = match (inserted, reason) {
            (false, _) => "duplicate",
            (true, None) => "enqueued",
            (true, Some(_)) => "skipped",
        };
        if cli.json {
            println!(
                "{}",
                json!({"result": result, "job_key": key.as_str(), "reason": reason})
            );
        } else if result == "skipped" {
            println!("skipped {key} ({})", reason.unwrap_or(""));
        } else {
            println!("{result} {key}");
        }
    }
    for (template, id) in &report.invalid {
        let id = crate::key::shown(id);
        if cli.json {
            println!(
                "{}",
                json!({"result": "invalid", "job_key": template.as_str(), "scope": id})
            );
        } else {
            eprintln!(
                "invalid scope {id:?} from the scope query of {template}: not enqueued (a scope is 1-36 lowercase letters, digits and single dashes, and the key at most 120 characters)"
            );
        }
    }
    if report.invalid.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::FAILURE)
    }
}
