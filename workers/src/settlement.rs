//! `daily-settlement`: settles the orders paid in one business period (the
//! instants the run was enqueued with, in the job's time zone then) into one
//! `settlement_item` per order, then per-merchant totals in
//! `settlement_summary`. Every write is fenced by the lease token (and the
//! database refuses one that is not: `batchonce_require_fence`); rows name
//! their attempt by number, never by token. The
//! item key is the order alone (`settlement_item_order_key`): an order is
//! settled once, ever, whatever run, date or configuration reaches it, and a
//! retry after a crash resumes without a second row.
//!
//! `DailySettlement`. Its defaults are the time zone Asia/Seoul, `schedule = "0 1 * * *"`, `covers
//! = previous-day` and `catch_up = 7d`: at 01:00 in Seoul it settles the day before, and it catches
//! up a week of missed days. It re-exports `start_of_day` and `day_bounds` from
//! `batchonce::schedule`, which compute the DST-safe bounds of a business day. The handler first
//! checks the date's orders for a negative `amount_minor` and, if it finds one, returns
//! `JobError::Fatal` (`order N has a negative amount; …`) before the attempt writes anything: bad
//! source data fails the run at once instead of being retried. It then runs keyset-paginated chunks
//! inside fenced transactions (keyset on `(paid_at, order_id)`, the source index's order), followed by an idempotent summary upsert. It also implements
//! `JobDemo`, with a seed and a verify that compares count, total, duplicates, wrong-date items and
//! summary totals against the source. With `partitions = N` a partition settles the orders for
//! which `batchonce_partition(order_id::text, N)` is its number, and the final step writes the
//! summary once, after all of them. With `scopes`, a run settles one merchant: the number that
//! ends its scope (`seller-4711` is merchant 4711), and writes that merchant's summary row; the
//! item key is still the order, so an order is settled once whatever scope reaches it. Its
//! migrations are embedded from
//! `workers/migrations/settlement/`.

use async_trait::async_trait;
use batchonce::queue::Step;
use batchonce::schedule::{Covers, CronSchedule};
use batchonce::{Job, JobConfig, JobContext, JobDemo, JobError, JobName, Outcome, Verification};
use chrono::{Days, NaiveDate};
use chrono_tz::Tz;
use sqlx::migrate::Migrator;
use sqlx::{PgPool, Row};

/// The job kind's tables: `orders` (source), `settlement_item`, `settlement_summary`.
pub static MIGRATIONS: Migrator = sqlx::migrate!("./migrations/settlement");

pub const NAME: &str = "daily-settlement";

#[derive(Debug, Clone, Copy, Default)]
pub struct DailySettlement;

/// `[start, end)` of a business date in UTC (DST-aware, see
/// [`batchonce::schedule`]).
pub use batchonce::schedule::{day_bounds, start_of_day};

#[async_trait]
impl Job for DailySettlement {
    fn name(&self) -> JobName {
        // Invariant: NAME is a valid job name (checked by a unit test).
        JobName::parse(NAME).expect("valid job name")
    }

    fn default_config(&self) -> JobConfig {
        // The seed article's settlement: 01:00 in Seoul, covering the day
        // before, catching up a week of missed days after downtime.
        JobConfig {
            timezone: chrono_tz::Asia::Seoul,
            // Invariant: a constant, valid expression (checked by a unit test).
            schedule: Some(CronSchedule::parse("0 1 * * *").expect("valid cron")),
            covers: Covers::PreviousDay,
            catch_up: std::time::Duration::from_secs(7 * 86_400),
            partitionable: true,
            scopable: true,
            ..JobConfig::default()
        }
    }

    fn migrations(&self) -> Option<&'static Migrator> {
        Some(&MIGRATIONS)
    }

    fn output_tables(&self) -> &'static [&'static str] {
        &["settlement_item", "settlement_summary"]
    }

    fn demo(&self) -> Option<&dyn JobDemo> {
        Some(self)
    }

    async fn run(&self, ctx: &JobContext) -> Result<Outcome, JobError> {
        // A partition settles its own orders; the summary is written once,
        // by the whole run or by the final step after every partition.
        let (no, count) = match ctx.step {
            Step::Whole => (0, 0),
            Step::Partition { no, count } => (i32::from(no), i32::from(count)),
            Step::Final { .. } => return summarize(ctx).await,
        };
        // The window the run was enqueued with, never this worker's idea of
        // the job's time zone.
        let (start, end) = (ctx.run.period_start, ctx.run.period_end);
        // A scoped run settles one merchant's orders; an unscoped run's
        // statements have no merchant condition at all (as for partitions).
        let merchant = merchant_of(ctx)?;
        refuse_negative(ctx, (start, end), (count, no), merchant).await?;
        settle(ctx, (start, end), (count, no), merchant).await?;
        if ctx.step != Step::Whole {
            return Ok(Outcome::Succeeded);
        }
        summarize(ctx).await
    }
}

/// A period's bounds, `[start, end)`.
type Window = (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>);

/// Fails the run at once if an order of the window (of this partition,
/// `(count, no)`, and merchant) has a negative amount.
async fn refuse_negative(
    ctx: &JobContext,
    (start, end): Window,
    (count, no): (i32, i32),
    merchant: Option<i64>,
) -> Result<(), JobError> {
    // Bad source data fails the run at once: retrying cannot fix it, and
    // settling a negative amount would move money the wrong way.
    // A partition reads only its own orders. The whole run's statements
    // have no partition condition at all: a condition that is always
    // true for it would still cost a generic plan its row estimate.
    let mine = if count > 0 {
        "AND batchonce_partition(order_id::text, $3) = $4"
    } else {
        "AND $3::int = 0 AND $4::int = 0"
    };
    let theirs = if merchant.is_some() {
        "AND merchant_id = $5"
    } else {
        ""
    };
    let mut stmt = batchonce::db::statement(ctx.pool()).await?;
    let sql = format!(
        "SELECT order_id FROM orders WHERE paid_at >= $1 AND paid_at < $2 AND amount_minor < 0 \
         {mine} {theirs} ORDER BY order_id LIMIT 1"
    );
    let mut q = batchonce::db::query_scalar(&sql)
        .bind(start)
        .bind(end)
        .bind(count)
        .bind(no);
    if let Some(m) = merchant {
        q = q.bind(m);
    }
    let negative: Option<i64> = q.fetch_optional(stmt.conn()).await?;
    stmt.done().await?;
    if let Some(id) = negative {
        return Err(JobError::Fatal(format!(
            "order {id} has a negative amount; fix the source, then `batchonce runs rerun`"
        )));
    }
    Ok(())
}

/// Settles the window's orders (of this partition and merchant) chunk by
/// chunk, each in a fenced transaction, and reports the orders another run
/// had already settled.
async fn settle(
    ctx: &JobContext,
    (start, end): Window,
    (count, no): (i32, i32),
    merchant: Option<i64>,
) -> Result<(), JobError> {
    let chunk = i64::from(ctx.run.chunk_size);
    // Keyset pagination on (paid_at, order_id), the order of
    // orders_paid_at_idx: each chunk is one range scan of that index,
    // stopping at the chunk's last row, with no sort, for the whole run
    // and for a partition (which skips the other partitions' rows).
    let mut after = (start, i64::MIN);
    let mut first = true;
    let mine = if count > 0 {
        "AND batchonce_partition(order_id::text, $9) = $10"
    } else {
        "AND $9::int = 0 AND $10::int = 0"
    };
    let theirs = if merchant.is_some() {
        "AND merchant_id = $11"
    } else {
        ""
    };
    // Orders of this window that another run already settled (under
    // another business date): reported, never settled again.
    let mut elsewhere = 0i64;
    let mut example: Option<(i64, String)> = None;
    loop {
        if !first {
            ctx.pause(ctx.config.chunk_pause).await?;
        }
        first = false;
        if ctx.is_cancelled() {
            return Err(JobError::Cancelled);
        }
        let mut tx = ctx.fenced().await?;
        // One round trip per chunk: read the next orders by key, insert
        // the missing items, and report how far the chunk reached.
        let sql = format!(
            r#"
            WITH chunk AS (
                SELECT order_id, merchant_id, amount_minor, paid_at
                FROM orders
                WHERE paid_at >= $1 AND paid_at < $2 AND (paid_at, order_id) > ($3, $4)
                  {mine} {theirs}
                ORDER BY paid_at, order_id
                LIMIT $5
            ), ins AS (
                INSERT INTO settlement_item
                    (business_date, order_id, merchant_id, amount_minor, job_key, attempt)
                SELECT $6, order_id, merchant_id, amount_minor, $7, $8 FROM chunk
                ON CONFLICT ON CONSTRAINT settlement_item_order_key DO NOTHING
                RETURNING order_id
            ), other AS (
                -- The statement's snapshot: items that existed before it.
                -- One probe of the order key per order (LIMIT keeps the
                -- subquery from being flattened into a join): a plan
                -- made while settlement_item looked empty would otherwise
                -- hash the whole table on every chunk.
                SELECT c.order_id, i.job_key FROM chunk c
                CROSS JOIN LATERAL (
                    SELECT s.job_key, s.business_date FROM settlement_item s
                    WHERE s.order_id = c.order_id LIMIT 1
                ) i
                WHERE i.business_date <> $6
            ), last AS (
                SELECT paid_at, order_id FROM chunk ORDER BY paid_at DESC, order_id DESC LIMIT 1
            )
            SELECT (SELECT paid_at FROM last) AS last_at,
                   (SELECT order_id FROM last) AS last_id,
                   (SELECT count(*) FROM chunk) AS scanned,
                   (SELECT count(*) FROM ins) AS inserted,
                   (SELECT count(*) FROM other) AS elsewhere,
                   (SELECT min(order_id) FROM other) AS example_order,
                   (SELECT min(job_key) FROM other) AS example_key
            "#
        );
        let mut q = batchonce::db::query(&sql)
            .bind(start)
            .bind(end)
            .bind(after.0)
            .bind(after.1)
            .bind(chunk)
            .bind(ctx.business_date)
            .bind(ctx.key.as_str())
            .bind(ctx.attempt)
            .bind(count)
            .bind(no);
        if let Some(m) = merchant {
            q = q.bind(m);
        }
        let row = q.fetch_one(tx.conn()).await?;
        let last_at: Option<chrono::DateTime<chrono::Utc>> = row.try_get("last_at")?;
        let last_id: Option<i64> = row.try_get("last_id")?;
        let scanned: i64 = row.try_get("scanned")?;
        let inserted: i64 = row.try_get("inserted")?;
        let other: i64 = row.try_get("elsewhere")?;
        if other > 0 {
            elsewhere += other;
            if example.is_none() {
                let order: Option<i64> = row.try_get("example_order")?;
                let key: Option<String> = row.try_get("example_key")?;
                example = order.zip(key);
            }
        }
        tx.add_progress(inserted, 0);
        ctx.commit(tx).await?;
        match last_at.zip(last_id) {
            Some(last) if scanned == chunk => after = last,
            _ => break,
        }
    }
    if elsewhere > 0 {
        let (order, key) = example.unwrap_or_default();
        tracing::warn!(
            job_key = %ctx.key, orders = elsewhere, example_order = order, example_run = %key,
            "orders of this period were already settled by another run; they were not settled again (did the job's time zone change between periods?)"
        );
    }
    Ok(())
}

/// The merchant a scoped run settles: the number that ends its scope
/// (`seller-4711` and `4711` both name merchant 4711). `None` for an
/// unscoped run; a scope that names no merchant fails the run at once.
fn merchant_of(ctx: &JobContext) -> Result<Option<i64>, JobError> {
    let Some(scope) = &ctx.scope else {
        return Ok(None);
    };
    let last = scope.as_str().rsplit('-').next().unwrap_or_default();
    match last.parse::<i64>() {
        Ok(id) => Ok(Some(id)),
        _ => Err(JobError::Fatal(format!(
            "scope {scope} names no merchant: daily-settlement's scopes end in a merchant id, such as seller-4711"
        ))),
    }
}

/// The per-merchant totals of the run's date, from its items: an idempotent
/// upsert, fenced by the whole run's token or the final step's. A scoped
/// run writes its merchant's row alone.
async fn summarize(ctx: &JobContext) -> Result<Outcome, JobError> {
    if ctx.is_cancelled() {
        return Err(JobError::Cancelled);
    }
    let merchant = merchant_of(ctx)?;
    let mut tx = ctx.fenced().await?;
    batchonce::db::query(
        r#"
        INSERT INTO settlement_summary (business_date, merchant_id, order_count, total_minor, job_key)
        SELECT business_date, merchant_id, count(*), sum(amount_minor), $3
        FROM settlement_item WHERE business_date = $1
          AND ($2::bigint IS NULL OR merchant_id = $2)
        GROUP BY business_date, merchant_id
        ON CONFLICT ON CONSTRAINT settlement_summary_pkey DO UPDATE
        SET order_count = EXCLUDED.order_count, total_minor = EXCLUDED.total_minor,
            job_key = EXCLUDED.job_key
        "#,
    )
    .bind(ctx.business_date)
    .bind(merchant)
    .bind(ctx.key.as_str())
    .execute(tx.conn())
    .await?;
    ctx.commit(tx).await?;
    Ok(Outcome::Succeeded)
}

/// Demo orders per business date.
const DEMO_ORDERS_PER_DAY: i64 = 1200;

#[async_trait]
impl JobDemo for DailySettlement {
    async fn seed(
        &self,
        pool: &PgPool,
        config: &JobConfig,
        dates: &[NaiveDate],
    ) -> Result<String, sqlx::Error> {
        let mut total = 0i64;
        // Orders of the day after the last date too: they must not be settled.
        let mut days: Vec<NaiveDate> = dates.to_vec();
        if let Some(next) = dates.last().and_then(|d| d.checked_add_days(Days::new(1))) {
            days.push(next);
        }
        for d in days {
            let (start, end) = day_bounds(d, config.timezone);
            let next_id: i64 =
                batchonce::db::query_scalar("SELECT coalesce(max(order_id), 0) FROM orders")
                    .fetch_one(pool)
                    .await?;
            // Spread evenly over the local day, starting exactly at local
            // midnight, so the time-zone boundary is exercised.
            let n = batchonce::db::query(
                r#"
                INSERT INTO orders (order_id, merchant_id, amount_minor, paid_at)
                SELECT $1 + g, 1 + (g * 7919) % 12, 1000 + (g * 104729) % 99000,
                       $2::timestamptz + ($3::timestamptz - $2::timestamptz) * ((g - 1)::float8 / $4)
                FROM generate_series(1, $4) AS g
                "#,
            )
            .bind(next_id)
            .bind(start)
            .bind(end)
            .bind(DEMO_ORDERS_PER_DAY)
            .execute(pool)
            .await?
            .rows_affected();
            total += n as i64;
        }
        Ok(format!(
            "{total} orders over {} business days, {DEMO_ORDERS_PER_DAY} a day, 12 merchants",
            dates.len() + 1
        ))
    }

    async fn verify(
        &self,
        pool: &PgPool,
        config: &JobConfig,
        _key: &batchonce::JobKey,
        date: NaiveDate,
    ) -> Result<Verification, sqlx::Error> {
        verify(pool, config.timezone, date).await
    }
}

/// Compares a date's settlement with its source orders: item count and total,
/// duplicates, items from the wrong date, and the summary totals.
pub async fn verify(pool: &PgPool, tz: Tz, date: NaiveDate) -> Result<Verification, sqlx::Error> {
    let (start, end) = day_bounds(date, tz);
    let row = batchonce::db::query(
        r#"
        SELECT
          (SELECT count(*) FROM orders WHERE paid_at >= $2 AND paid_at < $3) AS src_n,
          (SELECT coalesce(sum(amount_minor), 0)::bigint FROM orders
            WHERE paid_at >= $2 AND paid_at < $3) AS src_sum,
          (SELECT count(*) FROM settlement_item WHERE business_date = $1) AS item_n,
          (SELECT coalesce(sum(amount_minor), 0)::bigint FROM settlement_item
            WHERE business_date = $1) AS item_sum,
          (SELECT count(*) FROM (SELECT order_id FROM settlement_item WHERE business_date = $1
             GROUP BY order_id HAVING count(*) > 1) d) AS dups,
          (SELECT count(*) FROM settlement_item i JOIN orders o USING (order_id)
            WHERE i.business_date = $1 AND NOT (o.paid_at >= $2 AND o.paid_at < $3)) AS wrong_day,
          (SELECT coalesce(sum(order_count), 0)::bigint FROM settlement_summary
            WHERE business_date = $1) AS sum_n,
          (SELECT coalesce(sum(total_minor), 0)::bigint FROM settlement_summary
            WHERE business_date = $1) AS sum_total
        "#,
    )
    .bind(date)
    .bind(start)
    .bind(end)
    .fetch_one(pool)
    .await?;
    let get = |c: &str| row.try_get::<i64, _>(c);
    let (src_n, src_sum, item_n, item_sum) = (
        get("src_n")?,
        get("src_sum")?,
        get("item_n")?,
        get("item_sum")?,
    );
    let (dups, wrong_day, sum_n, sum_total) = (
        get("dups")?,
        get("wrong_day")?,
        get("sum_n")?,
        get("sum_total")?,
    );
    let ok = src_n == item_n
        && src_sum == item_sum
        && dups == 0
        && wrong_day == 0
        && sum_n == src_n
        && sum_total == src_sum;
    Ok(Verification {
        items: item_n,
        duplicates: dups,
        detail: format!(
            "total {item_sum} vs source {src_sum} ({src_n} orders); summary {sum_total}; wrong-date items {wrong_day}"
        ),
        ok,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_and_defaults_are_valid() {
        assert_eq!(DailySettlement.name().as_str(), NAME);
        assert!(DailySettlement.default_config().schedule.is_some());
    }

    #[test]
    fn seoul_day_starts_at_15_utc_the_day_before() {
        let d = NaiveDate::from_ymd_opt(2026, 9, 15).unwrap();
        let (s, e) = day_bounds(d, chrono_tz::Asia::Seoul);
        assert_eq!(s.to_rfc3339(), "2026-09-14T15:00:00+00:00");
        assert_eq!(e.to_rfc3339(), "2026-09-15T15:00:00+00:00");
    }

    #[test]
    fn dst_days_are_23_and_25_hours() {
        let ny = chrono_tz::America::New_York;
        let (s, e) = day_bounds(NaiveDate::from_ymd_opt(2026, 3, 8).unwrap(), ny);
        assert_eq!((e - s).num_hours(), 23);
        let (s, e) = day_bounds(NaiveDate::from_ymd_opt(2026, 11, 1).unwrap(), ny);
        assert_eq!((e - s).num_hours(), 25);
    }

    #[test]
    fn a_missing_midnight_starts_the_day_at_the_first_valid_time() {
        // Santiago springs forward at 24:00 on the first Saturday of September
        // 2026, so 2026-09-06 00:00 does not exist there and the day starts at 01:00.
        let tz = chrono_tz::America::Santiago;
        let d = NaiveDate::from_ymd_opt(2026, 9, 6).unwrap();
        let s = start_of_day(d, tz).with_timezone(&tz);
        assert_eq!(s.date_naive(), d);
        assert_eq!(s.format("%H:%M").to_string(), "01:00");
    }
}
