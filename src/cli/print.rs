//! Output shared by several commands.

use crate::text::escape_for_terminal as esc;

pub(super) fn distinct_fingerprints(d: &crate::runtime::worker_registry::ConfigDrift) -> usize {
    let mut f: Vec<&str> = d.processes.iter().map(|p| p.fingerprint.as_str()).collect();
    f.dedup();
    f.len()
}

/// Prints which live processes disagree about which jobs, and on which keys.
pub(super) fn print_drift(drift: &[crate::runtime::worker_registry::ConfigDrift]) {
    for line in drift_lines(drift) {
        println!("{line}");
    }
}

/// The lines of [`print_drift`].
pub(super) fn drift_lines(drift: &[crate::runtime::worker_registry::ConfigDrift]) -> Vec<String> {
    if drift.is_empty() {
        return vec!["configuration drift: none (live processes agree)".to_owned()];
    }
    let mut out = Vec::new();
    for d in drift {
        out.push(format!(
            "configuration drift: {} is run with {} different configurations; keys that differ: {}",
            esc(&d.job_name),
            distinct_fingerprints(d),
            esc(&d.keys.join(", "))
        ));
        for p in &d.processes {
            out.push(format!(
                "  {}  {} {} on {}",
                esc(&p.fingerprint),
                esc(&p.role),
                esc(&p.process_id),
                esc(&p.host)
            ));
        }
    }
    out
}

/// Names the registry rows every view leaves out (`queue::registry_problems`),
/// one line each, escaped; nothing when there are none.
pub(super) fn print_left_out(rows: &[crate::queue::RegistryProblem], total: i64) {
    for line in left_out_lines(rows, total) {
        println!("{line}");
    }
}

/// The lines of [`print_left_out`].
pub(super) fn left_out_lines(rows: &[crate::queue::RegistryProblem], total: i64) -> Vec<String> {
    let mut out: Vec<String> = rows
        .iter()
        .map(|p| format!("registry: left out {}", esc(&p.describe())))
        .collect();
    if total > rows.len() as i64 {
        out.push(format!(
            "registry: {} more rows left out",
            total - rows.len() as i64
        ));
    }
    out
}

/// An instant as the text output shows it: UTC to the second, always the
/// same width (`2026-09-15T16:00:07Z`). `--json` keeps the full precision.
pub(super) fn time(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// [`time`], or `-` for none.
pub(super) fn time_or_dash(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map_or_else(|| "-".to_owned(), time)
}

/// A number of seconds as an operator reads it: `45s`, `3m12s`, `2h05m`,
/// `3d04h`. Negative values are shown as their size; the caller says
/// whether it is "ago" or "left".
pub(super) fn seconds(s: f64) -> String {
    let s = s.abs().round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// How a column's cells line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Align {
    Left,
    Right,
}

/// A table whose columns start at the same place on every line, however
/// long a key or wide a worker's name: each column is as wide as its
/// widest cell in terminal columns (a CJK character takes two), two spaces
/// apart. Cells are shown as given: escape stored text before adding it.
pub(super) struct Table {
    columns: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(super) fn new(columns: &[(&'static str, Align)]) -> Self {
        Self {
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are blank and extra cells are dropped.
    pub(super) fn row(&mut self, mut cells: Vec<String>) {
        cells.resize(self.columns.len(), String::new());
        self.rows.push(cells);
    }

    /// The header and every row, each line prefixed with `indent`, without
    /// trailing spaces.
    pub(super) fn lines(&self, indent: &str) -> Vec<String> {
        use unicode_width::UnicodeWidthStr;
        let header: Vec<String> = self.columns.iter().map(|(h, _)| (*h).to_owned()).collect();
        let all: Vec<&Vec<String>> = std::iter::once(&header).chain(&self.rows).collect();
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|i| all.iter().map(|r| r[i].width()).max().unwrap_or(0))
            .collect();
        all.iter()
            .map(|cells| {
                let mut line = indent.to_owned();
                for (i, cell) in cells.iter().enumerate() {
                    let pad = " ".repeat(widths[i] - cell.width());
                    if i > 0 {
                        line.push_str("  ");
                    }
                    match self.columns[i].1 {
                        Align::Left => {
                            line.push_str(cell);
                            line.push_str(&pad);
                        }
                        Align::Right => {
                            line.push_str(&pad);
                            line.push_str(cell);
                        }
                    }
                }
                line.truncate(line.trim_end().len());
                line
            })
            .collect()
    }

    pub(super) fn print(&self) {
        for line in self.lines("") {
            println!("{line}");
        }
    }

    /// The table as text, a line each, ending in a line break.
    pub(super) fn text(&self) -> String {
        self.lines("").iter().map(|l| format!("{l}\n")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_start_together_whatever_the_cell_widths() {
        let mut t = Table::new(&[
            ("KEY", Align::Left),
            ("N", Align::Right),
            ("WHO", Align::Left),
        ]);
        t.row(vec!["a".repeat(70), "1".into(), "x".into()]);
        t.row(vec!["b".into(), "12345".into(), "東京-worker".into()]);
        t.row(vec!["c".into(), "7".into(), "e\u{301}".into()]);
        let lines = t.lines("");
        // In display columns, WHO starts at the same place on every line.
        let start_of_who = |l: &str| {
            use unicode_width::UnicodeWidthStr;
            l.width() - l.rsplit("  ").next().unwrap().width()
        };
        let starts: Vec<usize> = lines.iter().map(|l| start_of_who(l)).collect();
        assert!(starts.windows(2).all(|w| w[0] == w[1]), "{lines:#?}");
        assert!(lines.iter().all(|l| !l.ends_with(' ')), "{lines:#?}");
    }

    #[test]
    fn seconds_read_like_durations() {
        assert_eq!(seconds(0.4), "0s");
        assert_eq!(seconds(-12.0), "12s");
        assert_eq!(seconds(192.0), "3m12s");
        assert_eq!(seconds(7500.0), "2h05m");
        assert_eq!(seconds(3.0 * 86400.0 + 4.0 * 3600.0), "3d04h");
    }
}
