//! A job's newest runs as an inline SVG chart (no script, no image file:
//! the page's policy allows neither): one bar per run, the newest on the
//! right edge, its height the run's duration, a line over them for the
//! items processed, and FAILED runs red and marked with a ✕ and their
//! `<title>`, so a failure is not told by colour alone. Every text in it is escaped by the
//! templates like any other. Small on the overview, larger on a job's
//! calendar page, with its scale written out.

use maud::{html, Markup};

use super::html::age;
use crate::queue::{RecentRun, RunStatus, RECENT_RUNS};

/// How large a chart is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Size {
    /// A table cell of the overview.
    Small,
    /// The calendar page, with its scale.
    Large,
}

/// A number for an SVG attribute, to a tenth.
fn n(x: f64) -> String {
    format!("{x:.1}")
}

/// The class of a run's bar: its state's colour.
fn bar_class(status: RunStatus) -> &'static str {
    match status {
        RunStatus::Succeeded => "bar ok",
        RunStatus::Failed => "bar failed",
        RunStatus::Running => "bar",
        RunStatus::Skipped => "bar skipped",
        RunStatus::Pending => "bar pending",
    }
}

/// What hovering a bar says: the key, the state, how long and how many.
fn tooltip(r: &RecentRun) -> String {
    let mut t = format!(
        "{}: {}, {}, {} items processed",
        r.job_key,
        r.status,
        r.duration_seconds
            .map(age)
            .unwrap_or_else(|| "not started".into()),
        r.processed_count
    );
    if r.failed_count > 0 {
        t.push_str(&format!(", {} failed", r.failed_count));
    }
    if let Some(e) = &r.error {
        t.push_str(&format!(": {e}"));
    }
    t
}

/// The chart of `runs` (newest first, as `queue::recent_runs` gives them).
pub(crate) fn runs_chart(job: &str, runs: &[RecentRun], size: Size) -> Markup {
    let runs: Vec<&RecentRun> = runs.iter().rev().collect();
    let (width, height, top, bottom, left) = match size {
        Size::Small => (150.0, 36.0, 9.0, 1.0, 0.0),
        Size::Large => (640.0, 180.0, 16.0, 20.0, 48.0),
    };
    let plot = height - top - bottom;
    let base = height - bottom;
    let slot = (width - left) / RECENT_RUNS as f64;
    let longest = runs
        .iter()
        .filter_map(|r| r.duration_seconds)
        .fold(0.0_f64, f64::max);
    let most = runs.iter().map(|r| r.processed_count).max().unwrap_or(0);
    let failed = runs
        .iter()
        .filter(|r| r.status == RunStatus::Failed)
        .count();
    let label = format!(
        "The newest {} runs of {job}, oldest first: bars show how long each ran (longest {}), the line the items it processed (most {most}); {failed} FAILED",
        runs.len(),
        age(longest),
    );
    // The newest run on the right edge, whatever the number of runs.
    let empty = (RECENT_RUNS as usize).saturating_sub(runs.len());
    let x_of = |i: usize| left + (empty + i) as f64 * slot;
    let points: Vec<String> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let y = base - plot * r.processed_count as f64 / most.max(1) as f64;
            format!("{},{}", n(x_of(i) + slot / 2.0), n(y))
        })
        .collect();
    html! {
        svg.chart xmlns="http://www.w3.org/2000/svg" role="img" aria-label=(label)
            width=(n(width)) height=(n(height)) viewBox={ "0 0 " (n(width)) " " (n(height)) } {
            title { (label) }
            @for (i, r) in runs.iter().enumerate() {
                @let h = r.duration_seconds.map_or(0.0, |d| plot * d / longest.max(1.0)).max(1.0);
                g {
                    title { (tooltip(r)) }
                    rect class=(bar_class(r.status)) x=(n(x_of(i) + 1.0)) y=(n(base - h))
                        width=(n((slot - 2.0).max(1.0))) height=(n(h)) {}
                    @if r.status == RunStatus::Failed {
                        text.mark x=(n(x_of(i) + slot / 2.0)) y=(n((base - h - 1.0).max(top - 1.0)))
                            text-anchor="middle" { "✕" }
                    }
                }
            }
            @if runs.len() > 1 && most > 0 {
                polyline.items points=(points.join(" ")) {}
            }
            @if size == Size::Large {
                text.axis x="2" y=(n(top + 8.0)) { (age(longest)) }
                text.axis x="2" y=(n(base)) { "0" }
                text.axis x=(n(left)) y=(n(height - 4.0)) {
                    "bars: duration · line: items (most " (most) ") · ✕ FAILED"
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(key: &str, status: RunStatus, secs: Option<f64>, items: i64) -> RecentRun {
        RecentRun {
            job_key: key.into(),
            job_name: "settle".into(),
            business_date: chrono::NaiveDate::from_ymd_opt(2026, 9, 15).unwrap(),
            status,
            processed_count: items,
            failed_count: 0,
            duration_seconds: secs,
            error: Some("<script>x</script>".into()),
        }
    }

    #[test]
    fn failures_are_marked_and_text_is_escaped() {
        let runs = [
            run("settle:2026-09-16", RunStatus::Failed, Some(30.0), 5),
            run("settle:2026-09-15", RunStatus::Succeeded, Some(60.0), 10),
        ];
        let svg = runs_chart("settle", &runs, Size::Large).into_string();
        assert!(svg.starts_with("<svg class=\"chart\""), "{svg}");
        assert!(svg.contains("role=\"img\""));
        assert!(svg.contains("1 FAILED"));
        assert!(svg.contains("class=\"bar failed\""));
        assert!(svg.contains("✕"));
        assert!(svg.contains("settle:2026-09-16: FAILED, 30 s, 5 items processed"));
        assert!(!svg.contains("<script>"), "{svg}");
        // The oldest run is drawn first, on the left.
        assert!(svg.find("bar ok").unwrap() < svg.find("bar failed").unwrap());
        // Every SVG element is closed: HTML's parser nests unclosed ones.
        assert_eq!(svg.matches("<rect").count(), svg.matches("</rect>").count());
    }
}
