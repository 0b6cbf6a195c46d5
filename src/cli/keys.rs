//! Job keys as operators type them: a key that names no run but whose
//! period looks like a date written another way (`2026-9-15`, `15/09/2026`,
//! `20260915`) gets a hint with the key as it is stored.

use anyhow::anyhow;
use chrono::NaiveDate;

use crate::key::{JobKey, JobName, MAX_KEY_LEN};

/// Parses a key argument. A key the schema could not hold but that looks
/// like a date written another way is reported as a key without a run,
/// with the hint, since that is what the operator needs to hear.
pub(super) fn parse(s: &str) -> anyhow::Result<JobKey> {
    match JobKey::parse(s) {
        Ok(k) => Ok(k),
        Err(e) => match hint(s) {
            Some(h) => Err(anyhow!("no run with key {s}; {h}")),
            None => Err(e.into()),
        },
    }
}

/// The error for a key with no run, with the date hint when there is one.
pub(super) fn no_run(key: &JobKey) -> anyhow::Error {
    match hint(key.as_str()) {
        Some(h) => anyhow!("no run with key {key}; {h}"),
        None => anyhow!("no run with key {key}"),
    }
}

/// `business dates are written YYYY-MM-DD, e.g. KEY` when the period of
/// `s` reads as a calendar date that is not written `YYYY-MM-DD`; `None`
/// otherwise (a well-written key, or something that is no date at all).
/// A minute key's time (`T10:15`) is kept.
pub(super) fn hint(s: &str) -> Option<String> {
    if s.len() > MAX_KEY_LEN {
        return None;
    }
    let (job, period) = s.split_once(':')?;
    JobName::parse(job).ok()?;
    let (date, time) = match period.split_once('T') {
        Some((d, t)) => (d, Some(t)),
        None => (period, None),
    };
    if time.is_some_and(|t| !t.bytes().all(|b| b.is_ascii_digit() || b == b':')) {
        return None;
    }
    let candidates = read_date(date);
    let written: Vec<String> = candidates
        .iter()
        .map(|d| d.format("%Y-%m-%d").to_string())
        .filter(|d| d != date)
        .map(|d| match time {
            Some(t) => format!("{job}:{d}T{t}"),
            None => format!("{job}:{d}"),
        })
        .collect();
    // A date already written YYYY-MM-DD needs no hint.
    if written.len() < candidates.len() || written.is_empty() {
        return None;
    }
    Some(format!(
        "business dates are written YYYY-MM-DD, e.g. {}",
        written.join(" or ")
    ))
}

/// The calendar dates `s` may mean: year first (`2026-9-15`, `2026/09/15`,
/// `20260915`), or year last, day first (`15/09/2026`) or month first
/// (`09/15/2026`); both when either could be meant. Two-digit years are
/// too ambiguous to guess.
fn read_date(s: &str) -> Vec<NaiveDate> {
    let ymd = |y: &str, m: &str, d: &str| -> Option<NaiveDate> {
        NaiveDate::from_ymd_opt(y.parse().ok()?, m.parse().ok()?, d.parse().ok()?)
    };
    if s.len() == 8 && s.bytes().all(|b| b.is_ascii_digit()) {
        return ymd(&s[..4], &s[4..6], &s[6..]).into_iter().collect();
    }
    let parts: Vec<&str> = s.split(['-', '/', '.']).collect();
    let ok = parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit()));
    if !ok {
        return Vec::new();
    }
    let (a, b, c) = (parts[0], parts[1], parts[2]);
    let small = |p: &str| p.len() <= 2;
    let mut out = Vec::new();
    if a.len() == 4 && small(b) && small(c) {
        out.extend(ymd(a, b, c));
    } else if c.len() == 4 && small(a) && small(b) {
        out.extend(ymd(c, b, a));
        out.extend(ymd(c, a, b));
    }
    out.sort();
    out.dedup();
    out
}

/// The runs `enqueue` asks for: a scoped job's for `--scope` or
/// `--all-scopes`, an unscoped job's without either. `origin` names the
/// configuration in the errors.
pub(super) fn scoped_runs(
    job: &JobName,
    cfg: &crate::config::JobConfig,
    periods: &[crate::schedule::Period],
    scopes: &[String],
    all: bool,
    origin: &str,
) -> anyhow::Result<Vec<crate::queue::NewRun>> {
    use crate::config::ScopeSource;
    use crate::runtime::producer;
    match (&cfg.scopes, scopes.is_empty(), all) {
        (None, true, false) => Ok(producer::runs_for_periods(job, cfg, periods)?),
        (None, _, _) => Err(anyhow::anyhow!(
            "job {job} is not scoped ({origin} gives it no `scopes`): enqueue it without --scope and --all-scopes"
        )),
        (Some(_), true, false) => Err(anyhow::anyhow!(
            "job {job} runs per scope: give --scope <scope> (repeat it, or separate by commas) or --all-scopes"
        )),
        (Some(_), true, true) => Ok(producer::runs_for_periods(job, cfg, periods)?),
        (Some(source), false, _) => {
            let mut list = Vec::with_capacity(scopes.len());
            for s in scopes {
                let scope = crate::key::Scope::parse(s)?;
                if let ScopeSource::List(known) = source {
                    if !known.contains(&scope) {
                        anyhow::bail!(
                            "scope {scope} is not among the scopes {origin} lists for job {job}"
                        );
                    }
                }
                if !list.contains(&scope) {
                    list.push(scope);
                }
            }
            producer::runs_for_scopes(job, cfg, periods, &list).map_err(|e| anyhow::anyhow!(e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_written_another_way_get_the_stored_key() {
        let h = |s| hint(s).unwrap_or_default();
        let want = "business dates are written YYYY-MM-DD, e.g. daily-settlement:2026-09-15";
        for s in [
            "daily-settlement:2026-9-15",
            "daily-settlement:15/09/2026",
            "daily-settlement:09/15/2026",
            "daily-settlement:15.9.2026",
            "daily-settlement:2026/09/15",
            "daily-settlement:20260915",
        ] {
            assert_eq!(h(s), want, "{s}");
        }
        assert_eq!(
            h("inventory-sync:2026-9-15T10:15"),
            "business dates are written YYYY-MM-DD, e.g. inventory-sync:2026-09-15T10:15"
        );
        assert_eq!(
            h("daily-settlement:03/04/2026"),
            "business dates are written YYYY-MM-DD, e.g. daily-settlement:2026-03-04 or daily-settlement:2026-04-03"
        );
    }

    #[test]
    fn no_hint_for_good_keys_or_non_dates() {
        for s in [
            "daily-settlement:2026-09-15",
            "daily-settlement:2026-09-15T10:15",
            "daily-settlement:yesterday",
            "daily-settlement:2026-02-30",
            "daily-settlement:15/09/26",
            "Daily:2026-9-15",
            "daily-settlement:2026-9-15T10:15; DROP TABLE",
            "no-colon",
            "",
        ] {
            assert_eq!(hint(s), None, "{s}");
        }
        let long = format!("daily-settlement:2026-9-15T{}", "1".repeat(200));
        assert_eq!(hint(&long), None);
    }

    #[test]
    fn a_malformed_key_that_is_a_date_reads_as_no_run() {
        let e = parse("daily-settlement:15/09/2026")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "no run with key daily-settlement:15/09/2026; business dates are written YYYY-MM-DD, e.g. daily-settlement:2026-09-15"
        );
        let e = parse("daily-settlement:soon").unwrap_err().to_string();
        assert!(e.starts_with("invalid job key"), "{e}");
    }
}
