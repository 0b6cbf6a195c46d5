//! One real login per role of `batchonce roles`, for the tests that act as
//! a stolen login would: the roles applied before and after `migrate`,
//! `migrate` run by the migrator (which then owns every table and
//! function), and a password login in each group role.

use std::process::{Command, Output, Stdio};

use batchonce::testing::TestDb;

const PARTS: [&str; 7] = [
    "migrator", "producer", "worker", "operator", "readonly", "program", "console",
];

/// The logins of one database: `url("worker")` logs in as the worker role.
pub struct Logins {
    pub prefix: String,
    password: String,
    base: String,
}

impl Logins {
    /// Creates the roles under a random prefix, lets each log in, migrates
    /// as the migrator with `config` and applies the roles again, as
    /// docs/security.md tells an administrator to.
    pub async fn apply(bin: &str, db: &TestDb, config: &std::path::Path) -> Self {
        let prefix = format!("bo_t{:08x}", rand::random::<u32>());
        // Alphanumeric, so it needs no quoting in SQL or in a URL.
        let password = format!(
            "pw{:016x}{:016x}",
            rand::random::<u64>(),
            rand::random::<u64>()
        );
        let logins = Self {
            prefix,
            password,
            base: db.url.clone(),
        };
        ok(run(bin, &db.url, config, &logins.roles_args()));
        for part in PARTS {
            sqlx::query(&format!(
                "ALTER ROLE {} LOGIN PASSWORD '{}'",
                logins.role(part),
                logins.password
            ))
            .execute(&db.pool)
            .await
            .unwrap();
        }
        ok(run(bin, &logins.url("migrator"), config, &["migrate"]));
        ok(run(bin, &db.url, config, &logins.roles_args()));
        logins
    }

    fn roles_args(&self) -> Vec<&str> {
        vec!["roles", "--prefix", &self.prefix, "--apply"]
    }

    /// The group role `<prefix>_<part>`.
    pub fn role(&self, part: &str) -> String {
        format!("{}_{part}", self.prefix)
    }

    /// The URL of the database as the login of `part`.
    pub fn url(&self, part: &str) -> String {
        let mut u = url::Url::parse(&self.base).unwrap();
        u.set_username(&self.role(part)).unwrap();
        u.set_password(Some(&self.password)).unwrap();
        u.to_string()
    }

    /// A pool of one connection as the login of `part`.
    pub async fn pool(&self, part: &str) -> sqlx::PgPool {
        batchonce::db::connect(&self.url(part), "stolen-login-test", 1)
            .await
            .unwrap()
    }
}

fn ok(out: Output) {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `bin args` with `url` as its database and `config` as its file.
pub fn run(bin: &str, url: &str, config: &std::path::Path, args: &[&str]) -> Output {
    Command::new(bin)
        .env("DATABASE_URL", url)
        .env("BATCHONCE_CONFIG", config)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}
