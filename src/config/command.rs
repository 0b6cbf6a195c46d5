//! The keys of a command job (`command = [...]`, see [`crate::runtime::command`]):
//! how its program runs, and what of the worker's environment it receives.
//! A program gets no variable of the worker's by default besides a small
//! fixed base (see [`crate::runtime::command::BASE_ENV`]): `pass_env` names the
//! others it needs, and `database_url_env` names the variable that holds
//! the URL the program connects with, so that a program never gets the
//! worker's own credentials by accident.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::value::{as_duration, as_int, as_str};
use super::JobConfig;

/// How a command job runs its program (see [`crate::runtime::command`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSpec {
    /// The program and its arguments; run directly, not through a shell.
    /// A non-empty array of strings, at most 64 KiB in all, without NUL,
    /// the first not blank.
    pub argv: Vec<String>,
    /// Longest an attempt may run before its process group is stopped.
    pub timeout: Duration,
    /// After SIGTERM (shutdown, timeout), how long before SIGKILL.
    pub kill_grace: Duration,
    /// Working directory; the worker's own when unset.
    pub working_dir: Option<PathBuf>,
    /// Extra environment variables: names of letters, digits and `_` not
    /// starting with a digit, never `BATCHONCE_*` or `DATABASE_URL`;
    /// values at most 64 KiB.
    pub env: BTreeMap<String, String>,
    /// Variables of the worker's environment passed on to the program as
    /// they are (when the worker has them), besides the fixed base.
    pub pass_env: Vec<String>,
    /// The variable of the worker's environment whose value the program
    /// gets as `DATABASE_URL` and `BATCHONCE_DATABASE_URL`; without it the
    /// program gets no database URL.
    pub database_url_env: Option<String>,
    /// The exit code that means "nothing to do": the run is SKIPPED.
    pub skipped_exit_code: i32,
    /// Exit codes that fail the run at once instead of retrying.
    pub fatal_exit_codes: Vec<i32>,
    /// The user the program runs as instead of the worker's (see
    /// [`crate::runtime::isolation`]); checked as a name here, resolved on
    /// the worker's host when the program starts.
    pub run_as_user: Option<String>,
    /// The group the program runs as instead of the user's primary group;
    /// only with `run_as_user`.
    pub run_as_group: Option<String>,
}

impl CommandSpec {
    /// The defaults of every command key: timeout 1 h (at most 7 d),
    /// `kill_grace` 10 s (at most `timeout`), exit code 3 for a skip and
    /// `[2, 126, 127]` fatal.
    pub fn new(argv: Vec<String>) -> Self {
        Self {
            argv,
            timeout: Duration::from_secs(3600),
            kill_grace: Duration::from_secs(10),
            working_dir: None,
            env: BTreeMap::new(),
            pass_env: Vec::new(),
            database_url_env: None,
            skipped_exit_code: 3,
            fatal_exit_codes: vec![2, 126, 127],
            run_as_user: None,
            run_as_group: None,
        }
    }
}

/// Keys only a command job takes.
pub(super) const COMMAND_KEYS: &[&str] = &[
    "timeout",
    "kill_grace",
    "working_dir",
    "env",
    "pass_env",
    "database_url_env",
    "skipped_exit_code",
    "fatal_exit_codes",
    "run_as_user",
    "run_as_group",
];

/// Longest command line (program and arguments, in bytes).
const MAX_COMMAND_BYTES: usize = 64 * 1024;

/// Most names in `pass_env`.
const MAX_PASS_ENV: usize = 100;

/// Whether `name` can be an environment variable's name as a shell writes
/// it: letters, digits and `_`, not starting with a digit, at most 256.
pub fn is_variable_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 256
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

/// The variables the worker itself sets for the program: no `env` entry or
/// `pass_env` name may stand in for them.
fn set_by_the_worker(name: &str) -> bool {
    name.starts_with("BATCHONCE_") || name == "DATABASE_URL"
}

/// Whether `name` can be a user or group name on every system batchonce
/// runs on: 1 to 32 ASCII letters, digits, `_`, `-` and `.`, starting with
/// a letter or `_` (so never a number, nor an option).
pub fn is_account_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

fn account_name(value: &toml::Value, what: &str) -> Result<String, String> {
    let name = as_str(value)?;
    if is_account_name(name) {
        Ok(name.to_owned())
    } else {
        Err(format!(
            "{:?} is not a {what} name (1 to 32 letters, digits, _, - or ., starting with a \
             letter or _)",
            crate::text::truncate(name)
        ))
    }
}

fn variable_name(name: &str) -> Result<(), String> {
    if is_variable_name(name) {
        Ok(())
    } else {
        Err(format!(
            "{:?} is not a variable name (letters, digits and _, not starting with a digit)",
            crate::text::truncate(name)
        ))
    }
}

/// The keys that shape how a command job runs its program.
pub(super) fn apply_command_keys(
    cfg: &mut JobConfig,
    fields: &toml::Table,
    path: &str,
) -> Result<(), (String, String)> {
    let Some(spec) = cfg.command.as_mut() else {
        if let Some(k) = COMMAND_KEYS.iter().find(|k| fields.contains_key(**k)) {
            return Err((
                format!("{path}.{k}"),
                "only a command job (one with `command = [...]`) takes this key".into(),
            ));
        }
        return Ok(());
    };
    for (key, value) in fields {
        let full = format!("{path}.{key}");
        let err = |m: String| (full.clone(), m);
        match key.as_str() {
            "timeout" => spec.timeout = as_duration(value).map_err(err)?,
            "kill_grace" => spec.kill_grace = as_duration(value).map_err(err)?,
            "working_dir" => {
                let s = as_str(value).map_err(err)?;
                if s.is_empty() || s.contains('\0') {
                    return Err(err("must be a non-empty path without NUL bytes".into()));
                }
                spec.working_dir = Some(PathBuf::from(s));
            }
            "env" => {
                let table = value.as_table().ok_or_else(|| {
                    err(format!(
                        "expected a table of NAME = \"value\" pairs, found {}",
                        value.type_str()
                    ))
                })?;
                for (name, v) in table {
                    variable_name(name).map_err(err)?;
                    if set_by_the_worker(name) {
                        return Err(err(format!(
                            "{name} is set by the worker and cannot be overridden{}",
                            if name.ends_with("DATABASE_URL") {
                                " (name the variable that holds the program's URL with database_url_env)"
                            } else {
                                ""
                            }
                        )));
                    }
                    let v = as_str(v).map_err(|m| (format!("{full}.{name}"), m))?;
                    if v.contains('\0') || v.len() > MAX_COMMAND_BYTES {
                        return Err((
                            format!("{full}.{name}"),
                            "must hold no NUL byte and at most 64 KiB".into(),
                        ));
                    }
                    spec.env.insert(name.clone(), v.to_owned());
                }
            }
            "pass_env" => spec.pass_env = as_pass_env(value).map_err(err)?,
            "database_url_env" => {
                let name = as_str(value).map_err(err)?;
                variable_name(name).map_err(err)?;
                spec.database_url_env = Some(name.to_owned());
            }
            "run_as_user" => spec.run_as_user = Some(account_name(value, "user").map_err(err)?),
            "run_as_group" => spec.run_as_group = Some(account_name(value, "group").map_err(err)?),
            "skipped_exit_code" => {
                spec.skipped_exit_code = as_int(value, 1, 255).map_err(err)? as i32
            }
            "fatal_exit_codes" => {
                let list = value.as_array().ok_or_else(|| {
                    err(format!(
                        "expected an array of exit codes, found {}",
                        value.type_str()
                    ))
                })?;
                spec.fatal_exit_codes = list
                    .iter()
                    .map(|v| as_int(v, 1, 255).map(|n| n as i32))
                    .collect::<Result<_, _>>()
                    .map_err(err)?;
            }
            _ => {}
        }
    }
    if let Some(name) = spec.pass_env.iter().find(|n| spec.env.contains_key(*n)) {
        return Err((
            format!("{path}.pass_env"),
            format!("{name} is also in env; give it one way only"),
        ));
    }
    if spec.run_as_group.is_some() && spec.run_as_user.is_none() {
        return Err((
            format!("{path}.run_as_group"),
            "only with run_as_user: name the user the program runs as".into(),
        ));
    }
    if spec.fatal_exit_codes.contains(&spec.skipped_exit_code) {
        return Err((
            format!("{path}.skipped_exit_code"),
            format!(
                "{} is also in fatal_exit_codes; an exit code means one thing",
                spec.skipped_exit_code
            ),
        ));
    }
    if spec.timeout > Duration::from_secs(7 * 86_400) {
        return Err((format!("{path}.timeout"), "must be at most 7d".into()));
    }
    if spec.kill_grace > spec.timeout {
        return Err((
            format!("{path}.kill_grace"),
            "must not be longer than timeout".into(),
        ));
    }
    Ok(())
}

/// `pass_env = ["NODE_OPTIONS", "HTTPS_PROXY"]`: distinct variable names,
/// none of those the worker sets itself.
fn as_pass_env(v: &toml::Value) -> Result<Vec<String>, String> {
    let list = v.as_array().ok_or_else(|| {
        format!(
            "expected an array of variable names such as [\"NODE_OPTIONS\"], found {}",
            v.type_str()
        )
    })?;
    if list.len() > MAX_PASS_ENV {
        return Err(format!("names at most {MAX_PASS_ENV} variables"));
    }
    let mut names: Vec<String> = Vec::with_capacity(list.len());
    for item in list {
        let name = as_str(item)?;
        variable_name(name)?;
        if set_by_the_worker(name) {
            return Err(format!(
                "{name} is set by the worker, not passed on{}",
                if name.ends_with("DATABASE_URL") {
                    ": name the variable that holds the program's URL with database_url_env"
                } else {
                    ""
                }
            ));
        }
        if names.iter().any(|n| n == name) {
            return Err(format!("{name} is named twice"));
        }
        names.push(name.to_owned());
    }
    Ok(names)
}

/// `command = ["program", "arg", ...]`: a non-empty array of strings.
pub(super) fn as_argv(v: &toml::Value) -> Result<Vec<String>, String> {
    let list = v.as_array().ok_or_else(|| {
        format!(
            "expected an array such as [\"node\", \"settle.js\"], found {}",
            v.type_str()
        )
    })?;
    let argv: Vec<String> = list
        .iter()
        .map(|a| as_str(a).map(str::to_owned))
        .collect::<Result<_, _>>()?;
    match argv.first() {
        None => return Err("must name a program: the array is empty".into()),
        Some(p) if p.trim().is_empty() => return Err("the program name is empty".into()),
        _ => {}
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err("arguments cannot contain NUL bytes".into());
    }
    if argv.iter().map(String::len).sum::<usize>() > MAX_COMMAND_BYTES {
        return Err("the command line is longer than 64 KiB".into());
    }
    Ok(argv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{err, kinds};
    use crate::config::Config;
    use crate::key::JobName;

    #[test]
    fn command_jobs_are_declared_in_the_file() {
        let c = Config::parse(
            r#"
[jobs.nightly-invoices]
command = ["node", "invoices.js", "--all"]
timezone = "Asia/Seoul"
schedule = "30 2 * * *"
covers = "previous-day"
timeout = "20m"
kill_grace = "5s"
working_dir = "/srv/invoices"
skipped_exit_code = 10
fatal_exit_codes = [2, 64]
env = { NODE_ENV = "production" }
"#,
            "t.toml",
            &kinds(),
        )
        .unwrap();
        let j = c.job(&JobName::parse("nightly-invoices").unwrap()).unwrap();
        let spec = j.command.as_ref().unwrap();
        assert_eq!(spec.argv, ["node", "invoices.js", "--all"]);
        assert_eq!(spec.timeout, Duration::from_secs(1200));
        assert_eq!(spec.kill_grace, Duration::from_secs(5));
        assert_eq!(spec.skipped_exit_code, 10);
        assert_eq!(spec.fatal_exit_codes, [2, 64]);
        assert_eq!(spec.env["NODE_ENV"], "production");
        assert_eq!(j.timezone, chrono_tz::Asia::Seoul);
        // Defaults.
        let c = Config::parse("[jobs.x]\ncommand = [\"true\"]\n", "t.toml", &kinds()).unwrap();
        let spec = c.jobs[&JobName::parse("x").unwrap()]
            .command
            .clone()
            .unwrap();
        assert_eq!(spec, CommandSpec::new(vec!["true".into()]));
        assert_eq!(spec.skipped_exit_code, 3);
    }

    #[test]
    fn command_job_errors_name_the_key() {
        assert!(err("[jobs.x]\ncommand = \"node settle.js\"")
            .contains("`jobs.x.command`: expected an array"));
        assert!(err("[jobs.x]\ncommand = []").contains("`jobs.x.command`: must name a program"));
        assert!(err("[jobs.x]\ncommand = [\" \"]").contains("program name is empty"));
        assert!(err("[jobs.x]\ncommand = [\"a\\u0000b\"]").contains("NUL"));
        assert!(err("[jobs.x]\ncommand = [1]").contains("expected a string"));
        let long = format!("[jobs.x]\ncommand = [\"{}\"]", "a".repeat(70_000));
        assert!(err(&long).contains("longer than 64 KiB"));
        assert!(err("[jobs.daily-settlement]\ncommand = [\"true\"]")
            .contains("`jobs.daily-settlement.command`: daily-settlement is a built-in job kind"));
        assert!(err("[jobs.daily-settlement]\ntimeout = \"5m\"")
            .contains("`jobs.daily-settlement.timeout`: only a command job"));
        assert!(err("[jobs.x]\ntimeout = \"5m\"").contains("`jobs.x`: unknown job"));
        assert!(err("[jobs.x]\ntimeout = \"5m\"").contains("needs `command = [...]`"));
        assert!(err("[jobs.x]\ncommand = [\"true\"]\ntimeout = \"soon\"")
            .contains("`jobs.x.timeout`: invalid duration"));
        assert!(
            err("[jobs.x]\ncommand = [\"true\"]\ntimeout = \"1s\"\nkill_grace = \"5s\"")
                .contains("`jobs.x.kill_grace`: must not be longer than timeout")
        );
        assert!(err("[jobs.x]\ncommand = [\"true\"]\nskipped_exit_code = 0")
            .contains("`jobs.x.skipped_exit_code`: 0 is out of range"));
        assert!(err("[jobs.x]\ncommand = [\"true\"]\nskipped_exit_code = 2")
            .contains("also in fatal_exit_codes"));
        assert!(
            err("[jobs.x]\ncommand = [\"true\"]\nfatal_exit_codes = [300]")
                .contains("`jobs.x.fatal_exit_codes`: 300 is out of range")
        );
        assert!(
            err("[jobs.x]\ncommand = [\"true\"]\nenv = { \"A B\" = \"1\" }")
                .contains("not a variable name")
        );
        assert!(
            err("[jobs.x]\ncommand = [\"true\"]\nenv = { BATCHONCE_JOB_KEY = \"k\" }")
                .contains("set by the worker")
        );
        assert!(err("[jobs.x]\ncommand = [\"true\"]\nenv = { A = 1 }")
            .contains("`jobs.x.env.A`: expected a string"));
        assert!(err("[jobs.x]\ncommand = [\"true\"]\ncolour = 1")
            .contains("`jobs.x.colour`: unknown key (expected one of:"));
        assert!(err("[jobs.\"bad name!\"]\ncommand = [\"true\"]").contains("`jobs.bad name!`"));
        assert!(
            err("[jobs.x]\ncommand = [\"true\"]\nmax_item_failures = -1")
                .contains("`jobs.x.max_item_failures`: -1 is out of range")
        );
        assert!(!err("[jobs.x]\ncommand = []").contains('\n'));
    }

    #[test]
    fn pass_env_and_database_url_env_name_variables_of_the_worker() {
        let c = Config::parse(
            "[jobs.x]\ncommand = [\"true\"]\npass_env = [\"NODE_OPTIONS\", \"HTTPS_PROXY\"]\n\
             database_url_env = \"INVOICES_DATABASE_URL\"\n",
            "t.toml",
            &kinds(),
        )
        .unwrap();
        let spec = c.jobs[&JobName::parse("x").unwrap()]
            .command
            .clone()
            .unwrap();
        assert_eq!(spec.pass_env, ["NODE_OPTIONS", "HTTPS_PROXY"]);
        assert_eq!(
            spec.database_url_env.as_deref(),
            Some("INVOICES_DATABASE_URL")
        );
        let cmd = "[jobs.x]\ncommand = [\"true\"]\n";
        for (text, want) in [
            (
                "pass_env = \"NODE_OPTIONS\"",
                "`jobs.x.pass_env`: expected an array of variable names",
            ),
            (
                "pass_env = [\"A B\"]",
                "`jobs.x.pass_env`: \"A B\" is not a variable name",
            ),
            ("pass_env = [\"1X\"]", "is not a variable name"),
            ("pass_env = [\"\"]", "is not a variable name"),
            ("pass_env = [3]", "`jobs.x.pass_env`: expected a string"),
            (
                "pass_env = [\"DATABASE_URL\"]",
                "`jobs.x.pass_env`: DATABASE_URL is set by the worker, not passed on: name the variable",
            ),
            (
                "pass_env = [\"BATCHONCE_LISTEN_URL\"]",
                "BATCHONCE_LISTEN_URL is set by the worker",
            ),
            ("pass_env = [\"A\", \"A\"]", "A is named twice"),
            (
                "pass_env = [\"A\"]\nenv = { A = \"1\" }",
                "`jobs.x.pass_env`: A is also in env",
            ),
            (
                "database_url_env = \"A B\"",
                "`jobs.x.database_url_env`: \"A B\" is not a variable name",
            ),
            (
                "database_url_env = [\"X\"]",
                "`jobs.x.database_url_env`: expected a string",
            ),
            ("database_url_env = \"\"", "is not a variable name"),
            (
                "env = { DATABASE_URL = \"postgres://x\" }",
                "name the variable that holds the program's URL with database_url_env",
            ),
        ] {
            let e = err(&format!("{cmd}{text}\n"));
            assert!(e.contains(want), "{text}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let many: Vec<String> = (0..101).map(|i| format!("\"V{i}\"")).collect();
        assert!(err(&format!("{cmd}pass_env = [{}]\n", many.join(", "))).contains("at most 100"));
        assert!(err("[jobs.daily-settlement]\npass_env = [\"A\"]")
            .contains("`jobs.daily-settlement.pass_env`: only a command job"));
    }

    #[test]
    fn run_as_user_and_group_are_account_names() {
        let c = Config::parse(
            "[jobs.x]\ncommand = [\"true\"]\nrun_as_user = \"batch-jobs\"\nrun_as_group = \"_jobs.1\"\n",
            "t.toml",
            &kinds(),
        )
        .unwrap();
        let spec = c.jobs[&JobName::parse("x").unwrap()]
            .command
            .clone()
            .unwrap();
        assert_eq!(spec.run_as_user.as_deref(), Some("batch-jobs"));
        assert_eq!(spec.run_as_group.as_deref(), Some("_jobs.1"));
        let cmd = "[jobs.x]\ncommand = [\"true\"]\n";
        let long = format!("run_as_user = \"{}\"", "a".repeat(33));
        for (text, want) in [
            (
                "run_as_user = \"bad name!\"",
                "`jobs.x.run_as_user`: \"bad name!\" is not a user name",
            ),
            ("run_as_user = \"\"", "is not a user name"),
            ("run_as_user = \"1000\"", "is not a user name"),
            ("run_as_user = \"-n\"", "is not a user name"),
            ("run_as_user = \"a/b\"", "is not a user name"),
            (long.as_str(), "is not a user name"),
            (
                "run_as_user = 65534",
                "`jobs.x.run_as_user`: expected a string",
            ),
            (
                "run_as_user = \"nobody\"\nrun_as_group = \"x y\"",
                "`jobs.x.run_as_group`: \"x y\" is not a group name",
            ),
            (
                "run_as_group = \"nogroup\"",
                "`jobs.x.run_as_group`: only with run_as_user",
            ),
        ] {
            let e = err(&format!("{cmd}{text}\n"));
            assert!(e.contains(want), "{text}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        assert!(err("[jobs.daily-settlement]\nrun_as_user = \"nobody\"")
            .contains("`jobs.daily-settlement.run_as_user`: only a command job"));
    }
}
