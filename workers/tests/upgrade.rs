//! The rolling upgrade, with real processes of both releases: the previous
//! release's `batchonce` (0.1.0: the version and commit pinned in `.ci/previous-release`) and
//! this one's, on one database, as during a deploy.
//!
//! The database starts on the previous release's schema with one of its
//! workers mid-run; this release's `migrate` runs under that worker (the
//! deploy's first step). Then the previous release's producer and `enqueue`
//! insert runs without a context into the new schema, a fleet of one worker
//! of each release settles them, each release's worker is SIGKILLed
//! mid-run in turn so the other release takes its run over, and both
//! releases' inspection commands read the result. Last comes the contract
//! (`migrate --contract`): refused, naming it, while a worker of the previous
//! release runs; done once it has stopped; then this release's worker settles
//! a new run without the dropped functions. The check at the end is
//! written here, not taken from production code: every run SUCCEEDED, every
//! order settled exactly once under its own date with totals equal to the
//! source, every item written under an open attempt of its own run, every
//! run a process of this release touched carrying a context frozen from the
//! configuration, and no schema error in any log.
//!
//! `cargo test -p batchonce-workers --test upgrade`. The previous binary is
//! `BATCHONCE_PREVIOUS_BIN`, or is built once by `.ci/build-previous-release`
//! (cached under target/previous-release/; the first build takes minutes,
//! which is why `.ci/run` builds it before `cargo test`). Under CI a missing
//! prerequisite (git, the pinned commit) fails the test; elsewhere it skips.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use batchonce::testing::TestDb;
use chrono::NaiveDate;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sqlx::PgPool;

mod common;

const NEW: &str = env!("CARGO_BIN_EXE_batchonce");
const JOB: &str = "daily-settlement";
/// Orders per business date: at 20 orders a chunk and a 50 ms pause, a run
/// takes several seconds, long enough to act while it is mid-way.
const ORDERS: i64 = 1_200;
/// Items a run must have written under its current token before we call it
/// mid-run: three chunks, each committed through the holder's fence.
const MID_RUN: i64 = 60;
/// At most this many, so that ten chunks (half a second and more) are left
/// and a SIGKILL sent now lands before the run finishes.
const MID_RUN_MAX: i64 = ORDERS - 200;

/// Where the previous release's binary is: `BATCHONCE_PREVIOUS_BIN`, or the
/// one `.ci/build-previous-release` builds (once, cached) from the pinned
/// commit. `None` means "cannot run here" (no git, or a clone without the
/// commit), which skips the test, except under CI, where it fails: a test
/// that silently stops running protects nothing.
fn previous_release_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("BATCHONCE_PREVIOUS_BIN") {
        let p = PathBuf::from(p);
        // Set but wrong is a broken setup, never a reason to skip.
        assert!(
            p.is_file(),
            "BATCHONCE_PREVIOUS_BIN={} is not a file",
            p.display()
        );
        return Some(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workers/ is inside the workspace");
    // The workspace's target folder, wherever CARGO_TARGET_DIR put it
    // (CARGO_TARGET_TMPDIR is its tmp/): the cache lives beside the build.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("CARGO_TARGET_TMPDIR is inside the target folder");
    let script = root.join(".ci/build-previous-release");
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false");
    let out = match Command::new(&script)
        .env("CARGO_TARGET_DIR", target)
        // Cargo's progress and errors go straight to the terminal.
        .stderr(Stdio::inherit())
        .output()
    {
        Ok(out) => out,
        Err(e) => panic!("cannot run {}: {e}", script.display()),
    };
    match out.status.code() {
        Some(0) => {
            let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            assert!(path.is_file(), "{} printed {path:?}", script.display());
            Some(path)
        }
        // A missing prerequisite; the script said which on stderr.
        Some(3) if !ci => {
            eprintln!("skipped: the previous release's binary cannot be built here (see above)");
            None
        }
        Some(3) => panic!(
            "{}: a prerequisite is missing (see above), and under CI that is a failure",
            script.display()
        ),
        _ => panic!("{} failed ({})", script.display(), out.status),
    }
}

/// The date of business day `i` (1-based) of the workload.
fn day(i: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 9, i).unwrap()
}

/// The database, the processes of both releases and the folder of their
/// logs; kills whatever is still running when the test ends, however it
/// ends (before the database is dropped: fields drop after `drop`).
struct Deploy {
    db: TestDb,
    old_bin: PathBuf,
    dir: PathBuf,
    config: PathBuf,
    workers: Vec<(String, Child)>,
}

impl Drop for Deploy {
    fn drop(&mut self) {
        for (_, c) in &mut self.workers {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Deploy {
    fn pool(&self) -> &PgPool {
        &self.db.pool
    }

    fn command(&self, bin: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(bin);
        c.env("DATABASE_URL", &self.db.url)
            .env_remove("BATCHONCE_CONFIG")
            .env("RUST_LOG", "info")
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .stdin(Stdio::null());
        c
    }

    /// Runs a one-shot command of `bin` and returns its stdout; it must
    /// succeed and log no error.
    fn run(&self, bin: &Path, args: &[&str]) -> String {
        let out = self.command(bin, args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{} {args:?} failed ({}):\n{stderr}\n{stdout}",
            bin.display(),
            out.status
        );
        let bad = schema_errors(&stderr);
        assert!(
            bad.is_empty(),
            "{} {args:?} logged:\n{bad:#?}",
            bin.display()
        );
        stdout
    }

    /// A one-shot command of the previous release.
    fn run_old(&self, args: &[&str]) -> String {
        self.run(&self.old_bin, args)
    }

    /// A one-shot command of this release.
    fn run_new(&self, args: &[&str]) -> String {
        self.run(Path::new(NEW), args)
    }

    fn log(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.log"))
    }

    /// Starts worker `id` of `bin`, one run at a time, logging JSON to
    /// `<id>.log`.
    fn start_worker(&mut self, bin: &Path, id: &str) {
        let log = std::fs::File::create(self.log(id)).unwrap();
        let child = self
            .command(bin, &["--log-format", "json", "worker", "--worker-id", id])
            .args(["--concurrency", "1", "--poll-interval", "200ms"])
            .args(["--grace", "5s", "--metrics-addr", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.workers.push((id.to_owned(), child));
    }

    fn worker(&mut self, id: &str) -> &mut Child {
        &mut self
            .workers
            .iter_mut()
            .find(|(w, _)| w == id)
            .unwrap_or_else(|| panic!("no worker {id}"))
            .1
    }

    fn sigkill(&mut self, id: &str) {
        let c = self.worker(id);
        c.kill().unwrap();
        c.wait().unwrap();
    }

    fn assert_alive(&mut self, id: &str) {
        let st = self.worker(id).try_wait().unwrap();
        assert!(
            st.is_none(),
            "worker {id} exited ({st:?}):\n{}",
            self.read_log(id)
        );
    }

    /// SIGTERM, then the exit status: both releases must stop cleanly
    /// against the new schema (deregistration included).
    fn stop(&mut self, id: &str) {
        let c = self.worker(id);
        kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        let status = loop {
            if let Some(s) = c.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "{id} did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            status.success(),
            "{id} exited with {status}:\n{}",
            self.read_log(id)
        );
    }

    fn read_log(&self, id: &str) -> String {
        std::fs::read_to_string(self.log(id)).unwrap_or_default()
    }

    /// Polls `f` every 50 ms until it returns a value. On timeout, panics
    /// naming `what`, with the state of every run and the error lines of
    /// every worker's log: a worker of either release that hits an
    /// incompatible statement retries it quietly, and its log says why
    /// long before any deadline does.
    async fn wait_for<T, F, Fut>(&self, what: &str, timeout: Duration, mut f: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = f().await {
                return v;
            }
            if Instant::now() > deadline {
                // Key, status, attempts, holder, last error.
                type Run = (String, String, i32, Option<String>, Option<String>);
                let runs: Result<Vec<Run>, String> = sqlx::query_as(
                    "SELECT job_key, status::text, attempts, lease_owner, error_message \
                         FROM batch_job_run ORDER BY 1",
                )
                .fetch_all(self.pool())
                .await
                .map_err(|e| e.to_string());
                // Not only schema errors here: whatever went wrong (a failed
                // run, a lost lease) explains the timeout.
                let mut logs = String::new();
                for (id, _) in &self.workers {
                    let log = self.read_log(id);
                    let trouble = log
                        .lines()
                        .filter(|l| l.contains("\"error\":") || l.contains("\"level\":\"WARN\""));
                    for line in schema_errors(&log)
                        .iter()
                        .map(String::as_str)
                        .chain(trouble)
                        .take(3)
                    {
                        logs.push_str(&format!("{id}: {line}\n"));
                    }
                }
                panic!("timed out waiting for {what}\nruns: {runs:#?}\nworker errors:\n{logs}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn wait_until<F, Fut>(&self, what: &str, timeout: Duration, mut f: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        self.wait_for(what, timeout, || {
            let done = f();
            async move { done.await.then_some(()) }
        })
        .await
    }
}

/// Log lines that say a process hit an error: any ERROR-level line, and a
/// line at any level naming what a schema incompatibility looks like (a
/// missing column, relation or constraint, a violated one, a prepared
/// statement whose result changed under it, a missing grant). Any level,
/// because the previous release reports a failed statement only in the
/// `error` field of an INFO `run finished` line, and retries it.
fn schema_errors(log: &str) -> Vec<String> {
    const SIGNS: &[&str] = &[
        "does not exist",
        "column",
        "constraint",
        "violates",
        "cached plan",
        "permission denied",
    ];
    log.lines()
        .filter(|l| {
            let lower = l.to_lowercase();
            l.contains("\"level\":\"ERROR\"")
                || l.contains(" ERROR ")
                || l.starts_with("ERROR")
                || l.starts_with("error:")
                || SIGNS.iter().any(|s| lower.contains(s))
        })
        .map(str::to_owned)
        .collect()
}

/// The run `owner` holds mid-way: RUNNING under its lease with
/// [`MID_RUN`] to [`MID_RUN_MAX`] items committed under the current token; `legacy_only`
/// restricts it to a run that still has no context (a column only the new
/// schema has). Returns its key and token.
async fn held_mid_run(pool: &PgPool, owner: &str, legacy_only: bool) -> Option<(String, i64)> {
    let legacy = if legacy_only {
        "AND r.timezone IS NULL"
    } else {
        ""
    };
    // Items name their attempt by number from this release's schema on
    // (migration 20261208100001); before it, by the attempt's token.
    let migrated: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM information_schema.columns \
           WHERE table_name = 'settlement_item' AND column_name = 'attempt')",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let mine = if migrated {
        "i.attempt = r.attempts"
    } else {
        "i.lease_token = r.lease_token"
    };
    sqlx::query_as(&format!(
        "SELECT r.job_key, r.lease_token FROM batch_job_run r \
         WHERE r.status = 'RUNNING' AND r.lease_owner = $1 {legacy} \
           AND (SELECT count(*) FROM settlement_item i \
                WHERE i.job_key = r.job_key AND {mine}) \
               BETWEEN $2 AND $3 \
         LIMIT 1"
    ))
    .bind(owner)
    .bind(MID_RUN)
    .bind(MID_RUN_MAX)
    .fetch_optional(pool)
    .await
    .unwrap()
}

/// The run is still RUNNING under `token`: the worker that held it was
/// killed mid-run, so another must take it over.
async fn assert_still_held(pool: &PgPool, key: &str, token: i64) {
    let (status, now): (String, Option<i64>) =
        sqlx::query_as("SELECT status::text, lease_token FROM batch_job_run WHERE job_key = $1")
            .bind(key)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(
        (status.as_str(), now),
        ("RUNNING", Some(token)),
        "{key} was not mid-run under token {token} when its worker was killed"
    );
}

/// Whether worker `id` has an attempt on run `key`.
async fn has_attempt(pool: &PgPool, key: &str, id: &str) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM batch_job_attempt WHERE job_key = $1 AND worker_id = $2)",
    )
    .bind(key)
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn has_context(pool: &PgPool, key: &str) -> bool {
    sqlx::query_scalar("SELECT timezone IS NOT NULL FROM batch_job_run WHERE job_key = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn scalar(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

async fn rows(pool: &PgPool, sql: &str) -> Vec<(String, i64, i64)> {
    sqlx::query_as(sql).fetch_all(pool).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_release_workers_run_beside_this_release_through_the_upgrade() {
    let Some(old) = previous_release_bin() else {
        return;
    };
    let dir = batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), "upgrade");
    // One configuration file for both releases: the keys are the previous
    // release's, which this one still reads the same. A short lease so
    // takeovers are quick; small paced chunks so runs last seconds.
    let config = dir.join("batchonce.toml");
    std::fs::write(
        &config,
        "[jobs.daily-settlement]\ntimezone = \"Asia/Seoul\"\nmax_attempts = 50\nlease_ttl = \"2s\"\n\
         stale_after = \"1m\"\nchunk_size = 20\nchunk_pause = \"50ms\"\nbackoff = \"200ms\"\nbackoff_max = \"1s\"\n\
         [jobs.inventory-sync]\nenabled = false\n",
    )
    .unwrap();
    let mut d = Deploy {
        db: TestDb::empty().await,
        old_bin: old,
        dir,
        config,
        workers: Vec::new(),
    };

    // Before the deploy: the previous release's schema, orders for seven
    // business dates (the first twice as many, so that it is still running
    // when the migration comes), one run enqueued and a worker of the
    // previous release settling it.
    d.run_old(&["migrate"]);
    for i in 1..=7 {
        let n = if i == 1 { 2 * ORDERS } else { ORDERS };
        common::seed_orders(d.pool(), day(i), i64::from(i) * 1_000_000, n).await;
    }
    let d1 = format!("{JOB}:{}", day(1));
    let out = d.run_old(&["enqueue", JOB, "--date", &day(1).to_string()]);
    assert_eq!(out.trim(), format!("enqueued {d1}"));
    d.start_worker(&d.old_bin.clone(), "old-0");
    let (key, token) = d
        .wait_for(
            "old-0 mid-way through the first run",
            Duration::from_secs(60),
            || held_mid_run(d.pool(), "old-0", false),
        )
        .await;
    assert_eq!(key, d1);

    // Deploy step 1: this release's migrate, under the running old worker.
    // Its run has no context (the column does not exist yet); migrate
    // freezes it from the configuration it is given.
    let out = d.run_new(&["--json", "migrate"]);
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["migrated"], true, "{out}");
    assert_eq!(report["contexts_frozen"], 1, "{out}");
    assert_eq!(report["contexts_left"], 0, "{out}");
    // The kind's migration rewrote every item that existed (their attempt
    // in, their token out) in one transaction: the largest group of items
    // by transaction now, since old-0 commits 20 items a transaction and
    // had committed at least MID_RUN before the migration.
    let rewrite: String = sqlx::query_scalar(
        "SELECT xmin::text FROM settlement_item GROUP BY 1 ORDER BY count(*) DESC LIMIT 1",
    )
    .fetch_one(d.pool())
    .await
    .unwrap();
    // The old worker goes on under the new schema. (Normally under the same
    // lease; a migration that held its locks for longer than the 2s lease
    // on a loaded machine could cost old-0 the lease, which it would then
    // take back, so any attempt of old-0 counts.)
    let by_old_0 = "SELECT count(*) FROM settlement_item i JOIN batch_job_attempt a \
                    ON a.job_key = i.job_key AND a.attempt = i.attempt \
                    WHERE a.worker_id = 'old-0'";
    let before = scalar(d.pool(), by_old_0).await;
    assert!(before >= MID_RUN, "old-0's items under token {token}");
    d.wait_until(
        "old-0 to keep settling after the migration",
        Duration::from_secs(30),
        || async { scalar(d.pool(), by_old_0).await >= before + 40 },
    )
    .await;
    d.assert_alive("old-0");

    // The previous release's producer and enqueue, against the new schema:
    // their runs have no context. The producer's catch-up week ends with
    // the 3rd (covers previous-day); enqueue adds the 4th.
    let before: Vec<String> = sqlx::query_scalar("SELECT job_key FROM batch_job_run")
        .fetch_all(d.pool())
        .await
        .unwrap();
    d.run_old(&["produce", "--once", "--now", "2026-09-04T02:00:00+09:00"]);
    let out = d.run_old(&["enqueue", JOB, "--date", &day(4).to_string()]);
    assert_eq!(out.trim(), format!("enqueued {JOB}:{}", day(4)));
    let legacy: Vec<(String, bool)> = sqlx::query_as(
        "SELECT job_key, timezone IS NOT NULL FROM batch_job_run WHERE NOT job_key = ANY($1) ORDER BY 1",
    )
    .bind(&before)
    .fetch_all(d.pool())
    .await
    .unwrap();
    for i in 2..=4 {
        let k = format!("{JOB}:{}", day(i));
        assert!(
            legacy.iter().any(|(l, _)| *l == k),
            "{k} not enqueued: {legacy:?}"
        );
    }
    assert!(
        legacy.iter().all(|(_, ctx)| !ctx),
        "the previous release enqueued a run with a context: {legacy:?}"
    );

    // A mixed fleet: once old-0 is mid-way through a run without a context,
    // a worker of this release joins; once both are writing, old-0 is
    // SIGKILLed, and new-1 takes its run over after the lease (2s), freezing
    // the run's context as it claims it.
    d.wait_for(
        "old-0 mid-way through a legacy run",
        Duration::from_secs(60),
        || held_mid_run(d.pool(), "old-0", true),
    )
    .await;
    d.start_worker(Path::new(NEW), "new-1");
    d.wait_until(
        "new-1 writing items beside old-0",
        Duration::from_secs(60),
        || async {
            scalar(
                d.pool(),
                "SELECT count(*) FROM settlement_item i JOIN batch_job_attempt a \
                 ON a.job_key = i.job_key AND a.attempt = i.attempt \
                 WHERE a.worker_id = 'new-1'",
            )
            .await
                >= MID_RUN
        },
    )
    .await;
    // Still mid-way through a legacy run (normally the same one).
    let (key_a, token_a) = match held_mid_run(d.pool(), "old-0", true).await {
        Some(held) => held,
        None => {
            d.wait_for(
                "old-0 mid-way through a legacy run beside new-1",
                Duration::from_secs(60),
                || held_mid_run(d.pool(), "old-0", true),
            )
            .await
        }
    };
    d.sigkill("old-0");
    assert_still_held(d.pool(), &key_a, token_a).await;
    assert!(!has_context(d.pool(), &key_a).await);
    let items_a = scalar(
        d.pool(),
        &format!(
            "SELECT count(*) FROM settlement_item i JOIN batch_job_attempt a \
             ON a.job_key = i.job_key AND a.attempt = i.attempt WHERE a.lease_token = {token_a}"
        ),
    )
    .await;
    assert!(items_a >= MID_RUN, "old-0 had not written into {key_a}");
    // The claim writes the attempt; the worker freezes the context in the
    // next statement, before its handler starts: wait for both.
    d.wait_until(
        &format!("new-1 to take {key_a} over and freeze its context"),
        Duration::from_secs(60),
        || async {
            has_attempt(d.pool(), &key_a, "new-1").await && has_context(d.pool(), &key_a).await
        },
    )
    .await;

    // New enqueue: a run with a context, for the old worker to come.
    let out = d.run_new(&["enqueue", JOB, "--date", &day(5).to_string()]);
    assert_eq!(out.trim(), format!("enqueued {JOB}:{}", day(5)));

    // The reverse: new-1 is SIGKILLed mid-run, and a worker of the previous
    // release takes over a run this release claimed (so it has a context),
    // with the previous release's statements and fence.
    let (key_b, token_b) = d
        .wait_for(
            "new-1 mid-way through a run",
            Duration::from_secs(60),
            || held_mid_run(d.pool(), "new-1", false),
        )
        .await;
    d.sigkill("new-1");
    assert_still_held(d.pool(), &key_b, token_b).await;
    assert!(
        has_context(d.pool(), &key_b).await,
        "new-1 ran {key_b} without a context"
    );
    d.start_worker(&d.old_bin.clone(), "old-2");
    // Both releases' inspection commands, mid-fleet: runs with and without
    // a context, RUNNING and PENDING, workers of both releases registered.
    inspect(&d, &key_b);
    d.wait_until(
        &format!("old-2 to take {key_b} over"),
        Duration::from_secs(60),
        || has_attempt(d.pool(), &key_b, "old-2"),
    )
    .await;

    // The rest with one worker of each release again, and one more run
    // from each release's enqueue while both are up.
    d.start_worker(Path::new(NEW), "new-2");
    let out = d.run_new(&["enqueue", JOB, "--date", &day(6).to_string()]);
    assert_eq!(out.trim(), format!("enqueued {JOB}:{}", day(6)));
    let out = d.run_old(&["enqueue", JOB, "--date", &day(7).to_string()]);
    assert_eq!(out.trim(), format!("enqueued {JOB}:{}", day(7)));
    d.wait_until("every run to succeed", Duration::from_secs(180), || async {
        scalar(
            d.pool(),
            "SELECT count(*) FROM batch_job_run WHERE status <> 'SUCCEEDED'",
        )
        .await
            == 0
    })
    .await;
    inspect(&d, &key_b);
    d.assert_alive("old-2");
    d.assert_alive("new-2");
    d.stop("old-2");
    d.stop("new-2");
    // Nothing live is left without a context, so a second migrate freezes
    // nothing.
    let out = d.run_new(&["--json", "migrate"]);
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (&report["contexts_frozen"], &report["contexts_left"]),
        (&0.into(), &0.into()),
        "{out}"
    );

    check_settlement(d.pool(), 7, &rewrite).await;
    check_runs(d.pool(), &d1, &key_a, &key_b).await;

    // Both takeovers happened as arranged: old-0's attempt expired and
    // new-1's followed; new-1's expired and old-2's followed.
    for (key, gone, next) in [(&key_a, "old-0", "new-1"), (&key_b, "new-1", "old-2")] {
        let history: Vec<(String, Option<String>)> = sqlx::query_as(
            "SELECT worker_id, outcome FROM batch_job_attempt WHERE job_key = $1 ORDER BY attempt",
        )
        .bind(key)
        .fetch_all(d.pool())
        .await
        .unwrap();
        // The last attempt of the killed worker on the run.
        let i = history
            .iter()
            .rposition(|(w, _)| w == gone)
            .unwrap_or_else(|| panic!("{key}: {history:?}"));
        assert_eq!(
            history[i].1.as_deref(),
            Some("lease_expired"),
            "{key}: {history:?}"
        );
        assert!(
            history[i + 1..].iter().any(|(w, _)| w == next),
            "{key}: {history:?}"
        );
    }

    // new-1 froze the legacy run it took over, and said so.
    let log = d.read_log("new-1");
    assert!(
        log.lines()
            .any(|l| l.contains("froze the context") && l.contains(&key_a)),
        "new-1 did not log freezing {key_a}:\n{log}"
    );
    for id in ["old-0", "new-1", "old-2", "new-2"] {
        let bad = schema_errors(&d.read_log(id));
        assert!(bad.is_empty(), "{id} logged errors:\n{}", bad.join("\n"));
    }

    // The previous release's operator actions write their audit rows into
    // the new schema (the console's `remote_addr` column and stamp trigger,
    // migration 20261204000001): the row is written, with no address.
    let spare = day(9).to_string();
    d.run_old(&["enqueue", JOB, "--date", &spare]);
    let key = format!("{JOB}:{spare}");
    d.run_old(&[
        "runs",
        "skip",
        &key,
        "--operator",
        "old-release",
        "--reason",
        "upgrade check of the audit row",
    ]);
    let (status, operator, addr): (String, String, Option<String>) = sqlx::query_as(
        "SELECT r.status, a.operator, a.remote_addr FROM batch_job_run r \
         JOIN batch_operator_action a USING (job_key) WHERE r.job_key = $1",
    )
    .bind(&key)
    .fetch_one(d.pool())
    .await
    .unwrap();
    assert_eq!(
        (status.as_str(), operator.as_str(), addr),
        ("SKIPPED", "old-release", None)
    );

    // Partitioned runs (migration 20261204000002): the previous release's
    // worker never claims a partition or a parent, whose steps it does not
    // know. This release enqueues the 10th in 3 partitions (its own file:
    // the previous release's parser does not know the key); then the
    // previous release enqueues the 11th. Once old-3 has settled the 11th,
    // it has passed over the earlier-due partitions, which are untouched;
    // a worker of this release then runs them and the final step.
    //
    // Scoped runs (migration 20261204000003) likewise: this release also
    // enqueues the 12th as one run per merchant (scopes seller-1 to
    // seller-13, the merchants of the workload), which the previous
    // release's pick leaves alone (it cannot parse their keys) and this
    // release's worker settles, one merchant each.
    for i in [10, 11, 12] {
        common::seed_orders(d.pool(), day(i), i64::from(i) * 1_000_000, 300).await;
    }
    let shared = d.config.clone();
    d.config = d.dir.join("partitioned.toml");
    std::fs::write(
        &d.config,
        std::fs::read_to_string(&shared).unwrap().replace(
            "[jobs.daily-settlement]\n",
            "[jobs.daily-settlement]\npartitions = 3\n",
        ),
    )
    .unwrap();
    let parted = format!("{JOB}:{}", day(10));
    let out = d.run_new(&["enqueue", JOB, "--date", &day(10).to_string()]);
    assert_eq!(out.trim(), format!("enqueued {parted}"));
    d.config = d.dir.join("scoped.toml");
    let sellers: Vec<String> = (1..=13).map(|m| format!("\"seller-{m}\"")).collect();
    std::fs::write(
        &d.config,
        std::fs::read_to_string(&shared).unwrap().replace(
            "[jobs.daily-settlement]\n",
            &format!(
                "[jobs.daily-settlement]\nscopes = [{}]\n",
                sellers.join(", ")
            ),
        ),
    )
    .unwrap();
    let scoped = format!("{JOB}:{}", day(12));
    let out = d.run_new(&[
        "enqueue",
        JOB,
        "--date",
        &day(12).to_string(),
        "--all-scopes",
    ]);
    assert_eq!(out.matches("enqueued ").count(), 13, "{out}");
    assert!(
        out.contains(&format!("enqueued {scoped}@seller-13")),
        "{out}"
    );
    d.config = shared;
    let whole = format!("{JOB}:{}", day(11));
    d.run_old(&["enqueue", JOB, "--date", &day(11).to_string()]);
    d.start_worker(&d.old_bin.clone(), "old-3");
    d.wait_until("old-3 to settle the 11th", Duration::from_secs(60), || async {
        scalar(
            d.pool(),
            &format!("SELECT count(*) FROM batch_job_run WHERE job_key = '{whole}' AND status = 'SUCCEEDED'"),
        )
        .await
            == 1
    })
    .await;
    let touched = scalar(
        d.pool(),
        &format!(
            "SELECT count(*) FROM batch_job_run WHERE (job_key = '{parted}' OR partition_of = '{parted}') \
             AND (status <> 'PENDING' OR attempts > 0)"
        ),
    )
    .await;
    assert_eq!(
        touched, 0,
        "the previous release claimed part of a partitioned run"
    );
    let touched = scalar(
        d.pool(),
        "SELECT count(*) FROM batch_job_run WHERE scope IS NOT NULL \
         AND (status <> 'PENDING' OR attempts > 0)",
    )
    .await;
    assert_eq!(touched, 0, "the previous release claimed a scoped run");
    inspect(&d, &parted);
    // The previous release's `runs list` and `status` read scoped runs (the
    // inspection above ran with them in the table); its `runs show` cannot
    // parse their keys and says so, changing nothing.
    let seven = format!("{scoped}@seller-7");
    let list = d.run_old(&["runs", "list", "--limit", "1000"]);
    assert!(list.contains(&seven), "{list}");
    let out = d
        .command(&d.old_bin.clone(), &["runs", "show", &seven])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("invalid job key \"{seven}\"")),
        "{err}"
    );
    d.start_worker(Path::new(NEW), "new-3");
    d.wait_until("new-3 to run the partitioned 10th", Duration::from_secs(60), || async {
        scalar(
            d.pool(),
            &format!("SELECT count(*) FROM batch_job_run WHERE job_key = '{parted}' AND status = 'SUCCEEDED'"),
        )
        .await
            == 1
    })
    .await;
    d.wait_until(
        "new-3 to run the 12th's 13 scopes",
        Duration::from_secs(60),
        || async {
            scalar(
            d.pool(),
            "SELECT count(*) FROM batch_job_run WHERE scope IS NOT NULL AND status = 'SUCCEEDED'",
        )
        .await
            == 13
        },
    )
    .await;
    let by_other_merchant = scalar(
        d.pool(),
        &format!(
            "SELECT count(*) FROM settlement_item i JOIN batch_job_run r USING (job_key) \
             WHERE r.job_key LIKE '{scoped}@%' AND r.scope <> 'seller-' || i.merchant_id"
        ),
    )
    .await;
    assert_eq!(
        by_other_merchant, 0,
        "a scoped run settled another merchant"
    );
    d.stop("new-3");

    // The last step, the contract: refused while old-3, a process of the
    // previous release, still runs; done once it has stopped; and this
    // release's worker settles a new run without what it dropped.
    contract_after_the_roll(&mut d).await;
    for id in ["old-3", "new-3", "new-4"] {
        let bad = schema_errors(&d.read_log(id));
        assert!(bad.is_empty(), "{id} logged errors:\n{}", bad.join("\n"));
    }
    check_settlement(d.pool(), 11, &rewrite).await;
}

/// `migrate --contract` after the roll. old-3 (the previous release) is
/// running: the contract is refused, naming it, and drops nothing. Once it
/// has stopped (deregistering) and the row of old-0, SIGKILLed long ago, is
/// deleted as the refusal says to, the contract drops its list; a worker of
/// this release then settles the 13th.
async fn contract_after_the_roll(d: &mut Deploy) {
    let dropped = batchonce::ops::contract::drops();
    // How many of the functions the contract drops the schema still has.
    let pool = d.pool().clone();
    let count = format!(
        "SELECT count(*) FROM pg_proc WHERE pronamespace = current_schema()::regnamespace \
         AND proname IN ({})",
        batchonce::ops::contract::dropped_names()
            .iter()
            .map(|n| format!("'{n}'"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let left = || scalar(&pool, &count);
    d.assert_alive("old-3");
    let out = d
        .command(Path::new(NEW), &["migrate", "--contract"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the contract ran beside old-3:\n{err}"
    );
    assert!(
        err.contains("refused") && err.contains("old-3") && err.contains("version 0.1.0"),
        "{err}"
    );
    assert_eq!(
        left().await,
        dropped.len() as i64,
        "a refused contract dropped something"
    );
    d.assert_alive("old-3");

    d.stop("old-3");
    sqlx::query("DELETE FROM batch_worker WHERE worker_id = 'old-0'")
        .execute(d.pool())
        .await
        .unwrap();
    let out = d.run_new(&["--json", "migrate", "--contract"]);
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        report["contract"]["dropped"],
        serde_json::json!(dropped),
        "{out}"
    );
    assert_eq!(left().await, 0);
    let again = d.run_new(&["migrate", "--contract"]);
    assert!(again.contains("nothing left to drop"), "{again}");

    common::seed_orders(d.pool(), day(13), 13_000_000, 300).await;
    let out = d.run_new(&["enqueue", JOB, "--date", &day(13).to_string()]);
    assert_eq!(out.trim(), format!("enqueued {JOB}:{}", day(13)));
    d.start_worker(Path::new(NEW), "new-4");
    let key = format!("{JOB}:{}", day(13));
    d.wait_until(
        "new-4 to settle the 13th after the contract",
        Duration::from_secs(60),
        || async {
            scalar(
                d.pool(),
                &format!("SELECT count(*) FROM batch_job_run WHERE job_key = '{key}' AND status = 'SUCCEEDED'"),
            )
            .await
                == 1
        },
    )
    .await;
    d.run_new(&["status"]);
    d.stop("new-4");
}

/// The previous release's `runs list`, `runs show`, `runs stale` and
/// `status` (text and JSON), and this release's `status`, against the new
/// schema: they must succeed, log no error, and see every run.
fn inspect(d: &Deploy, key: &str) {
    let list = d.run_old(&["runs", "list", "--limit", "1000"]);
    let json = d.run_old(&["--json", "runs", "list", "--limit", "1000"]);
    for i in 1..=5 {
        let k = format!("{JOB}:{}", day(i));
        assert!(list.contains(&k), "old runs list lacks {k}:\n{list}");
        assert!(json.contains(&k), "old runs list --json lacks {k}:\n{json}");
    }
    let show = d.run_old(&["runs", "show", key]);
    assert!(show.contains(key), "{show}");
    d.run_old(&["runs", "stale"]);
    d.run_old(&["status"]);
    d.run_old(&["--json", "status"]);
    d.run_new(&["status"]);
}

/// The settlement oracle: each source order settled exactly once, under its
/// own business date in Seoul, with its merchant and amount; per-date and
/// per-merchant totals equal to the source.
/// `common::items_outside_their_lease`, except that the items the kind's
/// migration rewrote (those of transaction `rewrite`) need only name an
/// attempt of their own run: their commit time is the migration's.
async fn outside_their_lease_but_the_rewrite(pool: &PgPool, rewrite: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT i.*, pg_xact_commit_timestamp(i.xmin) AS committed_at, \
                                      i.xmin::text = $1 AS rewritten FROM settlement_item i) i \
         WHERE NOT EXISTS (SELECT 1 FROM batch_job_attempt a \
           WHERE a.job_key = i.job_key AND a.attempt = i.attempt \
             AND (i.rewritten OR NOT (i.committed_at IS NULL OR i.committed_at < a.started_at \
                  OR (a.finished_at IS NOT NULL AND i.committed_at > pg_xact_commit_timestamp(a.xmin)))))",
    )
    .bind(rewrite)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn check_settlement(pool: &PgPool, days: usize, rewrite: &str) {
    let not_once = scalar(
        pool,
        "SELECT count(*) FROM orders o \
         LEFT JOIN (SELECT order_id, count(*) AS n FROM settlement_item GROUP BY order_id) i \
         USING (order_id) WHERE i.n IS DISTINCT FROM 1",
    )
    .await;
    assert_eq!(not_once, 0, "orders not settled exactly once");
    let wrong = scalar(
        pool,
        "SELECT count(*) FROM settlement_item i LEFT JOIN orders o USING (order_id) \
         WHERE o.order_id IS NULL \
            OR i.business_date <> (o.paid_at AT TIME ZONE 'Asia/Seoul')::date \
            OR i.merchant_id <> o.merchant_id OR i.amount_minor <> o.amount_minor",
    )
    .await;
    assert_eq!(wrong, 0, "items that do not match their order");
    let source = rows(
        pool,
        "SELECT (paid_at AT TIME ZONE 'Asia/Seoul')::date::text, count(*), sum(amount_minor)::int8 \
         FROM orders GROUP BY 1 ORDER BY 1",
    )
    .await;
    let settled = rows(
        pool,
        "SELECT business_date::text, count(*), sum(amount_minor)::int8 \
         FROM settlement_item GROUP BY 1 ORDER BY 1",
    )
    .await;
    assert_eq!(settled, source, "per-date totals");
    assert_eq!(source.len(), days);
    let by_merchant = |sql: &'static str| async move {
        sqlx::query_as::<_, (String, i64, i64, i64)>(sql)
            .fetch_all(pool)
            .await
            .unwrap()
    };
    let source = by_merchant(
        "SELECT (paid_at AT TIME ZONE 'Asia/Seoul')::date::text, merchant_id, count(*), \
         sum(amount_minor)::int8 FROM orders GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .await;
    let summary = by_merchant(
        "SELECT business_date::text, merchant_id, order_count, total_minor \
         FROM settlement_summary ORDER BY 1, 2",
    )
    .await;
    assert_eq!(summary, source, "per-merchant summaries");
    // Both releases wrote items, each under an open attempt of the item's
    // own run. The kind's migration 20261208100001 rewrote the items that
    // existed when it ran (their attempt in, their token out), so those
    // rows carry its commit time, not their own, which says nothing of the
    // attempt that wrote them: they must name an attempt of their own run,
    // and every other item is judged by its commit time as well.
    assert_eq!(outside_their_lease_but_the_rewrite(pool, rewrite).await, 0);
    let by_release = rows(
        pool,
        "SELECT split_part(a.worker_id, '-', 1), count(*), count(DISTINCT i.job_key) \
         FROM settlement_item i JOIN batch_job_attempt a \
           ON a.job_key = i.job_key AND a.attempt = i.attempt \
         GROUP BY 1 ORDER BY 1",
    )
    .await;
    println!("items by release (release, items, runs): {by_release:?}");
    assert_eq!(by_release.len(), 2, "{by_release:?}");
}

/// Every run SUCCEEDED; every run a process of this release touched (this
/// release's enqueue, migrate or a claim by one of its workers) has the
/// context the configuration gives: Seoul, the business date's day, the
/// lease and chunk of the file.
async fn check_runs(pool: &PgPool, d1: &str, key_a: &str, key_b: &str) {
    let not_done = scalar(
        pool,
        "SELECT count(*) FROM batch_job_run WHERE status <> 'SUCCEEDED'",
    )
    .await;
    assert_eq!(not_done, 0);
    let untouched: Vec<String> = sqlx::query_scalar(
        "SELECT r.job_key FROM batch_job_run r WHERE r.timezone IS NULL \
         AND (r.job_key = ANY($1) OR EXISTS (SELECT 1 FROM batch_job_attempt a \
              WHERE a.job_key = r.job_key AND a.worker_id LIKE 'new-%'))",
    )
    .bind(vec![
        d1.to_owned(),
        key_a.to_owned(),
        key_b.to_owned(),
        format!("{JOB}:{}", day(5)),
        format!("{JOB}:{}", day(6)),
    ])
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(
        untouched.is_empty(),
        "runs left without a context: {untouched:?}"
    );
    let wrong: Vec<String> = sqlx::query_scalar(
        "SELECT job_key FROM batch_job_run WHERE timezone IS NOT NULL AND NOT ( \
           timezone = 'Asia/Seoul' \
           AND period_start = business_date::timestamp AT TIME ZONE 'Asia/Seoul' \
           AND period_end = (business_date + 1)::timestamp AT TIME ZONE 'Asia/Seoul' \
           AND lease_ttl = interval '2s' AND chunk_size = 20)",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(
        wrong.is_empty(),
        "contexts that are not the configuration's: {wrong:?}"
    );
    let (with, without): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE timezone IS NOT NULL), count(*) FILTER (WHERE timezone IS NULL) \
         FROM batch_job_run",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    println!(
        "runs with a context: {with}, without (touched by the previous release only): {without}"
    );
    // Who ran what, for whoever reads a failure or the figures.
    let history: Vec<(String, bool, String)> = sqlx::query_as(
        "SELECT r.job_key, r.timezone IS NOT NULL, \
                string_agg(a.worker_id || ':' || coalesce(a.outcome, '-'), ' ' ORDER BY a.attempt) \
         FROM batch_job_run r JOIN batch_job_attempt a USING (job_key) GROUP BY 1, 2 ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    for (key, context, attempts) in history {
        println!("{key} context={context} attempts: {attempts}");
    }
}
