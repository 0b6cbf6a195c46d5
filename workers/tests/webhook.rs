//! The webhook sender against real local HTTP servers (issue 16, item 2):
//! a redirect to another server is not followed (that server receives
//! nothing), an answer of a gigabyte is cut at 64 KiB without the process
//! growing, an overlong or control-character message id is not taken, plain
//! http with a token is refused, and no token shows in `Debug`. No
//! database.

use std::io::Read as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap, StatusCode};
use batchonce::config::KindOptions;
use batchonce_workers::notification::webhook::MAX_RESPONSE_BYTES;
use batchonce_workers::notification::{
    build_sender, Message, SendError, Sender, WebhookConfig, WebhookSender,
};
use chrono::NaiveDate;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const TOKEN: &str = "tok-5be1-only-for-the-provider";

fn message() -> Message<'static> {
    Message {
        idempotency_key: "bo-20260915-0123abcd",
        business_date: NaiveDate::from_ymd_opt(2026, 9, 15).unwrap(),
        campaign: "autumn",
        customer_id: 7,
        channel: "email",
        address: "kim@example.com",
        body: "hello",
    }
}

/// A sender to `url` over plain http (loopback), with the token.
fn sender(url: &str, retries: u32) -> WebhookSender {
    WebhookSender::new(WebhookConfig {
        retries,
        timeout: Duration::from_secs(30),
        bearer: Some(batchonce_workers::notification::Secret::new(TOKEN)),
        allow_http: true,
        ..WebhookConfig::new(url)
    })
    .unwrap()
}

async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test]
async fn a_redirect_is_answered_never_followed() {
    // The server a redirect points to counts every request it gets.
    let stolen = Arc::new(AtomicUsize::new(0));
    let counter = stolen.clone();
    let elsewhere = serve(axum::Router::new().fallback(move || {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            "{\"message_id\":\"stolen\"}"
        }
    }))
    .await;
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let provider = serve(axum::Router::new().route(
        "/{code}",
        axum::routing::post(move |axum::extract::Path(code): axum::extract::Path<u16>| {
            let seen = seen.clone();
            async move {
                seen.fetch_add(1, Ordering::SeqCst);
                let to = format!("http://{elsewhere}/steal?token=in-the-location");
                (
                    StatusCode::from_u16(code).unwrap(),
                    [(header::LOCATION, to)],
                    "moved",
                )
            }
        }),
    ))
    .await;
    for code in [301, 302, 303, 307, 308] {
        let before = calls.load(Ordering::SeqCst);
        let e = sender(&format!("http://{provider}/{code}"), 3)
            .send(&message())
            .await
            .unwrap_err();
        let SendError::Transient(text) = e else {
            panic!("{code}: {e:?}")
        };
        assert!(
            text.contains(&code.to_string()) && text.contains("redirects are not followed"),
            "{text}"
        );
        assert!(
            text.contains(&format!("to http://{elsewhere}/steal")),
            "{text}"
        );
        assert!(!text.contains("in-the-location"), "{text}");
        // Once: retrying a redirect within the send cannot help.
        assert_eq!(calls.load(Ordering::SeqCst) - before, 1, "{code}");
    }
    assert_eq!(
        stolen.load(Ordering::SeqCst),
        0,
        "the other server was reached"
    );
}

/// The peak resident set of this process, from /proc.
fn peak_rss_kib() -> u64 {
    let mut status = String::new();
    std::fs::File::open("/proc/self/status")
        .unwrap()
        .read_to_string(&mut status)
        .unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

const GIB: u64 = 1 << 30;

/// A server that answers 200 with a gigabyte of body, chunked or with its
/// length announced, and counts the bytes it managed to write before the
/// client hung up.
async fn flood(announce_length: bool) -> (SocketAddr, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let written = Arc::new(AtomicU64::new(0));
    let count = written.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let count = count.clone();
            tokio::spawn(async move {
                // The request: headers, then Content-Length bytes.
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let body_start = loop {
                    let n = conn.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..body_start]).to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while buf.len() < body_start + length {
                    let n = conn.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let framing = if announce_length {
                    format!("Content-Length: {GIB}")
                } else {
                    "Transfer-Encoding: chunked".to_owned()
                };
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
                );
                if conn.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let piece = vec![b'x'; 64 * 1024];
                let mut sent = 0u64;
                while sent < GIB {
                    let ok = if announce_length {
                        conn.write_all(&piece).await.is_ok()
                    } else {
                        let mut framed = format!("{:x}\r\n", piece.len()).into_bytes();
                        framed.extend_from_slice(&piece);
                        framed.extend_from_slice(b"\r\n");
                        conn.write_all(&framed).await.is_ok()
                    };
                    if !ok {
                        return;
                    }
                    sent += piece.len() as u64;
                    count.store(sent, Ordering::SeqCst);
                }
                if !announce_length {
                    let _ = conn.write_all(b"0\r\n\r\n").await;
                }
            });
        }
    });
    (addr, written)
}

#[tokio::test]
async fn a_gigabyte_answer_is_cut_at_the_cap_without_growing_the_process() {
    for announce_length in [false, true] {
        let (addr, written) = flood(announce_length).await;
        let peak_before = peak_rss_kib();
        let started = Instant::now();
        let result = sender(&format!("http://{addr}/n"), 0)
            .send(&message())
            .await;
        let took = started.elapsed();
        // The server notices the hang-up at its next write.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let served = written.load(Ordering::SeqCst);
        let grown_kib = peak_rss_kib().saturating_sub(peak_before);
        println!(
            "{}",
            serde_json::json!({
                "scenario": "webhook-gigabyte-answer",
                "announced_length": announce_length,
                "cap_bytes": MAX_RESPONSE_BYTES,
                "server_wrote_bytes": served,
                "peak_rss_growth_kib": grown_kib,
                "send_ms": took.as_millis() as u64,
            })
        );
        match result {
            Err(SendError::Transient(text)) => {
                assert!(text.contains("a body over 64 KiB"), "{text}")
            }
            other => panic!("{other:?}"),
        }
        // What the server could push into the socket buffers before the
        // client hung up, not the gigabyte.
        assert!(served < 32 << 20, "the server wrote {served} bytes");
        assert!(
            grown_kib < 32 * 1024,
            "the peak RSS grew by {grown_kib} KiB"
        );
    }
}

#[tokio::test]
async fn only_a_short_printable_message_id_is_taken() {
    let provider = serve(axum::Router::new().route(
        "/{case}",
        axum::routing::post(
            |axum::extract::Path(case): axum::extract::Path<String>| async move {
                let mut headers = HeaderMap::new();
                let body_id = match case.as_str() {
                    "long" => {
                        headers.insert("x-message-id", "hdr-1".parse().unwrap());
                        "x".repeat(10_000)
                    }
                    "escape" => "abc\u{1b}[2J\u{1b}]0;pwned\u{7}".to_owned(),
                    "bidi" => "msg\u{202e}gsm".to_owned(),
                    _ => "msg-7".to_owned(),
                };
                let body = serde_json::json!({ "message_id": body_id }).to_string();
                (StatusCode::OK, headers, body)
            },
        ),
    ))
    .await;
    for (case, want) in [
        ("long", "hdr-1"),
        ("escape", "bo-20260915-0123abcd"),
        ("bidi", "bo-20260915-0123abcd"),
        ("plain", "msg-7"),
    ] {
        let r = sender(&format!("http://{provider}/{case}"), 0)
            .send(&message())
            .await
            .unwrap();
        assert_eq!(r.provider_message_id, want, "{case}");
    }
}

#[test]
fn plain_http_with_a_token_is_refused_and_debug_shows_no_token() {
    let options = |text: &str| KindOptions {
        values: text.parse().unwrap(),
        ..KindOptions::default()
    };
    // Only this test reads the variable.
    std::env::set_var("BO_WEBHOOK_TEST_TOKEN", TOKEN);
    let webhook = "sender = \"webhook\"\nwebhook_token_env = \"BO_WEBHOOK_TEST_TOKEN\"\n";
    for (url, allow, refused) in [
        ("http://notify.internal/n", false, "webhook_allow_http"),
        ("http://notify.internal/n", true, "bearer token in clear"),
    ] {
        let e = build_sender(&options(&format!(
            "{webhook}webhook_url = \"{url}\"\nwebhook_allow_http = {allow}\n"
        )))
        .unwrap_err();
        assert!(e.contains(refused), "{url}: {e}");
    }
    for url in [
        "https://notify.internal/n?key=query-secret",
        "http://127.0.0.1:9/n",
    ] {
        let s = build_sender(&options(&format!(
            "{webhook}webhook_url = \"{url}\"\nwebhook_allow_http = true\n"
        )))
        .unwrap();
        let shown = format!("{s:?}");
        assert!(
            !shown.contains(TOKEN) && !shown.contains("query-secret"),
            "{shown}"
        );
        assert!(shown.contains("WebhookSender"), "{shown}");
    }
}
