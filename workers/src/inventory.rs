//! `inventory-sync`: every 15 minutes, copies the upstream stock per SKU into
//! `inventory_level`. The source is the `inventory_source` table (normally
//! replicated from the warehouse system) or, with `source_file`, a JSON
//! snapshot `[{"sku": "A-1", "quantity": 5, "version": 17}, ...]`. A level is
//! replaced only by a strictly newer `source_version`, so a late, repeated or
//! overlapping run never overwrites fresher data, and every chunk is a fenced
//! upsert.
//!
//! `InventorySync`, the `inventory-sync` kind. Its defaults are `schedule = "*/15 * * * *"`,
//! `covers = firing`, `catch_up = 30m`, `stale_after = 10m` and `chunk_size = 1000`, in UTC. Its
//! one key of its own, `source_file`, switches the source from the `inventory_source` table (read
//! in SKU order, keyset-paginated) to a JSON snapshot that `read_snapshot` reads whole in a
//! blocking task: at most 256 MiB, `[{"sku", "quantity", "version"}]` with no other fields, SKUs of
//! 1–200 characters, no negative numbers, and the highest version of a SKU listed twice. A missing
//! or unreadable file is `SnapshotError::Unreadable`, which retries, and an invalid one
//! `SnapshotError::Invalid`, which is fatal. Every chunk is one fenced `UPSERT` into
//! `inventory_level` whose `DO UPDATE` has `WHERE l.source_version < EXCLUDED.source_version`, and
//! `processed_count` counts the rows it changed. The `JobDemo` runs the last three quarter-hours
//! over 600 SKUs, 10 of which already have a newer level that must survive.

use std::collections::BTreeMap;
use std::path::Path;

use async_trait::async_trait;
use batchonce::config::{KindOptions, OptionError};
use batchonce::schedule::{Covers, CronSchedule, Period};
use batchonce::{
    Job, JobConfig, JobContext, JobDemo, JobError, JobKey, JobName, Outcome, Verification,
};
use chrono::{DateTime, NaiveDate, Utc};
use sqlx::migrate::Migrator;
use sqlx::{PgPool, Row};

/// The job kind's tables: `inventory_source` (source) and `inventory_level`.
pub static MIGRATIONS: Migrator = sqlx::migrate!("./migrations/inventory");

pub const NAME: &str = "inventory-sync";

const OPTION_KEYS: &[&str] = &["source_file"];

/// Largest snapshot file read.
pub const MAX_SNAPSHOT_BYTES: u64 = 256 * 1024 * 1024;

/// One SKU's stock at one source version.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StockLevel {
    pub sku: String,
    pub quantity: i64,
    pub version: i64,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct InventorySync;

fn check_options(values: &toml::Table) -> Result<(), OptionError> {
    if let Some(v) = values.get("source_file") {
        match v.as_str() {
            Some(s) if !s.is_empty() && !s.contains('\0') => {}
            Some(_) => return Err(OptionError::new("source_file", "must be a non-empty path")),
            None => {
                return Err(OptionError::new(
                    "source_file",
                    format!("expected a string, found {}", v.type_str()),
                ))
            }
        }
    }
    Ok(())
}

/// Why a snapshot file could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// Missing or unreadable: it may arrive or become readable later.
    #[error("{0}")]
    Unreadable(String),
    /// Readable but wrong: it stays wrong.
    #[error("{0}")]
    Invalid(String),
}

/// Reads and checks a snapshot file; keeps the highest version of a SKU
/// listed twice, and returns the levels in SKU order.
pub fn read_snapshot(path: &Path) -> Result<Vec<StockLevel>, SnapshotError> {
    use SnapshotError::{Invalid, Unreadable};
    let shown = path.display();
    let unreadable = |e: std::io::Error| Unreadable(format!("cannot read {shown}: {e}"));
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    if meta.len() > MAX_SNAPSHOT_BYTES {
        return Err(Invalid(format!(
            "{shown} is {} bytes; the limit is {MAX_SNAPSHOT_BYTES}",
            meta.len()
        )));
    }
    let text = std::fs::read(path).map_err(unreadable)?;
    let levels: Vec<StockLevel> = serde_json::from_slice(&text).map_err(|e| {
        Invalid(format!(
            "{shown}: not a snapshot (expected [{{\"sku\", \"quantity\", \"version\"}}, ...]): {e}"
        ))
    })?;
    let mut by_sku: BTreeMap<String, StockLevel> = BTreeMap::new();
    for (i, l) in levels.into_iter().enumerate() {
        if l.sku.is_empty() || l.sku.chars().count() > 200 || l.sku.contains('\0') {
            return Err(Invalid(format!(
                "{shown}: entry {i}: sku must be 1 to 200 characters without NUL"
            )));
        }
        if l.quantity < 0 || l.version < 0 {
            return Err(Invalid(format!(
                "{shown}: entry {i} ({}): quantity and version must not be negative",
                batchonce::text::truncate(&l.sku)
            )));
        }
        match by_sku.get(&l.sku) {
            Some(old) if old.version >= l.version => {}
            _ => {
                by_sku.insert(l.sku.clone(), l);
            }
        }
    }
    Ok(by_sku.into_values().collect())
}

#[async_trait]
impl Job for InventorySync {
    fn name(&self) -> JobName {
        // Invariant: NAME is a valid job name (checked by a unit test).
        JobName::parse(NAME).expect("valid job name")
    }

    fn default_config(&self) -> JobConfig {
        JobConfig {
            // Invariant: a constant, valid expression (checked by a unit test).
            schedule: Some(CronSchedule::parse("*/15 * * * *").expect("valid cron")),
            covers: Covers::Firing,
            // Only the latest stock matters: after downtime, catch up the
            // last half hour, not every missed quarter.
            catch_up: std::time::Duration::from_secs(30 * 60),
            lease_ttl: std::time::Duration::from_secs(30),
            stale_after: std::time::Duration::from_secs(10 * 60),
            chunk_size: 1000,
            options: KindOptions {
                keys: OPTION_KEYS,
                check: Some(check_options),
                values: toml::Table::new(),
            },
            ..JobConfig::default()
        }
    }

    fn migrations(&self) -> Option<&'static Migrator> {
        Some(&MIGRATIONS)
    }

    fn output_tables(&self) -> &'static [&'static str] {
        &["inventory_level"]
    }

    fn demo(&self) -> Option<&dyn JobDemo> {
        Some(self)
    }

    async fn run(&self, ctx: &JobContext) -> Result<Outcome, JobError> {
        match ctx.config.options.str("source_file") {
            Some(path) => {
                let path = path.to_owned();
                let levels = tokio::task::spawn_blocking(move || read_snapshot(Path::new(&path)))
                    .await
                    .map_err(|e| JobError::Retryable(format!("snapshot reader failed: {e}")))?
                    .map_err(|e| match e {
                        // Not delivered yet, or a passing I/O error: try again.
                        SnapshotError::Unreadable(m) => JobError::Retryable(m),
                        // A bad snapshot stays bad on retry.
                        SnapshotError::Invalid(m) => JobError::Fatal(m),
                    })?;
                sync_levels(ctx, &levels).await
            }
            None => sync_table(ctx).await,
        }
    }
}

/// The upsert that never moves a level back to an older version.
const UPSERT: &str = r#"
    INSERT INTO inventory_level AS l (sku, quantity, source_version, synced_at, job_key, attempt)
    SELECT sku, quantity, version, now(), $4, $5
    FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS s(sku, quantity, version)
    ON CONFLICT ON CONSTRAINT inventory_level_pkey DO UPDATE
    SET quantity = EXCLUDED.quantity,
        source_version = EXCLUDED.source_version,
        synced_at = EXCLUDED.synced_at,
        job_key = EXCLUDED.job_key,
        attempt = EXCLUDED.attempt
    WHERE l.source_version < EXCLUDED.source_version
"#;

async fn upsert_chunk(ctx: &JobContext, levels: &[StockLevel]) -> Result<(), JobError> {
    let skus: Vec<&str> = levels.iter().map(|l| l.sku.as_str()).collect();
    let qty: Vec<i64> = levels.iter().map(|l| l.quantity).collect();
    let ver: Vec<i64> = levels.iter().map(|l| l.version).collect();
    let mut tx = ctx.fenced().await?;
    let changed = batchonce::db::query(UPSERT)
        .bind(&skus)
        .bind(&qty)
        .bind(&ver)
        .bind(ctx.key.as_str())
        .bind(ctx.attempt)
        .execute(tx.conn())
        .await?
        .rows_affected();
    tx.add_progress(changed as i64, 0);
    ctx.commit(tx).await?;
    Ok(())
}

async fn sync_levels(ctx: &JobContext, levels: &[StockLevel]) -> Result<Outcome, JobError> {
    for (i, chunk) in levels.chunks(ctx.config.chunk_size as usize).enumerate() {
        if i > 0 {
            ctx.pause(ctx.config.chunk_pause).await?;
        }
        if ctx.is_cancelled() {
            return Err(JobError::Cancelled);
        }
        upsert_chunk(ctx, chunk).await?;
    }
    Ok(Outcome::Succeeded)
}

async fn sync_table(ctx: &JobContext) -> Result<Outcome, JobError> {
    let chunk = i64::from(ctx.config.chunk_size);
    // Every SKU is non-empty, so every SKU sorts after "".
    let mut after = String::new();
    let mut first = true;
    loop {
        if !first {
            ctx.pause(ctx.config.chunk_pause).await?;
        }
        first = false;
        if ctx.is_cancelled() {
            return Err(JobError::Cancelled);
        }
        // Read the chunk in SKU order (keyset paging), then upsert it fenced.
        let mut stmt = batchonce::db::statement(ctx.pool()).await?;
        let rows = batchonce::db::query(
            "SELECT sku, quantity, source_version FROM inventory_source \
             WHERE sku > $1 ORDER BY sku LIMIT $2",
        )
        .bind(&after)
        .bind(chunk)
        .fetch_all(stmt.conn())
        .await?;
        stmt.done().await?;
        let levels: Vec<StockLevel> = rows
            .iter()
            .map(|r| {
                Ok(StockLevel {
                    sku: r.try_get("sku")?,
                    quantity: r.try_get("quantity")?,
                    version: r.try_get("source_version")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()?;
        if !levels.is_empty() {
            upsert_chunk(ctx, &levels).await?;
        }
        match levels.last() {
            Some(l) if levels.len() as i64 == chunk => after = l.sku.clone(),
            _ => return Ok(Outcome::Succeeded),
        }
    }
}

const DEMO_SKUS: i64 = 600;

#[async_trait]
impl JobDemo for InventorySync {
    fn periods(&self, config: &JobConfig, now: DateTime<Utc>) -> Vec<Period> {
        // The last three quarter-hours, keyed as the producer keys them.
        let Some(sched) = &config.schedule else {
            return Vec::new();
        };
        let (firings, _) =
            sched.firings(config.timezone, now - chrono::Duration::hours(1), now, 16);
        let n = firings.len();
        firings
            .into_iter()
            .skip(n.saturating_sub(3))
            .map(|f| batchonce::schedule::period_of(&f, config.timezone, Covers::Firing))
            .collect()
    }

    async fn seed(
        &self,
        pool: &PgPool,
        _config: &JobConfig,
        _dates: &[NaiveDate],
    ) -> Result<String, sqlx::Error> {
        batchonce::db::query(
            "INSERT INTO inventory_source (sku, quantity, source_version) \
             SELECT 'SKU-' || lpad(g::text, 5, '0'), (g * 37) % 500, 1000 + g FROM generate_series(1, $1) g",
        )
        .bind(DEMO_SKUS)
        .execute(pool)
        .await?;
        // A fresher level than the source already synced for a few SKUs: a
        // run must leave them alone.
        // Written by no run, so outside any fence: the schema's owner says
        // so for this transaction alone (`batchonce_unfenced`, migration
        // 20261208000004); the demo seeds as the owner.
        let mut tx = pool.begin().await?;
        batchonce::db::query("SET LOCAL batchonce.unfenced = on")
            .execute(&mut *tx)
            .await?;
        batchonce::db::query(
            "INSERT INTO inventory_level (sku, quantity, source_version, synced_at, job_key, attempt) \
             SELECT sku, 1, source_version + 1, now(), 'seeded', 0 FROM inventory_source \
             WHERE sku <= 'SKU-00010'",
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(format!(
            "{DEMO_SKUS} SKUs in inventory_source, 10 of them already synced at a newer version"
        ))
    }

    async fn verify(
        &self,
        pool: &PgPool,
        _config: &JobConfig,
        _key: &JobKey,
        _date: NaiveDate,
    ) -> Result<Verification, sqlx::Error> {
        let mut v = verify(pool).await?;
        // The seeded newer levels must have survived every run.
        let kept: i64 = batchonce::db::query_scalar(
            "SELECT count(*) FROM inventory_level WHERE job_key = 'seeded'",
        )
        .fetch_one(pool)
        .await?;
        v.ok &= kept == 10;
        v.detail
            .push_str(&format!("; newer levels kept {kept} of 10"));
        Ok(v)
    }
}

/// Compares `inventory_level` with `inventory_source`: every SKU present, at
/// least at the source's version, and equal to the source where the version
/// is the same.
pub async fn verify(pool: &PgPool) -> Result<Verification, sqlx::Error> {
    let row = batchonce::db::query(
        r#"
        SELECT
          (SELECT count(*) FROM inventory_source) AS skus,
          (SELECT count(*) FROM inventory_level) AS levels,
          (SELECT count(*) FROM inventory_source s LEFT JOIN inventory_level l USING (sku)
            WHERE l.sku IS NULL) AS missing,
          (SELECT count(*) FROM inventory_source s JOIN inventory_level l USING (sku)
            WHERE l.source_version < s.source_version) AS behind,
          (SELECT count(*) FROM inventory_source s JOIN inventory_level l USING (sku)
            WHERE l.source_version = s.source_version AND l.quantity <> s.quantity) AS wrong
        "#,
    )
    .fetch_one(pool)
    .await?;
    let get = |c: &str| row.try_get::<i64, _>(c);
    let (skus, levels, missing, behind, wrong) = (
        get("skus")?,
        get("levels")?,
        get("missing")?,
        get("behind")?,
        get("wrong")?,
    );
    Ok(Verification {
        items: levels,
        duplicates: 0,
        detail: format!(
            "{levels} levels for {skus} SKUs; missing {missing}, behind the source {behind}, wrong quantity {wrong}"
        ),
        ok: missing == 0 && behind == 0 && wrong == 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_and_defaults_are_valid() {
        let c = InventorySync.default_config();
        assert_eq!(InventorySync.name().as_str(), NAME);
        assert_eq!(c.schedule.unwrap().as_str(), "*/15 * * * *");
        assert_eq!(c.covers, Covers::Firing);
    }

    #[test]
    fn snapshots_are_checked_and_keep_the_newest_version() {
        let dir = std::env::temp_dir().join(format!("bo-inv-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("s.json");
        std::fs::write(
            &p,
            r#"[{"sku":"B","quantity":2,"version":5},{"sku":"A","quantity":1,"version":3},{"sku":"B","quantity":9,"version":4}]"#,
        )
        .unwrap();
        let l = read_snapshot(&p).unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].sku, "A");
        assert_eq!((l[1].quantity, l[1].version), (2, 5));
        for (bad, want) in [
            (r#"[{"sku":"","quantity":1,"version":1}]"#, "entry 0"),
            (
                r#"[{"sku":"A","quantity":-1,"version":1}]"#,
                "must not be negative",
            ),
            (r#"[{"sku":"A","quantity":1}]"#, "not a snapshot"),
            (
                r#"[{"sku":"A","quantity":1,"version":1,"colour":2}]"#,
                "not a snapshot",
            ),
            (r#"{"sku":"A"}"#, "not a snapshot"),
        ] {
            std::fs::write(&p, bad).unwrap();
            let e = read_snapshot(&p).unwrap_err();
            assert!(matches!(e, SnapshotError::Invalid(_)));
            let e = e.to_string();
            assert!(e.contains(want), "{bad}: {e}");
            assert!(!e.contains('\n'));
        }
        assert!(matches!(
            read_snapshot(&dir.join("absent.json")),
            Err(SnapshotError::Unreadable(m)) if m.contains("cannot read")
        ));
        let _ = std::fs::remove_dir_all(dir);
    }
}
