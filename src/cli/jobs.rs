//! `batchonce jobs ...`: pausing and resuming a job (issue 44), and the
//! list of paused jobs, which `status` shows too ([`paused_text`]).
//!
//! `jobs pause JOB --reason R --operator O` and `jobs resume JOB --reason R
//! --operator O` check the job name (`JobName::parse`), `--operator` and
//! `--reason` (`validate_operator`, `validate_reason`) and call
//! `queue::pause::pause` or `resume` on the database clock; the database
//! refuses an unknown job, a job already paused (pause) or not paused
//! (resume), each with one error line and nothing written. `jobs paused`
//! lists the paused jobs, with since when, for how long, by whom and why.
//! `--json` prints the outcome or the list as one JSON value.

use std::process::ExitCode;

use anyhow::anyhow;

use super::print::{seconds, time, Align, Table};
use super::{validate_operator, validate_reason};
use crate::clock::Clock;
use crate::key::JobName;
use crate::queue::{self, pause};
use crate::text::{escape_for_terminal as esc, json_for_terminal};

#[derive(Debug, clap::Subcommand)]
pub(super) enum JobsCommand {
    /// Stops a job's runs from being claimed, until `jobs resume`: the
    /// producer still enqueues them, so nothing is missed.
    #[command(after_help = "\
Allowed from: a job that is not paused.
Becomes: paused. Its PENDING runs, and those enqueued, re-run or retried while it
stays paused, are not claimed by any worker (of this release or the previous one);
a RUNNING run finishes. Audited; `status`, the console and the metric
batchonce_job_paused show it.

Example:
  batchonce jobs pause daily-settlement --operator alice \\
    --reason \"bank file late; hold until it arrives (INC-12)\"")]
    Pause(JobActionArgs),
    /// Lets a paused job's runs be claimed again, in their order.
    #[command(after_help = "\
Allowed from: a paused job.
Becomes: active. Its PENDING runs are claimable again, oldest due first, and idle
workers are woken. Audited.

Example:
  batchonce jobs resume daily-settlement --operator alice \\
    --reason \"bank file arrived\"")]
    Resume(JobActionArgs),
    /// Lists the paused jobs: since when, by whom and why.
    Paused,
}

#[derive(Debug, clap::Args)]
pub(super) struct JobActionArgs {
    /// The job's name, e.g. daily-settlement.
    job: String,
    /// Why (recorded in the audit trail, and shown while the job is paused).
    #[arg(long)]
    reason: String,
    /// Who (recorded in the audit trail with the database session user).
    #[arg(long)]
    operator: String,
}

pub(super) async fn jobs_command(
    pool: &sqlx::PgPool,
    command: &JobsCommand,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let request = |a: &JobActionArgs| -> anyhow::Result<pause::PauseRequest> {
        Ok(pause::PauseRequest {
            job: JobName::parse(&a.job).map_err(|e| anyhow!("{e}"))?,
            operator: validate_operator(&a.operator)?,
            reason: validate_reason(&a.reason)?,
        })
    };
    match command {
        JobsCommand::Pause(a) => {
            let req = request(a)?;
            let done = pause::pause(pool, &req, Clock::Db, None).await?;
            if json_out {
                println!("{}", json_for_terminal(&done)?);
            } else {
                println!(
                    "paused {}: {} PENDING runs held; no run of it is claimed until `batchonce jobs resume {}`; RUNNING runs finish (audited)",
                    done.job, done.runs_held, done.job
                );
            }
        }
        JobsCommand::Resume(a) => {
            let req = request(a)?;
            let done = pause::resume(pool, &req, Clock::Db, None).await?;
            if json_out {
                println!("{}", json_for_terminal(&done)?);
            } else {
                println!(
                    "resumed {} after {} paused: {} PENDING runs claimable again (audited)",
                    done.job,
                    seconds(done.paused_seconds),
                    done.runs_released
                );
            }
        }
        JobsCommand::Paused => {
            let paused = queue::paused_jobs(pool, Clock::Db).await?;
            if json_out {
                println!("{}", json_for_terminal(&paused)?);
            } else if paused.is_empty() {
                println!("no job is paused");
            } else {
                let mut t = Table::new(&[
                    ("JOB", Align::Left),
                    ("PAUSED SINCE", Align::Left),
                    ("FOR", Align::Right),
                    ("BY", Align::Left),
                    ("REASON", Align::Left),
                ]);
                for p in &paused {
                    t.row(vec![
                        esc(&p.job).into_owned(),
                        time(p.paused_at),
                        seconds(p.paused_seconds),
                        esc(&p.paused_by).into_owned(),
                        esc(&p.reason).into_owned(),
                    ]);
                }
                t.print();
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The paused jobs under `status`, one line each; nothing when none is.
pub(super) fn paused_text(paused: &[queue::Paused]) -> String {
    paused
        .iter()
        .map(|p| {
            format!(
                "paused: {} since {} ({}) by {}: {}\n",
                esc(&p.job),
                time(p.paused_at),
                seconds(p.paused_seconds),
                esc(&p.paused_by),
                esc(&p.reason)
            )
        })
        .collect()
}
