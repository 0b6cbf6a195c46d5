//! What a command job's program receives of the worker's environment
//! (issue 16, item 1): a worker that holds secrets (a token, a LISTEN URL
//! with its password, its own `DATABASE_URL`) runs programs that dump their
//! environment and their supervisor's. Only the fixed base, the run's
//! variables, the job's `env` table, the names in `pass_env` and the URL of
//! `database_url_env` arrive; the supervisor has no environment at all; the
//! worker's log never carries a value of the program's environment; and a
//! `database_url_env` the worker does not have fails the run with a reason.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use batchonce::testing::{wait_for_status, TestDb};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");

const TOKEN: &str = "tok-3f9a-never-in-a-program";
const LISTEN_PASSWORD: &str = "listen-pw-never-in-a-program";
/// The narrower URL operators give the program (not used to connect here).
const PROGRAM_URL: &str = "postgres://invoices_program:narrow-pw-7c1e@db.internal/batch";

fn scratch(name: &str) -> PathBuf {
    batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), name)
}

/// `NAME=value` lines of a dump, as a map (values may not hold newlines
/// here: every value of this test is one line).
fn vars(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[tokio::test]
async fn a_program_receives_only_what_the_configuration_names() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let dir = scratch("cmd-env-boundary");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    // Dumps the program's environment and its supervisor's (its parent),
    // without a shell in between for the latter: /proc as it is.
    let dump = |name: &str| {
        format!(
            "env > \\\"$OUT/{name}.env\\\"; tr '\\\\000' '\\\\n' < /proc/$PPID/environ > \\\"$OUT/{name}.supervisor\\\""
        )
    };
    let cfg = dir.join("batchonce.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[jobs.env-named]
command = ["sh", "-c", "{named}"]
env = {{ OUT = "{out}", EXTRA = "from the table" }}
pass_env = ["PASSED_ON", "NOT_SET_ANYWHERE"]
database_url_env = "PROGRAM_DATABASE_URL"

[jobs.env-bare]
command = ["sh", "-c", "{bare}"]
env = {{ OUT = "{out}" }}

[jobs.env-no-url]
command = ["sh", "-c", "echo must not run > \"$OUT/no-url.ran\""]
env = {{ OUT = "{out}" }}
database_url_env = "NOT_SET_IN_THE_WORKER"
max_attempts = 3
"#,
            named = dump("named"),
            bare = dump("bare"),
            out = out.display(),
        ),
    )
    .unwrap();
    let base = || {
        let mut c = Command::new(BIN);
        c.env("DATABASE_URL", &db.url)
            .env_remove("BATCHONCE_CONFIG")
            .arg("--config")
            .arg(&cfg);
        c
    };
    for job in ["env-named", "env-bare", "env-no-url"] {
        let o = base()
            .args(["enqueue", job, "--date", "2026-09-15"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    // LISTEN on a URL with a password (the test cluster trusts local
    // logins, so any password connects).
    let mut listen = url::Url::parse(&db.url).unwrap();
    listen.set_password(Some(LISTEN_PASSWORD)).unwrap();
    let log = dir.join("worker.log");
    let mut worker = base()
        .env("RUST_LOG", "info")
        .env("SECRET_TOKEN", TOKEN)
        .env("BATCHONCE_LISTEN_URL", listen.as_str())
        .env("PROGRAM_DATABASE_URL", PROGRAM_URL)
        .env("PASSED_ON", "passed on as is")
        .env("LANG", "C.UTF-8")
        .env("LC_TIME", "C")
        .env("SHELL", "/bin/bash")
        .args(["--log-format", "json", "worker", "--worker-id", "w-env"])
        .args(["--poll-interval", "200ms", "--metrics-addr", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    for key in ["env-named", "env-bare", "env-no-url"] {
        wait_for_status(
            &db.pool,
            Some(&format!("{key}:2026-09-15")),
            &["SUCCEEDED", "FAILED"],
            Duration::from_secs(60),
        )
        .await;
    }
    let _ = kill(Pid::from_raw(worker.id() as i32), Signal::SIGTERM);
    assert!(worker.wait().unwrap().success());

    let named = vars(&out.join("named.env"));
    let bare = vars(&out.join("bare.env"));
    // What the configuration names arrives.
    assert_eq!(named["DATABASE_URL"], PROGRAM_URL);
    assert_eq!(named["BATCHONCE_DATABASE_URL"], PROGRAM_URL);
    assert_eq!(named["PASSED_ON"], "passed on as is");
    assert_eq!(named["EXTRA"], "from the table");
    assert!(!named.contains_key("NOT_SET_ANYWHERE"));
    // The base and the run's variables arrive for every job.
    for env in [&named, &bare] {
        assert_eq!(env["LANG"], "C.UTF-8");
        assert_eq!(env["LC_TIME"], "C");
        assert!(env.contains_key("PATH"), "{env:?}");
        assert_eq!(env["BATCHONCE_WORKER_ID"], "w-env");
        assert!(env["BATCHONCE_LEASE_TOKEN"].parse::<i64>().is_ok());
        // The program's own sessions carry the worker's name, so they count
        // as evidence in `runs stale`.
        assert_eq!(env["PGAPPNAME"], "w-env");
    }
    // Without database_url_env, no URL at all.
    assert!(!bare.contains_key("DATABASE_URL"), "{bare:?}");
    assert!(!bare.contains_key("BATCHONCE_DATABASE_URL"), "{bare:?}");
    // Nothing else: every name is accounted for (the shell adds PWD).
    let named_keys = ["OUT", "EXTRA", "PASSED_ON", "DATABASE_URL"];
    for (job, env) in [("named", &named), ("bare", &bare)] {
        for name in env.keys() {
            let allowed = batchonce::runtime::command::BASE_ENV.contains(&name.as_str())
                || name.starts_with("LC_")
                || name.starts_with("BATCHONCE_")
                || name == "PWD"
                || name == "PGAPPNAME"
                || named_keys.contains(&name.as_str());
            assert!(allowed, "{job}: {name} reached the program");
        }
        let text = format!("{env:?}");
        for secret in [TOKEN, LISTEN_PASSWORD, &db.url, "SHELL", "CARGO"] {
            assert!(
                !text.contains(secret),
                "{job}: {secret} reached the program"
            );
        }
    }
    // The supervisor holds nothing of the worker's.
    for job in ["named", "bare"] {
        let sup = std::fs::read_to_string(out.join(format!("{job}.supervisor"))).unwrap();
        assert_eq!(sup.trim(), "", "{job}: the supervisor's environment");
    }
    // An unset database_url_env fails the run at once, saying why, and the
    // program never runs.
    let (status, attempts, error): (String, i32, Option<String>) = sqlx::query_as(
        "SELECT status, attempts, error_message FROM batch_job_run WHERE job_key = $1",
    )
    .bind("env-no-url:2026-09-15")
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((status.as_str(), attempts), ("FAILED", 1));
    let error = error.unwrap();
    assert!(
        error.contains("database_url_env names NOT_SET_IN_THE_WORKER, which is not set"),
        "{error}"
    );
    assert!(!out.join("no-url.ran").exists());
    // The worker's log never carries a value of a program's environment
    // (the control line that sends it included).
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("command started"), "{log}");
    for secret in [TOKEN, LISTEN_PASSWORD, "narrow-pw-7c1e", "passed on as is"] {
        assert!(!log.contains(secret), "{secret} in the worker's log");
    }
}

#[test]
fn a_bad_pass_env_or_database_url_env_is_one_config_error() {
    let dir = scratch("cmd-env-bad");
    for (text, want) in [
        (
            "pass_env = \"NODE_OPTIONS\"",
            "`jobs.x.pass_env`: expected an array of variable names",
        ),
        (
            "pass_env = [\"NODE OPTIONS\"]",
            "`jobs.x.pass_env`: \"NODE OPTIONS\" is not a variable name",
        ),
        (
            "pass_env = [\"DATABASE_URL\"]",
            "`jobs.x.pass_env`: DATABASE_URL is set by the worker",
        ),
        (
            "database_url_env = \"postgres://u:pw@db/x\"",
            "`jobs.x.database_url_env`: \"postgres://u:pw@db/x\" is not a variable name",
        ),
        (
            "database_url_env = true",
            "`jobs.x.database_url_env`: expected a string",
        ),
    ] {
        common::config_refused(
            BIN,
            &dir,
            &format!("[jobs.x]\ncommand = [\"true\"]\n{text}\n"),
            &["enqueue", "x", "--date", "2026-09-15"],
            want,
        );
    }
}
