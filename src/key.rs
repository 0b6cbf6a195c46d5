//! Job names, job keys and business dates: the validated identifiers every
//! other module takes. Nothing here touches the database or the clock.
//!
//! Validated identifiers: `JobName` (1–64 characters, lowercase letters and digits separated by
//! single dashes), `JobKey` (`<job>:<period>`, where the period is digits, `T`, `:` and `-`, such
//! as `2026-09-15` or `2026-09-15T10:15`, a scoped run's key adds `@<scope>` (a `Scope`: 1–36
//! lowercase letters and digits separated by single dashes, such as `seller-4711`), and a
//! partition's key adds `.p<1..=256>` after that; at most 120 characters, the same rule as the
//! schema's CHECK), and `parse_date`, which accepts strict `YYYY-MM-DD` within `date_range()`, 1970-01-01 to
//! 2199-12-31, and otherwise fails with `KeyError::DateRange` (`date D is out of range: business
//! dates run from 1970-01-01 to 2199-12-31`). The range is wide enough for any backfill or plan and
//! narrow enough that time-zone and interval arithmetic never overflows; `--date`, `--from`, `--to`
//! and `skip_dates` all go through `parse_date`. `instant_range()` is the same range as instants,
//! `[1970-01-01T00:00:00Z, 2200-01-01T00:00:00Z)`, and `check_instant` refuses an instant outside
//! it with `KeyError::InstantRange` (`instant T is out of range: business dates run from 1970-01-01
//! to 2199-12-31, so an instant must be at or after 1970-01-01T00:00:00Z and before
//! 2200-01-01T00:00:00Z`); `produce --now` goes through it. `shown(s)` is a rejected input as an
//! error message repeats it: at most 80 characters, cut on a char boundary and followed by `…`.
//! Every `KeyError` quotes its input through it, and so does `Registry::resolve`, so a megabyte
//! argument makes a short message. `JobKey::daily` builds `<job>:<YYYY-MM-DD>`. This module does
//! not touch the database or the clock.

use std::fmt;

use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};

/// Longest job key the schema accepts (`varchar(120)`).
pub const MAX_KEY_LEN: usize = 120;
/// Longest job name; leaves room in the key for a period.
pub const MAX_JOB_NAME_LEN: usize = 64;

/// A rejected identifier, with the reason in words an operator can act on.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("invalid job name {0:?}: use 1-64 lowercase letters, digits and single dashes, e.g. daily-settlement")]
    JobName(String),
    #[error("invalid job key {0:?}: expected <job>:<period> or <job>:<period>@<scope> such as daily-settlement:2026-09-15 or daily-settlement:2026-09-15@seller-4711 (at most 120 characters)")]
    JobKey(String),
    #[error("invalid scope {0:?}: use 1-36 lowercase letters, digits and single dashes, e.g. seller-4711")]
    Scope(String),
    #[error("invalid date {0:?}: expected a calendar date as YYYY-MM-DD")]
    Date(String),
    #[error("date {0} is out of range: business dates run from 1970-01-01 to 2199-12-31")]
    DateRange(String),
    #[error("instant {0} is out of range: business dates run from 1970-01-01 to 2199-12-31, so an instant must be at or after 1970-01-01T00:00:00Z and before 2200-01-01T00:00:00Z")]
    InstantRange(String),
}

/// How much of a rejected input an error message repeats.
const SHOWN_CHARS: usize = 80;

/// A rejected input as error messages show it: at most 80 characters, cut
/// on a char boundary, so a megabyte argument makes a short message.
pub fn shown(s: &str) -> String {
    match s.char_indices().nth(SHOWN_CHARS) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// FNV-1a (64 bits) of some bytes: a short hash that is the same on every
/// machine and with every Rust release (std's hasher is neither), for names
/// derived from paths and for values recorded without being shown.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The business dates accepted: wide enough for any backfill or plan,
/// narrow enough that time-zone and interval arithmetic never overflows.
pub fn date_range() -> (NaiveDate, NaiveDate) {
    (
        NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default(),
        NaiveDate::from_ymd_opt(2199, 12, 31).unwrap_or_default(),
    )
}

/// The instants of [`date_range`] in UTC, as `[first, end)`: from the first
/// moment of 1970-01-01 to the first moment after 2199-12-31.
pub fn instant_range() -> (DateTime<Utc>, DateTime<Utc>) {
    let (min, max) = date_range();
    let end = max.succ_opt().unwrap_or(max);
    (
        min.and_time(chrono::NaiveTime::MIN).and_utc(),
        end.and_time(chrono::NaiveTime::MIN).and_utc(),
    )
}

/// Checks that an instant given for "now" (such as `produce --now`) lies
/// in [`instant_range`], so that it names a moment the business dates can
/// describe.
pub fn check_instant(t: DateTime<Utc>) -> Result<DateTime<Utc>, KeyError> {
    let (first, end) = instant_range();
    if t < first || t >= end {
        return Err(KeyError::InstantRange(
            t.to_rfc3339_opts(SecondsFormat::AutoSi, true),
        ));
    }
    Ok(t)
}

/// A validated job name such as `daily-settlement`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobName(String);

impl JobName {
    pub fn parse(s: &str) -> Result<Self, KeyError> {
        let ok = !s.is_empty()
            && s.len() <= MAX_JOB_NAME_LEN
            && s.split('-').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            });
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(KeyError::JobName(shown(s)))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JobName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated job key, `<job>:<period>`, the unique business identity of a run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobKey(String);

impl JobKey {
    /// The key of a daily job for one business date.
    pub fn daily(job: &JobName, date: NaiveDate) -> Self {
        Self(format!("{}:{}", job, date.format("%Y-%m-%d")))
    }

    /// Parses a key typed by an operator; the same rule as the schema's CHECK.
    pub fn parse(s: &str) -> Result<Self, KeyError> {
        let bad = || KeyError::JobKey(shown(s));
        if s.len() > MAX_KEY_LEN {
            return Err(bad());
        }
        let (job, period) = s.split_once(':').ok_or_else(bad)?;
        JobName::parse(job).map_err(|_| bad())?;
        // A partition's key is its parent's with `.p<1..=256>`.
        let period = match period.rsplit_once(".p") {
            Some((p, no)) => {
                parse_partition_no(no).ok_or_else(bad)?;
                p
            }
            None => period,
        };
        // A scoped run's key is `<job>:<period>@<scope>`.
        let period = match period.split_once('@') {
            Some((p, scope)) => {
                Scope::parse(scope).map_err(|_| bad())?;
                p
            }
            None => period,
        };
        if period.is_empty()
            || !period
                .bytes()
                .all(|b| b.is_ascii_digit() || b == b'T' || b == b':' || b == b'-')
        {
            return Err(bad());
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key of partition `no` (1-based) of this run.
    pub fn partition(&self, no: u16) -> Self {
        Self(format!("{}.p{no}", self.0))
    }

    /// For a partition's key, its parent's key and its number.
    pub fn parent(&self) -> Option<(Self, u16)> {
        let (parent, no) = self.0.rsplit_once(".p")?;
        Some((Self(parent.to_owned()), parse_partition_no(no)?))
    }

    /// The key of this run for one scope: `<job>:<period>@<scope>`.
    /// `None` if the result would break the length rule, or if this key
    /// already has a scope or is a partition's.
    pub fn with_scope(&self, scope: &Scope) -> Option<Self> {
        if self.scope().is_some() || self.parent().is_some() {
            return None;
        }
        let k = format!("{}@{}", self.0, scope.as_str());
        (k.len() <= MAX_KEY_LEN).then_some(Self(k))
    }

    /// The scope the key names, if it is a scoped run's (or a partition of one).
    pub fn scope(&self) -> Option<&str> {
        let (_, rest) = self.0.split_once(':')?;
        let rest = match rest.rsplit_once(".p") {
            Some((p, no)) if parse_partition_no(no).is_some() => p,
            _ => rest,
        };
        rest.split_once('@').map(|(_, s)| s)
    }

    /// The key without its scope: a scoped run's template (the key it
    /// would have without scopes); the key itself if it has none.
    pub fn unscoped(&self) -> Self {
        match self.scope() {
            Some(scope) => Self(self.0.replacen(&format!("@{scope}"), "", 1)),
            None => self.clone(),
        }
    }

    /// The period part of the key, without its scope or partition: what the
    /// business period rules read (`2026-09-15`, `2026-09-15T10:15`).
    pub fn period(&self) -> &str {
        let rest = self.0.split_once(':').map_or("", |(_, p)| p);
        let rest = match rest.rsplit_once(".p") {
            Some((p, no)) if parse_partition_no(no).is_some() => p,
            _ => rest,
        };
        rest.split_once('@').map_or(rest, |(p, _)| p)
    }

    /// The job-name half of the key.
    pub fn job_name(&self) -> &str {
        // Invariant: a JobKey is only built with a ':' in it.
        self.0.split_once(':').map(|(j, _)| j).unwrap_or(&self.0)
    }
}

impl fmt::Display for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Longest scope; the schema's `batch_job_run.scope` is `varchar(36)`, room
/// for a UUID.
pub const MAX_SCOPE_LEN: usize = 36;

/// A validated scope such as `seller-4711`: what a scoped run is about
/// besides its job and period (one seller, region or tenant). 1 to 36
/// lowercase letters and digits separated by single dashes, the rule of
/// the schema's key CHECK; no `:`, `@` or `.`, so a key stays unambiguous.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope(String);

impl Scope {
    pub fn parse(s: &str) -> Result<Self, KeyError> {
        let ok = !s.is_empty()
            && s.len() <= MAX_SCOPE_LEN
            && s.split('-').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            });
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(KeyError::Scope(shown(s)))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Most partitions a run may have (the schema's CHECK says the same).
pub const MAX_PARTITIONS: u16 = 256;

/// A partition number as keys write it: 1 to 256, no leading zero.
fn parse_partition_no(s: &str) -> Option<u16> {
    if s.is_empty() || s.starts_with('0') || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u16>()
        .ok()
        .filter(|n| (1..=MAX_PARTITIONS).contains(n))
}

/// Parses `YYYY-MM-DD` strictly (no time, no two-digit years).
pub fn parse_date(s: &str) -> Result<NaiveDate, KeyError> {
    let bad = || KeyError::Date(shown(s));
    if s.len() != 10 {
        return Err(bad());
    }
    let d = NaiveDate::parse_from_str(s, "%Y-%m-%d").map_err(|_| bad())?;
    let (min, max) = date_range();
    if d < min || d > max {
        return Err(KeyError::DateRange(s.to_owned()));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_keys_name_their_parent() {
        let k = JobKey::parse("daily-settlement:2026-09-15").unwrap();
        let p = k.partition(3);
        assert_eq!(p.as_str(), "daily-settlement:2026-09-15.p3");
        assert_eq!(JobKey::parse(p.as_str()).unwrap(), p);
        assert_eq!(p.parent(), Some((k.clone(), 3)));
        assert_eq!(p.job_name(), "daily-settlement");
        assert_eq!(k.parent(), None);
        for bad in [
            "daily-settlement:2026-09-15.p0",
            "daily-settlement:2026-09-15.p257",
            "daily-settlement:2026-09-15.p03",
            "daily-settlement:2026-09-15.p",
            "daily-settlement:.p2",
            "daily-settlement:2026-09-15.p2.p3",
        ] {
            assert!(JobKey::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn scoped_keys_name_their_scope() {
        let k = JobKey::parse("daily-settlement:2026-09-15").unwrap();
        let s = Scope::parse("seller-4711").unwrap();
        let scoped = k.with_scope(&s).unwrap();
        assert_eq!(scoped.as_str(), "daily-settlement:2026-09-15@seller-4711");
        assert_eq!(JobKey::parse(scoped.as_str()).unwrap(), scoped);
        assert_eq!(scoped.scope(), Some("seller-4711"));
        assert_eq!(scoped.period(), "2026-09-15");
        assert_eq!(scoped.job_name(), "daily-settlement");
        let p = scoped.partition(2);
        assert_eq!(p.as_str(), "daily-settlement:2026-09-15@seller-4711.p2");
        assert_eq!(JobKey::parse(p.as_str()).unwrap(), p);
        assert_eq!(p.scope(), Some("seller-4711"));
        assert_eq!(p.period(), "2026-09-15");
        assert_eq!(p.parent(), Some((scoped.clone(), 2)));
        assert_eq!(k.scope(), None);
        assert_eq!(k.period(), "2026-09-15");
        assert_eq!(scoped.unscoped(), k);
        assert_eq!(p.unscoped(), k.partition(2));
        assert_eq!(k.unscoped(), k);
        assert_eq!(scoped.with_scope(&s), None);
        let m = JobKey::parse("inventory-sync:2026-09-15T10:15@eu-west-1").unwrap();
        assert_eq!(
            (m.period(), m.scope()),
            ("2026-09-15T10:15", Some("eu-west-1"))
        );
        let uuid = Scope::parse("6f1c2a3e-0b4d-4e5f-8a9b-0c1d2e3f4a5b").unwrap();
        assert_eq!(uuid.as_str().len(), MAX_SCOPE_LEN);
        // The longest job name, minute period and scope still fit; with a
        // partition's `.p256` they would not (the enqueue checks that).
        let long = JobKey::parse(&format!("{}:2026-09-15T10:15", "j".repeat(64))).unwrap();
        assert_eq!(long.with_scope(&uuid).unwrap().as_str().len(), 118);
        for bad in [
            "a:2026-09-15@",
            "a:2026-09-15@Seller",
            "a:2026-09-15@seller--1",
            "a:2026-09-15@-seller",
            "a:2026-09-15@seller_1",
            "a:2026-09-15@a@b",
            "a:2026-09-15@a.b",
            "a:2026-09-15.p2@seller",
            "a:@seller",
        ] {
            assert!(JobKey::parse(bad).is_err(), "{bad}");
        }
        for bad in ["", "A", "a b", "a:b", "a@b", "a.b", "-a", &"x".repeat(37)] {
            assert!(Scope::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn dates_are_strict_and_bounded() {
        assert!(parse_date("2026-09-15").is_ok());
        assert!(parse_date("1970-01-01").is_ok());
        assert!(parse_date("2199-12-31").is_ok());
        for bad in [
            "2026-02-30",
            "2026-9-15",
            "26-09-15",
            "2026-09-15T00",
            "",
            "0000-00-00",
        ] {
            assert!(matches!(parse_date(bad), Err(KeyError::Date(_))), "{bad:?}");
        }
        for far in ["1969-12-31", "2200-01-01", "0001-01-01", "9999-12-31"] {
            assert!(
                matches!(parse_date(far), Err(KeyError::DateRange(_))),
                "{far:?}"
            );
        }
    }

    #[test]
    fn instants_span_the_business_dates_in_utc() {
        let t = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().to_utc();
        for ok in [
            "1970-01-01T00:00:00Z",
            "2026-09-15T01:00:00+09:00",
            "2199-12-31T23:59:59.999999999Z",
            // 2200-01-01 in Seoul, still 2199-12-31 in UTC.
            "2200-01-01T08:59:59+09:00",
        ] {
            assert_eq!(check_instant(t(ok)), Ok(t(ok)), "{ok}");
        }
        for far in [
            "1969-12-31T23:59:59.999Z",
            "1969-12-31T00:00:00Z",
            // 1970-01-01 in Seoul, still 1969-12-31 in UTC.
            "1970-01-01T08:00:00+09:00",
            "2200-01-01T00:00:00Z",
            "0001-01-01T00:00:00Z",
            "9999-12-31T23:59:59Z",
        ] {
            assert!(
                matches!(check_instant(t(far)), Err(KeyError::InstantRange(_))),
                "{far}"
            );
        }
        assert_eq!(
            check_instant(t("1970-01-01T08:00:00+09:00")).unwrap_err().to_string(),
            "instant 1969-12-31T23:00:00Z is out of range: business dates run from 1970-01-01 to 2199-12-31, so an instant must be at or after 1970-01-01T00:00:00Z and before 2200-01-01T00:00:00Z"
        );
        let (first, end) = instant_range();
        assert_eq!(first.date_naive(), date_range().0);
        assert_eq!(end.date_naive().pred_opt(), Some(date_range().1));
    }

    #[test]
    fn errors_repeat_at_most_80_characters_of_the_input() {
        let long = "가".repeat(100_000);
        let e = JobName::parse(&long).unwrap_err().to_string();
        assert!(e.chars().count() < 300, "{}", e.len());
        let e = JobKey::parse(&format!("a:{long}")).unwrap_err().to_string();
        assert!(e.chars().count() < 300);
        assert_eq!(shown("short"), "short");
        assert!(!JobName::parse("a\nb")
            .unwrap_err()
            .to_string()
            .contains('\n'));
    }

    #[test]
    fn job_names() {
        assert!(JobName::parse("daily-settlement").is_ok());
        assert!(JobName::parse("a1").is_ok());
        for bad in [
            "",
            "Daily",
            "a--b",
            "-a",
            "a-",
            "a_b",
            "a:b",
            &"x".repeat(65),
        ] {
            assert!(JobName::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn job_keys() {
        let k = JobKey::parse("daily-settlement:2026-09-15").unwrap();
        assert_eq!(k.job_name(), "daily-settlement");
        assert!(JobKey::parse("inventory-sync:2026-09-15T10:15").is_ok());
        for bad in [
            "daily-settlement",
            "daily-settlement:",
            ":2026-09-15",
            "Daily:2026-09-15",
            "a:2026 09 15",
            "a:2026-09-15;drop",
        ] {
            assert!(JobKey::parse(bad).is_err(), "{bad:?}");
        }
        let long = format!("a:{}", "1".repeat(119));
        assert!(JobKey::parse(&long).is_err());
        assert_eq!(
            JobKey::daily(
                &JobName::parse("x").unwrap(),
                NaiveDate::from_ymd_opt(2026, 1, 2).unwrap()
            )
            .as_str(),
            "x:2026-01-02"
        );
    }

    #[test]
    fn dates() {
        assert!(parse_date("2026-09-15").is_ok());
        for bad in [
            "2026-9-15",
            "2026-02-30",
            "15-09-2026",
            "2026-09-15T00:00",
            "",
            "tomorrow",
        ] {
            assert!(parse_date(bad).is_err(), "{bad:?}");
        }
    }
}
