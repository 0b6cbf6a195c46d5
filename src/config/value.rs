//! The readers of one value of a `[jobs.<name>]` table (a string, an
//! integer in a range, a duration), each failing with the message that the
//! table's error puts after the key's name. Both the job table
//! (`job_table.rs`) and the command job's keys (`command.rs`) use them; they
//! depend on neither, so neither depends on the other for them.

use std::time::Duration;

use super::parse_duration;

pub(super) fn as_str(v: &toml::Value) -> Result<&str, String> {
    v.as_str()
        .ok_or_else(|| format!("expected a string, found {}", v.type_str()))
}

pub(super) fn as_int(v: &toml::Value, min: i64, max: i64) -> Result<i64, String> {
    let n = v
        .as_integer()
        .ok_or_else(|| format!("expected an integer, found {}", v.type_str()))?;
    if n < min || n > max {
        return Err(format!("{n} is out of range {min}..={max}"));
    }
    Ok(n)
}

pub(super) fn as_duration_or_zero(v: &toml::Value) -> Result<Duration, String> {
    match as_str(v)? {
        "0" | "0s" => Ok(Duration::ZERO),
        _ => as_duration(v),
    }
}

pub(super) fn as_duration(v: &toml::Value) -> Result<Duration, String> {
    let s = as_str(v)?;
    parse_duration(s)
}
