//! The webhook sender: each message POSTed as JSON with its
//! `Idempotency-Key`, a timeout and retries, to one configured URL and
//! nowhere else.
//!
//! The message carries a customer's address and body, and the request may
//! carry a bearer token, so the sender keeps both where they were sent:
//! - **No redirects.** A 3xx answer is never followed (following would
//!   re-POST the message, possibly with the token, to whatever host the
//!   answer names). It is a transient failure without in-send retries: the
//!   delivery stays pending, and `webhook_url` must name the final URL.
//!   Not a rejection, because a rejected delivery is never resent unless
//!   its request changes, and a redirect says nothing about the message.
//! - **HTTPS unless allowed.** `http://` needs `allow_http`, and even then
//!   a bearer token goes only to a loopback host (a provider stub or a
//!   sidecar on the same machine), never across a network in clear.
//! - **A bounded answer.** At most [`MAX_RESPONSE_BYTES`] of the body is
//!   read, as it streams; a longer one is a provider error, retried like a
//!   5xx (the resend carries the same key), and is never buffered whole.
//! - **A checked message id** ([`super::sender::checked_message_id`]).
//! - **No secret in `Debug`**: the token is a [`Secret`], and the URL is
//!   shown without its password and query.
//!
//! `WebhookSender`, built from a `WebhookConfig` (url, timeout, retries, `bearer: Option<Secret>`,
//! `allow_http`), POSTs the message as JSON with reqwest, with `Idempotency-Key`, an optional
//! bearer token, a request timeout and a connect timeout of at most 10 s. Its client follows no
//! redirect (`redirect::Policy::none()`) and is `https_only` unless `allow_http`; `new` applies
//! `check_transport` again. A 3xx is transient at once (`Failure::GiveUp`: no retries within the
//! send, the delivery stays pending, the message names the redirect's target without its query).
//! The body is read by `read_capped`, chunk by chunk, up to `MAX_RESPONSE_BYTES` (64 KiB); a longer
//! one, by `Content-Length` or as it streams, is a retryable provider error and the response is
//! dropped unread. A 2xx answer is sent, with the id from the body's `message_id`, else the
//! `X-Message-Id` header, each only if `checked_message_id` accepts it, else the key;
//! `Idempotent-Replayed: true` marks a replay. 408, 429, 5xx, network errors and oversized bodies
//! are retried up to `retries` times, with a delay from 200 ms doubling to 5 s, and are then
//! transient. Any other status is a rejection. `Secret`'s and both types' `Debug` show no token,
//! and URLs in messages and in `Debug` have their password and query redacted.

use std::time::Duration;

use async_trait::async_trait;

use super::sender::{checked_message_id, Message, Receipt, SendError, Sender};

/// The most of an answer's body that is read.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// A secret string, such as a bearer token: its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// How a [`WebhookSender`] is set up (the job's `webhook_*` options).
/// Its `Debug`, like the sender's, shows no token and no URL secret.
#[derive(Clone)]
pub struct WebhookConfig {
    pub url: String,
    /// Of one request, body included.
    pub timeout: Duration,
    /// Retries of a retryable answer within one send.
    pub retries: u32,
    /// Sent as `Authorization: Bearer <token>`.
    pub bearer: Option<Secret>,
    /// Accept an `http://` URL (see [`check_transport`]).
    pub allow_http: bool,
}

impl WebhookConfig {
    /// The defaults of the job's options: 10 s, 3 retries, no token, HTTPS.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            timeout: Duration::from_secs(10),
            retries: 3,
            bearer: None,
            allow_http: false,
        }
    }
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = reqwest::Url::parse(&self.url)
            .map(|u| redact_url(&u))
            .unwrap_or_else(|_| "(not a URL)".into());
        f.debug_struct("WebhookConfig")
            .field("url", &url)
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .field("bearer", &self.bearer)
            .field("allow_http", &self.allow_http)
            .finish()
    }
}

/// POSTs each message as JSON to a URL with `Idempotency-Key: <key>`.
/// 2xx is sent (the message id is the response's `message_id`, else its
/// `X-Message-Id` header, else the key, each only if it is a valid id;
/// `Idempotent-Replayed: true` marks a duplicate); 408, 429, 5xx, network
/// errors and oversized answers are retried up to `retries` times with
/// backoff, then reported transient; 3xx is transient at once (see the
/// module documentation); other 4xx are rejections.
#[derive(Clone)]
pub struct WebhookSender {
    client: reqwest::Client,
    url: reqwest::Url,
    retries: u32,
    bearer: Option<Secret>,
}

impl std::fmt::Debug for WebhookSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookSender")
            .field("url", &redact_url(&self.url))
            .field("retries", &self.retries)
            .field("bearer", &self.bearer)
            .finish_non_exhaustive()
    }
}

/// How one request failed.
enum Failure {
    /// Worth retrying within the send.
    Retry(String),
    /// Transient, but retrying within the send cannot help.
    GiveUp(String),
    Reject(String),
}

impl WebhookSender {
    pub fn new(config: WebhookConfig) -> Result<Self, String> {
        let url = parse_webhook_url(&config.url)?;
        check_transport(&url, config.allow_http, config.bearer.is_some())?;
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout.min(Duration::from_secs(10)))
            .user_agent(concat!("batchonce/", env!("CARGO_PKG_VERSION")))
            // A redirect is answered, never followed: see the module doc.
            .redirect(reqwest::redirect::Policy::none())
            .https_only(!config.allow_http)
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Self {
            client,
            url,
            retries: config.retries,
            bearer: config.bearer,
        })
    }

    async fn once(&self, m: &Message<'_>) -> Result<Receipt, Failure> {
        let mut req = self
            .client
            .post(self.url.clone())
            .header("Idempotency-Key", m.idempotency_key)
            .json(m);
        if let Some(token) = &self.bearer {
            req = req.bearer_auth(token.expose());
        }
        let mut resp = req.send().await.map_err(|e| {
            let kind = if e.is_timeout() {
                "timed out"
            } else if e.is_connect() {
                "cannot connect"
            } else {
                "request failed"
            };
            Failure::Retry(format!("webhook {kind}: {}", without_url(&e)))
        })?;
        let status = resp.status();
        if status.is_redirection() {
            let to = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|l| self.url.join(l).ok())
                .map(|u| format!(" to {}", redact_url(&u)))
                .unwrap_or_default();
            return Err(Failure::GiveUp(batchonce::text::truncate(&format!(
                "webhook answered {status}, a redirect{to}; redirects are not followed, so that \
                 a message and its token go nowhere but webhook_url: set webhook_url to the final URL"
            ))));
        }
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let replayed = header("idempotent-replayed").is_some_and(|v| v == "true");
        let header_id = header("x-message-id");
        let body = read_capped(&mut resp, MAX_RESPONSE_BYTES)
            .await
            .map_err(|e| match e {
                ReadError::TooLong => Failure::Retry(format!(
                    "webhook answered {status} with a body over {} KiB, which is a provider \
                     error; not read further (a resend carries the same Idempotency-Key)",
                    MAX_RESPONSE_BYTES / 1024
                )),
                ReadError::Failed(e) => Failure::Retry(format!(
                    "webhook answered {status}, then the body failed: {}",
                    without_url(&e)
                )),
            })?;
        if status.is_success() {
            let body_id = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["message_id"].as_str().map(str::to_owned));
            let id = [body_id, header_id]
                .into_iter()
                .flatten()
                .find(|id| checked_message_id(id).is_some())
                .unwrap_or_else(|| m.idempotency_key.to_owned());
            return Ok(Receipt {
                provider_message_id: id,
                duplicate: replayed,
            });
        }
        let text = String::from_utf8_lossy(&body[..body.len().min(2048)]).into_owned();
        let message = format!("webhook answered {status}: {}", text.trim());
        if status.is_server_error() || status.as_u16() == 408 || status.as_u16() == 429 {
            Err(Failure::Retry(message))
        } else {
            Err(Failure::Reject(message))
        }
    }
}

enum ReadError {
    TooLong,
    Failed(reqwest::Error),
}

/// The body, as it streams, up to `cap` bytes: a longer one (announced or
/// not) is refused without reading it further, and the connection closes
/// when the response is dropped.
async fn read_capped(resp: &mut reqwest::Response, cap: usize) -> Result<Vec<u8>, ReadError> {
    if resp.content_length().is_some_and(|n| n > cap as u64) {
        return Err(ReadError::TooLong);
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(ReadError::Failed)? {
        if body.len() + chunk.len() > cap {
            return Err(ReadError::TooLong);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Keeps a URL's credentials out of messages.
fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(u) = e.url() {
        s = s.replace(u.as_str(), &redact_url(u));
    }
    s
}

/// A URL as messages show it: no password, no query (a token often hides
/// in either).
fn redact_url(u: &reqwest::Url) -> String {
    let mut u = u.clone();
    if u.password().is_some() {
        let _ = u.set_password(Some("***"));
    }
    u.set_query(None);
    u.to_string()
}

/// A webhook URL: http or https with a host (whether http is acceptable is
/// [`check_transport`]'s question).
pub fn parse_webhook_url(url: &str) -> Result<reqwest::Url, String> {
    let u = reqwest::Url::parse(url).map_err(|e| format!("invalid URL: {e}"))?;
    if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
        return Err(format!(
            "expected an https:// URL with a host, found {:?}",
            redact_url(&u)
        ));
    }
    Ok(u)
}

/// Whether the URL's host is this machine's loopback interface.
fn is_loopback(u: &reqwest::Url) -> bool {
    let Some(host) = u.host_str() else {
        return false;
    };
    // An IPv6 host is written in brackets; the URL parser has normalised
    // every IP address already.
    match host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
    {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

/// HTTPS, or `http://` when `allow_http` is set, and then with a bearer
/// token only to a loopback host: the message and the token never cross a
/// network in clear.
pub fn check_transport(u: &reqwest::Url, allow_http: bool, with_token: bool) -> Result<(), String> {
    if u.scheme() != "http" {
        return Ok(());
    }
    if !allow_http {
        return Err(
            "is http://, which would send addresses and message bodies in clear: use https://, \
             or set webhook_allow_http = true for a provider on a private network"
                .into(),
        );
    }
    if with_token && !is_loopback(u) {
        return Err(
            "is http:// and webhook_token_env is set, which would send the bearer token in \
             clear: use https:// (plain http with a token goes only to a loopback host such as \
             127.0.0.1)"
                .into(),
        );
    }
    Ok(())
}

#[async_trait]
impl Sender for WebhookSender {
    async fn send(&self, m: &Message<'_>) -> Result<Receipt, SendError> {
        let mut delay = Duration::from_millis(200);
        let mut attempt = 0;
        loop {
            match self.once(m).await {
                Ok(r) => return Ok(r),
                Err(Failure::Reject(msg)) => return Err(SendError::Rejected(msg)),
                Err(Failure::GiveUp(msg)) => return Err(SendError::Transient(msg)),
                Err(Failure::Retry(msg)) if attempt >= self.retries => {
                    return Err(SendError::Transient(format!(
                        "{msg} (after {} tries)",
                        attempt + 1
                    )))
                }
                Err(Failure::Retry(_)) => {
                    attempt += 1;
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_urls_must_be_http() {
        assert!(parse_webhook_url("https://hooks.example.com/notify").is_ok());
        assert!(parse_webhook_url("ftp://example.com").is_err());
        assert!(parse_webhook_url("not a url").is_err());
        let e = parse_webhook_url("file://user:secret@/x").unwrap_err();
        assert!(!e.contains("secret"), "{e}");
    }

    #[test]
    fn plain_http_needs_permission_and_a_token_needs_loopback() {
        let check = |url: &str, allow: bool, token: bool| {
            check_transport(&parse_webhook_url(url).unwrap(), allow, token)
        };
        assert!(check("https://hooks.example/n", false, true).is_ok());
        assert!(check("http://hooks.example/n", false, false)
            .unwrap_err()
            .contains("webhook_allow_http"));
        assert!(check("http://hooks.example/n", true, false).is_ok());
        assert!(check("http://hooks.example/n", true, true)
            .unwrap_err()
            .contains("bearer token in clear"));
        for local in [
            "http://127.0.0.1:8080/n",
            "http://127.9.9.9/n",
            "http://[::1]:8080/n",
            "http://localhost/n",
            "http://LOCALHOST/n",
        ] {
            assert!(check(local, true, true).is_ok(), "{local}");
            assert!(check(local, false, false).is_err(), "{local}");
        }
        // Names that only look local are not.
        for remote in ["http://localhost.evil.example/n", "http://10.0.0.1/n"] {
            assert!(check(remote, true, true).is_err(), "{remote}");
        }
    }

    #[test]
    fn debug_shows_no_token_and_no_url_secret() {
        let sender = WebhookSender::new(WebhookConfig {
            bearer: Some(Secret::new("tok-very-secret")),
            ..WebhookConfig::new("https://user:url-pw@hooks.example/n?key=query-secret")
        })
        .unwrap();
        let shown = format!("{sender:?}");
        for secret in ["tok-very-secret", "url-pw", "query-secret"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(
            shown.contains("hooks.example") && shown.contains("Secret(***)"),
            "{shown}"
        );
        let cfg = WebhookConfig {
            bearer: Some(Secret::new("tok-very-secret")),
            ..WebhookConfig::new("https://u:url-pw@h.example/?key=query-secret")
        };
        let shown = format!("{cfg:?}");
        for secret in ["tok-very-secret", "url-pw", "query-secret"] {
            assert!(!shown.contains(secret), "{shown}");
        }
    }
}
