//! `batchonce status`: counts per job and status, each job's health
//! (`queue::job_health`, the very numbers the console's overview shows:
//! MISSING periods with why, overdue, FAILED, stale, PENDING, RUNNING, live
//! workers) and the banners, the scoped periods, the oldest due run, expired
//! leases, stale runs, configuration drift and the registry rows left out.
//! [`status_output`] builds the whole text or JSON, so a test reads exactly
//! what the command prints.

use sqlx::PgPool;

use super::print::{drift_lines, left_out_lines, seconds, Align, Table};
use crate::clock::Clock;
use crate::queue;
use crate::text::{escape_for_terminal as esc, json_for_terminal};

/// What `status` prints (with `json`, what `status --json` prints), ending
/// in a line break. Database errors are returned as they are; the command
/// turns them into the `not migrated` line when that is why.
pub async fn status_output(pool: &PgPool, json: bool) -> anyhow::Result<String> {
    let st = queue::status(pool, Clock::Db).await?;
    let health = queue::job_health(pool, Clock::Db).await?;
    let drift = crate::runtime::worker_registry::config_drift(pool).await?;
    let left_out = queue::registry_problems(pool).await?;
    // Paused jobs (`jobs pause`): a section of their own.
    let paused = queue::paused_jobs(pool, Clock::Db).await?;
    if json {
        let mut v = serde_json::to_value(&st)?;
        v["jobs"] = serde_json::to_value(&health.jobs)?;
        v["paused"] = serde_json::to_value(&paused)?;
        v["banners"] = serde_json::to_value(&health.banners)?;
        v["producers"] = serde_json::to_value(&health.producers)?;
        v["workers_without_jobs"] = serde_json::to_value(health.workers_without_jobs)?;
        v["config_drift"] = serde_json::to_value(&drift)?;
        v["registry_left_out"] = serde_json::to_value(&left_out.0)?;
        v["registry_left_out_count"] = serde_json::to_value(left_out.1)?;
        return Ok(format!("{}\n", json_for_terminal(&v)?));
    }
    let mut out = String::new();
    let mut t = Table::new(&[
        ("JOB", Align::Left),
        ("STATUS", Align::Left),
        ("RUNS", Align::Right),
    ]);
    for c in &st.counts {
        t.row(vec![
            esc(&c.job_name).into_owned(),
            c.status.to_string(),
            c.runs.to_string(),
        ]);
    }
    out.push_str(&t.text());
    if !st.partitions.is_empty() {
        // A partitioned run counts once above, by its parent; its
        // partitions are leased apart and counted here.
        let mut t = Table::new(&[
            ("JOB", Align::Left),
            ("STATUS", Align::Left),
            ("PARTITIONS", Align::Right),
        ]);
        for c in &st.partitions {
            t.row(vec![
                esc(&c.job_name).into_owned(),
                c.status.to_string(),
                c.runs.to_string(),
            ]);
        }
        out.push_str(&t.text());
    }
    out.push_str(&health_text(&health));
    out.push_str(&scopes_text(&st.scopes));
    match st.oldest_pending_seconds {
        Some(s) => out.push_str(&format!("oldest due pending run: {s:.0}s\n")),
        None => out.push_str("oldest due pending run: none\n"),
    }
    out.push_str(&format!("expired leases: {}\n", st.expired_leases));
    out.push_str(&format!(
        "stale runs: {}\n",
        if st.stale.is_empty() {
            "none".to_owned()
        } else {
            esc(&st
                .stale
                .iter()
                .map(|s| format!("{} ({})", s.job_key, s.conclusion))
                .collect::<Vec<_>>()
                .join(", "))
            .into_owned()
        }
    ));
    out.push_str(&super::jobs::paused_text(&paused));
    for line in drift_lines(&drift)
        .into_iter()
        .chain(left_out_lines(&left_out.0, left_out.1))
    {
        out.push_str(&line);
        out.push('\n');
    }
    Ok(out)
}

/// Each job's health as a table, its MISSING periods with why, and the
/// banners.
fn health_text(h: &queue::Health) -> String {
    let mut out = String::new();
    if !h.jobs.is_empty() {
        let mut t = Table::new(&[
            ("JOB", Align::Left),
            ("MISSING", Align::Right),
            ("OVERDUE", Align::Right),
            ("FAILED", Align::Right),
            ("STALE", Align::Right),
            ("PENDING", Align::Right),
            ("RUNNING", Align::Right),
            ("WORKERS", Align::Right),
        ]);
        for j in &h.jobs {
            t.row(vec![
                esc(&j.job_name).into_owned(),
                j.missing.shown(),
                j.overdue.to_string(),
                j.failed.to_string(),
                j.stale.to_string(),
                j.pending.to_string(),
                j.running.to_string(),
                j.workers.to_string(),
            ]);
        }
        out.push_str(&t.text());
    }
    for j in &h.jobs {
        for m in &j.missing.periods {
            out.push_str(&format!("missing: {}: {}\n", esc(&m.key), esc(&m.why)));
        }
        let more = j.missing.count.saturating_sub(j.missing.periods.len());
        if more > 0 {
            out.push_str(&format!(
                "missing: {} {more}{} more (the console's calendar shows them)\n",
                esc(&j.job_name),
                if j.missing.at_least { " or" } else { "" },
            ));
        }
    }
    if h.producers.live == 0 {
        out.push_str(&format!(
            "producers: none live{}\n",
            h.producers
                .last_seen_age_seconds
                .map(|s| format!(" (last seen {} ago)", seconds(s)))
                .unwrap_or_default()
        ));
    } else {
        out.push_str(&format!("producers: {} live\n", h.producers.live));
    }
    for b in &h.banners {
        out.push_str(&format!(
            "warning: {} ({})\n",
            esc(&b.message()),
            esc(&b.command_hint())
        ));
    }
    out
}

/// The scoped jobs' periods: one row per period with its scopes per state,
/// then, for each state but SUCCEEDED, the scopes in it (the first few by
/// name, the rest counted).
fn scopes_text(periods: &[queue::ScopePeriod]) -> String {
    if periods.is_empty() {
        return String::new();
    }
    let mut cols = vec![("PERIOD", Align::Left), ("SCOPES", Align::Right)];
    cols.extend(
        queue::RunStatus::ALL
            .iter()
            .map(|s| (s.as_str(), Align::Right)),
    );
    let mut t = Table::new(&cols);
    for p in periods {
        let mut row = vec![esc(&p.period_key).into_owned(), p.scopes.to_string()];
        row.extend(p.states.iter().map(|s| s.count.to_string()));
        t.row(row);
    }
    let mut out = t.text();
    for p in periods {
        for s in p
            .states
            .iter()
            .filter(|s| s.count > 0 && s.status != queue::RunStatus::Succeeded)
        {
            let more = s.count - s.named.len() as i64;
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            out.push_str(&format!(
                "  {} {}: {}{more}\n",
                esc(&p.period_key),
                s.status,
                esc(&s.named.join(", "))
            ));
        }
    }
    out
}
