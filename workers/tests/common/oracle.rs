//! The settlement oracle: what "never twice, never lost" means for the
//! daily-settlement workload, checked in plain SQL against the source orders
//! and the runs' stored periods. It shares no code with the production
//! `settlement::verify` (which `batchonce verify` runs), so a bug there
//! cannot hide a bug in the engine here.
//!
//! It counts what could really go wrong, whatever constraints the schema
//! holds today: an order settled twice (under two runs, dates or tokens),
//! an order settled under a run whose period does not contain it, an item
//! written under a token that no attempt of its run held, an item committed
//! outside its attempt (by commit time, not by the transaction's start), an
//! order that no item settles, and summaries that disagree with the orders.

use sqlx::PgPool;

/// The oracle's counts; every field but `orders` and `items` must be zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Settled {
    /// Orders paid within the stored period of some daily-settlement run.
    pub orders: i64,
    /// Settlement items written.
    pub items: i64,
    /// Orders in some run's period that no item settles.
    pub lost: i64,
    /// Orders with more than one item: under two runs, dates or tokens.
    pub twice: i64,
    /// Items whose run's stored period does not contain the order's payment
    /// time, or whose business date is not that run's date, or whose run
    /// does not exist, or that a partition wrote for an order of another
    /// partition, or that a scoped run wrote for a merchant its scope does
    /// not name.
    pub wrong_run: i64,
    /// Items that name no attempt of their own run (by `(job_key, attempt)`).
    pub foreign_token: i64,
    /// Items committed before their attempt began or after the transaction
    /// that ended it (a takeover, a release, a finish) committed.
    pub outside_lease: i64,
    /// (date, merchant) summaries whose count or total differ from the
    /// orders of that run's period, including missing and extra ones.
    pub wrong_summaries: i64,
    /// Daily-settlement runs without a stored period: the oracle cannot
    /// judge them, so it counts them as a failure.
    pub runs_without_period: i64,
}

impl Settled {
    /// Everything the workload may never produce is absent, and every order
    /// in scope is settled.
    pub fn holds(&self) -> bool {
        self.lost == 0
            && self.twice == 0
            && self.wrong_run == 0
            && self.foreign_token == 0
            && self.outside_lease == 0
            && self.wrong_summaries == 0
            && self.runs_without_period == 0
            && self.items == self.orders
    }

    /// Panics with every count unless the oracle holds.
    #[track_caller]
    pub fn assert_holds(&self, what: &str) {
        assert!(
            self.holds(),
            "{what}: the settlement oracle failed: {self:?}"
        );
    }
}

/// An item `i` (with `committed_at`, its commit time) that its attempt `a`
/// did not write while it held the lease: committed before the attempt began
/// or after the transaction that ended it committed. The attempt row is last
/// written by that transaction (a finish, a takeover, a release), and a
/// takeover waits for the holder's open fenced transactions, so every item
/// written in time committed before it.
const OUTSIDE_ATTEMPT: &str = "(i.committed_at IS NULL OR i.committed_at < a.started_at \
    OR (a.finished_at IS NOT NULL AND i.committed_at > pg_xact_commit_timestamp(a.xmin)))";

fn assert_commit_times(on: &str) {
    assert_eq!(
        on, "on",
        "the settlement oracle needs track_commit_timestamp = on on the test server"
    );
}

/// Settlement items (of run `key`, or of every run) that do not name an
/// attempt of their own run, or that committed while that
/// attempt did not hold the lease: what no fault may ever produce.
pub async fn items_outside_their_lease(pool: &PgPool, key: Option<&str>) -> i64 {
    assert_commit_times(&commit_times(pool).await);
    let sql = format!(
        "SELECT count(*) FROM (SELECT i.*, pg_xact_commit_timestamp(i.xmin) AS committed_at \
           FROM settlement_item i WHERE $1::text IS NULL OR i.job_key = $1) i \
         WHERE NOT EXISTS (SELECT 1 FROM batch_job_attempt a \
           WHERE a.job_key = i.job_key AND a.attempt = i.attempt AND NOT {OUTSIDE_ATTEMPT})"
    );
    sqlx::query_scalar(&sql)
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn commit_times(pool: &PgPool) -> String {
    sqlx::query_scalar("SELECT current_setting('track_commit_timestamp')")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Runs the oracle over every daily-settlement run of the database.
///
/// Needs `track_commit_timestamp = on` (the private test cluster sets it):
/// without commit times, a transaction that began before a takeover and
/// committed after it would look like one that committed in time.
pub async fn settlement(pool: &PgPool) -> Settled {
    assert_commit_times(&commit_times(pool).await);
    batchonce::testing::assert_lists_in_step(pool).await;
    let sql = r#"
        WITH runs AS (
            SELECT job_key, period_start, period_end,
                   (period_start AT TIME ZONE timezone)::date AS business_date,
                   (regexp_match(scope, '([0-9]+)$'))[1]::bigint AS merchant_id
            FROM batch_job_run
            WHERE job_name = 'daily-settlement' AND period_start IS NOT NULL
              AND partition_of IS NULL
        ),
        -- Each order with the run it belongs to: its period's run, or for
        -- scoped runs the run of its period whose scope names its merchant.
        scope AS (
            SELECT o.order_id, o.merchant_id, o.amount_minor, r.job_key, r.business_date
            FROM orders o JOIN runs r
              ON o.paid_at >= r.period_start AND o.paid_at < r.period_end
             AND (r.merchant_id IS NULL OR r.merchant_id = o.merchant_id)
        ),
        items AS (
            SELECT i.*, pg_xact_commit_timestamp(i.xmin) AS committed_at
            FROM settlement_item i
        )
        SELECT
          (SELECT count(DISTINCT order_id) FROM scope),
          (SELECT count(*) FROM items),
          (SELECT count(*) FROM scope s
            WHERE NOT EXISTS (SELECT 1 FROM items i WHERE i.order_id = s.order_id)),
          (SELECT count(*) FROM (SELECT order_id FROM items GROUP BY order_id
             HAVING count(*) > 1) d),
          (SELECT count(*) FROM items i
            WHERE NOT EXISTS (
              SELECT 1 FROM scope s WHERE s.order_id = i.order_id
                AND s.business_date = i.business_date
                AND (s.job_key = i.job_key
                     -- Or the partition of that run the order belongs to.
                     OR EXISTS (SELECT 1 FROM batch_job_run p
                       WHERE p.job_key = i.job_key AND p.partition_of = s.job_key
                         AND batchonce_partition(i.order_id::text, p.partition_count) = p.partition_no)))),
          (SELECT count(*) FROM items i
            WHERE NOT EXISTS (SELECT 1 FROM batch_job_attempt a
              WHERE a.job_key = i.job_key AND a.attempt = i.attempt)),
          (SELECT count(*) FROM items i JOIN batch_job_attempt a
             ON a.job_key = i.job_key AND a.attempt = i.attempt
            WHERE OUTSIDE_ATTEMPT),
          (SELECT count(*) FROM (
             SELECT business_date, merchant_id, count(*) AS n, sum(amount_minor) AS total
             FROM scope GROUP BY 1, 2
           ) want FULL JOIN settlement_summary got USING (business_date, merchant_id)
            WHERE want.n IS DISTINCT FROM got.order_count
               OR want.total IS DISTINCT FROM got.total_minor::numeric),
          (SELECT count(*) FROM batch_job_run
            WHERE job_name = 'daily-settlement' AND period_start IS NULL)
        "#
    .replace("OUTSIDE_ATTEMPT", OUTSIDE_ATTEMPT);
    let row: (i64, i64, i64, i64, i64, i64, i64, i64, i64) =
        sqlx::query_as(&sql).fetch_one(pool).await.unwrap();
    Settled {
        orders: row.0,
        items: row.1,
        lost: row.2,
        twice: row.3,
        wrong_run: row.4,
        foreign_token: row.5,
        outside_lease: row.6,
        wrong_summaries: row.7,
        runs_without_period: row.8,
    }
}
