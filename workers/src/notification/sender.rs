//! Senders: where notification-send hands a message. Every send carries the
//! delivery's idempotency key, and a sender must treat a second send with
//! the same key as the same message (deliver nothing new, answer with the
//! first message id). That is what makes a crash between "sent" and "marked
//! sent" harmless: the retry sends again with the same key.
//!
//! Bundled: [`OutboxSender`], files in a folder (demo, tests, and a spool
//! another process ships), and [`super::webhook::WebhookSender`], an HTTP
//! POST with the key in the `Idempotency-Key` header, a timeout and retries.
//! Whatever the sender, the message id it answers is stored only if
//! [`checked_message_id`] accepts it.
//!
//! the `Sender` trait (`send(&Message) -> Result<Receipt, SendError>`), whose contract is that a
//! second send with the same idempotency key is the same message: nothing new is delivered and the
//! first message id comes back. `SendError::Rejected` will never succeed (the delivery is marked
//! failed), `SendError::Transient` may (it stays pending). `OutboxSender` checks the address for
//! its channel (`validate_address`), writes `<dir>/sent/<key>.json` by hard-linking a temporary
//! file (created `create_new` with mode `0600`, so the linked inode is never readable by others),
//! which fails if the file exists, so two processes sending one key deliver it once, and appends
//! every call to `<dir>/calls.log` (also `0600`). The folders it creates are `0700` (`private_dir`,
//! a recursive `DirBuilder`); existing ones keep their mode. `checked_message_id` is the rule for a
//! stored provider id.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use chrono::NaiveDate;
use serde::Serialize;

/// One message to send.
#[derive(Debug, Clone, Serialize)]
pub struct Message<'a> {
    pub idempotency_key: &'a str,
    pub business_date: NaiveDate,
    pub campaign: &'a str,
    pub customer_id: i64,
    pub channel: &'a str,
    pub address: &'a str,
    pub body: &'a str,
}

/// What the provider answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    pub provider_message_id: String,
    /// The provider had this key already and sent nothing new.
    pub duplicate: bool,
}

/// Why a send did not happen.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SendError {
    /// The message cannot be delivered, ever (a bad address): the delivery
    /// is marked failed and counts against `max_item_failures`.
    #[error("rejected: {0}")]
    Rejected(String),
    /// Worth trying again later (timeout, 5xx, connection refused): the
    /// delivery stays pending for the next attempt.
    #[error("{0}")]
    Transient(String),
}

/// A notification provider.
#[async_trait]
pub trait Sender: Send + Sync + std::fmt::Debug {
    async fn send(&self, message: &Message<'_>) -> Result<Receipt, SendError>;
}

/// Longest provider message id stored, in bytes.
pub const MAX_MESSAGE_ID_BYTES: usize = 256;

/// A provider's message id as it may be stored
/// (`notification_delivery.provider_message_id`) and later printed: 1 to
/// [`MAX_MESSAGE_ID_BYTES`] printable ASCII characters without spaces, the
/// shape of every provider's ids. Anything else (a megabyte, an escape
/// sequence meant for an operator's terminal) is not an id: `None`.
pub fn checked_message_id(id: &str) -> Option<&str> {
    let ok = !id.is_empty()
        && id.len() <= MAX_MESSAGE_ID_BYTES
        && id.bytes().all(|b| b.is_ascii_graphic());
    ok.then_some(id)
}

/// Checks an address for its channel, as a provider would before accepting.
pub fn validate_address(channel: &str, address: &str) -> Result<(), String> {
    let ok = match channel {
        "email" => {
            let mut parts = address.split('@');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(local), Some(domain), None) => {
                    !local.is_empty()
                        && domain.contains('.')
                        && !domain.starts_with('.')
                        && !domain.ends_with('.')
                        && !address.chars().any(|c| c.is_whitespace() || c.is_control())
                }
                _ => false,
            }
        }
        "sms" => {
            let digits = address.strip_prefix('+').unwrap_or("");
            (8..=15).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit())
        }
        "push" => {
            !address.is_empty()
                && address.len() <= 4096
                && address.bytes().all(|b| b.is_ascii_graphic())
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid {channel} address {:?}",
            batchonce::text::truncate(address)
        ))
    }
}

/// Writes each message once to `<dir>/sent/<idempotency key>.json` and logs
/// every call to `<dir>/calls.log`. The file is created with a hard link,
/// which fails if it exists, so two processes sending the same key deliver it
/// once between them. A message holds a customer's address and body, so
/// every file is created `0600` and every folder this sender creates `0700`
/// (before the umask): only the worker's user reads them. A folder that
/// exists already keeps its mode, since an operator may have shared it on
/// purpose.
#[derive(Debug, Clone)]
pub struct OutboxSender {
    dir: PathBuf,
}

impl OutboxSender {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn deliver(&self, m: &Message<'_>) -> std::io::Result<Receipt> {
        let sent = self.dir.join("sent");
        private_dir(&sent)?;
        // The key is made of [A-Za-z0-9-] (see the delivery table), so it is
        // a safe file name; anything else is refused rather than escaped.
        if m.idempotency_key.is_empty()
            || !m
                .idempotency_key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "idempotency key is not a plain token",
            ));
        }
        let target = sent.join(format!("{}.json", m.idempotency_key));
        if let Some(id) = read_message_id(&target)? {
            return Ok(Receipt {
                provider_message_id: id,
                duplicate: true,
            });
        }
        let id = format!(
            "outbox-{}-{}",
            std::process::id(),
            chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default()
        );
        let record = serde_json::json!({ "message_id": id, "message": m });
        let tmp = sent.join(format!(
            ".{}.{}.tmp",
            m.idempotency_key,
            rand::random::<u64>()
        ));
        {
            // Private from its creation: the link below shares this inode,
            // mode included, so the delivered file is never readable by
            // others, not even for a moment.
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(PRIVATE_FILE)
                .open(&tmp)?;
            f.write_all(record.to_string().as_bytes())?;
            f.sync_all()?;
        }
        let linked = std::fs::hard_link(&tmp, &target);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(Receipt {
                provider_message_id: id,
                duplicate: false,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let id = read_message_id(&target)?.unwrap_or(id);
                Ok(Receipt {
                    provider_message_id: id,
                    duplicate: true,
                })
            }
            Err(e) => Err(e),
        }
    }

    fn log_call(&self, m: &Message<'_>, result: &str) -> std::io::Result<()> {
        private_dir(&self.dir)?;
        let line = serde_json::json!({
            "idempotency_key": m.idempotency_key,
            "business_date": m.business_date,
            "campaign": m.campaign,
            "customer_id": m.customer_id,
            "channel": m.channel,
            "result": result,
            "pid": std::process::id(),
        });
        // One write of one short line with O_APPEND: lines from several
        // processes never interleave.
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(PRIVATE_FILE)
            .open(self.dir.join("calls.log"))?;
        f.write_all(format!("{line}\n").as_bytes())
    }
}

/// The mode of every file the outbox creates.
const PRIVATE_FILE: u32 = 0o600;
/// The mode of every folder the outbox creates.
const PRIVATE_DIR: u32 = 0o700;

/// Creates `dir` and its missing parents with [`PRIVATE_DIR`].
fn private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR)
        .create(dir)
}

fn read_message_id(path: &Path) -> std::io::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["message_id"].as_str().map(str::to_owned))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[async_trait]
impl Sender for OutboxSender {
    async fn send(&self, m: &Message<'_>) -> Result<Receipt, SendError> {
        if let Err(reason) = validate_address(m.channel, m.address) {
            let _ = self.log_call(m, "rejected");
            return Err(SendError::Rejected(reason));
        }
        let this = self.clone();
        let owned = OwnedMessage::from(m);
        let result = tokio::task::spawn_blocking(move || {
            let m = owned.borrow();
            let r = this.deliver(&m);
            let label = match &r {
                Ok(r) if r.duplicate => "duplicate",
                Ok(_) => "delivered",
                Err(_) => "error",
            };
            let _ = this.log_call(&m, label);
            r
        })
        .await
        .map_err(|e| SendError::Transient(format!("outbox task failed: {e}")))?;
        result.map_err(|e| SendError::Transient(format!("outbox {}: {e}", self.dir.display())))
    }
}

/// A message that can cross into a blocking task.
struct OwnedMessage {
    idempotency_key: String,
    business_date: NaiveDate,
    campaign: String,
    customer_id: i64,
    channel: String,
    address: String,
    body: String,
}

impl From<&Message<'_>> for OwnedMessage {
    fn from(m: &Message<'_>) -> Self {
        Self {
            idempotency_key: m.idempotency_key.to_owned(),
            business_date: m.business_date,
            campaign: m.campaign.to_owned(),
            customer_id: m.customer_id,
            channel: m.channel.to_owned(),
            address: m.address.to_owned(),
            body: m.body.to_owned(),
        }
    }
}

impl OwnedMessage {
    fn borrow(&self) -> Message<'_> {
        Message {
            idempotency_key: &self.idempotency_key,
            business_date: self.business_date,
            campaign: &self.campaign,
            customer_id: self.customer_id,
            channel: &self.channel,
            address: &self.address,
            body: &self.body,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_checked_per_channel() {
        assert!(validate_address("email", "kim@example.com").is_ok());
        assert!(validate_address("email", "kim@example").is_err());
        assert!(validate_address("email", "kim example.com").is_err());
        assert!(validate_address("email", "a@b@c.com").is_err());
        assert!(validate_address("email", "kim@exa mple.com").is_err());
        assert!(validate_address("sms", "+821012345678").is_ok());
        assert!(validate_address("sms", "01012345678").is_err());
        assert!(validate_address("sms", "+82-10").is_err());
        assert!(validate_address("push", "tok_123").is_ok());
        assert!(validate_address("push", "").is_err());
        assert!(validate_address("fax", "123").is_err());
    }

    #[test]
    fn message_ids_are_short_printable_tokens() {
        assert_eq!(checked_message_id("msg-42"), Some("msg-42"));
        assert_eq!(
            checked_message_id("<0a1b@mail.example>"),
            Some("<0a1b@mail.example>")
        );
        let longest = "x".repeat(MAX_MESSAGE_ID_BYTES);
        assert_eq!(checked_message_id(&longest), Some(longest.as_str()));
        for bad in [
            "",
            &"x".repeat(MAX_MESSAGE_ID_BYTES + 1),
            "abc\u{1b}[2Jdef",
            "a\u{7f}",
            "a\u{9b}b",
            "id\u{202e}di",
            "two words",
            "line\nbreak",
            "메시지",
        ] {
            assert_eq!(checked_message_id(bad), None, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn the_outbox_delivers_a_key_once() {
        let dir = std::env::temp_dir().join(format!("bo-outbox-{}", rand::random::<u64>()));
        let outbox = OutboxSender::new(&dir);
        let m = Message {
            idempotency_key: "bo-20260915-abc",
            business_date: NaiveDate::from_ymd_opt(2026, 9, 15).unwrap(),
            campaign: "autumn",
            customer_id: 7,
            channel: "email",
            address: "kim@example.com",
            body: "hello",
        };
        let first = outbox.send(&m).await.unwrap();
        let second = outbox.send(&m).await.unwrap();
        assert!(!first.duplicate);
        assert!(second.duplicate);
        assert_eq!(first.provider_message_id, second.provider_message_id);
        let bad = Message {
            address: "nobody",
            ..m.clone()
        };
        assert!(matches!(
            outbox.send(&bad).await,
            Err(SendError::Rejected(_))
        ));
        let calls = std::fs::read_to_string(dir.join("calls.log")).unwrap();
        assert_eq!(calls.lines().count(), 3);
        // Only the worker's user reads addresses and bodies, whatever the
        // umask lets through (it can only take bits away).
        use std::os::unix::fs::PermissionsExt as _;
        let mode = |p: &Path| {
            format!(
                "{:o}",
                std::fs::metadata(p).unwrap().permissions().mode() & 0o777
            )
        };
        assert_eq!(mode(&dir), "700", "the outbox folder");
        assert_eq!(mode(&dir.join("sent")), "700", "sent/");
        assert_eq!(mode(&dir.join("calls.log")), "600", "calls.log");
        let delivered = dir.join("sent/bo-20260915-abc.json");
        assert_eq!(mode(&delivered), "600", "the delivered message");
        // Nothing else is left in sent/: the temporary file is gone.
        let names: Vec<_> = std::fs::read_dir(dir.join("sent")).unwrap().collect();
        assert_eq!(names.len(), 1);
        let _ = std::fs::remove_dir_all(dir);
    }
}
