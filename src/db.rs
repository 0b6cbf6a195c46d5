//! Connections and migrations. Every pool is built here, so every session
//! carries an `application_name` (the worker id) that `pg_stat_activity` shows,
//! and no URL with a password reaches a log line or an error message. It also
//! owns how statements reach PostgreSQL through PgBouncer in transaction
//! pooling mode ([`set_transaction_pooler`], [`statement`]).
//!
//! Every pool is built here. `connect` connects eagerly for short commands, and `connect_lazy`
//! connects on first use, so a long-running process starts while the database is down.
//! `connect_worker`, which `worker` uses for both its pools, is lazy too and sets
//! `idle_in_transaction_session_timeout` on every session; `src/cli/` passes twice the largest
//! configured `lease_ttl`, at least 10 s. A stopped or wedged process therefore cannot keep a
//! transaction, and the run row lock it holds, open forever and block lease-expiry recovery, which
//! skips locked rows. Every session carries an `application_name`: the worker id for workers and
//! `batchonce-<command>` otherwise. `redact` and `sanitize` keep passwords out of messages.
//! `ENGINE_MIGRATIONS` embeds `migrations/`. `combined` and `migrate` merge the engine's migrations
//! with each job kind's into one version-sorted `Migrator`. `pending_migrations` lists the versions
//! of that set not yet applied successfully (all of them when `_sqlx_migrations` does not exist
//! yet).
//!
//! It also owns how statements reach PostgreSQL through PgBouncer in transaction pooling mode.
//! `set_transaction_pooler(true)` (the global `--pgbouncer` flag) is a process-wide switch, because
//! a process reaches its database one way and threading a flag through every queue call would
//! change every signature. When it is on, `options` turns off sqlx's statement cache and
//! `connect_worker` sends no `idle_in_transaction_session_timeout`; `query`, `query_as` and
//! `query_scalar` build sqlx queries that are named prepared statements only when it is off
//! (through a pooler a named statement outlives its transaction on a server that other clients then
//! get, and the same name collides); and `statement(pool)` gives one statement its own transaction
//! when it is on (sqlx sends a statement as parse-then-sync and bind-execute-then-sync, and a
//! transaction pooler may hand the second exchange to another server; inside a transaction it keeps
//! one), and a plain pooled connection, at no extra cost, when it is off. Every statement of the
//! queue, the worker registry, the producer and the bundled kinds' reads outside a fenced
//! transaction goes through these. `connect_direct_lazy` builds the pool for `--listen-url`, which
//! never goes through a pooler.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::query::{Query, QueryAs, QueryScalar};
use sqlx::{FromRow, PgConnection, PgPool, Postgres, Transaction};

/// The engine's own migrations, embedded in the binary.
pub static ENGINE_MIGRATIONS: Migrator = sqlx::migrate!("./migrations");

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("invalid database URL {url}: {message}")]
    Url { url: String, message: String },
    #[error("cannot connect to {url}: {source}")]
    Connect { url: String, source: sqlx::Error },
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("database error: {0}")]
    Sql(#[from] sqlx::Error),
}

/// Replaces the password of a URL with `***` for display.
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                // Setting a password only fails for URLs that cannot have one.
                let _ = u.set_password(Some("***"));
            }
            // libpq also takes the password as a query parameter.
            if u.query_pairs().any(|(k, _)| k == "password") {
                let pairs: Vec<(String, String)> = u
                    .query_pairs()
                    .map(|(k, v)| {
                        let v = if k == "password" {
                            "***".into()
                        } else {
                            v.into_owned()
                        };
                        (k.into_owned(), v)
                    })
                    .collect();
                u.query_pairs_mut().clear().extend_pairs(pairs);
            }
            u.to_string()
        }
        Err(_) => "<unparseable URL>".to_owned(),
    }
}

/// Whether this process reaches PostgreSQL through a pooler in transaction
/// mode (PgBouncer `pool_mode = transaction`), which hands each transaction
/// to whichever server connection is free. One process talks to its database
/// one way, so this is set once at start (`--pgbouncer`) rather than passed
/// through every call.
static TRANSACTION_POOLER: AtomicBool = AtomicBool::new(false);

/// Declares that every connection of this process goes through a pooler in
/// transaction mode. From then on pools keep no prepared statements and send
/// no session settings, and [`statement`] wraps each statement in its own
/// transaction.
pub fn set_transaction_pooler(on: bool) {
    TRANSACTION_POOLER.store(on, Ordering::Relaxed);
}

/// See [`set_transaction_pooler`].
pub fn transaction_pooler() -> bool {
    TRANSACTION_POOLER.load(Ordering::Relaxed)
}

/// The connection one statement runs on, from [`statement`].
pub enum StatementConn {
    /// Through a transaction pooler: its own transaction, committed by
    /// [`StatementConn::done`].
    Tx(Transaction<'static, Postgres>),
    /// Direct: a pooled connection, the statement commits by itself.
    Conn(PoolConnection<Postgres>),
}

impl StatementConn {
    pub fn conn(&mut self) -> &mut PgConnection {
        match self {
            StatementConn::Tx(tx) => tx,
            StatementConn::Conn(c) => c,
        }
    }

    /// Commits the statement's transaction, if it has one.
    pub async fn done(self) -> Result<(), sqlx::Error> {
        match self {
            StatementConn::Tx(tx) => tx.commit().await,
            StatementConn::Conn(_) => Ok(()),
        }
    }
}

/// A connection for one statement that is not part of a transaction of its
/// own. sqlx sends a statement as two protocol exchanges (parse, then bind
/// and execute, each ending in a Sync), and a transaction pooler may hand
/// the second to another server between them, which then runs another
/// client's statement or none ("unnamed prepared statement does not
/// exist"). Inside an explicit transaction the pooler keeps one server, so
/// through a pooler every such statement gets one; directly, it costs
/// nothing extra.
pub async fn statement(pool: &PgPool) -> Result<StatementConn, sqlx::Error> {
    if transaction_pooler() {
        Ok(StatementConn::Tx(pool.begin().await?))
    } else {
        Ok(StatementConn::Conn(pool.acquire().await?))
    }
}

/// `sqlx::query`, prepared as a named statement that the connection keeps
/// only when this process talks to PostgreSQL directly. Through a
/// transaction pooler a named statement stays on a server connection that
/// other clients then get, where the same name collides ("prepared
/// statement \"sqlx_s_1\" already exists"); there the statement is unnamed
/// and lives only as long as its own transaction ([`statement`]).
pub fn query(sql: &str) -> Query<'_, Postgres, PgArguments> {
    sqlx::query(sql).persistent(!transaction_pooler())
}

/// `sqlx::query_as`, prepared as [`query`] says.
pub fn query_as<'q, O>(sql: &'q str) -> QueryAs<'q, Postgres, O, PgArguments>
where
    O: for<'r> FromRow<'r, PgRow>,
{
    sqlx::query_as(sql).persistent(!transaction_pooler())
}

/// `sqlx::query_scalar`, prepared as [`query`] says.
pub fn query_scalar<'q, O>(sql: &'q str) -> QueryScalar<'q, Postgres, O, PgArguments>
where
    (O,): for<'r> FromRow<'r, PgRow>,
{
    sqlx::query_scalar(sql).persistent(!transaction_pooler())
}

/// Parses a PostgreSQL URL. sqlx reads any URL-shaped text and would start a
/// lazy pool on `foo:bar`, so the scheme is checked here.
fn parse_url(url: &str) -> Result<PgConnectOptions, DbError> {
    let scheme = url.split_once("://").map(|(s, _)| s);
    if !matches!(scheme, Some("postgres" | "postgresql")) {
        return Err(DbError::Url {
            url: redact(url),
            message: "expected postgres://… or postgresql://…".into(),
        });
    }
    PgConnectOptions::from_str(url).map_err(|e| DbError::Url {
        url: redact(url),
        message: sanitize(&e.to_string(), url),
    })
}

/// Parses a URL into connect options tagged with `application_name`.
pub fn options(url: &str, application_name: &str) -> Result<PgConnectOptions, DbError> {
    let opts = parse_url(url)?.application_name(application_name);
    // Named prepared statements live on one server connection, and a
    // transaction pooler moves the client between them: keep none.
    Ok(if transaction_pooler() {
        opts.statement_cache_capacity(0)
    } else {
        // No JIT compilation: every statement of the engine reads a few
        // rows by key, but a generic plan's estimates can pass the JIT
        // thresholds, and compiling then costs 100-200 ms a statement for
        // nothing (`runs list --status SKIPPED` took 230 ms instead of 3,
        // BENCHMARKS.md "A ledger of years"). A transaction pooler refuses
        // startup options, so there it is the server's setting.
        opts.options([("jit", "off")])
    })
}

/// A pool that connects eagerly, so a bad URL or a down server is reported now.
pub async fn connect(url: &str, application_name: &str, max: u32) -> Result<PgPool, DbError> {
    let opts = options(url, application_name)?;
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(opts)
        .await
        .map_err(|source| DbError::Connect {
            url: redact(url),
            source,
        })
}

/// A pool for a worker: like [`connect_lazy`], and a transaction left idle
/// longer than `idle_tx_timeout` (a stopped or wedged process) is ended by the
/// server, so its row locks cannot keep a run from being recovered.
pub fn connect_worker(
    url: &str,
    application_name: &str,
    max: u32,
    idle_tx_timeout: Duration,
) -> Result<PgPool, DbError> {
    let opts = options(url, application_name)?;
    // A transaction pooler refuses session settings in the startup packet;
    // there the pooler's own `idle_transaction_timeout` does this job
    // (README, "Running on several servers").
    let opts = if transaction_pooler() {
        opts
    } else {
        opts.options([(
            "idle_in_transaction_session_timeout",
            format!("{}ms", idle_tx_timeout.as_millis()),
        )])
    };
    Ok(PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(opts))
}

/// A lazy pool to PostgreSQL itself, never through a pooler, whatever
/// [`set_transaction_pooler`] says: for the LISTEN session, which needs a
/// session of its own.
pub fn connect_direct_lazy(url: &str, application_name: &str, max: u32) -> Result<PgPool, DbError> {
    Ok(PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(parse_url(url)?.application_name(application_name)))
}

/// Versions of the engine's and job kinds' migrations not yet applied.
pub async fn pending_migrations(
    pool: &PgPool,
    kinds: &[&'static Migrator],
) -> Result<Vec<i64>, DbError> {
    let applied = applied_versions(pool).await?;
    Ok(combined(kinds)
        .iter()
        .map(|m| m.version)
        .filter(|v| !applied.contains(v))
        .collect())
}

/// What `migrate` applies: the declared kinds' migrations, and those of
/// every other known kind that this database already holds some of. A kind
/// that was migrated once (the samples, before only declared jobs existed)
/// stays migrated and keeps its tables: sqlx refuses a set that lacks an
/// applied migration, and dropping a kind's tables is for a person to do.
pub async fn kinds_to_migrate(
    pool: &PgPool,
    declared: &[&'static Migrator],
    known: &[&'static Migrator],
) -> Result<Vec<&'static Migrator>, DbError> {
    let applied = applied_versions(pool).await?;
    let mut kinds = declared.to_vec();
    for m in known {
        let in_use = m.iter().any(|x| applied.contains(&x.version));
        if in_use && !kinds.iter().any(|k| std::ptr::eq(*k, *m)) {
            kinds.push(m);
        }
    }
    Ok(kinds)
}

/// Versions of the migrations this database has applied (none when it was
/// never migrated).
async fn applied_versions(pool: &PgPool) -> Result<Vec<i64>, DbError> {
    let mut stmt = statement(pool).await?;
    let applied: Vec<i64> = match query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
        .fetch_all(stmt.conn())
        .await
    {
        Ok(v) => {
            stmt.done().await?;
            v
        }
        // 42P01: undefined table, a database that was never migrated.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    Ok(applied)
}

/// A pool that connects on first use: long-running processes start even while
/// the database is down and retry their work instead of exiting.
pub fn connect_lazy(url: &str, application_name: &str, max: u32) -> Result<PgPool, DbError> {
    let opts = options(url, application_name)?;
    Ok(PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(opts))
}

/// Applies the engine's migrations and each job kind's as one ordered set, so
/// sqlx's bookkeeping table validates all of them (a missing or edited
/// migration is an error, never silently skipped).
///
/// A migration that changes a table the previous release's running workers
/// use can lose a deadlock against one of them (a rolling upgrade migrates
/// under running workers). PostgreSQL then rolls that migration back whole,
/// since each runs in one transaction, so the pending migrations are run
/// again, a few times, on a fresh session: the one that failed still holds
/// sqlx's advisory lock, and closing it lets the lock go.
pub async fn migrate(pool: &PgPool, kinds: &[&'static Migrator]) -> Result<(), DbError> {
    accept_reworded(pool).await?;
    let migrator = combined(kinds);
    let mut lost = 0u64;
    loop {
        let mut conn = pool.acquire().await?;
        match migrator.run(&mut *conn).await {
            Ok(()) => return Ok(()),
            Err(e) if lost < 5 && lost_a_deadlock(&e) => {
                lost += 1;
                conn.close_on_drop();
                drop(conn);
                tokio::time::sleep(Duration::from_millis(100 * lost)).await;
            }
            Err(e) => {
                conn.close_on_drop();
                return Err(e.into());
            }
        }
    }
}

/// Released migrations whose text changed since, in whole-line `--`
/// comments only, with the SHA-384 checksum (hex) of the text a database
/// applied. The first named a design note the repository does not hold.
/// A test proves each change is comments only.
const REWORDED: &[(i64, &str)] = &[(
    20260901000001,
    "9c02367fe981dd5768d7b1e1edb97c56390a9fe35170e0f9ce864fa3c70cb3d0098d84b103aed702e65b75ab7a5b42b3",
)];

/// Records the present checksum of each [`REWORDED`] migration in a database
/// that applied its released text, so that sqlx does not refuse it as
/// edited. The SQL such a database ran is the SQL the file holds now; a row
/// with any other checksum is left for sqlx to refuse.
async fn accept_reworded(pool: &PgPool) -> Result<(), DbError> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !exists {
        return Ok(());
    }
    for (version, released) in REWORDED {
        let Some(now) = ENGINE_MIGRATIONS.iter().find(|m| m.version == *version) else {
            continue;
        };
        sqlx::query(
            "UPDATE _sqlx_migrations SET checksum = $1 \
             WHERE version = $2 AND checksum = decode($3, 'hex')",
        )
        .bind(now.checksum.as_ref())
        .bind(version)
        .bind(released)
        .execute(pool)
        .await?;
    }
    Ok(())
}

/// Whether a migration failed because PostgreSQL chose it as a deadlock's
/// victim (SQLSTATE 40P01).
fn lost_a_deadlock(e: &sqlx::migrate::MigrateError) -> bool {
    use sqlx::migrate::MigrateError;
    let inner = match e {
        MigrateError::Execute(e) | MigrateError::ExecuteMigration(e, _) => e,
        _ => return false,
    };
    matches!(inner, sqlx::Error::Database(d) if d.code().as_deref() == Some("40P01"))
}

/// The engine's migrations and the job kinds', sorted by version.
pub fn combined(kinds: &[&'static Migrator]) -> Migrator {
    let mut all: Vec<_> = ENGINE_MIGRATIONS.migrations.iter().cloned().collect();
    for m in kinds {
        all.extend(m.migrations.iter().cloned());
    }
    all.sort_by_key(|m| m.version);
    Migrator {
        migrations: std::borrow::Cow::Owned(all),
        ..Migrator::DEFAULT
    }
}

/// Removes a URL (and so its password) from an error text.
fn sanitize(text: &str, url: &str) -> String {
    text.replace(url, &redact(url))
}

/// The URL of another database on the same server.
pub fn with_database(url: &str, database: &str) -> Result<String, DbError> {
    let mut u = url::Url::parse(url).map_err(|e| DbError::Url {
        url: redact(url),
        message: e.to_string(),
    })?;
    u.set_path(&format!("/{database}"));
    Ok(u.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each reworded migration differs from its released text in whole-line
    /// comments only: with those removed, both hash alike. The hash of the
    /// released text without comments is recorded here.
    #[test]
    fn reworded_migrations_change_comments_only() {
        use sqlx::migrate::{Migration, MigrationType};
        let released_without_comments = [(
            20260901000001_i64,
            "d0226c3ddcca2e58af0ab2d6f5a1d88093435bc7a04ccb7590feebee018902ffa6445cb07f3bfdd831e27cd3dcc3c00c",
        )];
        assert_eq!(released_without_comments.len(), REWORDED.len());
        for (version, expected) in released_without_comments {
            let m = ENGINE_MIGRATIONS
                .iter()
                .find(|m| m.version == version)
                .expect("a reworded migration is still embedded");
            let code: String = m
                .sql
                .split_inclusive('\n')
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect();
            let hashed = Migration::new(
                version,
                "".into(),
                MigrationType::Simple,
                code.into(),
                false,
            );
            let hex: String = hashed.checksum.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(
                hex, expected,
                "migration {version} changed more than its comments"
            );
        }
    }

    #[test]
    fn redacts_passwords() {
        let r = redact("postgres://app:s3cret@db.example:5432/x");
        assert!(!r.contains("s3cret"));
        assert!(r.contains("***"));
        assert_eq!(redact("postgres:///x?host=/tmp"), "postgres:///x?host=/tmp");
        let q = redact("postgres://app@db/x?sslmode=require&password=s3cret");
        assert!(
            !q.contains("s3cret") && q.contains("sslmode=require"),
            "{q}"
        );
    }

    #[test]
    fn only_postgres_urls_are_taken() {
        for bad in [
            "daily-settlement:2026-09-15' OR '1'='1",
            "foo:bar",
            "mysql://h/db",
            "",
        ] {
            let err = options(bad, "t").unwrap_err().to_string();
            assert!(err.starts_with("invalid database URL"), "{bad}: {err}");
        }
        assert!(options("postgresql://u@h:5432/db", "t").is_ok());
        assert!(options("postgres:///db?host=/tmp", "t").is_ok());
    }

    #[test]
    fn swaps_database() {
        assert_eq!(
            with_database("postgres://u:p@h:1/a?sslmode=disable", "b").unwrap(),
            "postgres://u:p@h:1/b?sslmode=disable"
        );
        assert_eq!(
            with_database("postgres:///a?host=/tmp/s", "b").unwrap(),
            "postgres:///b?host=/tmp/s"
        );
    }
}
