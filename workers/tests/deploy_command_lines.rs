//! Every `batchonce` command line of `deploy/` (the Kubernetes workloads
//! and the systemd units) uses only subcommands and flags that the binary's
//! `--help` lists, which a checker shown to catch made-up ones verifies;
//! and the long-running ones start as they are written and answer the
//! probes they are given (`/healthz`, and `/readyz` but for the console),
//! then exit 0 on SIGTERM. None of this needs a database.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

mod common;

use common::deploy::*;
use common::{free_port, http_status, BIN};

#[test]
fn the_checker_reports_made_up_flags_and_subcommands() {
    // The checker must be able to fail, or its silence below proves nothing.
    let refused = [
        (
            "worker --made-up-flag",
            "--made-up-flag is not in `batchonce worker --help`",
        ),
        (
            "--no-such-global worker",
            "--no-such-global is not in `batchonce --help`",
        ),
        (
            "--config /x wroker",
            "subcommand wroker is not in `batchonce --help`",
        ),
        ("worker --grace", "--grace has no value"),
        (
            "worker --grace 20 s",
            "`batchonce worker` takes no argument \"s\"",
        ),
        // --once exists for produce, not for worker.
        (
            "worker --once",
            "--once is not in `batchonce worker --help`",
        ),
    ];
    for (line, want) in refused {
        assert_eq!(command_line_problems(&words(line)), [want], "{line}");
    }
    // And it accepts what the binary accepts: global options before or
    // after the subcommand, inline values, flags and positional arguments.
    for ok in [
        "--config /etc/batchonce/batchonce.toml worker --worker-id a-1 --grace 20s --no-listen",
        "worker --config=/x --log-format json --metrics-addr=0.0.0.0:9464",
        "produce --once --json",
        "enqueue daily-settlement --date 2026-09-15",
        "migrate",
    ] {
        assert_eq!(
            command_line_problems(&words(ok)),
            Vec::<String>::new(),
            "{ok}"
        );
    }
}

/// A `batchonce` command line of a manifest or a unit.
struct Line {
    /// The file it comes from, for messages.
    source: String,
    /// The Deployment or Job that runs it, for a manifest.
    workload: Option<String>,
    argv: Vec<String>,
}

/// Every `batchonce` command line of the manifests and the units.
fn all_command_lines() -> Vec<Line> {
    let all = manifests();
    let mut out: Vec<Line> = batchonce_containers(&all)
        .into_iter()
        .map(|(m, _, argv)| Line {
            source: format!("kubernetes/{}", m.file),
            workload: Some(name(m).to_owned()),
            argv,
        })
        .collect();
    for u in units() {
        for argv in u.command_lines() {
            out.push(Line {
                source: format!("systemd/{}", u.file),
                workload: None,
                argv,
            });
        }
    }
    out
}

#[test]
fn every_command_line_uses_subcommands_and_flags_the_binary_has() {
    let lines = all_command_lines();
    // Five workloads in Kubernetes and four units, or the extraction
    // missed some and the check below would pass on nothing.
    let sources: Vec<&str> = lines.iter().map(|l| l.source.as_str()).collect();
    assert_eq!(lines.len(), 9, "{sources:?}");
    let mut failures = Vec::new();
    for line in &lines {
        for problem in command_line_problems(&line.argv) {
            failures.push(format!("{}: {problem}", line.source));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A pod name as a Deployment's ReplicaSet generates it: the ReplicaSet is
/// `<deployment>-<pod-template-hash>` (at most 10 characters), and its pods
/// get a random 5-character suffix after a prefix cut to 58 characters.
fn pod_name(deployment: &str) -> String {
    let prefix: String = format!("{deployment}-7d9f8c6b5d-")
        .chars()
        .take(58)
        .collect();
    format!("{prefix}x2x4z")
}

/// Runs a long-running command line as it is written, except for the
/// values of `flags` (its address, on the free loopback `port`, so that
/// parallel tests never compete for 9464, and a file of the test's), in
/// `cwd` (an empty folder, as the unit and the pod give it), against a
/// database that refuses connections. It must answer `/healthz` with 200,
/// which the probes rely on, and `path` with `want`, then exit 0 on
/// SIGTERM.
fn start_and_probe(
    source: &str,
    argv: &[String],
    flags: &[(&str, String)],
    port: u16,
    cwd: &Path,
    (path, want): (&str, u16),
) {
    let argv = with_values(source, argv, flags);
    let mut child = Command::new(BIN)
        .args(&argv)
        .current_dir(cwd)
        .env("DATABASE_URL", NO_DATABASE)
        .env_remove("BATCHONCE_CONFIG")
        .env_remove("BATCHONCE_CONSOLE_USERS")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let healthz = wait_for_healthz(&mut child, port, source, &argv);
    let answer = http_status(port, path);
    let status = common::signal_and_wait(&mut child, Signal::SIGTERM, Duration::from_secs(20));
    assert_eq!(healthz, 200, "{source}: /healthz");
    assert_eq!(answer, Some(want), "{source}: {path}");
    assert!(status.success(), "{source}: SIGTERM gave {status}");
}

/// Waits (30 s at most) for a started command line's `/healthz`; its
/// status. A process that exits first fails the test with its stderr.
fn wait_for_healthz(child: &mut Child, port: u16, source: &str, argv: &[String]) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            panic!("{source}: {argv:?} exited with {status}: {err}");
        }
        if let Some(code) = http_status(port, "/healthz") {
            return code;
        }
        assert!(Instant::now() < deadline, "{source}: no /healthz in 30s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A users file with one operator, its hash made by the binary itself, as
/// the install steps make it.
fn console_users_file(dir: &Path) -> PathBuf {
    let mut child = Command::new(BIN)
        .args(["console", "--hash-password"])
        .env_remove("DATABASE_URL")
        .env_remove("BATCHONCE_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"correct horse battery staple\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "--hash-password: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hash = String::from_utf8(out.stdout).unwrap();
    let path = dir.join("console-users.toml");
    std::fs::write(
        &path,
        format!(
            "[[user]]\nname = \"alice\"\nrole = \"operator\"\npassword_hash = \"{}\"\n",
            hash.trim()
        ),
    )
    .unwrap();
    path
}

#[test]
fn the_long_running_command_lines_start_and_answer_their_probes() {
    let all = manifests();
    let map = find(&all, "ConfigMap", "batchonce-config");
    let dir = scratch("probe");
    let config = dir.join("batchonce.toml");
    std::fs::write(
        &config,
        str_of(&map.doc["data"]["batchonce.toml"], "batchonce.toml"),
    )
    .unwrap();
    let users = console_users_file(&dir);
    let empty = dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    let mut runs = Vec::new();
    for line in all_command_lines() {
        if subcommand(&line.argv) == "migrate" {
            // migrate needs a database; its flags were checked above.
            continue;
        }
        // What the kubelet and systemd substitute before the process starts.
        let pod = pod_name(line.workload.as_deref().unwrap_or("none"));
        let argv: Vec<String> = line
            .argv
            .iter()
            .map(|w| {
                w.replace("$(POD_NAME)", &pod)
                    .replace("%H", &host)
                    .replace("%i", "1")
                    .replace("${BATCHONCE_METRICS_ADDR}", "127.0.0.1:9464")
            })
            .collect();
        runs.push((line.source, argv));
    }
    // Each process takes a few seconds to stop without a database, so they
    // run side by side; a panic in one thread fails the test.
    std::thread::scope(|scope| {
        for (source, argv) in &runs {
            let (config, users, empty) = (&config, &users, &empty);
            scope.spawn(move || {
                let port = free_port();
                if subcommand(argv) == "console" {
                    let flags = [
                        ("--listen", format!("127.0.0.1:{port}")),
                        ("--users", users.display().to_string()),
                    ];
                    // A browser that has not signed in goes to the sign-in
                    // page.
                    start_and_probe(source, argv, &flags, port, empty, ("/", 303))
                } else {
                    let flags = [
                        ("--metrics-addr", format!("127.0.0.1:{port}")),
                        ("--config", config.display().to_string()),
                    ];
                    // Not ready without a database.
                    start_and_probe(source, argv, &flags, port, empty, ("/readyz", 503))
                }
            });
        }
    });
    let started = runs.len();
    assert_eq!(started, 7, "four Deployments and three units run for good");
    let _ = std::fs::remove_dir_all(&dir);
}
