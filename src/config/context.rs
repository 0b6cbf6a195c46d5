//! The run context: what defines a run, fixed when its key is enqueued and
//! stored on its row (`batch_job_run.timezone`, `period_start` … see
//! `migrations/20261203000001_run_context.sql`). The business time zone, the
//! instants its period starts and ends, `covers`, and the policies that
//! workers and operators act on (lease length, stale threshold, lease-expiry
//! policy, chunk size, backoff, item-failure limit, attempt budget) come
//! from here once a run exists, never from the configuration file of the
//! process that happens to touch it. This module builds a context from a
//! job's configuration and a period, and nothing else; the queue stores and
//! reads it.
//!
//! `RunContext`: what defines a run, fixed when its key is enqueued and stored on its row: the
//! business time zone, the instants its period starts and ends (`[period_start, period_end)`: a
//! local day, or a firing's minute to the schedule's next firing), `covers`, and the policies
//! workers and operators act on (`lease_ttl`, `stale_after`, `on_lease_expiry`, `chunk_size`,
//! `backoff`, `backoff_max`, `max_item_failures`, and `attempt_budget`, the job's `max_attempts` at
//! enqueue, which a rerun grants anew). `RunContext::new(cfg, period)` builds one for the producer
//! and `enqueue`; `for_key(cfg, date, key_period)` builds one from a key, for runs built by hand
//! and for freezing runs the previous release enqueued without one; `apply_to(cfg)` gives a handler
//! the worker's configuration with every value the run defines replaced by the run's.

use std::time::Duration;

use chrono::{DateTime, NaiveDate, NaiveTime, Utc};
use chrono_tz::Tz;

use crate::config::{JobConfig, LeaseExpiryPolicy};
use crate::schedule::{self, Covers, Period};

/// What defines one run (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct RunContext {
    pub timezone: Tz,
    /// The first instant of the business period.
    pub period_start: DateTime<Utc>,
    /// The instant after the last one of the period: `[start, end)`.
    pub period_end: DateTime<Utc>,
    pub covers: Covers,
    pub lease_ttl: Duration,
    pub stale_after: Duration,
    pub on_lease_expiry: LeaseExpiryPolicy,
    pub chunk_size: u32,
    pub backoff: Duration,
    pub backoff_max: Duration,
    pub max_item_failures: Option<u64>,
    /// Attempts a run gets (and a rerun gets anew).
    pub attempt_budget: u32,
}

/// A period whose bounds cannot be computed (a date at the end of the
/// calendar, a key whose period does not parse).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot compute the period of {0}")]
pub struct PeriodError(pub String);

impl RunContext {
    /// The context of a run of `cfg`'s job for `period`: what the producer
    /// and `enqueue` store with the run.
    pub fn new(cfg: &JobConfig, period: &Period) -> Result<Self, PeriodError> {
        let (period_start, period_end) = period_bounds(cfg, period)?;
        Ok(Self {
            timezone: cfg.timezone,
            period_start,
            period_end,
            covers: cfg.covers,
            lease_ttl: cfg.lease_ttl,
            stale_after: cfg.stale_after,
            on_lease_expiry: cfg.on_lease_expiry,
            chunk_size: cfg.chunk_size,
            backoff: cfg.backoff,
            backoff_max: cfg.backoff_max,
            max_item_failures: cfg.max_item_failures,
            attempt_budget: cfg.max_attempts,
        })
    }

    /// The context of a run under `cfg`, from its business date and the
    /// period half of its key (`2026-09-15` or `2026-09-15T10:15`): how a
    /// run enqueued by a release that stored none is frozen, and how a run
    /// built by hand gets one.
    pub fn for_key(
        cfg: &JobConfig,
        business_date: NaiveDate,
        key_period: &str,
    ) -> Result<Self, PeriodError> {
        let minute = match key_period.split_once('T') {
            None => None,
            Some((_, hm)) => Some(
                NaiveTime::parse_from_str(hm, "%H:%M")
                    .map_err(|_| PeriodError(key_period.to_owned()))?,
            ),
        };
        let mut cfg = cfg.clone();
        // The key says whether the period is a minute or a day, whatever
        // the file says now.
        if minute.is_some() {
            cfg.covers = Covers::Firing;
        } else if cfg.covers == Covers::Firing {
            cfg.covers = Covers::SameDay;
        }
        Self::new(
            &cfg,
            &Period {
                date: business_date,
                minute,
            },
        )
    }

    /// The configuration a handler sees: `cfg` with every value the run
    /// defines replaced by the run's, so code reading `config.timezone` or
    /// `config.chunk_size` reads what the run was enqueued with.
    pub fn apply_to(&self, cfg: &JobConfig) -> JobConfig {
        JobConfig {
            timezone: self.timezone,
            covers: self.covers,
            lease_ttl: self.lease_ttl,
            stale_after: self.stale_after,
            on_lease_expiry: self.on_lease_expiry,
            chunk_size: self.chunk_size,
            backoff: self.backoff,
            backoff_max: self.backoff_max,
            max_item_failures: self.max_item_failures,
            max_attempts: self.attempt_budget,
            ..cfg.clone()
        }
    }

    /// The context as `runs show --json` and the console print it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "timezone": self.timezone.name(),
            "period_start": self.period_start,
            "period_end": self.period_end,
            "covers": self.covers.as_str(),
            "lease_ttl": humantime::format_duration(self.lease_ttl).to_string(),
            "stale_after": humantime::format_duration(self.stale_after).to_string(),
            "on_lease_expiry": self.on_lease_expiry.as_str(),
            "chunk_size": self.chunk_size,
            "backoff": humantime::format_duration(self.backoff).to_string(),
            "backoff_max": humantime::format_duration(self.backoff_max).to_string(),
            "max_item_failures": self.max_item_failures,
            "attempt_budget": self.attempt_budget,
        })
    }
}

/// `[start, end)` of a period: a whole local day for daily jobs, and from
/// the firing's instant to the schedule's next firing for `covers =
/// "firing"` (one minute when there is no schedule to ask).
fn period_bounds(
    cfg: &JobConfig,
    period: &Period,
) -> Result<(DateTime<Utc>, DateTime<Utc>), PeriodError> {
    let tz = cfg.timezone;
    let bad = || PeriodError(period.key_part());
    match period.minute {
        None => {
            let (start, end) = schedule::day_bounds(period.date, tz);
            if start < end {
                Ok((start, end))
            } else {
                Err(bad())
            }
        }
        Some(minute) => {
            let start = schedule::local_instant(period.date.and_time(minute), tz);
            let next = cfg.schedule.as_ref().and_then(|s| {
                // The next firing lies within a day for any sub-daily
                // schedule; a wider window would only cost time.
                let (f, _) = s.firings(tz, start, start + chrono::Duration::days(32), 1);
                f.first().map(|f| f.at)
            });
            let end = next.unwrap_or(start + chrono::Duration::minutes(1));
            if start < end {
                Ok((start, end))
            } else {
                Err(bad())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::CronSchedule;

    fn d(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    #[test]
    fn a_daily_period_is_the_local_day() {
        let cfg = JobConfig {
            timezone: chrono_tz::Asia::Seoul,
            ..JobConfig::default()
        };
        let c = RunContext::new(&cfg, &Period::day(d("2026-09-15"))).unwrap();
        assert_eq!(c.period_start.to_rfc3339(), "2026-09-14T15:00:00+00:00");
        assert_eq!(c.period_end.to_rfc3339(), "2026-09-15T15:00:00+00:00");
        assert_eq!(c.attempt_budget, cfg.max_attempts);
    }

    #[test]
    fn a_firing_period_ends_at_the_next_firing() {
        let cfg = JobConfig {
            timezone: chrono_tz::Asia::Seoul,
            schedule: Some(CronSchedule::parse("*/15 * * * *").unwrap()),
            covers: Covers::Firing,
            ..JobConfig::default()
        };
        let p = Period {
            date: d("2026-09-15"),
            minute: NaiveTime::from_hms_opt(10, 15, 0),
        };
        let c = RunContext::new(&cfg, &p).unwrap();
        assert_eq!(c.period_start.to_rfc3339(), "2026-09-15T01:15:00+00:00");
        assert_eq!(c.period_end.to_rfc3339(), "2026-09-15T01:30:00+00:00");
    }

    #[test]
    fn a_legacy_key_gives_its_own_kind_of_period() {
        let cfg = JobConfig::default();
        let c = RunContext::for_key(&cfg, d("2026-09-15"), "2026-09-15T10:15").unwrap();
        assert_eq!(c.covers, Covers::Firing);
        assert_eq!((c.period_end - c.period_start).num_minutes(), 1);
        let c = RunContext::for_key(&cfg, d("2026-09-15"), "2026-09-15").unwrap();
        assert_eq!((c.period_end - c.period_start).num_hours(), 24);
        assert!(RunContext::for_key(&cfg, d("2026-09-15"), "2026-09-15T99:99").is_err());
    }

    #[test]
    fn the_run_overrides_the_file() {
        let file = JobConfig {
            timezone: Tz::UTC,
            chunk_size: 7,
            ..JobConfig::default()
        };
        let run = RunContext::new(
            &JobConfig {
                timezone: chrono_tz::Asia::Seoul,
                chunk_size: 500,
                ..JobConfig::default()
            },
            &Period::day(d("2026-09-15")),
        )
        .unwrap();
        let seen = run.apply_to(&file);
        assert_eq!(seen.timezone, chrono_tz::Asia::Seoul);
        assert_eq!(seen.chunk_size, 500);
    }
}
