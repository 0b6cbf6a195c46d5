//! `batchonce runs ...`: inspecting runs and the operator actions on them.

use std::process::ExitCode;

use anyhow::{anyhow, bail};
use serde_json::json;

use super::print::{distinct_fingerprints, print_drift};
use super::{validate_operator, validate_reason, RunsCommand};
use crate::clock::Clock;
use crate::config::Config;
use crate::job::Registry;
use crate::key::{JobKey, JobName};
use crate::queue::{self, RunStatus};
use crate::text::{escape_for_terminal as esc, json_for_terminal};

pub(super) async fn runs_command(
    pool: &sqlx::PgPool,
    registry: &Registry,
    config: &Config,
    command: &RunsCommand,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    match command {
        RunsCommand::Stale => {
            let stale =
                queue::stale_runs(pool, &queue::StaleSpec::from_config(config), Clock::Db).await?;
            let drift = crate::worker_registry::config_drift(pool).await?;
            if json_out {
                println!("{}", json_for_terminal(&stale)?);
                // Standard output stays the list scripts read.
                for d in &drift {
                    eprintln!(
                        "batchonce: warning: live processes run {} with {} different configurations (keys: {}); see `batchonce status`",
                        esc(&d.job_name),
                        distinct_fingerprints(d),
                        esc(&d.keys.join(", "))
                    );
                }
                return Ok(ExitCode::SUCCESS);
            }
            print_drift(&drift);
            if stale.is_empty() {
                println!("no stale runs");
            }
            let age = |a: Option<f64>| {
                a.map(|s| format!("{s:.0}s ago"))
                    .unwrap_or_else(|| "never".into())
            };
            for r in &stale {
                println!("{}  {}", esc(&r.job_key), esc(&r.conclusion));
                println!(
                    "  attempt {} by {}, running {:.0}s{}",
                    r.attempt,
                    esc(r.worker_id.as_deref().unwrap_or("?")),
                    r.running_seconds,
                    if r.lease_expired {
                        ", lease expired"
                    } else {
                        ""
                    }
                );
                println!(
                    "  last heartbeat {}; processed {} ({} since the last heartbeat)",
                    age(r.heartbeat_age_seconds),
                    r.processed_count,
                    if r.advanced_since_heartbeat {
                        "advancing"
                    } else {
                        "not advancing"
                    }
                );
                println!(
                    "  worker last seen {}; database session {}",
                    age(r.worker_last_seen_age_seconds),
                    if r.session_alive { "connected" } else { "gone" }
                );
                if let Some(w) = &r.lock_wait {
                    println!(
                        "  its session {} waits on a lock ({}) for {:.0}s{}, held by:",
                        w.pid,
                        esc(w.wait_event.as_deref().unwrap_or("?")),
                        w.waiting_seconds.unwrap_or(0.0),
                        if w.for_this_run {
                            ""
                        } else {
                            " (maybe for another of its runs)"
                        }
                    );
                    for b in &w.blockers {
                        println!("    {}", esc(&b.session.describe()));
                        for s in &b.blocked_by {
                            println!("      {}", esc(&s.describe()));
                        }
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        RunsCommand::Fail(a) | RunsCommand::Rerun(a) | RunsCommand::Skip(a) => {
            let action = match command {
                RunsCommand::Fail(_) => queue::Action::Fail,
                RunsCommand::Rerun(_) => queue::Action::Rerun,
                _ => queue::Action::Skip,
            };
            let key = JobKey::parse(&a.key)?;
            let operator = validate_operator(&a.operator)?;
            let reason = validate_reason(&a.reason)?;
            let cfg = JobName::parse(key.job_name())
                .ok()
                .and_then(|n| config.job(&n).cloned())
                .unwrap_or_default();
            let req = queue::OperatorRequest {
                action,
                key,
                operator,
                reason,
                force: a.force,
                stale_after: cfg.stale_after,
                max_attempts: cfg.max_attempts,
            };
            let opts = queue::blockers::ActOptions {
                lock_timeout: a.lock_timeout,
                terminate_blocker: a.terminate_blocker,
                dry_run: a.dry_run,
            };
            let report = match queue::blockers::act(pool, &req, Clock::Db, opts).await {
                Ok(r) => r,
                Err(queue::blockers::ActError::Blocked(b)) => return blocked(&b, json_out),
                Err(e) => return Err(e.into()),
            };
            let outcome = &report.outcome;
            if json_out {
                println!("{}", json_for_terminal(&report)?);
                return Ok(ExitCode::SUCCESS);
            }
            for s in &report.terminated {
                println!("terminated {} (audited)", esc(&s.describe()));
            }
            let (key, before, after) = (
                esc(&outcome.job_key),
                esc(&outcome.before),
                esc(&outcome.after),
            );
            if outcome.applied {
                println!("{} {key}: {before} -> {after} (audited)", outcome.action);
            } else {
                println!(
                    "dry run: {} {key} would change {before} -> {after}; nothing changed",
                    outcome.action
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        RunsCommand::List { status, job, limit } => {
            let status = match status {
                Some(s) => Some(RunStatus::parse(s).ok_or_else(|| {
                    anyhow!("unknown status {s:?} (expected PENDING, RUNNING, SUCCEEDED, FAILED or SKIPPED)")
                })?),
                None => None,
            };
            let job = match job {
                Some(j) => Some(registry.resolve(j).map_err(|e| anyhow!(e))?),
                None => None,
            };
            let runs = queue::list_runs(pool, status, job.as_ref(), *limit).await?;
            if json_out {
                println!("{}", json_for_terminal(&runs)?);
            } else {
                println!(
                    "{:<40} {:<10} {:>8} {:>10} {:>7}  {:<25} FINISHED",
                    "KEY", "STATUS", "ATTEMPTS", "PROCESSED", "FAILED", "STARTED"
                );
                for r in runs {
                    println!(
                        "{:<40} {:<10} {:>8} {:>10} {:>7}  {:<25} {}",
                        esc(&r.job_key),
                        esc(&r.status),
                        format!("{}/{}", r.attempts, r.max_attempts),
                        r.processed_count,
                        r.failed_count,
                        r.started_at
                            .map(|t| t.to_rfc3339())
                            .unwrap_or_else(|| "-".into()),
                        r.finished_at
                            .map(|t| t.to_rfc3339())
                            .unwrap_or_else(|| "-".into()),
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        RunsCommand::Show { key } => {
            let key = JobKey::parse(key)?;
            let Some((run, attempts)) = queue::show_run(pool, &key).await? else {
                bail!("no run with key {key}");
            };
            let actions = queue::actions(pool, &key).await?;
            if json_out {
                println!(
                    "{}",
                    json_for_terminal(
                        &json!({"run": run, "attempts": attempts, "operator_actions": actions})
                    )?
                );
            } else {
                println!("key:          {}", esc(&run.job_key));
                println!("job:          {}", esc(&run.job_name));
                println!("business date {}", run.business_date);
                println!("status:       {}", esc(&run.status));
                println!("attempts:     {}/{}", run.attempts, run.max_attempts);
                println!(
                    "processed:    {} (failed {})",
                    run.processed_count, run.failed_count
                );
                match &run.context {
                    Some(c) => {
                        println!(
                            "period:       {} .. {} ({}, {})",
                            c.period_start.to_rfc3339(),
                            c.period_end.to_rfc3339(),
                            c.timezone.name(),
                            c.covers.as_str()
                        );
                        println!(
                            "policies:     lease {}, stale after {}, on lease expiry {}, chunk {}, backoff {}..{}, {} attempts, item failures {}",
                            humantime::format_duration(c.lease_ttl),
                            humantime::format_duration(c.stale_after),
                            c.on_lease_expiry.as_str(),
                            c.chunk_size,
                            humantime::format_duration(c.backoff),
                            humantime::format_duration(c.backoff_max),
                            c.attempt_budget,
                            c.max_item_failures
                                .map_or_else(|| "unlimited".to_owned(), |n| n.to_string()),
                        );
                    }
                    None => println!(
                        "period:       not recorded (enqueued by a release before run contexts; the worker that claims it records it)"
                    ),
                }
                println!("enqueued at:  {}", run.enqueued_at.to_rfc3339());
                println!("next run at:  {}", run.next_run_at.to_rfc3339());
                match (&run.lease_owner, run.status.as_str()) {
                    (Some(o), "RUNNING") => println!(
                        "lease:        {} token {} expires {}",
                        esc(o),
                        run.lease_token.unwrap_or_default(),
                        run.lease_expires_at
                            .map(|t| t.to_rfc3339())
                            .unwrap_or_else(|| "-".into())
                    ),
                    (Some(o), _) => println!("last worker:  {}", esc(o)),
                    (None, _) => {}
                }

                if let Some(e) = &run.error_message {
                    println!("message:      {}", esc(e));
                }
                println!("attempts:");
                for a in attempts {
                    println!(
                        "  #{:<3} {:<24} token {:<6} {:<14} processed {:<6} failed {:<4} {} .. {}{}",
                        a.attempt,
                        esc(&a.worker_id),
                        a.lease_token,
                        esc(a.outcome.as_deref().unwrap_or("running")),
                        a.processed_count,
                        a.failed_count,
                        a.started_at.to_rfc3339(),
                        a.finished_at.map(|t| t.to_rfc3339()).unwrap_or_else(|| "-".into()),
                        a.error_message.map(|e| format!("  ({})", esc(&e))).unwrap_or_default(),
                    );
                }
                if !actions.is_empty() {
                    println!("operator actions:");
                    for a in actions {
                        println!(
                            "  {} {} by {} (session {}): {} -> {}: {}",
                            a.at.to_rfc3339(),
                            esc(&a.action),
                            esc(&a.operator),
                            esc(&a.session_user),
                            esc(&a.before_status),
                            esc(&a.after_status),
                            esc(&a.reason)
                        );
                        if let Some(d) = &a.detail {
                            println!("    {}", esc(d));
                        }
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// An operator action that gave up waiting for the run's row: one error
/// line and the sessions in detail on stderr, and with `--json` the same
/// as one object on stdout. Exit 1.
fn blocked(b: &queue::blockers::Blocked, json_out: bool) -> anyhow::Result<ExitCode> {
    let line = crate::queue::truncate(&b.to_string());
    eprintln!("batchonce: error: {}", esc(&line));
    if json_out {
        let mut v = serde_json::to_value(b)?;
        v["error"] = json!("blocked");
        v["message"] = json!(line);
        println!("{}", json_for_terminal(&v)?);
    } else {
        for l in b.detail() {
            eprintln!("{}", esc(&l));
        }
    }
    Ok(ExitCode::FAILURE)
}
