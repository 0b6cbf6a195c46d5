//! `batchonce migrate --contract`: the contract step of a rolling upgrade, which drops the engine
//! functions that only earlier releases call, once no process of such a release can still call
//! them. It owns the list of what a contract drops, `sql/contract/<release>.sql` (embedded), and
//! nothing else reads that file.
//!
//! Invariants:
//! - The check and the drops are one transaction that first locks `batch_worker` against every
//!   write (`SHARE ROW EXCLUSIVE`), so no process registers between the check and the drops.
//! - It refuses, dropping nothing, while `worker_registry::running` lists a process whose version
//!   is older than [`RELEASE`] or unparseable, and names each.
//! - It is idempotent: a function already gone is skipped, and a second run drops nothing.
//! - Each drop is `RESTRICT`: a function something still depends on (a trigger, a view) stops the
//!   contract and rolls it back rather than taking that with it.

use sqlx::{PgPool, Row};

use crate::runtime::worker_registry::{self, Running};

/// The release this contract belongs to: processes of any earlier release
/// must be gone before it runs.
pub const RELEASE: &str = "0.2.0";

/// The functions the contract drops, one `DROP FUNCTION IF EXISTS <signature>;` a line.
const DROPS: &str = include_str!("../../sql/contract/0.2.0.sql");

/// What a contract did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Contracted {
    pub release: &'static str,
    /// The signatures dropped now, in the file's order.
    pub dropped: Vec<String>,
    /// Those an earlier contract had dropped already.
    pub already_gone: Vec<String>,
}

/// Why the contract did not run.
#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    #[error("{}", refusal(.0))]
    EarlierReleaseRunning(Vec<Running>),
    #[error("the contract failed, and dropped nothing: {0}")]
    Database(#[from] sqlx::Error),
}

/// The refusal's one line: what to do, then each process.
fn refusal(running: &[Running]) -> String {
    const LISTED: usize = 5;
    let mut names: Vec<String> = running
        .iter()
        .take(LISTED)
        .map(|p| {
            let why = if p.connected {
                "connected".to_owned()
            } else {
                match p.counted_until {
                    Some(t) => format!("counted live until {}", t.format("%Y-%m-%d %H:%M:%SZ")),
                    None => "live".to_owned(),
                }
            };
            format!(
                "{} ({}, host {}, pid {}, version {}, {why})",
                crate::text::truncate(&p.worker_id),
                p.role,
                crate::text::truncate(&p.host),
                p.pid,
                crate::text::truncate(&p.version),
            )
        })
        .collect();
    if running.len() > LISTED {
        names.push(format!("and {} more", running.len() - LISTED));
    }
    // The advice first: the top level cuts an error line at 1,000 characters.
    format!(
        "the contract of {RELEASE} refused, nothing dropped: stop every process of an earlier \
         release or roll it to {RELEASE}, then run `batchonce migrate --contract` again (a killed \
         process keeps its row: delete it, as the migrator, once you know it is gone); {} registered process(es) may \
         still call the functions the contract drops: {}",
        running.len(),
        names.join("; ")
    )
}

/// The signatures the contract drops, in the file's order.
pub fn drops() -> Vec<&'static str> {
    DROPS
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("DROP FUNCTION IF EXISTS ")
                .and_then(|s| s.strip_suffix(';'))
        })
        .collect()
}

/// The names of the functions the contract drops (for `roles`, which grants
/// on them only while they exist).
pub fn dropped_names() -> Vec<&'static str> {
    drops()
        .into_iter()
        .map(|s| s.split_once('(').map_or(s, |(name, _)| name))
        .collect()
}

/// Whether `version` (as a process registered it) is [`RELEASE`] or later.
/// A version that does not start with `MAJOR.MINOR.PATCH`, or a pre-release
/// of [`RELEASE`] itself, is earlier: the contract must not assume it calls
/// only what stays.
pub fn at_least_this_release(version: &str) -> bool {
    fn triple(v: &str) -> Option<([u64; 3], bool)> {
        let v = v.trim().strip_prefix('v').unwrap_or(v.trim());
        let core_end = v
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(v.len());
        let (core, rest) = v.split_at(core_end);
        let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
        let out = [parts.next()??, parts.next()??, parts.next()??];
        if parts.next().is_some() {
            return None;
        }
        Some((out, rest.starts_with('-')))
    }
    let Some((want, _)) = triple(RELEASE) else {
        return false;
    };
    match triple(version) {
        Some((have, pre)) => have > want || (have == want && !pre),
        None => false,
    }
}

/// Drops the functions of the contract, refusing while a process of an
/// earlier release may still be running (see the module documentation).
pub async fn run(pool: &PgPool) -> Result<Contracted, ContractError> {
    let mut tx = pool.begin().await?;
    // Blocks registrations, refreshes and deregistrations until the commit,
    // which follows within milliseconds; a process of this release only logs
    // a refresh that timed out.
    sqlx::query("SET LOCAL lock_timeout = '30s'")
        .execute(&mut *tx)
        .await?;
    sqlx::query("LOCK TABLE batch_worker IN SHARE ROW EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await?;
    let earlier: Vec<Running> = worker_registry::running(&mut tx)
        .await?
        .into_iter()
        .filter(|p| !at_least_this_release(&p.version))
        .collect();
    if !earlier.is_empty() {
        tx.rollback().await?;
        tracing::warn!(
            release = RELEASE,
            processes = ?earlier.iter().map(|p| p.worker_id.as_str()).collect::<Vec<_>>(),
            "contract refused: processes of an earlier release are running"
        );
        return Err(ContractError::EarlierReleaseRunning(earlier));
    }
    let schema: String = sqlx::query_scalar("SELECT quote_ident(current_schema())")
        .fetch_one(&mut *tx)
        .await?;
    let mut done = Contracted {
        release: RELEASE,
        dropped: Vec::new(),
        already_gone: Vec::new(),
    };
    for signature in drops() {
        let qualified = format!("{schema}.{signature}");
        let exists: bool = sqlx::query("SELECT to_regprocedure($1) IS NOT NULL")
            .bind(&qualified)
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
        if !exists {
            done.already_gone.push(signature.to_owned());
            continue;
        }
        // The signature is a constant of the embedded file, never input.
        sqlx::query(&format!("DROP FUNCTION {qualified} RESTRICT"))
            .execute(&mut *tx)
            .await?;
        done.dropped.push(signature.to_owned());
    }
    tx.commit().await?;
    for f in &done.dropped {
        tracing::info!(release = RELEASE, function = %f, "contract dropped a function");
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_lists_signatures_only() {
        let drops = drops();
        assert!(!drops.is_empty());
        for line in DROPS.lines().map(str::trim) {
            assert!(
                line.is_empty()
                    || line.starts_with("--")
                    || line.starts_with("DROP FUNCTION IF EXISTS "),
                "sql/contract/{RELEASE}.sql may hold only comments and drops: {line}"
            );
        }
        for s in &drops {
            assert!(s.starts_with("batchonce_") && s.ends_with(')'), "{s}");
            assert!(!s.contains(';') && !s.contains("--"), "{s}");
        }
        assert!(dropped_names().contains(&"batchonce_due_runs"));
    }

    #[test]
    fn versions_before_this_release_are_earlier() {
        for v in [
            "0.2.0",
            "0.2.1",
            "0.10.0",
            "1.0.0",
            "v0.2.0",
            "0.2.0+abc",
            "0.2.0 (abc1234)",
        ] {
            assert!(at_least_this_release(v), "{v}");
        }
        for v in [
            "0.1.0",
            "0.1.9",
            "0.2.0-rc.1",
            "",
            "unknown",
            "0.2",
            "0.2.x",
            "0.2.0.1",
        ] {
            assert!(!at_least_this_release(v), "{v}");
        }
    }
}
