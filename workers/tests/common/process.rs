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
/// while nothing answers. It asks in HTTP/1.0, so that no server sends the
/// body in chunks, and the body ends at its `Content-Length` (a server such
/// as chromedriver keeps the connection open) or when the server closes.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n").ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = s.read(&mut buf).ok()?;
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse::<usize>().ok())
                    .flatten()
            });
            if n == 0 || length.is_some_and(|len| body.len() >= len) {
                let status = head.split(' ').nth(1)?.parse().ok()?;
                return Some((status, body.to_owned()));
            }
        }
        if n == 0 {
            return None;
        }
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
