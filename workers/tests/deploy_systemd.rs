//! The systemd units in `deploy/systemd` have the settings the code needs
//! (a stop timeout longer than the worker's `--grace`, a metrics address
//! per worker instance, the console on loopback with its users file as a
//! credential and a user of its own, …), deploy/systemd/README.md tells how
//! to install each, a broken copy of each is caught, and
//! `systemd-analyze verify` accepts them where it is installed (under CI it
//! must be). None of this needs a database.

use std::path::PathBuf;
use std::process::Command;

mod common;

use common::deploy::*;
use common::BIN;

fn systemd_readme() -> String {
    std::fs::read_to_string(deploy().join("systemd/README.md")).unwrap()
}

fn unit<'a>(all: &'a [Unit], file: &str) -> &'a Unit {
    all.iter()
        .find(|u| u.file == file)
        .unwrap_or_else(|| panic!("no {file}"))
}

/// The settings the code needs in the units; panics on the first problem.
/// `readme` is deploy/systemd/README.md, which must tell how to install
/// each of them.
fn check_units(all: &[Unit], readme: &str) {
    for u in all {
        let lines = u.command_lines();
        assert_eq!(lines.len(), 1, "{}: one batchonce ExecStart", u.file);
        let argv = &lines[0];
        if subcommand(argv) == "console" {
            // It reads everything from the database, and runs as a user of
            // its own, which could not read batchonce.toml.
            assert_eq!(flag_value(argv, "--config"), None, "{}", u.file);
        } else {
            assert_eq!(
                flag_value(argv, "--config"),
                Some("/etc/batchonce/batchonce.toml"),
                "{}",
                u.file
            );
        }
        assert!(
            readme.contains(&u.file),
            "deploy/systemd/README.md does not mention {}",
            u.file
        );
        assert!(
            u.all("Service", "EnvironmentFile")
                .contains(&"/etc/batchonce/batchonce.env"),
            "{}: DATABASE_URL comes from /etc/batchonce/batchonce.env",
            u.file
        );
        let user = u.service("User");
        assert!(user != "root" && user != "0", "{}: User={user}", u.file);
        assert_eq!(u.service("NoNewPrivileges"), "true", "{}", u.file);
        assert_eq!(u.service("ProtectSystem"), "strict", "{}", u.file);
    }

    let worker = unit(all, "batchonce-worker@.service");
    let argv = &worker.command_lines()[0];
    assert_eq!(subcommand(argv), "worker");
    // The host name and the instance make a worker id that is unique and
    // stable across restarts.
    assert_eq!(flag_value(argv, "--worker-id"), Some("%H-%i"));
    assert_eq!(worker.service("KillSignal"), "SIGTERM");
    assert_eq!(worker.service("KillMode"), "mixed");
    assert_eq!(worker.service("Restart"), "on-failure");
    let grace = seconds(flag_value(argv, "--grace").unwrap_or("20s"));
    let stop = seconds(worker.service("TimeoutStopSec"));
    assert!(stop > grace, "TimeoutStopSec {stop} <= --grace {grace}");
    // Each instance needs its own metrics port: the address is a variable
    // that an EnvironmentFile named after the instance defines, and the
    // install steps of deploy/systemd/README.md write that file.
    let addr = flag_value(argv, "--metrics-addr").expect("worker --metrics-addr");
    let var = addr
        .strip_prefix("${")
        .and_then(|a| a.strip_suffix('}'))
        .unwrap_or_else(|| panic!("--metrics-addr {addr} is the same for every instance"));
    assert!(
        worker
            .all("Service", "EnvironmentFile")
            .iter()
            .any(|f| f.contains("%i") && !f.starts_with('-')),
        "no required per-instance EnvironmentFile"
    );
    assert!(readme.contains(&format!("{var}=127.0.0.1:")), "README.md");

    let producer = unit(all, "batchonce-producer.service");
    let argv = &producer.command_lines()[0];
    assert_eq!(subcommand(argv), "produce");
    assert!(!argv.iter().any(|w| w == "--once"));
    assert_eq!(producer.service("Restart"), "on-failure");

    let migrate = unit(all, "batchonce-migrate.service");
    assert_eq!(subcommand(&migrate.command_lines()[0]), "migrate");
    assert_eq!(migrate.service("Type"), "oneshot");

    let console = unit(all, "batchonce-console.service");
    let argv = &console.command_lines()[0];
    assert_eq!(subcommand(argv), "console");
    // It signs users in over plain HTTP: loopback only, behind a proxy
    // that terminates HTTPS or an SSH tunnel.
    let listen = flag_value(argv, "--listen").unwrap_or("127.0.0.1:8470");
    let addr: std::net::SocketAddr = listen
        .parse()
        .unwrap_or_else(|e| panic!("{}: --listen {listen}: {e}", console.file));
    assert!(
        addr.ip().is_loopback(),
        "{}: --listen {listen} is reachable from other hosts",
        console.file
    );
    // The users file (password hashes) is a credential: systemd reads it
    // as root and hands the console a copy in %d that only its user reads.
    let users = flag_value(argv, "--users").expect("console --users");
    let credential = users.strip_prefix("%d/").unwrap_or_else(|| {
        panic!(
            "{}: --users {users} is not a credential (%d/NAME)",
            console.file
        )
    });
    assert!(
        console
            .all("Service", "LoadCredential")
            .iter()
            .any(|c| c.split_once(':').map(|(n, _)| n) == Some(credential)),
        "{}: no LoadCredential={credential}:…",
        console.file
    );
    // Not the workers' user, whose command jobs run any program.
    assert_ne!(
        console.service("User"),
        worker.service("User"),
        "{}: the workers' command jobs could read its users file",
        console.file
    );
    assert_eq!(console.service("Restart"), "on-failure");
    // Its working directory is an empty one of its own, where no stray
    // batchonce.toml is read.
    let dir = console.service("WorkingDirectory");
    let own: Vec<String> = [("RuntimeDirectory", "/run"), ("StateDirectory", "/var/lib")]
        .iter()
        .filter_map(|(key, base)| console.get("Service", key).map(|d| format!("{base}/{d}")))
        .collect();
    assert!(
        own.iter().any(|d| d == dir),
        "{}: WorkingDirectory={dir} is none of its own directories {own:?}",
        console.file
    );
}

#[test]
fn durations_parse_as_both_tools_write_them() {
    assert_eq!(seconds("20s"), 20.0);
    assert_eq!(seconds("45"), 45.0);
    assert_eq!(seconds("1min 30s"), 90.0);
    assert_eq!(seconds("1m30s"), 90.0);
    assert_eq!(seconds("2h"), 7200.0);
    assert_eq!(seconds("500ms"), 0.5);
}

#[test]
fn the_systemd_units_are_configured_as_the_code_needs() {
    check_units(&units(), &systemd_readme());
}

#[test]
fn the_unit_checks_catch_a_broken_unit() {
    let texts = unit_texts();
    let readme = systemd_readme();
    let worker = "batchonce-worker@.service";
    let console = "batchonce-console.service";
    for (file, from, to) in [
        (worker, "TimeoutStopSec=45s", "TimeoutStopSec=15s"),
        (worker, "KillMode=mixed", "KillMode=control-group"),
        (console, "--listen 127.0.0.1:8470", "--listen 0.0.0.0:8470"),
        (
            console,
            "--users %d/users.toml",
            "--users /etc/batchonce/console-users.toml",
        ),
        (
            console,
            "LoadCredential=users.toml:",
            "LoadCredential=console-users.toml:",
        ),
        (console, "User=batchonce-console", "User=batchonce"),
        (
            console,
            "ExecStart=/usr/bin/batchonce console",
            "ExecStart=/usr/bin/batchonce --config /etc/batchonce/batchonce.toml console",
        ),
        (
            console,
            "WorkingDirectory=/run/batchonce-console",
            "WorkingDirectory=/",
        ),
    ] {
        let broken = edited(&texts, file, from, to);
        let all = parse_units(&broken);
        assert_caught(&format!("{file}: {from:?} -> {to:?}"), || {
            check_units(&all, &readme)
        });
    }
    // And a unit the README does not mention.
    assert_caught("a unit missing from the README", || {
        check_units(&units(), &readme.replace(console, "the console's unit"))
    });
}

/// Whether this is a CI run, where a missing tool fails the test.
fn ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false")
}

/// `systemd-analyze verify` on `units`: its exit status and its stderr.
fn systemd_verify(units: &[PathBuf]) -> (std::process::ExitStatus, String) {
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(units)
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn systemd_analyze_verifies_the_units() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            !ci(),
            "CI=true, but systemd-analyze is missing: .ci/run must install Debian's systemd package"
        );
        eprintln!("skipped: systemd-analyze not installed (it comes with systemd)");
        return;
    }
    // verify checks that the program exists, so the copies point at the
    // binary under test; and a template is only verified as an instance.
    let dir = scratch("systemd");
    let mut copies = Vec::new();
    for path in files(&deploy().join("systemd"), &["service"]) {
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("/usr/bin/batchonce", BIN);
        let name = file_name(&path).replace("@.service", "@1.service");
        let copy = dir.join(&name);
        std::fs::write(&copy, text).unwrap();
        copies.push(copy);
    }
    let (status, err) = systemd_verify(&copies);
    // verify exits 0 even for an unknown setting, which it only reports on
    // stderr; any line about these units is a failure. Lines about the
    // machine's own units are not ours to fix.
    let ours = |err: &str| -> Vec<String> {
        err.lines()
            .filter(|l| l.contains("batchonce") || l.contains(&*dir.to_string_lossy()))
            .map(str::to_owned)
            .collect()
    };
    assert!(status.success() && ours(&err).is_empty(), "{err}");
    // The check can fail here: the same units with an unknown setting are
    // reported, so a systemd-analyze that verified nothing (one that cannot
    // work in this environment) would not pass the units above.
    let broken: Vec<PathBuf> = copies
        .iter()
        .map(|c| {
            let text = std::fs::read_to_string(c).unwrap().replacen(
                "[Service]\n",
                "[Service]\nFrobnicate=yes\n",
                1,
            );
            let name = dir.join(format!("broken-{}", file_name(c)));
            std::fs::write(&name, text).unwrap();
            name
        })
        .collect();
    let (_, err) = systemd_verify(&broken);
    for b in &broken {
        assert!(
            ours(&err)
                .iter()
                .any(|l| l.contains(&*file_name(b)) && l.contains("Frobnicate")),
            "systemd-analyze verify did not report the unknown key in {}: {err}",
            b.display()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
