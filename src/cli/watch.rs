//! `batchonce runs watch KEY`: follows one run until it ends. On a terminal
//! one line is redrawn in place (`\r`); otherwise each look is a plain line
//! of its own, for logs and scripts. Every figure comes from the database:
//! the counters of the run and its current attempt, and times compared
//! with the database clock of the same read.

use std::collections::VecDeque;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde_json::json;

use super::keys;
use super::print::{seconds, time};
use crate::key::JobKey;
use crate::queue::{self, AttemptView, RunStatus, RunView};
use crate::text::{escape_for_terminal as esc, json_for_terminal};

/// Looks closer together than this would only load the database.
const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// The rate is items over the last this many seconds of database time.
const RATE_WINDOW_SECONDS: f64 = 30.0;

/// How a watch writes its lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// One line redrawn in place, cut to the terminal's width.
    Live,
    /// One line per look.
    Plain,
    /// One JSON object per look.
    Json,
}

/// Follows `key` until its run is SUCCEEDED, SKIPPED (exit 0) or FAILED
/// (exit [`super::EXIT_FOUND`]). A key without a run is an error; a
/// database that stops answering is retried at the next interval. It polls
/// `queue::show_run` every `interval` (at least [`MIN_INTERVAL`]); the rate
/// is the current attempt's items over about the last
/// [`RATE_WINDOW_SECONDS`] of database time, from the attempt's start until
/// a look that old exists.
pub(super) async fn watch(
    pool: &sqlx::PgPool,
    key: &JobKey,
    interval: Duration,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let mode = if json_out {
        Mode::Json
    } else if std::io::stdout().is_terminal() {
        Mode::Live
    } else {
        Mode::Plain
    };
    let interval = interval.max(MIN_INTERVAL);
    let mut rate = Rate::default();
    let mut out = std::io::stdout().lock();
    loop {
        match queue::show_run(pool, key).await {
            Ok(Some((run, attempts))) => {
                let current = current_attempt(&run, &attempts);
                let items_per_second = rate.observe(&run, current);
                let done = run.status.is_terminal();
                write_look(&mut out, mode, &run, items_per_second, done)
                    .context("cannot write to standard output")?;
                if done {
                    return Ok(match run.status {
                        RunStatus::Failed => ExitCode::from(super::EXIT_FOUND),
                        _ => ExitCode::SUCCESS,
                    });
                }
            }
            Ok(None) => {
                if mode == Mode::Live {
                    // The error line must not land after a progress line.
                    let _ = write!(out, "\r\x1b[2K");
                    let _ = out.flush();
                }
                return Err(keys::no_run(key));
            }
            Err(e) if e.is_transient() => {
                if mode == Mode::Live {
                    let _ = write!(out, "\r\x1b[2K");
                    let _ = out.flush();
                }
                let line = crate::text::truncate(&e.to_string().replace(['\n', '\r'], " "));
                eprintln!(
                    "batchonce: warning: cannot read the run ({}); trying again in {}",
                    esc(&line),
                    humantime::format_duration(interval)
                );
            }
            Err(e) => return Err(e.into()),
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => {
                if mode == Mode::Live {
                    // Leave the last progress line on the screen.
                    let _ = writeln!(out);
                }
                // What a shell reports for a process ended by SIGINT.
                return Ok(ExitCode::from(130));
            }
        }
    }
}

/// The attempt the run is on: the last one, while it is open.
fn current_attempt<'a>(run: &RunView, attempts: &'a [AttemptView]) -> Option<&'a AttemptView> {
    attempts
        .last()
        .filter(|a| a.attempt == run.attempts && a.finished_at.is_none())
}

/// Items per second of the current attempt over about the last
/// [`RATE_WINDOW_SECONDS`] of database time: from the newest look at least
/// that old, or from the attempt's start (0 items) while there is none.
#[derive(Debug, Default)]
struct Rate {
    attempt: i32,
    looks: VecDeque<(DateTime<Utc>, i64)>,
}

impl Rate {
    fn observe(&mut self, run: &RunView, current: Option<&AttemptView>) -> Option<f64> {
        let Some(a) = current.filter(|_| run.status == RunStatus::Running) else {
            self.attempt = 0;
            self.looks.clear();
            return None;
        };
        if a.attempt != self.attempt {
            self.attempt = a.attempt;
            self.looks.clear();
            self.looks.push_back((a.started_at, 0));
        }
        let now = run.read_at;
        self.looks.push_back((now, a.processed_count));
        while self.looks.len() > 2 && secs(now - self.looks[1].0) >= RATE_WINDOW_SECONDS {
            self.looks.pop_front();
        }
        let &(since, from) = self.looks.front()?;
        let elapsed = secs(now - since);
        (elapsed > 0.0).then(|| (a.processed_count - from).max(0) as f64 / elapsed)
    }
}

fn secs(d: chrono::TimeDelta) -> f64 {
    d.num_milliseconds() as f64 / 1000.0
}

/// One look at the run, in the words of every mode.
fn describe(run: &RunView, items_per_second: Option<f64>) -> String {
    let now = run.read_at;
    let mut parts = vec![
        esc(&run.job_key).into_owned(),
        run.status.to_string(),
        format!(
            "items {} ({} failed)",
            run.processed_count, run.failed_count
        ),
    ];
    match run.status {
        RunStatus::Running => {
            parts.push(match items_per_second {
                Some(r) => format!("rate {r:.1}/s"),
                None => "rate -".to_owned(),
            });
            parts.push(format!("attempt {}/{}", run.attempts, run.max_attempts));
            if let Some(t) = run.lease_expires_at {
                let left = secs(t - now);
                parts.push(if left > 0.0 {
                    format!("lease left {}", seconds(left))
                } else {
                    format!("lease EXPIRED {} ago", seconds(left))
                });
            }
            if let Some(w) = &run.lease_owner {
                parts.push(format!("worker {}", esc(w)));
            }
        }
        RunStatus::Pending => {
            parts.push(format!("attempt {}/{}", run.attempts, run.max_attempts));
            let wait = secs(run.next_run_at - now);
            parts.push(if wait > 0.0 {
                format!("next try in {}", seconds(wait))
            } else {
                "due, waiting for a worker".to_owned()
            });
        }
        _ => {
            parts.push(format!("attempt {}/{}", run.attempts, run.max_attempts));
            if let Some(t) = run.finished_at {
                parts.push(format!("finished {}", time(t)));
            }
            if let Some(m) = &run.error_message {
                parts.push(format!("message: {}", esc(m)));
            }
        }
    }
    parts.join("  ")
}

fn write_look(
    out: &mut impl Write,
    mode: Mode,
    run: &RunView,
    items_per_second: Option<f64>,
    done: bool,
) -> std::io::Result<()> {
    match mode {
        Mode::Json => {
            let now = run.read_at;
            let v = json!({
                "read_at": run.read_at,
                "job_key": run.job_key,
                "status": run.status,
                "final": done,
                "attempt": run.attempts,
                "max_attempts": run.max_attempts,
                "processed_count": run.processed_count,
                "failed_count": run.failed_count,
                "items_per_second": items_per_second,
                "lease_owner": run.lease_owner,
                "lease_seconds_left": run.lease_expires_at.map(|t| secs(t - now)),
                "next_run_in_seconds": (run.status == RunStatus::Pending).then(|| secs(run.next_run_at - now)),
                "error_message": run.error_message,
            });
            let text = json_for_terminal(&v).map_err(std::io::Error::other)?;
            writeln!(out, "{text}")?;
        }
        Mode::Plain => writeln!(
            out,
            "{}  {}",
            time(run.read_at),
            describe(run, items_per_second)
        )?,
        Mode::Live => {
            let line = describe(run, items_per_second);
            if done {
                // The final line stays whole, as in a log.
                writeln!(out, "\r\x1b[2K{line}")?;
            } else {
                let width = terminal_size::terminal_size_of(std::io::stdout())
                    .map_or(80, |(w, _)| usize::from(w.0));
                write!(out, "\r\x1b[2K{}", fit(&line, width.saturating_sub(1)))?;
            }
        }
    }
    out.flush()
}

/// `line` cut to `width` terminal columns, with `…` where it was cut: a
/// progress line that wrapped could not be redrawn in place.
fn fit(line: &str, width: usize) -> String {
    use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};
    if line.width() <= width {
        return line.to_owned();
    }
    let mut out = String::new();
    let mut used = 0;
    for c in line.chars() {
        let w = c.width().unwrap_or(0);
        if used + w + 1 > width {
            break;
        }
        out.push(c);
        used += w;
    }
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_line_is_cut_to_the_terminal() {
        use unicode_width::UnicodeWidthStr;
        assert_eq!(fit("abc", 3), "abc");
        assert_eq!(fit("abcdef", 4), "abc…");
        let cut = fit("東京東京東京", 6);
        assert!(cut.width() <= 6, "{cut}");
        assert_eq!(fit("abc", 0), "…");
    }
}
