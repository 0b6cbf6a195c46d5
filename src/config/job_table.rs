//! One `[jobs.<name>]` table of the configuration file applied to a job's
//! [`JobConfig`]: each key parsed and range-checked (one error naming the
//! key), then the rules between keys (a `stale_after` longer than the lease,
//! a schedule whose `catch_up` holds too many firings, `partitions` or
//! `scopes` on a kind that cannot take them, …). `Config::parse` calls
//! [`apply_job_table`] for every table. The value readers it shares with
//! the command job's keys (`command.rs`) are in `value.rs`.

use std::time::Duration;

use chrono::Weekday;
use chrono_tz::Tz;

use super::command::{apply_command_keys, as_argv, COMMAND_KEYS};
use super::value::{as_duration, as_duration_or_zero, as_int, as_str};
use super::{scopes, CommandSpec, JobConfig, LeaseExpiryPolicy, ScopeSource, MAX_CATCH_UP};

use crate::key::parse_date;
use crate::schedule::{Covers, CronSchedule};

pub(super) const JOB_KEYS: &[&str] = &[
    "timezone",
    "max_attempts",
    "lease_ttl",
    "stale_after",
    "chunk_size",
    "backoff",
    "backoff_max",
    "chunk_pause",
    "on_lease_expiry",
    "schedule",
    "covers",
    "catch_up",
    "skip_dates",
    "skip_weekdays",
    "enabled",
    "max_item_failures",
    "partitions",
    "scopes",
    "command",
];

/// Applies one `[jobs.<name>]` table to `cfg`; an error is the dotted key
/// and what is wrong with it.
///
/// The rules between keys: `lease_ttl` between 1s and 24h,
/// `lease_ttl <= stale_after <= 30d`, `backoff <= backoff_max <= 7d`,
/// `chunk_pause <= 60s`, `catch_up` at most [`MAX_CATCH_UP`] (400 days), and,
/// for every job with a `schedule`, whatever its `covers`, a `catch_up`
/// window holding at most `schedule::MAX_PERIODS_PER_TICK` (20,000)
/// firings, because one tick walks every firing of its window. That last
/// rule estimates the firings per day from a one-week sample of the
/// schedule (the firings in `(2026-01-05T00:00Z, 2026-01-12T00:00Z]`, from a
/// Monday, in the job's zone, so a schedule of some weekdays only is counted
/// fairly), scales it to `catch_up`, and fails naming `catch_up` (`holds
/// about N firings of this schedule; the limit is 20000: shorten it`). It
/// counts firings, not periods, because the producer's cap does too (see
/// `src/runtime/producer.rs`). These rules check only the jobs that have a
/// table in the file; a kind's `default_config()` alone is not checked.
/// `skip_dates` are strict `YYYY-MM-DD`, `skip_weekdays` chrono's weekday
/// names. The command-only keys are applied after the loop by
/// `apply_command_keys`, once `command` is known.
pub(super) fn apply_job_table(
    cfg: &mut JobConfig,
    fields: &toml::Table,
    path: &str,
) -> Result<(), (String, String)> {
    for (key, value) in fields {
        apply_key(cfg, fields, path, key, value)?;
    }
    apply_command_keys(cfg, fields, path)?;
    check_kind(cfg, path)?;
    check_bounds(cfg, path)
}

/// Applies one key of the job's table (`fields`) to `cfg`; an unknown key
/// is an error that lists the keys this job accepts.
fn apply_key(
    cfg: &mut JobConfig,
    fields: &toml::Table,
    path: &str,
    key: &str,
    value: &toml::Value,
) -> Result<(), (String, String)> {
    let full = format!("{path}.{key}");
    let err = |m: String| (full.clone(), m);
    match key {
        "timezone" => {
            let s = as_str(value).map_err(err)?;
            cfg.timezone = s.parse::<Tz>().map_err(|_| {
                err(format!(
                    "unknown time zone {s:?} (use an IANA name such as Asia/Seoul)"
                ))
            })?;
        }
        "max_attempts" => cfg.max_attempts = as_int(value, 1, 1000).map_err(err)? as u32,
        "chunk_size" => cfg.chunk_size = as_int(value, 1, 100_000).map_err(err)? as u32,
        "lease_ttl" => cfg.lease_ttl = as_duration(value).map_err(err)?,
        "stale_after" => cfg.stale_after = as_duration(value).map_err(err)?,
        "backoff" => cfg.backoff = as_duration(value).map_err(err)?,
        "backoff_max" => cfg.backoff_max = as_duration(value).map_err(err)?,
        "chunk_pause" => cfg.chunk_pause = as_duration_or_zero(value).map_err(err)?,
        "on_lease_expiry" => {
            cfg.on_lease_expiry = match as_str(value).map_err(err)? {
                "retry" => LeaseExpiryPolicy::Retry,
                "hold" => LeaseExpiryPolicy::Hold,
                other => {
                    return Err(err(format!(
                        "unknown policy {other:?} (expected \"retry\" or \"hold\")"
                    )))
                }
            }
        }
        "schedule" => {
            cfg.schedule = Some(CronSchedule::parse(as_str(value).map_err(err)?).map_err(err)?)
        }
        "covers" => {
            let s = as_str(value).map_err(err)?;
            cfg.covers = Covers::parse(s).ok_or_else(|| {
                err(format!(
                    "unknown value {s:?} (expected \"same-day\", \"previous-day\" or \"firing\")"
                ))
            })?;
        }
        "catch_up" => {
            let d = as_duration_or_zero(value).map_err(err)?;
            if d > MAX_CATCH_UP {
                return Err(err(format!(
                    "{} is longer than the limit of 400d",
                    as_str(value).unwrap_or("")
                )));
            }
            cfg.catch_up = d;
        }
        "skip_dates" => {
            let list = value.as_array().ok_or_else(|| {
                err(format!(
                    "expected an array of \"YYYY-MM-DD\" strings, found {}",
                    value.type_str()
                ))
            })?;
            cfg.skip_dates = list
                .iter()
                .map(|v| as_str(v).and_then(|s| parse_date(s).map_err(|e| e.to_string())))
                .collect::<Result<_, _>>()
                .map_err(err)?;
        }
        "skip_weekdays" => {
            let list = value.as_array().ok_or_else(|| {
                err(format!(
                    "expected an array of weekday names, found {}",
                    value.type_str()
                ))
            })?;
            cfg.skip_weekdays = list
                .iter()
                .map(|v| {
                    let s = as_str(v)?;
                    s.parse::<Weekday>().map_err(|_| {
                        format!("unknown weekday {s:?} (use mon, tue, wed, thu, fri, sat, sun)")
                    })
                })
                .collect::<Result<_, _>>()
                .map_err(err)?;
        }
        "enabled" => {
            cfg.enabled = value.as_bool().ok_or_else(|| {
                err(format!(
                    "expected true or false, found {}",
                    value.type_str()
                ))
            })?
        }
        "max_item_failures" => {
            cfg.max_item_failures = Some(as_int(value, 0, i64::MAX).map_err(err)? as u64)
        }
        "partitions" => {
            cfg.partitions =
                as_int(value, 1, i64::from(crate::key::MAX_PARTITIONS)).map_err(err)? as u16
        }
        "scopes" => cfg.scopes = Some(ScopeSource::parse(value).map_err(err)?),
        "command" => cfg.command = Some(CommandSpec::new(as_argv(value).map_err(err)?)),
        k if COMMAND_KEYS.contains(&k) => {
            // Applied after the loop, once `command` is known to be there.
        }
        k if cfg.options.keys.contains(&k) => {
            cfg.options.values.insert(k.to_owned(), value.clone());
        }
        _ => {
            let mut expected: Vec<&str> = JOB_KEYS.to_vec();
            expected.extend(cfg.options.keys);
            if cfg.command.is_some() || fields.contains_key("command") {
                expected.extend(COMMAND_KEYS);
            }
            return Err(err(format!(
                "unknown key (expected one of: {})",
                expected.join(", ")
            )));
        }
    }
    Ok(())
}

/// What the job kind allows: partitions, scopes (whose keys must stay
/// within the length rule) and the kind's own check of its options.
fn check_kind(cfg: &JobConfig, path: &str) -> Result<(), (String, String)> {
    if cfg.partitions > 1 && !cfg.partitionable && cfg.command.is_none() {
        return Err((
            format!("{path}.partitions"),
            "this job kind cannot split a run into partitions (daily-settlement, notification-send and command jobs can)".to_owned(),
        ));
    }
    if let Some(scopes) = &cfg.scopes {
        let at = format!("{path}.scopes");
        if !cfg.scopable && cfg.command.is_none() {
            return Err((
                at,
                "this job kind cannot run per scope (daily-settlement and command jobs can)"
                    .to_owned(),
            ));
        }
        // Every listed scope must leave the key within the length rule.
        let job = path.rsplit_once('.').map_or(path, |(_, j)| j);
        let period_len = if cfg.covers == Covers::Firing { 16 } else { 10 };
        let room = scopes::room_for_scope(job, period_len, cfg.partitions);
        if let ScopeSource::List(list) = scopes {
            if let Some(long) = list.iter().find(|s| s.as_str().len() > room) {
                return Err((
                    at,
                    format!(
                        "scope {long:?} makes keys longer than 120 characters; this job's scopes may have at most {room}"
                    ),
                ));
            }
        }
    }
    if let Some(check) = cfg.options.check {
        check(&cfg.options.values).map_err(|e| (format!("{path}.{}", e.key), e.message))?;
    }
    Ok(())
}

/// The bounds of the durations, and of the firings a schedule's catch-up
/// window may hold.
fn check_bounds(cfg: &JobConfig, path: &str) -> Result<(), (String, String)> {
    let bound = |key: &str, m: &str| (format!("{path}.{key}"), m.to_owned());
    if cfg.lease_ttl < Duration::from_secs(1) || cfg.lease_ttl > Duration::from_secs(86_400) {
        return Err(bound("lease_ttl", "must be between 1s and 24h"));
    }
    if cfg.stale_after < cfg.lease_ttl {
        return Err(bound("stale_after", "must not be shorter than lease_ttl"));
    }
    if cfg.stale_after > Duration::from_secs(30 * 86_400) {
        return Err(bound("stale_after", "must be at most 30d"));
    }
    if cfg.backoff > cfg.backoff_max {
        return Err(bound("backoff", "must not be longer than backoff_max"));
    }
    if cfg.backoff_max > Duration::from_secs(7 * 86_400) {
        return Err(bound("backoff_max", "must be at most 7d"));
    }
    if let Some(sched) = &cfg.schedule {
        // One tick walks every firing of the window and enqueues its periods
        // in one statement, so the window must hold a bounded number of
        // firings (whatever periods they cover). Count a sample week (from a
        // Monday), since a schedule may fire on some weekdays only.
        let t0 = chrono::DateTime::from_timestamp(1_767_571_200, 0).unwrap_or_default();
        let (sample, _) = sched.firings(cfg.timezone, t0, t0 + chrono::Duration::days(7), 100_000);
        let per_day = sample.len() as f64 / 7.0;
        let periods = per_day * cfg.catch_up.as_secs_f64() / 86_400.0;
        if periods > crate::schedule::MAX_PERIODS_PER_TICK as f64 {
            return Err(bound(
                "catch_up",
                &format!(
                    "holds about {periods:.0} firings of this schedule; the limit is {}: shorten it",
                    crate::schedule::MAX_PERIODS_PER_TICK
                ),
            ));
        }
    }
    if cfg.chunk_pause > Duration::from_secs(60) {
        return Err(bound("chunk_pause", "must be at most 60s"));
    }
    Ok(())
}
