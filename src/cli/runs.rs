//! `batchonce runs ...`: inspecting runs and the operator actions on them.

use std::process::ExitCode;

use anyhow::anyhow;
use serde_json::json;

use super::keys;
use super::print::{
    distinct_fingerprints, print_drift, print_left_out, seconds, time, time_or_dash, Align, Table,
};
use super::{validate_operator, validate_reason, RunsCommand};
use crate::clock::Clock;
use crate::config::Config;
use crate::key::{JobName, Scope};
use crate::queue::{self, RunStatus};
use crate::runtime::job::Registry;
use crate::text::{escape_for_terminal as esc, json_for_terminal};

/// The `runs` subcommands. `status`, `runs list` and `runs stale` read no
/// configuration to judge or filter runs; `runs stale` prints, per run, the
/// key, the conclusion and three lines of evidence (for `blocked`, the
/// waiting session and the sessions it waits for), or `no stale runs`.
/// `runs fail|rerun|skip` parse the key ([`super::keys::parse`]), check
/// `--operator` and `--reason`, take `max_attempts` from the key's job
/// configuration and the engine's default `stale_after` (both serve only a
/// run that stores none), and call `queue::blockers::act` with
/// `--lock-timeout`, `--terminate-blocker` and `--dry-run`; a `Refused`
/// becomes an error and `ActError::Blocked` goes to [`blocked`]. A
/// database error of `status` or `runs …` becomes the `not migrated` line
/// when a migration is pending (`unless_unmigrated`).
pub(super) async fn runs_command(
    pool: &sqlx::PgPool,
    registry: &Registry,
    config: &Config,
    command: &RunsCommand,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    match command {
        RunsCommand::Stale { fail_if_dead } => stale(pool, *fail_if_dead, json_out).await,
        RunsCommand::Watch { key, interval } => {
            let key = keys::parse(key)?;
            super::watch::watch(pool, &key, *interval, json_out).await
        }
        RunsCommand::Fail(a) | RunsCommand::Rerun(a) | RunsCommand::Skip(a) => {
            act(pool, config, command, a, json_out).await
        }
        RunsCommand::List {
            status,
            job,
            scope,
            limit,
        } => list(pool, registry, status, job, scope, *limit, json_out).await,
        RunsCommand::Archive(a) => archive(pool, a, json_out).await,
        RunsCommand::Show { key } => show(pool, key, json_out).await,
    }
}

/// `runs stale`: the stale runs with their evidence, after the
/// configuration drift and the registry's problems.
async fn stale(
    pool: &sqlx::PgPool,
    fail_if_dead: bool,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let stale = queue::stale_runs(pool, Clock::Db).await?;
    let drift = crate::runtime::worker_registry::config_drift(pool).await?;
    let left_out = queue::registry_problems(pool).await?;
    if json_out {
        for p in &left_out.0 {
            eprintln!(
                "batchonce: warning: registry: left out {}",
                esc(&p.describe())
            );
        }
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
        return Ok(stale_exit(&stale, fail_if_dead));
    }
    print_drift(&drift);
    print_left_out(&left_out.0, left_out.1);
    if stale.is_empty() {
        println!("no stale runs");
    }
    let age = |a: Option<f64>| {
        a.map(|s| format!("{s:.0}s ago"))
            .unwrap_or_else(|| "never".into())
    };
    for r in &stale {
        println!("{}  {}", esc(&r.job_key), r.conclusion);
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
    Ok(stale_exit(&stale, fail_if_dead))
}

/// `runs fail|rerun|skip`: the operator action `command` names, on the
/// run `a.key` names.
async fn act(
    pool: &sqlx::PgPool,
    config: &Config,
    command: &RunsCommand,
    a: &super::ActionArgs,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let action = match command {
        RunsCommand::Fail(_) => queue::Action::Fail,
        RunsCommand::Rerun(_) => queue::Action::Rerun,
        _ => queue::Action::Skip,
    };
    let key = keys::parse(&a.key)?;
    let operator = validate_operator(&a.operator)?;
    let reason = validate_reason(&a.reason)?;
    // A key that may be a date written another way: if it names no
    // run, say how dates are written rather than only "no run".
    if keys::hint(key.as_str()).is_some() && queue::show_run(pool, &key).await?.is_none() {
        return Err(keys::no_run(&key));
    }
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
        // Only for a run that stores no policy: the engine's default,
        // as `runs stale` judges such a run.
        stale_after: crate::config::JobConfig::default().stale_after,
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
    let (key, before, after) = (esc(&outcome.job_key), outcome.before, outcome.after);
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

/// `runs list`: the runs that match, as a table or JSON.
async fn list(
    pool: &sqlx::PgPool,
    registry: &Registry,
    status: &Option<String>,
    job: &Option<String>,
    scope: &Option<String>,
    limit: u32,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let status = match status {
        Some(s) => Some(RunStatus::parse(s).ok_or_else(|| {
            anyhow!(
                "unknown status {s:?} (expected PENDING, RUNNING, SUCCEEDED, FAILED or SKIPPED)"
            )
        })?),
        None => None,
    };
    let runs = list_runs(
        pool,
        registry,
        status,
        job.as_deref(),
        scope.as_deref(),
        limit,
    )
    .await?;
    if json_out {
        println!("{}", json_for_terminal(&runs)?);
    } else {
        print_list(&runs);
    }
    Ok(ExitCode::SUCCESS)
}

/// `runs show`: one run with its attempts and operator actions, from the
/// ledger or, once archived, from the archive.
async fn show(pool: &sqlx::PgPool, key: &str, json_out: bool) -> anyhow::Result<ExitCode> {
    let key = keys::parse(key)?;
    let Some((run, attempts)) = queue::show_run(pool, &key).await? else {
        // Archived runs leave the ledger but not the record.
        if let Some((run, attempts, archived)) = queue::show_archived(pool, &key).await? {
            let actions = queue::actions(pool, &key).await?;
            if json_out {
                println!(
                    "{}",
                    json_for_terminal(&json!({"run": run, "attempts": attempts,
                        "archived": archived, "operator_actions": actions}))?
                );
            } else {
                print_show(&run, &attempts, &actions);
                println!();
                println!(
                    "archived:       {} by audit row {} (`batchonce runs archive`); this run is no longer in the live ledger, and its key is never enqueued again",
                    time(archived.archived_at),
                    archived.audit_id
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
        return Err(keys::no_run(&key));
    };
    let actions = queue::actions(pool, &key).await?;
    let partitions = queue::partitions(pool, &key).await?;
    if json_out {
        println!(
            "{}",
            json_for_terminal(&json!({"run": run, "attempts": attempts,
                "partitions": partitions, "operator_actions": actions}))?
        );
    } else {
        print_show(&run, &attempts, &actions);
        print_partitions(&run, &partitions);
    }
    Ok(ExitCode::SUCCESS)
}

/// `runs archive`: checks the input, then previews or archives batch after
/// batch, printing each batch as it commits (an interrupted archive has
/// printed what it committed).
async fn archive(
    pool: &sqlx::PgPool,
    a: &super::ArchiveArgs,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let before = crate::key::parse_date(&a.before)
        .map_err(|e| anyhow!("invalid --before {:?}: {e}", a.before))?;
    let job = match &a.job {
        Some(j) => Some(JobName::parse(j).map_err(|e| anyhow!("invalid --job: {e}"))?),
        None => None,
    };
    let req = queue::ArchiveRequest {
        before,
        job,
        batch: a.batch,
        operator: validate_operator(&a.operator)?,
        reason: validate_reason(&a.reason)?,
    };
    if a.dry_run {
        let jobs = queue::preview_archive(pool, &req, Clock::Db).await?;
        if json_out {
            println!(
                "{}",
                json_for_terminal(&json!({"before": before, "applied": false, "jobs": jobs}))?
            );
        } else {
            for j in &jobs {
                println!(
                    "dry run: {}: would archive {} runs and {} attempts (business dates before {before})",
                    esc(&j.job),
                    j.runs,
                    j.attempts
                );
            }
            let runs: i64 = jobs.iter().map(|j| j.runs).sum();
            println!("dry run: {runs} runs would be archived; nothing changed");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let jobs = queue::archive(pool, &req, Clock::Db, |batch| {
        if !json_out {
            for j in batch {
                println!(
                    "archived {} runs and {} attempts of {} (audit row {})",
                    j.runs,
                    j.attempts,
                    esc(&j.job),
                    j.audit_id.unwrap_or_default()
                );
            }
        }
    })
    .await?;
    if json_out {
        println!(
            "{}",
            json_for_terminal(&json!({"before": before, "applied": true, "batches": jobs}))?
        );
    } else {
        let runs: i64 = jobs.iter().map(|j| j.runs).sum();
        let attempts: i64 = jobs.iter().map(|j| j.attempts).sum();
        println!("archived {runs} runs and {attempts} attempts with business dates before {before} (audited)");
    }
    Ok(ExitCode::SUCCESS)
}

/// `runs stale`'s exit status: [`super::EXIT_FOUND`] if asked to look for
/// a dead run and one is there.
fn stale_exit(stale: &[queue::StaleRun], fail_if_dead: bool) -> ExitCode {
    if fail_if_dead
        && stale
            .iter()
            .any(|r| r.conclusion == queue::Conclusion::Dead)
    {
        ExitCode::from(super::EXIT_FOUND)
    } else {
        ExitCode::SUCCESS
    }
}

/// `runs list` as a table: the worker is the lease holder of a RUNNING run
/// and the last one otherwise.
fn print_list(runs: &[queue::RunView]) {
    let mut t = Table::new(&[
        ("KEY", Align::Left),
        ("STATUS", Align::Left),
        ("ATTEMPTS", Align::Right),
        ("PROCESSED", Align::Right),
        ("FAILED", Align::Right),
        ("WORKER", Align::Left),
        ("STARTED", Align::Left),
        ("FINISHED", Align::Left),
    ]);
    for r in runs {
        t.row(vec![
            esc(&r.job_key).into_owned(),
            r.status.to_string(),
            format!("{}/{}", r.attempts, r.max_attempts),
            r.processed_count.to_string(),
            r.failed_count.to_string(),
            r.lease_owner
                .as_deref()
                .map_or_else(|| "-".to_owned(), |w| esc(w).into_owned()),
            time_or_dash(r.started_at),
            time_or_dash(r.finished_at),
        ]);
    }
    t.print();
}

/// A partitioned run's partitions under `runs show`: each is leased apart,
/// and the parent's own attempts above are its final step.
fn print_partitions(run: &queue::RunView, partitions: &[queue::RunView]) {
    if partitions.is_empty() {
        return;
    }
    let done = partitions
        .iter()
        .filter(|p| p.status == RunStatus::Succeeded)
        .count();
    println!();
    println!(
        "partitions: {done} of {} succeeded; the attempts above are the final step, which runs once all have",
        partitions.len()
    );
    print_list(partitions);
    if run.status == RunStatus::Failed {
        println!(
            "`batchonce runs rerun {}` re-runs the FAILED and SKIPPED partitions (none if only the final step failed), then the final step",
            esc(&run.job_key)
        );
    }
}

/// One `label: value` line of `runs show`, the values in one column.
fn field(label: &str, value: impl std::fmt::Display) {
    println!("{:<16}{value}", format!("{label}:"));
}

/// `runs show` in text: the run, then its attempts and operator actions.
/// Every time is compared with the database clock of the read (`read_at`).
fn print_show(
    run: &queue::RunView,
    attempts: &[queue::AttemptView],
    actions: &[queue::ActionView],
) {
    print_run(run);
    println!();
    print_attempts(attempts);
    print_actions(actions);
}

/// How long before or after `now` the instant `t` is: `3m12s ago`, `in 5s`.
fn relative(now: chrono::DateTime<chrono::Utc>, t: chrono::DateTime<chrono::Utc>) -> String {
    let s = (now - t).num_milliseconds() as f64 / 1000.0;
    if s >= 0.0 {
        format!("{} ago", seconds(s))
    } else {
        format!("in {}", seconds(s))
    }
}

/// `runs show`'s fields of the run itself, from its key to its message.
fn print_run(run: &queue::RunView) {
    let now = run.read_at;
    let ago = |t| relative(now, t);
    field("key", esc(&run.job_key));
    field("job", esc(&run.job_name));
    match (run.step, &run.partition_of) {
        (queue::Step::Partition { no, count }, Some(parent)) => {
            field("partition", format!("{no} of {count} of {}", esc(parent)))
        }
        (queue::Step::Final { count }, _) => field(
            "partitions",
            format!("{count} (this run's own attempts are its final step)"),
        ),
        _ => {}
    }
    field("business date", run.business_date);
    field("status", run.status);
    field("attempts", format!("{}/{}", run.attempts, run.max_attempts));
    field(
        "processed",
        format!("{} items, {} failed", run.processed_count, run.failed_count),
    );
    print_context(run);
    field("enqueued", time(run.enqueued_at));
    if queue::is_waiting(run) {
        field("next try", "after its partitions (below)");
    } else if run.status == RunStatus::Pending {
        field(
            "next try",
            format!("{} ({})", time(run.next_run_at), ago(run.next_run_at)),
        );
    }
    if let Some(t) = run.started_at {
        field("started", format!("{} ({})", time(t), ago(t)));
    }
    if let Some(t) = run.finished_at {
        field("finished", format!("{} ({})", time(t), ago(t)));
    }
    print_lease(run);
    if let Some(e) = &run.error_message {
        field("message", esc(e));
    }
}

/// `runs show`'s period and policies, from the run's stored context.
fn print_context(run: &queue::RunView) {
    match &run.context {
        Some(c) => {
            field(
                "period",
                format!(
                    "{} .. {} ({}, {})",
                    time(c.period_start),
                    time(c.period_end),
                    c.timezone.name(),
                    c.covers.as_str()
                ),
            );
            field(
                "policies",
                format!(
                    "lease {}, stale after {}, on lease expiry {}, chunk {}, backoff {}..{}, {} attempts, item failures {}",
                    humantime::format_duration(c.lease_ttl),
                    humantime::format_duration(c.stale_after),
                    c.on_lease_expiry.as_str(),
                    c.chunk_size,
                    humantime::format_duration(c.backoff),
                    humantime::format_duration(c.backoff_max),
                    c.attempt_budget,
                    c.max_item_failures
                        .map_or_else(|| "unlimited".to_owned(), |n| n.to_string()),
                ),
            );
        }
        None => field(
            "period",
            "not recorded (enqueued by a release before run contexts; the worker that claims it records it)",
        ),
    }
}

/// `runs show`'s lease of a RUNNING run, or the last worker of another.
fn print_lease(run: &queue::RunView) {
    let now = run.read_at;
    let ago = |t| relative(now, t);
    match (&run.lease_owner, run.status) {
        (Some(o), RunStatus::Running) => {
            // The attempt, never the token: a token is the capability to
            // change the run, for its holder alone.
            let holder = format!("held by {}, attempt {}", esc(o), run.attempts);
            match run.lease_expires_at {
                Some(t) if t <= now => field(
                    "lease",
                    format!(
                        "EXPIRED {} ago at {}, {holder}; see `batchonce runs stale`",
                        seconds((now - t).num_milliseconds() as f64 / 1000.0),
                        time(t)
                    ),
                ),
                Some(t) => field(
                    "lease",
                    format!("{holder}, expires {} ({})", time(t), ago(t)),
                ),
                None => field("lease", holder),
            }
            if let Some(h) = run.heartbeat_at {
                field("last heartbeat", format!("{} ({})", time(h), ago(h)));
            }
        }
        (Some(o), _) => field("last worker", esc(o)),
        (None, _) => {}
    }
}

/// `runs show`'s attempt history, with a command job's last lines.
fn print_attempts(attempts: &[queue::AttemptView]) {
    println!("attempt history:");
    if attempts.is_empty() {
        println!("  none yet");
    } else {
        let mut t = Table::new(&[
            ("#", Align::Right),
            ("WORKER", Align::Left),
            ("OUTCOME", Align::Left),
            ("PROCESSED", Align::Right),
            ("FAILED", Align::Right),
            ("STARTED", Align::Left),
            ("FINISHED", Align::Left),
            ("MESSAGE", Align::Left),
        ]);
        for a in attempts {
            t.row(vec![
                a.attempt.to_string(),
                esc(&a.worker_id).into_owned(),
                esc(a.outcome.as_deref().unwrap_or("running")).into_owned(),
                a.processed_count.to_string(),
                a.failed_count.to_string(),
                time(a.started_at),
                time_or_dash(a.finished_at),
                a.error_message
                    .as_deref()
                    .map(|e| esc(e).into_owned())
                    .unwrap_or_default(),
            ]);
        }
        for line in t.lines("  ") {
            println!("{line}");
        }
        // A command job's last lines, attempt by attempt, successful ones
        // included: what the program said is often the whole story.
        for a in attempts {
            if let Some(out) = a.output.as_deref() {
                println!();
                println!("  output of attempt {} (last lines):", a.attempt);
                for line in out.lines() {
                    println!("    {}", esc(line));
                }
            }
        }
    }
}

/// `runs show`'s operator actions, if any.
fn print_actions(actions: &[queue::ActionView]) {
    if !actions.is_empty() {
        println!();
        println!("operator actions:");
        for a in actions {
            println!(
                "  {} {} by {} (session {}): {} -> {}: {}",
                time(a.at),
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

/// `runs list`: the runs of any job the database holds, whatever this
/// process's configuration declares. A name with no runs that the
/// configuration does not know either is most likely a typo: that is an
/// error naming the known jobs, rather than an empty list.
async fn list_runs(
    pool: &sqlx::PgPool,
    registry: &Registry,
    status: Option<RunStatus>,
    job: Option<&str>,
    scope: Option<&str>,
    limit: u32,
) -> anyhow::Result<Vec<queue::RunView>> {
    let name = job.map(JobName::parse).transpose()?;
    let scope = scope.map(Scope::parse).transpose()?;
    let runs = queue::list_runs(pool, status, name.as_ref(), scope.as_ref(), limit).await?;
    if let (Some(j), true) = (job, runs.is_empty()) {
        if queue::list_runs(pool, None, name.as_ref(), None, 1)
            .await?
            .is_empty()
        {
            registry.resolve(j).map_err(|e| anyhow!(e))?;
        }
    }
    Ok(runs)
}

/// An operator action that gave up waiting for the run's row: one error
/// line and the sessions in detail on stderr, and with `--json` the same
/// as one object on stdout. Exit 1.
fn blocked(b: &queue::blockers::Blocked, json_out: bool) -> anyhow::Result<ExitCode> {
    let line = crate::text::truncate(&b.to_string());
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
