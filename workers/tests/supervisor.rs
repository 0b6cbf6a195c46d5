//! The supervisor of command jobs, through its protocol, against the built
//! `batchonce` binary and real programs (no database): the deadline and its
//! renewals, `term` and `kill`, end of file, exit codes and signals passed
//! through, the program's clean start (stdin, no inherited socket, signal
//! mask), signals to the supervisor ignored, a SIGKILLed supervisor taking
//! its program with it, and the errors when the program or the supervisor
//! cannot start. Each test takes well under a second, except the one that
//! waits out the start timeout.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use batchonce::runtime::supervisor::{self, Ending, StartError, Supervised, MARKER};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");

fn scratch(name: &str) -> PathBuf {
    batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), name)
}

fn sh(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

/// A supervisor of `argv`, started from `exe`, output discarded.
fn spawn_from(exe: &Path, argv: &[String]) -> Supervised {
    let mut cmd = supervisor::command(exe, argv);
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    Supervised::spawn(cmd).unwrap()
}

/// A started supervisor of `sh -c script` with the first deadline `first`
/// from now.
async fn started(script: &str, first: Duration) -> Supervised {
    let mut sup = spawn_from(Path::new(BIN), &sh(script));
    sup.start(vec![], Instant::now() + first).await.unwrap();
    sup
}

async fn ending(sup: &mut Supervised) -> Ending {
    tokio::time::timeout(Duration::from_secs(10), sup.ending())
        .await
        .expect("the supervisor reported no ending within 10s")
}

fn alive(pid: i32) -> bool {
    // A zombie is gone for our purposes: it runs nothing.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

async fn wait_for<F: FnMut() -> bool>(what: &str, mut f: F) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn pid_in(path: &Path) -> i32 {
    wait_for(&path.display().to_string(), || {
        std::fs::read_to_string(path).is_ok_and(|s| s.trim().parse::<i32>().is_ok())
    })
    .await;
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn exited(e: Ending) -> std::process::ExitStatus {
    match e {
        Ending::Exited(s) => s,
        other => panic!("expected an exit, got {other:?}"),
    }
}

#[tokio::test]
async fn exit_codes_and_signals_pass_through() {
    use std::os::unix::process::ExitStatusExt as _;
    for (script, code, signal) in [
        ("exit 0", Some(0), None),
        ("exit 7", Some(7), None),
        ("kill -USR1 $$", None, Some(10)),
        ("kill -KILL $$", None, Some(9)),
    ] {
        let mut sup = started(script, Duration::from_secs(30)).await;
        let status = exited(ending(&mut sup).await);
        assert_eq!((status.code(), status.signal()), (code, signal), "{script}");
    }
}

#[tokio::test]
async fn renewals_keep_the_program_and_their_end_kills_its_group() {
    let dir = scratch("sup-renew");
    let script = format!(
        "sleep 300 & echo $! > {d}/bg.pid; echo $$ > {d}/sh.pid; wait",
        d = dir.display()
    );
    let mut sup = started(&script, Duration::from_millis(300)).await;
    let sh = pid_in(&dir.join("sh.pid")).await;
    let bg = pid_in(&dir.join("bg.pid")).await;
    // Renewed for a second, three times the first deadline.
    let renewed_until = Instant::now() + Duration::from_secs(1);
    let mut last_deadline = Instant::now();
    while Instant::now() < renewed_until {
        last_deadline = Instant::now() + Duration::from_millis(300);
        sup.renew_until(last_deadline);
        tokio::select! {
            e = sup.ending() => panic!("ended while renewed: {e:?}"),
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    assert!(alive(sh) && alive(bg));
    // Then nothing: killed at the last deadline, not before, with its group.
    assert!(matches!(ending(&mut sup).await, Ending::Expired));
    let late = Instant::now().saturating_duration_since(last_deadline);
    // Renewals are whole milliseconds, rounded down.
    assert!(Instant::now() + Duration::from_millis(1) >= last_deadline);
    assert!(late < Duration::from_secs(2), "killed {late:?} late");
    assert!(!alive(sh));
    wait_for("the background child to die", || !alive(bg)).await;
}

#[tokio::test]
async fn term_and_kill_reach_the_group_and_leftovers_die_with_the_program() {
    let dir = scratch("sup-term");
    // The background child ignores SIGTERM: only the supervisor's SIGKILL
    // after the program's exit ends it.
    let script = format!(
        "trap 'exit 42' TERM; sh -c 'trap \"\" TERM; echo $$ > {d}/bg.pid; exec sleep 300' & wait",
        d = dir.display()
    );
    let mut sup = started(&script, Duration::from_secs(30)).await;
    let bg = pid_in(&dir.join("bg.pid")).await;
    sup.term();
    // The trap ran, so SIGTERM is not blocked in the program.
    assert_eq!(exited(ending(&mut sup).await).code(), Some(42));
    wait_for("the child that ignored SIGTERM to die", || !alive(bg)).await;

    use std::os::unix::process::ExitStatusExt as _;
    let mut sup = started("trap '' TERM; sleep 300", Duration::from_secs(30)).await;
    sup.kill();
    // Killed on request, not for a missed deadline.
    assert_eq!(exited(ending(&mut sup).await).signal(), Some(9));
}

#[tokio::test]
async fn dropping_the_handle_kills_the_group() {
    let dir = scratch("sup-drop");
    let script = format!(
        "sleep 300 & echo $! > {d}/bg.pid; echo $$ > {d}/sh.pid; wait",
        d = dir.display()
    );
    let sup = started(&script, Duration::from_secs(30)).await;
    let sh = pid_in(&dir.join("sh.pid")).await;
    let bg = pid_in(&dir.join("bg.pid")).await;
    drop(sup);
    wait_for("the program to die", || !alive(sh)).await;
    wait_for("its background child to die", || !alive(bg)).await;
}

#[tokio::test]
async fn the_program_starts_clean() {
    let dir = scratch("sup-clean");
    let script = format!(
        "readlink /proc/$$/fd/0 > {d}/stdin; ls -l /proc/$$/fd/ > {d}/fds; \
         echo \"$X\" > {d}/env; ps -o pgid= -p $$ > {d}/pgid; echo $$ > {d}/pid",
        d = dir.display()
    );
    let mut sup = spawn_from(Path::new(BIN), &sh(&script));
    let pid = sup
        .start(
            vec![("X".into(), "one\ntwo".into())],
            Instant::now() + Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(exited(ending(&mut sup).await).success());
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    assert_eq!(read("pid").trim(), pid.to_string());
    // A group of its own, led by the program.
    assert_eq!(read("pgid").trim(), pid.to_string());
    assert_eq!(read("stdin").trim(), "/dev/null");
    let fds = read("fds");
    assert!(
        !fds.contains("socket:"),
        "the control socket leaked:\n{fds}"
    );
    // The environment came over the socket, newline and all.
    assert_eq!(read("env"), "one\ntwo\n");

    // The signal mask, read by a program that is not a shell (shells reset
    // theirs before they exec).
    let argv = [
        "grep".to_owned(),
        "SigBlk".into(),
        "/proc/self/status".into(),
    ];
    let mut cmd = supervisor::command(Path::new(BIN), &argv);
    cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut sup = Supervised::spawn(cmd).unwrap();
    let (stdout, _) = sup.take_output();
    sup.start(vec![], Instant::now() + Duration::from_secs(30))
        .await
        .unwrap();
    let mut mask = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stdout.unwrap(), &mut mask)
        .await
        .unwrap();
    assert!(exited(ending(&mut sup).await).success());
    assert_eq!(mask.trim(), "SigBlk:\t0000000000000000");
}

#[tokio::test]
async fn signals_to_the_supervisor_are_ignored_but_sigkill_takes_the_program() {
    use std::os::unix::process::ExitStatusExt as _;
    let mut sup = started("sleep 300", Duration::from_secs(30)).await;
    let pid = Pid::from_raw(sup.id().unwrap() as i32);
    for s in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGTSTP,
    ] {
        kill(pid, s).unwrap();
    }
    // Still there and acting: it answers `kill` with the program's end.
    sup.kill();
    assert_eq!(exited(ending(&mut sup).await).signal(), Some(9));

    let dir = scratch("sup-pdeathsig");
    let mut sup = started(
        &format!("echo $$ > {}/sh.pid; exec sleep 300", dir.display()),
        Duration::from_secs(30),
    )
    .await;
    let sh = pid_in(&dir.join("sh.pid")).await;
    kill(Pid::from_raw(sup.id().unwrap() as i32), Signal::SIGKILL).unwrap();
    assert!(matches!(ending(&mut sup).await, Ending::Vanished));
    wait_for("the program of the SIGKILLed supervisor to die", || {
        !alive(sh)
    })
    .await;
}

#[tokio::test]
async fn a_program_that_cannot_start_is_reported_with_its_error() {
    let dir = scratch("sup-missing");
    let not_executable = dir.join("data.txt");
    std::fs::write(&not_executable, "not a program").unwrap();
    for (program, kind) in [
        (
            dir.join("no-such-program").display().to_string(),
            std::io::ErrorKind::NotFound,
        ),
        (
            not_executable.display().to_string(),
            std::io::ErrorKind::PermissionDenied,
        ),
    ] {
        let mut sup = spawn_from(Path::new(BIN), std::slice::from_ref(&program));
        match sup
            .start(vec![], Instant::now() + Duration::from_secs(30))
            .await
        {
            Err(StartError::Program(e)) => assert_eq!(e.kind(), kind, "{program}: {e}"),
            other => panic!("{program}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn an_executable_that_is_no_supervisor_fails_with_the_cause() {
    // One that exits at once: `sh` looks for a script named like the marker.
    let mut sup = spawn_from(Path::new("/bin/sh"), &sh("exit 0"));
    let e = sup
        .start(vec![], Instant::now() + Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(
        matches!(e, StartError::NotASupervisor(_)) && e.to_string().contains("run_if_invoked"),
        "{e}"
    );
    // One that never answers is given up on after the start timeout, and
    // killed.
    let dir = scratch("sup-silent");
    let silent = dir.join("silent");
    std::fs::write(&silent, "#!/bin/sh\nexec sleep 300\n").unwrap();
    std::fs::set_permissions(&silent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut sup = spawn_from(&silent, &sh("exit 0"));
    let pid = sup.id().unwrap() as i32;
    let began = Instant::now();
    let e = sup
        .start(vec![], Instant::now() + Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(began.elapsed() >= supervisor::START_TIMEOUT);
    assert!(
        e.to_string().contains("within 5s") && e.to_string().contains("run_if_invoked"),
        "{e}"
    );
    sup.reap().await;
    assert!(!alive(pid));
}

/// The supervisor, driven by hand over a raw socket: the program starts
/// only on the first renewal, an unreadable line kills it, and end of file
/// kills it.
#[test]
fn the_raw_protocol() {
    let spawn = |script: &str| {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let child = std::process::Command::new(BIN)
            .args([MARKER, "--", "sh", "-c", script])
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let reader = BufReader::new(ours.try_clone().unwrap());
        (child, ours, reader)
    };
    let line = |r: &mut BufReader<UnixStream>| {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        l
    };

    let (mut child, mut ours, mut reports) = spawn("sleep 300");
    ours.write_all(b"renew 10000\n").unwrap();
    let started = line(&mut reports);
    assert!(started.starts_with("started "), "{started}");
    ours.write_all(b"extend please\n").unwrap();
    assert_eq!(line(&mut reports), "signal 9\n");
    assert!(child.wait().unwrap().success());

    let (mut child, mut ours, mut reports) = spawn("sleep 300");
    ours.write_all(b"renew 10000\n").unwrap();
    let pid: i32 = line(&mut reports)
        .trim()
        .strip_prefix("started ")
        .unwrap()
        .parse()
        .unwrap();
    ours.shutdown(std::net::Shutdown::Write).unwrap();
    // End of file: killed and reported (to a worker that may be gone).
    assert_eq!(line(&mut reports), "signal 9\n");
    assert!(child.wait().unwrap().success());
    assert!(!alive(pid));

    // Without a renewal nothing starts.
    let (mut child, ours, mut reports) = spawn("sleep 300");
    ours.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(line(&mut reports), "");
    assert!(child.wait().unwrap().success());
}

/// An `env` line carries the program's credentials: one the supervisor
/// cannot read is named by its first word and length, never quoted, on the
/// socket (before the start) or on stderr, which is the worker's log
/// (after it).
#[test]
fn an_unreadable_env_line_is_never_repeated() {
    let secret = "pw-never-repeated";
    let cut_env = format!("env [[\"DATABASE_URL\",\"postgres://u:{secret}@db/batch\"]\n");
    let spawn = || {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let child = std::process::Command::new(BIN)
            .args([MARKER, "--", "sleep", "300"])
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let reader = BufReader::new(ours.try_clone().unwrap());
        (child, ours, reader)
    };
    // Before the start: the failure report names the line.
    let (child, mut ours, mut reports) = spawn();
    ours.write_all(cut_env.as_bytes()).unwrap();
    let mut report = String::new();
    reports.read_line(&mut report).unwrap();
    assert!(report.starts_with("failed "), "{report}");
    assert!(
        !report.contains(secret) && !report.contains("DATABASE"),
        "{report}"
    );
    drop(ours);
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!said.contains(secret), "{said}");

    // After the start: the supervisor says why it kills the program.
    let (child, mut ours, mut reports) = spawn();
    ours.write_all(b"renew 10000\n").unwrap();
    let mut started = String::new();
    reports.read_line(&mut started).unwrap();
    assert!(started.starts_with("started "), "{started}");
    ours.write_all(cut_env.as_bytes()).unwrap();
    let mut ended = String::new();
    reports.read_line(&mut ended).unwrap();
    assert_eq!(ended, "signal 9\n");
    drop(ours);
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("unreadable control line `env …`"), "{said}");
    assert!(
        !said.contains(secret) && !said.contains("DATABASE"),
        "{said}"
    );
}
