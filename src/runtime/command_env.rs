//! What a command job's program receives in its environment (see
//! [`crate::runtime::command`]): a fixed base of the worker's variables
//! ([`BASE_ENV`]), the ones the job names (`pass_env`), its `env` table,
//! the run's own variables, and the URL of `database_url_env`, nothing
//! else, so the worker's secrets stay in the worker. A program run as
//! another user (`run_as_user`) gets that user's `HOME`, `USER` and
//! `LOGNAME`.

use std::collections::BTreeMap;

use crate::config::CommandSpec;
use crate::runtime::isolation::Account;
use crate::runtime::job::JobContext;

/// The variables of the worker's environment that every program receives
/// when the worker has them, besides every `LC_*`: what a program needs to
/// find programs, its home, its locale, its time zone and its temporary
/// folder, and who it runs as. `SHELL` is not among them: the program is
/// run directly, not through a shell; name it in `pass_env` if a program
/// wants it.
pub const BASE_ENV: &[&str] = &[
    "PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "USER", "LOGNAME",
];

/// Why a program's environment cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error(
        "database_url_env names {0}, which is not set (or empty) in the worker's environment; \
         set it to the URL this program connects with"
    )]
    DatabaseUrlUnset(String),
}

/// The worker's environment as the program's is built from: its variables
/// whose name and value are UTF-8 (the control socket carries JSON).
pub fn worker_environment() -> BTreeMap<String, String> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// The run's own variables: its identity, lease token and context.
pub fn run_variables(ctx: &JobContext) -> Vec<(String, String)> {
    let mut vars = vec![
        ("BATCHONCE_JOB_KEY".into(), ctx.key.to_string()),
        ("BATCHONCE_JOB_NAME".into(), ctx.job.to_string()),
        (
            "BATCHONCE_BUSINESS_DATE".into(),
            ctx.business_date.to_string(),
        ),
        ("BATCHONCE_ATTEMPT".into(), ctx.attempt.to_string()),
        ("BATCHONCE_LEASE_TOKEN".into(), ctx.lease_token.to_string()),
        ("BATCHONCE_WORKER_ID".into(), ctx.worker_id.clone()),
        // The run's own context, fixed when it was enqueued.
        (
            "BATCHONCE_TIMEZONE".into(),
            ctx.run.timezone.name().to_owned(),
        ),
        (
            "BATCHONCE_PERIOD_START".into(),
            ctx.run.period_start.to_rfc3339(),
        ),
        (
            "BATCHONCE_PERIOD_END".into(),
            ctx.run.period_end.to_rfc3339(),
        ),
        ("BATCHONCE_PAYLOAD".into(), ctx.payload.to_string()),
        // The rule for the program's fenced transactions (shorter than a
        // third of the lease) needs the lease it runs under.
        (
            "BATCHONCE_LEASE_TTL_MS".into(),
            ctx.run.lease_ttl.as_millis().to_string(),
        ),
        // libpq and node-postgres name their sessions after it, so the
        // program's own sessions count as the worker's in `runs stale`.
        ("PGAPPNAME".into(), ctx.worker_id.clone()),
    ];
    // Which step of the run this is: a partition works on the items for
    // which `batchonce_partition(item_key, BATCHONCE_PARTITIONS)` is
    // BATCHONCE_PARTITION, fenced by this partition's own key and token.
    vars.extend(ctx.step.env().into_iter().map(|(k, v)| (k.to_owned(), v)));
    // A scoped run's scope, the part of its key after `@`: the program
    // works on that scope's items alone. Unset for an unscoped run.
    if let Some(scope) = &ctx.scope {
        vars.push(("BATCHONCE_SCOPE".to_owned(), scope.as_str().to_owned()));
    }
    vars
}

/// The program's whole environment, and nothing else: the [`BASE_ENV`]
/// and `LC_*` variables of the worker's, the ones `pass_env` names, the
/// job's `env` table, the run's variables, and the URL of
/// `database_url_env` as `DATABASE_URL` and `BATCHONCE_DATABASE_URL`. Each
/// later source wins over an earlier one (the configuration refuses the
/// names that would clash with the worker's own). A `pass_env` name the
/// worker does not have is left out, as if unset.
pub fn environment(
    spec: &CommandSpec,
    run: Vec<(String, String)>,
    worker: &BTreeMap<String, String>,
) -> Result<Vec<(String, String)>, EnvError> {
    environment_as(spec, run, worker, None)
}

/// [`environment`] of a program that runs as `account` (`run_as_user`):
/// its `HOME`, `USER` and `LOGNAME` are the account's, not the worker's,
/// and the job's `env` table and the run's variables still win over them.
pub fn environment_as(
    spec: &CommandSpec,
    run: Vec<(String, String)>,
    worker: &BTreeMap<String, String>,
    account: Option<&Account>,
) -> Result<Vec<(String, String)>, EnvError> {
    let mut env = BTreeMap::new();
    for (k, v) in worker {
        if BASE_ENV.contains(&k.as_str()) || k.starts_with("LC_") {
            env.insert(k.clone(), v.clone());
        }
    }
    for name in &spec.pass_env {
        if let Some(v) = worker.get(name) {
            env.insert(name.clone(), v.clone());
        }
    }
    if let Some(a) = account {
        env.extend(a.env());
    }
    env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.extend(run);
    if let Some(var) = &spec.database_url_env {
        let url = worker
            .get(var)
            .filter(|u| !u.trim().is_empty())
            .ok_or_else(|| EnvError::DatabaseUrlUnset(var.clone()))?;
        env.insert("BATCHONCE_DATABASE_URL".into(), url.clone());
        env.insert("DATABASE_URL".into(), url.clone());
    }
    Ok(env.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker() -> BTreeMap<String, String> {
        [
            ("PATH", "/usr/bin:/bin"),
            ("HOME", "/home/batch"),
            ("LANG", "ko_KR.UTF-8"),
            ("LC_TIME", "C"),
            ("TZ", "Asia/Seoul"),
            ("SHELL", "/bin/bash"),
            ("DATABASE_URL", "postgres://worker:worker-pw@db/batch"),
            (
                "BATCHONCE_LISTEN_URL",
                "postgres://worker:listen-pw@db/batch",
            ),
            ("NOTIFY_API_TOKEN", "token-secret"),
            ("NODE_OPTIONS", "--max-old-space-size=512"),
            (
                "INVOICES_DATABASE_URL",
                "postgres://invoices:narrow@db/batch",
            ),
            ("EMPTY_URL", " "),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    #[test]
    fn a_program_gets_the_base_what_is_named_and_the_run_nothing_else() {
        let run = vec![("BATCHONCE_JOB_KEY".to_owned(), "x:2026-09-15".to_owned())];
        let mut spec = CommandSpec::new(vec!["x".into()]);
        let env: BTreeMap<_, _> = environment(&spec, run.clone(), &worker())
            .unwrap()
            .into_iter()
            .collect();
        let names: Vec<&str> = env.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            ["BATCHONCE_JOB_KEY", "HOME", "LANG", "LC_TIME", "PATH", "TZ"]
        );

        spec.pass_env = vec!["NODE_OPTIONS".into(), "HTTPS_PROXY".into()];
        spec.database_url_env = Some("INVOICES_DATABASE_URL".into());
        spec.env.insert("PATH".into(), "/opt/node/bin".into());
        let env: BTreeMap<_, _> = environment(&spec, run.clone(), &worker())
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(env["NODE_OPTIONS"], "--max-old-space-size=512");
        assert!(!env.contains_key("HTTPS_PROXY"), "not set in the worker");
        assert_eq!(env["PATH"], "/opt/node/bin", "the env table wins");
        for var in ["DATABASE_URL", "BATCHONCE_DATABASE_URL"] {
            assert_eq!(env[var], "postgres://invoices:narrow@db/batch");
        }
        let all = format!("{env:?}");
        for secret in ["worker-pw", "listen-pw", "token-secret", "SHELL"] {
            assert!(!all.contains(secret), "{secret} reached the program");
        }

        for unset in ["NO_SUCH_VARIABLE", "EMPTY_URL"] {
            spec.database_url_env = Some(unset.into());
            let e = environment(&spec, run.clone(), &worker()).unwrap_err();
            assert_eq!(e, EnvError::DatabaseUrlUnset(unset.into()));
            assert!(e
                .to_string()
                .contains(&format!("database_url_env names {unset}")));
        }
    }

    #[test]
    fn a_program_run_as_another_user_gets_its_home_and_names() {
        use crate::runtime::isolation::Switch;
        use nix::unistd::{Gid, Uid};
        let account = Account {
            name: "nobody".into(),
            home: "/nonexistent".into(),
            switch: Switch {
                uid: Uid::from_raw(65534),
                gid: Gid::from_raw(65534),
                groups: vec![],
            },
        };
        let mut spec = CommandSpec::new(vec!["x".into()]);
        let env: BTreeMap<_, _> = environment_as(&spec, vec![], &worker(), Some(&account))
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(env["HOME"], "/nonexistent");
        assert_eq!(env["USER"], "nobody");
        assert_eq!(env["LOGNAME"], "nobody");
        assert_eq!(env["PATH"], "/usr/bin:/bin");
        spec.env.insert("HOME".into(), "/srv/jobs".into());
        let env: BTreeMap<_, _> = environment_as(&spec, vec![], &worker(), Some(&account))
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(env["HOME"], "/srv/jobs", "the env table wins");
    }
}
