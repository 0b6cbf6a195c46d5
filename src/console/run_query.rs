//! The run list's query (`/runs?job=…&status=…`): its fields, the
//! [`RunFilter`] and page cursor it asks for, and the link that keeps it.
//! The run list (`pages.rs`) and the bulk actions on its rows (`bulk.rs`)
//! both read it, so it belongs to neither.

use chrono::NaiveDate;

use super::html::encode;
use crate::key::JobName;
use crate::queue::{RunCursor, RunFilter, RunStatus};

#[derive(serde::Deserialize, Default)]
pub(crate) struct RunsQuery {
    pub(super) job: Option<String>,
    pub(super) status: Option<String>,
    pub(super) from: Option<String>,
    pub(super) to: Option<String>,
    pub(super) key: Option<String>,
    pub(super) scope: Option<String>,
    /// The cursor: the last row of the previous page, `DATE|KEY`.
    after: Option<String>,
}

/// A query field that is set and not blank, trimmed.
pub(super) fn opt(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// `path?` with the given filters that are set, each percent-encoded, for
/// paging links that keep the filter.
pub(super) fn query_path(path: &str, filters: &[(&str, &Option<String>)]) -> String {
    let mut out = format!("{path}?");
    for (name, v) in filters {
        if let Some(v) = opt(v) {
            out.push_str(&format!("&{name}={}", encode(v)));
        }
    }
    out
}

/// The filter a query asks for, or the one line saying what is wrong.
pub(super) fn run_filter(q: &RunsQuery) -> Result<RunFilter, String> {
    let date = |s: Option<&str>| -> Result<Option<NaiveDate>, String> {
        s.map(|s| crate::key::parse_date(s).map_err(|e| e.to_string()))
            .transpose()
    };
    Ok(RunFilter {
        job: opt(&q.job)
            .map(|j| JobName::parse(j).map_err(|e| e.to_string()))
            .transpose()?,
        status: opt(&q.status)
            .map(|s| {
                RunStatus::parse(s).ok_or_else(|| {
                    format!(
                        "unknown state {:?}: PENDING, RUNNING, SUCCEEDED, FAILED or SKIPPED",
                        crate::text::truncate(s)
                    )
                })
            })
            .transpose()?,
        from: date(opt(&q.from))?,
        to: date(opt(&q.to))?,
        key: opt(&q.key).map(|k| k.chars().take(120).collect()),
        scope: opt(&q.scope)
            .map(|s| crate::key::Scope::parse(s).map_err(|e| e.to_string()))
            .transpose()?,
    })
}

/// The page a query starts after, if it names one.
pub(super) fn cursor(q: &RunsQuery) -> Result<Option<RunCursor>, String> {
    let Some(after) = opt(&q.after) else {
        return Ok(None);
    };
    let (d, k) = after
        .split_once('|')
        .ok_or_else(|| "bad page cursor".to_owned())?;
    Ok(Some(RunCursor {
        business_date: crate::key::parse_date(d).map_err(|e| e.to_string())?,
        job_key: k.chars().take(120).collect(),
    }))
}
