//! The built binary as a process, for the tests that run it: the command
//! against a test database, a worker process, a free port, a plain HTTP GET
//! on loopback, and stopping a process with a deadline (a process that does
//! not stop fails the test instead of hanging it, and is killed).

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use batchonce::testing::TestDb;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

pub const BIN: &str = env!("CARGO_BIN_EXE_batchonce");

/// `batchonce` against `db`, with `--config` only when given, logging at
/// info and without stdin. The test's own environment cannot leak in: no
/// `BATCHONCE_CONFIG` (without `--config` the binary then looks for
/// `./batchonce.toml`, which a scratch folder does not have) and no
/// `BATCHONCE_CONSOLE_USERS`.
pub fn batchonce(db: &TestDb, config: Option<&Path>) -> Command {
    let mut c = Command::new(BIN);
    c.env("DATABASE_URL", &db.url)
        .env_remove("BATCHONCE_CONFIG")
        .env_remove("BATCHONCE_CONSOLE_USERS")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null());
    if let Some(cfg) = config {
        c.arg("--config").arg(cfg);
    }
    c
}

/// The stdout of a command that must have succeeded; on failure the test
/// fails with its stdout and stderr.
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `cmd` (a [`batchonce`] command) made the worker `id`: JSON logs, a
/// 200 ms poll and a 5 s grace, then `extra` flags (`--concurrency 6`).
pub fn worker(mut cmd: Command, id: &str, extra: &[&str]) -> Command {
    cmd.args(["--log-format", "json", "worker", "--worker-id", id])
        .args(["--poll-interval", "200ms", "--grace", "5s"])
        .args(extra);
    cmd
}

/// Starts [`worker`] `id` of `cmd`, its log in `dir/<id>.log`.
pub fn spawn_worker(cmd: Command, dir: &Path, id: &str, extra: &[&str]) -> Child {
    let log = std::fs::File::create(dir.join(format!("{id}.log"))).unwrap();
    worker(cmd, id, extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// A port on the loopback interface that nothing listened on just now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` on a loopback port: the status code and the body, or `None`
/// while nothing answers. The body ends at its `Content-Length` or its last
/// chunk (a server such as chromedriver keeps the connection open, and
/// refuses HTTP/1.0) or when the server closes.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = s.read(&mut buf).ok()?;
        got.extend_from_slice(&buf[..n]);
        if let Some((status, body)) = response(&got, n == 0) {
            return Some((status, String::from_utf8_lossy(&body).into_owned()));
        }
        if n == 0 {
            return None;
        }
    }
}

/// The status and body of the HTTP/1.1 response read so far, once it is
/// whole: `closed` says the server has closed the connection.
fn response(got: &[u8], closed: bool) -> Option<(u16, Vec<u8>)> {
    let end = got.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&got[..end]);
    let body = &got[end + 4..];
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        // Each chunk is its size in hex, CRLF, the bytes, CRLF; size 0 ends.
        let mut out = Vec::new();
        let mut rest = body;
        loop {
            let line = rest.windows(2).position(|w| w == b"\r\n")?;
            let size = String::from_utf8_lossy(&rest[..line]);
            let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
            if size == 0 {
                return Some((status, out));
            }
            let data = rest.get(line + 2..line + 2 + size)?;
            out.extend_from_slice(data);
            rest = rest.get(line + 2 + size + 2..)?;
        }
    }
    match header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        Some(len) if body.len() >= len => Some((status, body[..len].to_vec())),
        _ if closed => Some((status, body.to_vec())),
        _ => None,
    }
}

/// The status code of `GET path` on a loopback port, or `None`.
pub fn http_status(port: u16, path: &str) -> Option<u16> {
    http_get(port, path).map(|(status, _)| status)
}

/// Waits for `child` to exit by itself; its status. After `within` it is
/// killed and the test fails.
pub fn wait_exit(child: &mut Child, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process {} did not exit within {within:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Sends `signal` to `child` and waits, at most `within`, for it to exit.
pub fn signal_and_wait(child: &mut Child, signal: Signal, within: Duration) -> ExitStatus {
    // It fails only for a process the test has already reaped, whose
    // status the wait then returns at once.
    let _ = kill(Pid::from_raw(child.id() as i32), signal);
    wait_exit(child, within)
}

/// SIGTERM, then at most 15 s for the process to exit.
pub fn stop(mut child: Child) -> ExitStatus {
    signal_and_wait(&mut child, Signal::SIGTERM, Duration::from_secs(15))
}
