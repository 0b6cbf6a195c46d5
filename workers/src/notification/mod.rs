//! `notification-send`: sends the notifications requested for one business
//! date (`notification_request`), each exactly once per (date, campaign,
//! customer, channel). [`NotificationSend`] is the kind; its defaults
//! (`chunk_size = 100`, `max_item_failures = 100`, no schedule) and its own
//! keys, checked at load time by `check_options`, are described in
//! `docs/configuration.md`.
//!
//! The protocol, per attempt:
//! 1. Claim: fenced inserts of one `notification_delivery` row per request
//!    (`pending`, with an idempotency key derived from its unique key);
//!    duplicates of an existing delivery are no-ops (`claim_deliveries`).
//! 2. Send: every `pending` delivery goes to the [`Sender`] with its key, then
//!    a fenced update marks the chunk `sent` (with the provider's message id)
//!    or `failed` (rejected, e.g. a bad address). A transient error leaves the
//!    delivery `pending` for the next attempt. A crash between a send and its
//!    mark resends with the same key, which the provider deduplicates: a
//!    delivery is never sent under a second key (`send_pending`, `mark`).
//! 3. Rejections count in the run's `failed_count`; more than
//!    `max_item_failures` for the date fails the run, any delivery still
//!    pending makes the attempt retryable (`judge`), and a date without
//!    requests is SKIPPED.
//!
//! There is no default sender: without `sender`, or with a
//! `webhook_token_env` naming an unset variable, the run fails with
//! `JobError::Fatal`. The `JobDemo` seeds `DEMO_REQUESTS_PER_DAY` customers
//! a day (one requested twice, two undeliverable addresses) and verifies the
//! deliveries against the requests and, through [`outbox_report`], the outbox
//! folder: every sent delivery delivered, and no (campaign, customer,
//! channel) sent under a second key.

pub mod sender;
pub mod webhook;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use batchonce::config::{KindOptions, OptionError};
use batchonce::queue::Step;
use batchonce::{Job, JobConfig, JobContext, JobDemo, JobError, JobName, Outcome, Verification};
use chrono::NaiveDate;
use sqlx::migrate::Migrator;
use sqlx::{PgPool, Row};

pub use sender::{Message, OutboxSender, Receipt, SendError, Sender};
pub use webhook::{Secret, WebhookConfig, WebhookSender};

/// The job kind's tables: `notification_request` (source) and `notification_delivery`.
pub static MIGRATIONS: Migrator = sqlx::migrate!("./migrations/notification");

pub const NAME: &str = "notification-send";

/// The kind's own configuration keys.
const OPTION_KEYS: &[&str] = &[
    "sender",
    "outbox_dir",
    "webhook_url",
    "webhook_timeout",
    "webhook_retries",
    "webhook_token_env",
    "webhook_allow_http",
    "send_concurrency",
];

/// Provider calls in flight per run when `send_concurrency` is not set.
pub const DEFAULT_SEND_CONCURRENCY: usize = 8;
/// The most `send_concurrency` may ask for.
pub const MAX_SEND_CONCURRENCY: i64 = 256;

#[derive(Debug, Clone, Default)]
pub struct NotificationSend {
    /// Overrides the configured sender (tests, embedding applications).
    sender: Option<Arc<dyn Sender>>,
}

impl NotificationSend {
    /// Sends through the sender named in the job's configuration.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends through `sender` whatever the configuration says.
    pub fn with_sender(sender: Arc<dyn Sender>) -> Self {
        Self {
            sender: Some(sender),
        }
    }

    fn sender(&self, options: &KindOptions) -> Result<Arc<dyn Sender>, JobError> {
        if let Some(s) = &self.sender {
            return Ok(s.clone());
        }
        build_sender(options).map_err(JobError::Fatal)
    }
}

/// The sender the options describe (checked at load by [`check_options`]),
/// made when a run starts.
pub fn build_sender(options: &KindOptions) -> Result<Arc<dyn Sender>, String> {
    match options.str("sender") {
        Some("outbox") => Ok(Arc::new(OutboxSender::new(
            options.str("outbox_dir").unwrap_or(".batchonce/outbox"),
        ))),
        Some("webhook") => {
            let url = options
                .str("webhook_url")
                .ok_or("sender = \"webhook\" needs webhook_url")?;
            let mut config = WebhookConfig::new(url);
            if let Some(timeout) = options.duration("webhook_timeout") {
                config.timeout = timeout;
            }
            if let Some(retries) = options.int("webhook_retries") {
                config.retries = retries as u32;
            }
            config.allow_http = options
                .values
                .get("webhook_allow_http")
                .and_then(toml::Value::as_bool)
                .unwrap_or(false);
            config.bearer = match options.str("webhook_token_env") {
                Some(var) => Some(Secret::new(std::env::var(var).map_err(|_| {
                    format!("webhook_token_env names {var}, which is not set in the worker's environment")
                })?)),
                None => None,
            };
            Ok(Arc::new(WebhookSender::new(config)?))
        }
        Some(other) => Err(format!(
            "unknown sender {other:?} (expected \"outbox\" or \"webhook\")"
        )),
        None => Err(format!(
            "no sender configured: set sender = \"webhook\" (with webhook_url) or \"outbox\" in [jobs.{NAME}]"
        )),
    }
}

/// Load-time check of the kind's keys: one error naming the key. The keys
/// are `sender`, `outbox_dir`, `webhook_url`, `webhook_timeout` (at most
/// 5 m), `webhook_retries` (0–10), `webhook_token_env`,
/// `webhook_allow_http` and `send_concurrency` (1–256, default 8); a webhook
/// URL must pass `webhook::check_transport`.
fn check_options(values: &toml::Table) -> Result<(), OptionError> {
    let string = |k: &str| -> Result<Option<&str>, OptionError> {
        match values.get(k) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| {
                OptionError::new(k, format!("expected a string, found {}", v.type_str()))
            }),
        }
    };
    let sender = string("sender")?;
    match sender {
        None | Some("outbox") | Some("webhook") => {}
        Some(other) => {
            return Err(OptionError::new(
                "sender",
                format!("unknown sender {other:?} (expected \"outbox\" or \"webhook\")"),
            ))
        }
    }
    if let Some(dir) = string("outbox_dir")? {
        if dir.is_empty() || dir.contains('\0') {
            return Err(OptionError::new("outbox_dir", "must be a non-empty path"));
        }
    }
    let allow_http = match values.get("webhook_allow_http") {
        None => false,
        Some(v) => v.as_bool().ok_or_else(|| {
            OptionError::new(
                "webhook_allow_http",
                format!("expected true or false, found {}", v.type_str()),
            )
        })?,
    };
    match (sender, string("webhook_url")?) {
        (Some("webhook"), None) => {
            return Err(OptionError::new(
                "webhook_url",
                "is required with sender = \"webhook\"",
            ))
        }
        (_, Some(url)) => {
            let u =
                webhook::parse_webhook_url(url).map_err(|m| OptionError::new("webhook_url", m))?;
            let with_token = values.contains_key("webhook_token_env");
            webhook::check_transport(&u, allow_http, with_token)
                .map_err(|m| OptionError::new("webhook_url", m))?;
        }
        _ => {}
    }
    if let Some(t) = string("webhook_timeout")? {
        let d = batchonce::config::parse_duration(t)
            .map_err(|m| OptionError::new("webhook_timeout", m))?;
        if d > Duration::from_secs(300) {
            return Err(OptionError::new("webhook_timeout", "must be at most 5m"));
        }
    }
    if let Some(v) = values.get("webhook_retries") {
        match v.as_integer() {
            Some(n) if (0..=10).contains(&n) => {}
            Some(n) => {
                return Err(OptionError::new(
                    "webhook_retries",
                    format!("{n} is out of range 0..=10"),
                ))
            }
            None => {
                return Err(OptionError::new(
                    "webhook_retries",
                    format!("expected an integer, found {}", v.type_str()),
                ))
            }
        }
    }
    if let Some(v) = values.get("send_concurrency") {
        match v.as_integer() {
            Some(n) if (1..=MAX_SEND_CONCURRENCY).contains(&n) => {}
            Some(n) => {
                return Err(OptionError::new(
                    "send_concurrency",
                    format!("{n} is out of range 1..={MAX_SEND_CONCURRENCY}"),
                ))
            }
            None => {
                return Err(OptionError::new(
                    "send_concurrency",
                    format!("expected an integer, found {}", v.type_str()),
                ))
            }
        }
    }
    if let Some(var) = string("webhook_token_env")? {
        let name_ok = var.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !name_ok {
            return Err(OptionError::new(
                "webhook_token_env",
                "must be an environment variable name",
            ));
        }
    }
    Ok(())
}

/// The idempotency key of a delivery, from its unique key: the same message
/// gets the same key in every attempt of every run, and the key is a plain
/// token safe in headers and file names.
const IDEMPOTENCY_KEY_SQL: &str = "'bo-' || to_char(business_date, 'YYYYMMDD') || '-' || \
     encode(sha256(convert_to(campaign || chr(31) || customer_id::text || chr(31) || channel, 'UTF8')), 'hex')";

#[async_trait]
impl Job for NotificationSend {
    fn name(&self) -> JobName {
        // Invariant: NAME is a valid job name (checked by a unit test).
        JobName::parse(NAME).expect("valid job name")
    }

    fn default_config(&self) -> JobConfig {
        JobConfig {
            chunk_size: 100,
            // A few bad addresses are normal; many mean broken source data.
            max_item_failures: Some(100),
            options: KindOptions {
                keys: OPTION_KEYS,
                check: Some(check_options),
                values: toml::Table::new(),
            },
            partitionable: true,
            ..JobConfig::default()
        }
    }

    fn migrations(&self) -> Option<&'static Migrator> {
        Some(&MIGRATIONS)
    }

    fn output_tables(&self) -> &'static [&'static str] {
        &["notification_delivery"]
    }

    fn demo(&self) -> Option<&dyn JobDemo> {
        Some(self)
    }

    async fn run(&self, ctx: &JobContext) -> Result<Outcome, JobError> {
        // A partition claims and sends its own deliveries (the idempotency
        // key decides which are its own); the final step judges the date's
        // rejections once, after all of them.
        let part = match ctx.step {
            Step::Whole => None,
            Step::Partition { no, count } => Some((i32::from(no), i32::from(count))),
            Step::Final { .. } => return judge(ctx, None).await,
        };
        let sender = self.sender(&ctx.config.options)?;
        let requests = claim_deliveries(ctx, part).await?;
        if requests == 0 && part.is_some() {
            return Ok(Outcome::Succeeded);
        }
        if requests == 0 {
            return Ok(Outcome::Skipped(format!(
                "no notification requests for {}",
                ctx.business_date
            )));
        }
        let transient = send_pending(ctx, sender.as_ref(), part).await?;
        if part.is_some() {
            return match transient {
                Some((n, last)) => Err(JobError::Retryable(format!(
                    "{n} deliveries could not be sent yet and stay pending (last error: {last})"
                ))),
                None => Ok(Outcome::Succeeded),
            };
        }
        judge(ctx, transient).await
    }
}

/// A date's verdict: more rejections than `max_item_failures` is fatal,
/// deliveries still pending after transient errors are retried, and
/// otherwise the run succeeded (the final step of a partitioned run with no
/// requests at all is skipped).
async fn judge(ctx: &JobContext, transient: Option<(u64, String)>) -> Result<Outcome, JobError> {
    let mut stmt = batchonce::db::statement(ctx.pool()).await?;
    let (failed, total): (i64, i64) = batchonce::db::query_as(
        "SELECT count(*) FILTER (WHERE state = 'failed'), count(*) \
         FROM notification_delivery WHERE business_date = $1",
    )
    .bind(ctx.business_date)
    .fetch_one(stmt.conn())
    .await?;
    stmt.done().await?;
    if let Some(max) = ctx.config.max_item_failures {
        if failed as u64 > max {
            return Err(JobError::Fatal(format!(
                "{failed} of {total} deliveries for {} were rejected, more than max_item_failures = {max}; \
                 see notification_delivery.last_error, correct the requests, then `batchonce runs rerun` \
                 (a corrected request is sent again)",
                ctx.business_date
            )));
        }
    }
    if let Some((n, last)) = transient {
        return Err(JobError::Retryable(format!(
            "{n} deliveries could not be sent yet and stay pending (last error: {last})"
        )));
    }
    if total == 0 {
        return Ok(Outcome::Skipped(format!(
            "no notification requests for {}",
            ctx.business_date
        )));
    }
    Ok(Outcome::Succeeded)
}

/// Step 1: one pending delivery per request of the date, chunk by chunk,
/// `ON CONFLICT ON CONSTRAINT notification_delivery_key DO NOTHING`, with
/// the idempotency key computed in SQL ([`IDEMPOTENCY_KEY_SQL`]: `bo-YYYYMMDD-`
/// and the SHA-256 of campaign, customer id and channel). Returns how many
/// requests the date has.
async fn claim_deliveries(ctx: &JobContext, part: Option<(i32, i32)>) -> Result<i64, JobError> {
    let (no, count) = part.unwrap_or((0, 0));
    let chunk = i64::from(ctx.config.chunk_size);
    let mut after = i64::MIN;
    let mut requests = 0;
    loop {
        if ctx.is_cancelled() {
            return Err(JobError::Cancelled);
        }
        let mut tx = ctx.fenced().await?;
        let row = batchonce::db::query(&format!(
            r#"
            WITH chunk AS (
                SELECT request_id, business_date, campaign, customer_id, channel, address, body
                FROM notification_request
                WHERE business_date = $1 AND request_id > $2
                  AND ($6 = 0 OR batchonce_partition({IDEMPOTENCY_KEY_SQL}, $6) = $7)
                ORDER BY request_id
                LIMIT $3
            ), latest AS (
                -- One row per delivery key (the latest request wins), since
                -- one statement cannot update a row twice.
                SELECT DISTINCT ON (campaign, customer_id, channel) *
                FROM chunk
                ORDER BY campaign, customer_id, channel, request_id DESC
            ), ins AS (
                INSERT INTO notification_delivery AS d
                    (business_date, campaign, customer_id, channel, address, body, request_id,
                     idempotency_key, job_key, attempt)
                SELECT business_date, campaign, customer_id, channel, address, body, request_id,
                       {IDEMPOTENCY_KEY_SQL}, $4, $5
                FROM latest
                ON CONFLICT ON CONSTRAINT notification_delivery_key DO UPDATE
                -- A rejected delivery whose request was corrected (a fixed
                -- address) goes out again, under the same key: it was never
                -- delivered. Sent and pending deliveries are never touched.
                SET address = EXCLUDED.address,
                    body = EXCLUDED.body,
                    request_id = EXCLUDED.request_id,
                    state = 'pending',
                    job_key = EXCLUDED.job_key,
                    attempt = EXCLUDED.attempt,
                    updated_at = now()
                WHERE d.state = 'failed'
                  AND (d.address, d.body) IS DISTINCT FROM (EXCLUDED.address, EXCLUDED.body)
                RETURNING 1
            )
            SELECT (SELECT max(request_id) FROM chunk) AS last_id,
                   (SELECT count(*) FROM chunk) AS scanned
            "#
        ))
        .bind(ctx.business_date)
        .bind(after)
        .bind(chunk)
        .bind(ctx.key.as_str())
        .bind(ctx.attempt)
        .bind(count)
        .bind(no)
        .fetch_one(tx.conn())
        .await?;
        let last_id: Option<i64> = row.try_get("last_id")?;
        let scanned: i64 = row.try_get("scanned")?;
        ctx.commit(tx).await?;
        requests += scanned;
        match last_id {
            Some(id) if scanned == chunk => after = id,
            _ => return Ok(requests),
        }
    }
}

/// What a send ended as, for the mark statement.
struct Sent {
    delivery_id: i64,
    state: &'static str,
    /// The provider answered with an earlier send of the same key.
    replayed: bool,
    message_id: Option<String>,
    error: Option<String>,
}

/// One pending delivery, read for sending.
struct Pending {
    delivery_id: i64,
    key: String,
    campaign: String,
    customer_id: i64,
    channel: String,
    address: String,
    body: String,
}

/// Step 2: send every pending delivery of the date and mark it, a chunk at
/// a time, with at most `send_concurrency` provider calls in flight. Each
/// chunk is marked in one fenced transaction once all its sends have
/// answered, so a crash mid-chunk resends only unmarked deliveries, under
/// the same keys. Returns the number of transient failures and the last of
/// their errors, if any. Sends run through `JobContext::concurrently`, in
/// delivery order; on cancellation no new send starts and those in flight
/// are marked.
async fn send_pending(
    ctx: &JobContext,
    sender: &dyn Sender,
    part: Option<(i32, i32)>,
) -> Result<Option<(u64, String)>, JobError> {
    let (no, count) = part.unwrap_or((0, 0));
    let chunk = i64::from(ctx.config.chunk_size);
    let limit = ctx
        .config
        .options
        .int("send_concurrency")
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(DEFAULT_SEND_CONCURRENCY)
        .max(1);
    let mut after = i64::MIN;
    let mut transient: Option<(u64, String)> = None;
    let mut first = true;
    loop {
        if !first {
            ctx.pause(ctx.config.chunk_pause).await?;
        }
        first = false;
        if ctx.is_cancelled() {
            return Err(JobError::Cancelled);
        }
        let mut stmt = batchonce::db::statement(ctx.pool()).await?;
        let rows = batchonce::db::query(
            "SELECT delivery_id, idempotency_key, campaign, customer_id, channel, address, body \
             FROM notification_delivery \
             WHERE business_date = $1 AND state = 'pending' AND delivery_id > $2 \
               AND ($4 = 0 OR batchonce_partition(idempotency_key, $4) = $5) \
             ORDER BY delivery_id LIMIT $3",
        )
        .bind(ctx.business_date)
        .bind(after)
        .bind(chunk)
        .bind(count)
        .bind(no)
        .fetch_all(stmt.conn())
        .await?;
        stmt.done().await?;
        if rows.is_empty() {
            return Ok(transient);
        }
        let pending = rows
            .iter()
            .map(|row| {
                Ok(Pending {
                    delivery_id: row.try_get("delivery_id")?,
                    key: row.try_get("idempotency_key")?,
                    campaign: row.try_get("campaign")?,
                    customer_id: row.try_get("customer_id")?,
                    channel: row.try_get("channel")?,
                    address: row.try_get("address")?,
                    body: row.try_get("body")?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        // In delivery order; a new send starts only while fewer than
        // `limit` are in flight and the attempt is not cancelled. On
        // shutdown or lease loss no new send starts; those in flight finish
        // (bounded by the sender's timeout) and are marked below, or resent
        // with the same key by the next holder.
        let results = ctx
            .concurrently(&pending, limit, |p| send_one(ctx, sender, p))
            .await;
        for r in results.iter().filter(|r| r.state == "pending") {
            let n = transient.as_ref().map_or(0, |(n, _)| *n);
            transient = Some((n + 1, r.error.clone().unwrap_or_default()));
        }
        if let Some(last) = results.last() {
            after = last.delivery_id;
            mark(ctx, &results).await?;
        }
        if results.len() < pending.len() {
            return Err(JobError::Cancelled);
        }
    }
}

/// Sends one delivery with its idempotency key; what it ended as.
async fn send_one(ctx: &JobContext, sender: &dyn Sender, p: &Pending) -> Sent {
    let m = Message {
        idempotency_key: &p.key,
        business_date: ctx.business_date,
        campaign: &p.campaign,
        customer_id: p.customer_id,
        channel: &p.channel,
        address: &p.address,
        body: &p.body,
    };
    match sender.send(&m).await {
        Ok(r) => Sent {
            delivery_id: p.delivery_id,
            state: "sent",
            replayed: r.duplicate,
            message_id: Some(stored_message_id(ctx, &r.provider_message_id, &p.key)),
            error: None,
        },
        Err(SendError::Rejected(e)) => Sent {
            delivery_id: p.delivery_id,
            state: "failed",
            replayed: false,
            message_id: None,
            error: Some(batchonce::text::truncate(&e)),
        },
        Err(SendError::Transient(e)) => Sent {
            delivery_id: p.delivery_id,
            state: "pending",
            replayed: false,
            message_id: None,
            error: Some(batchonce::text::truncate(&e)),
        },
    }
}

/// The id to store for a sent message: whatever the sender (an embedding
/// application's own included), only a checked one. An id that is not is
/// replaced by the delivery's idempotency key (a sent delivery must name an
/// id), never cut or escaped, and never logged (its length only).
fn stored_message_id(ctx: &JobContext, id: &str, key: &str) -> String {
    match sender::checked_message_id(id) {
        Some(id) => id.to_owned(),
        None => {
            tracing::warn!(job_key = %ctx.key, id_bytes = id.len(),
                "the sender answered a message id that is not 1-256 printable ASCII characters; \
                 stored the idempotency key instead");
            key.to_owned()
        }
    }
}

/// Marks one chunk's sends in one fenced `UPDATE … WHERE state =
/// 'pending'`: `sent` with the provider's message id if
/// `sender::checked_message_id` accepts it (1–256 printable ASCII
/// characters, else [`stored_message_id`]), `failed` for a rejection
/// (counted as failed items), or still `pending` with the error for a
/// transient failure.
async fn mark(ctx: &JobContext, results: &[Sent]) -> Result<(), JobError> {
    let ids: Vec<i64> = results.iter().map(|r| r.delivery_id).collect();
    let states: Vec<&str> = results.iter().map(|r| r.state).collect();
    let message_ids: Vec<Option<String>> = results.iter().map(|r| r.message_id.clone()).collect();
    let errors: Vec<Option<String>> = results.iter().map(|r| r.error.clone()).collect();
    let mut tx = ctx.fenced().await?;
    let marked: Vec<String> = batchonce::db::query_scalar(
        r#"
        UPDATE notification_delivery d
        SET state = u.state,
            provider_message_id = COALESCE(u.message_id, d.provider_message_id),
            last_error = u.error,
            attempts = d.attempts + 1,
            sent_at = CASE WHEN u.state = 'sent' THEN now() ELSE d.sent_at END,
            job_key = $5,
            attempt = $6,
            updated_at = now()
        FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[]) AS u(id, state, message_id, error)
        WHERE d.delivery_id = u.id AND d.state = 'pending'
        RETURNING u.state
        "#,
    )
    .bind(&ids)
    .bind(&states)
    .bind(&message_ids)
    .bind(&errors)
    .bind(ctx.key.as_str())
    .bind(ctx.attempt)
    .fetch_all(tx.conn())
    .await?;
    let replayed = results
        .iter()
        .filter(|r| r.state == "sent" && r.replayed)
        .count();
    if replayed > 0 {
        // Sent before a crash or a lost lease, and recognised by its key.
        tracing::info!(job_key = %ctx.key, replayed, "the provider already had these keys: nothing sent twice");
    }
    let sent = marked.iter().filter(|s| *s == "sent").count() as i64;
    let failed = marked.iter().filter(|s| *s == "failed").count() as i64;
    tx.add_progress(sent, failed);
    ctx.commit(tx).await?;
    Ok(())
}

/// Demo requests per business date (plus one duplicate request and two bad
/// addresses among them).
const DEMO_REQUESTS_PER_DAY: i64 = 240;

#[async_trait]
impl JobDemo for NotificationSend {
    fn prepare(&self, config: &mut JobConfig, home: &std::path::Path) {
        let dir = home.join("outbox");
        let _ = std::fs::remove_dir_all(&dir);
        config
            .options
            .values
            .insert("sender".into(), toml::Value::String("outbox".into()));
        config.options.values.insert(
            "outbox_dir".into(),
            toml::Value::String(dir.display().to_string()),
        );
    }

    async fn seed(
        &self,
        pool: &PgPool,
        _config: &JobConfig,
        dates: &[NaiveDate],
    ) -> Result<String, sqlx::Error> {
        for d in dates {
            batchonce::db::query(
                r#"
                INSERT INTO notification_request (business_date, campaign, customer_id, channel, address, body)
                SELECT $1, 'daily-digest', g,
                       CASE WHEN g % 4 = 0 THEN 'sms' ELSE 'email' END,
                       CASE WHEN g IN (17, 171) THEN 'no-address-on-file'
                            WHEN g % 4 = 0 THEN '+8210' || lpad(g::text, 8, '0')
                            ELSE 'customer' || g || '@example.com' END,
                       'Your digest for ' || $1::text
                FROM generate_series(1, $2) g
                "#,
            )
            .bind(d)
            .bind(DEMO_REQUESTS_PER_DAY)
            .execute(pool)
            .await?;
            // The same notification requested twice: it must go out once.
            batchonce::db::query(
                "INSERT INTO notification_request (business_date, campaign, customer_id, channel, address, body) \
                 SELECT business_date, campaign, customer_id, channel, address, body \
                 FROM notification_request WHERE business_date = $1 AND customer_id = 5",
            )
            .bind(d)
            .execute(pool)
            .await?;
        }
        Ok(format!(
            "{} requests over {} business days ({DEMO_REQUESTS_PER_DAY} customers a day, one requested twice, two bad addresses), outbox sender",
            (DEMO_REQUESTS_PER_DAY + 1) * dates.len() as i64,
            dates.len()
        ))
    }

    async fn verify(
        &self,
        pool: &PgPool,
        config: &JobConfig,
        _key: &batchonce::JobKey,
        date: NaiveDate,
    ) -> Result<Verification, sqlx::Error> {
        let outbox = config
            .options
            .str("outbox_dir")
            .map(std::path::PathBuf::from);
        verify(pool, date, outbox.as_deref()).await
    }
}

/// Compares a date's deliveries with its requests and, given an outbox
/// folder, with what was actually delivered there.
pub async fn verify(
    pool: &PgPool,
    date: NaiveDate,
    outbox: Option<&std::path::Path>,
) -> Result<Verification, sqlx::Error> {
    let row = batchonce::db::query(
        r#"
        SELECT
          (SELECT count(*) FROM (SELECT DISTINCT campaign, customer_id, channel
             FROM notification_request WHERE business_date = $1) r) AS wanted,
          (SELECT count(*) FROM notification_delivery WHERE business_date = $1) AS deliveries,
          (SELECT count(*) FROM notification_delivery WHERE business_date = $1 AND state = 'sent') AS sent,
          (SELECT count(*) FROM notification_delivery WHERE business_date = $1 AND state = 'failed') AS failed,
          (SELECT count(*) FROM notification_delivery WHERE business_date = $1 AND state = 'pending') AS pending,
          (SELECT array_agg(idempotency_key) FROM notification_delivery
            WHERE business_date = $1 AND state = 'sent') AS sent_keys
        "#,
    )
    .bind(date)
    .fetch_one(pool)
    .await?;
    let get = |c: &str| row.try_get::<i64, _>(c);
    let (wanted, deliveries, sent, failed, pending) = (
        get("wanted")?,
        get("deliveries")?,
        get("sent")?,
        get("failed")?,
        get("pending")?,
    );
    let sent_keys: Vec<String> = row
        .try_get::<Option<Vec<String>>, _>("sent_keys")?
        .unwrap_or_default();
    let mut ok = wanted == deliveries && pending == 0 && sent + failed == deliveries;
    let mut detail = format!("{sent} sent, {failed} rejected of {wanted} requested");
    let mut duplicates = 0;
    if let Some(dir) = outbox {
        let report = outbox_report(dir, date, &sent_keys);
        duplicates = report.second_keys;
        ok &= report.missing == 0 && report.second_keys == 0;
        detail.push_str(&format!(
            "; outbox: {} delivered, {} missing, {} customers sent under a second key",
            report.delivered, report.missing, report.second_keys
        ));
    }
    Ok(Verification {
        items: deliveries,
        duplicates,
        detail,
        ok,
    })
}

/// What an outbox folder says about one date's sends.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OutboxReport {
    /// Messages delivered for the date (one file each).
    pub delivered: i64,
    /// Deliveries marked sent with no file in the outbox.
    pub missing: i64,
    /// (campaign, customer, channel) sent under more than one key: must be 0.
    pub second_keys: i64,
    /// Send calls, duplicates included.
    pub calls: i64,
}

/// Reads `calls.log` and `sent/` of an outbox folder for one date.
pub fn outbox_report(dir: &std::path::Path, date: NaiveDate, sent_keys: &[String]) -> OutboxReport {
    use std::collections::{BTreeMap, BTreeSet};
    let mut report = OutboxReport::default();
    let mut keys_per_target: BTreeMap<(String, i64, String), BTreeSet<String>> = BTreeMap::new();
    let log = std::fs::read_to_string(dir.join("calls.log")).unwrap_or_default();
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["business_date"].as_str() != Some(&date.to_string()) {
            continue;
        }
        report.calls += 1;
        let target = (
            v["campaign"].as_str().unwrap_or_default().to_owned(),
            v["customer_id"].as_i64().unwrap_or_default(),
            v["channel"].as_str().unwrap_or_default().to_owned(),
        );
        keys_per_target
            .entry(target)
            .or_default()
            .insert(v["idempotency_key"].as_str().unwrap_or_default().to_owned());
    }
    report.second_keys = keys_per_target.values().filter(|k| k.len() > 1).count() as i64;
    let prefix = format!("bo-{}-", date.format("%Y%m%d"));
    if let Ok(entries) = std::fs::read_dir(dir.join("sent")) {
        report.delivered = entries
            .filter_map(Result::ok)
            .filter(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                n.starts_with(&prefix) && n.ends_with(".json")
            })
            .count() as i64;
    }
    report.missing = sent_keys
        .iter()
        .filter(|k| !dir.join("sent").join(format!("{k}.json")).exists())
        .count() as i64;
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_and_defaults_are_valid() {
        let job = NotificationSend::new();
        assert_eq!(job.name().as_str(), NAME);
        assert_eq!(job.default_config().max_item_failures, Some(100));
    }

    fn check(text: &str) -> Result<(), OptionError> {
        check_options(&text.parse::<toml::Table>().unwrap())
    }

    #[test]
    fn options_are_checked() {
        assert!(check("sender = \"outbox\"\noutbox_dir = \"/tmp/x\"").is_ok());
        assert!(check("sender = \"webhook\"\nwebhook_url = \"https://h.example/n\"\nwebhook_timeout = \"5s\"\nwebhook_retries = 2").is_ok());
        assert_eq!(check("sender = \"pigeon\"").unwrap_err().key, "sender");
        assert_eq!(
            check("sender = \"webhook\"").unwrap_err().key,
            "webhook_url"
        );
        assert_eq!(
            check("sender = \"webhook\"\nwebhook_url = \"ftp://x\"")
                .unwrap_err()
                .key,
            "webhook_url"
        );
        assert_eq!(
            check("webhook_timeout = \"1h\"").unwrap_err().key,
            "webhook_timeout"
        );
        assert_eq!(
            check("webhook_retries = 99").unwrap_err().key,
            "webhook_retries"
        );
        assert_eq!(
            check("webhook_token_env = \"A B\"").unwrap_err().key,
            "webhook_token_env"
        );
        assert_eq!(
            check("webhook_token_env = \"0s\"").unwrap_err().key,
            "webhook_token_env"
        );
        assert_eq!(check("sender = 3").unwrap_err().key, "sender");
        // Plain http only when allowed, and a token only to loopback.
        let http = "sender = \"webhook\"\nwebhook_url = \"http://notify.internal/n\"\n";
        let e = check(http).unwrap_err();
        assert_eq!(e.key, "webhook_url");
        assert!(e.message.contains("webhook_allow_http"), "{}", e.message);
        assert!(check(&format!("{http}webhook_allow_http = true")).is_ok());
        let e = check(&format!(
            "{http}webhook_allow_http = true\nwebhook_token_env = \"T\""
        ))
        .unwrap_err();
        assert_eq!(e.key, "webhook_url");
        assert!(e.message.contains("bearer token in clear"), "{}", e.message);
        assert!(check(
            "webhook_url = \"http://127.0.0.1:8080/n\"\nwebhook_allow_http = true\nwebhook_token_env = \"T\""
        )
        .is_ok());
        assert_eq!(
            check("webhook_allow_http = \"yes\"").unwrap_err().key,
            "webhook_allow_http"
        );
        assert!(build_sender(&KindOptions::default())
            .unwrap_err()
            .contains("no sender configured"));
    }
}
