//! The operator console in a real browser: Debian's `chromium`, driven
//! through `chromedriver` (WebDriver), signs in to `batchonce console`, reads
//! a job's calendar (SUCCEEDED, FAILED, SKIPPED and MISSING periods), opens
//! a FAILED run and re-runs it with a reason through the preview and the
//! confirmation, re-runs the other FAILED run in bulk from the run list,
//! reads the overview's MISSING count and no-worker banner, pauses and
//! resumes the job, enqueues the MISSING period from the calendar, and
//! watches a worker bring every run to SUCCEEDED while the run's page
//! refreshes itself. Every process is the built binary against real
//! PostgreSQL, and each audit row must name the signed-in operator.
//! Screenshots of the calendar, the overview and the run page are left in
//! the test's folder (docs/images holds copies).
//!
//! Without `/usr/bin/chromium` and `/usr/bin/chromedriver` the test skips,
//! except under CI, where it fails (`.ci/run` installs them).

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use batchonce::testing::{wait_for_count, wait_for_status, TestDb};
use chrono::{Days, NaiveDate};
use fantoccini::wd::Capabilities;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

mod common;

use common::{batchonce, free_port, http_get};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const JOB: &str = "cal-report";
const OPERATOR: &str = "ana";
const PASSWORD: &str = "correct horse battery staple";
/// How long any one wait may take: a page, a process, a run.
const DEADLINE: Duration = Duration::from_secs(30);

/// Whether the browser and its driver are installed. Without them a local
/// run skips; CI must have them.
fn browser_installed() -> bool {
    let missing: Vec<&str> = [CHROMIUM, CHROMEDRIVER]
        .into_iter()
        .filter(|p| !Path::new(p).is_file())
        .collect();
    if missing.is_empty() {
        return true;
    }
    let why = format!(
        "{} not installed (apt-get install -y chromium chromium-driver)",
        missing.join(" and ")
    );
    assert!(
        std::env::var_os("CI").is_none(),
        "{why}: under CI .ci/run must install Debian's chromium and chromium-driver"
    );
    eprintln!("skipped: {why}");
    false
}

/// A process this test started, stopped when the value is dropped (also
/// when the test fails): SIGTERM, then at most 15 s for it to exit, then
/// SIGKILL. With `group`, the signals go to its whole process group (for
/// chromedriver, the browser it started).
struct Running {
    what: &'static str,
    child: Child,
    group: bool,
}

impl Running {
    fn spawn(what: &'static str, cmd: &mut Command, log: &Path, group: bool) -> Self {
        let log = std::fs::File::create(log).unwrap();
        if group {
            cmd.process_group(0);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {what}: {e}"));
        Self { what, child, group }
    }

    fn signal(&self, sig: Signal) {
        let pid = self.child.id() as i32;
        let target = if self.group { -pid } else { pid };
        let _ = kill(Pid::from_raw(target), sig);
    }

    /// Stops it and says whether it exited by itself after SIGTERM.
    fn stop(&mut self) -> bool {
        if self.child.try_wait().ok().flatten().is_none() {
            self.signal(Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        let clean = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status.success(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    eprintln!("{} ignored SIGTERM for 15 s: killed", self.what);
                    self.signal(Signal::SIGKILL);
                    let _ = self.child.wait();
                    break false;
                }
            }
        };
        if self.group {
            // Whatever the driver left behind (browser helpers) goes too.
            self.signal(Signal::SIGKILL);
        }
        clean
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

fn scratch(name: &str) -> PathBuf {
    batchonce::testing::scratch_dir(env!("CARGO_TARGET_TMPDIR"), name)
}

/// Polls `GET path` until `ok` holds of its answer; panics after
/// [`DEADLINE`], naming `what` and the log to read.
async fn wait_http(what: &str, port: u16, path: &str, log: &Path, ok: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some((200, body)) = http_get(port, path) {
            if ok(&body) {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not answer {path} within {DEADLINE:?}; its log: {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn run_ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The worker `id` of `cfg`, stopped when dropped.
fn start_worker(db: &TestDb, dir: &Path, cfg: &Path, id: &'static str) -> Running {
    let mut cmd = batchonce(db, Some(cfg));
    cmd.current_dir(dir);
    let log = dir.join(format!("{id}.log"));
    Running::spawn(id, &mut common::worker(cmd, id, &[]), &log, false)
}

fn key(date: NaiveDate) -> String {
    format!("{JOB}:{date}")
}

fn save_png(path: &Path, png: &[u8]) {
    assert!(png.starts_with(b"\x89PNG"), "the screenshot is not a PNG");
    std::fs::write(path, png).unwrap();
    println!("screenshot: {}", path.display());
}

/// The calendar's cells as (element, class, period), in page order.
async fn calendar_cells(c: &Client) -> Vec<(String, String, String)> {
    let mut cells = Vec::new();
    for e in c.find_all(Locator::Css("table.weeks .cell")).await.unwrap() {
        let text = e.text().await.unwrap();
        let class = e.attr("class").await.unwrap().unwrap_or_default();
        cells.push((
            e.tag_name().await.unwrap(),
            class.trim_start_matches("cell ").to_owned(),
            text.lines().next().unwrap_or_default().trim().to_owned(),
        ));
    }
    cells
}

/// Waits at most [`DEADLINE`] for an element after a navigation; on
/// timeout, panics with `what`, the page's address and its text.
async fn expect(c: &Client, css: &str, what: &str) -> fantoccini::elements::Element {
    match c
        .wait()
        .at_most(DEADLINE)
        .for_element(Locator::Css(css))
        .await
    {
        Ok(e) => e,
        Err(e) => {
            let url = c.current_url().await.map(|u| u.to_string());
            let text = match c.find(Locator::Css("body")).await {
                Ok(b) => b.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            panic!("{what}: no `{css}` ({e}) on {url:?}, which shows:\n{text}")
        }
    }
}

/// Types `reason` into a form's reason field and sends the form.
async fn submit_with_reason(form: &fantoccini::elements::Element, reason: &str) {
    form.find(Locator::Css("input[name=reason]"))
        .await
        .unwrap()
        .send_keys(reason)
        .await
        .unwrap();
    form.find(Locator::Css("button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// The job's MISSING count on the overview.
async fn missing_on_overview(c: &Client) -> u32 {
    let text = c
        .find(Locator::Css(&format!("tr#job-{JOB} td.missing")))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("MISSING on the overview: {text:?}"))
}

/// The audit rows of `key` as (action, operator, reason), oldest first.
async fn audit_rows(db: &TestDb, key: &str) -> Vec<(String, String, String)> {
    sqlx::query_as(
        "SELECT action, operator, reason FROM batch_operator_action \
         WHERE job_key = $1 ORDER BY id",
    )
    .bind(key)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// The state badge in the run page's heading.
async fn run_state(c: &Client) -> String {
    c.find(Locator::Css("h1 .badge"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn an_operator_reruns_a_failed_date_from_the_calendar_in_a_real_browser() {
    if !browser_installed() {
        return;
    }
    let db = TestDb::empty().await;
    let dir = scratch("console-browser");
    let flag = dir.join("input-delivered");

    // Six consecutive business dates ending four days ago, so that every
    // period is due on any clock: D1 succeeds, D2 and D5 fail until the flag
    // file exists, D3 and D6 are skipped by the business calendar (D3 is
    // enqueued and so has a SKIPPED row, D6 is not), and D4 is due by the
    // schedule but never enqueued: MISSING.
    let today: NaiveDate = sqlx::query_scalar("SELECT (now() AT TIME ZONE 'UTC')::date")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let d: Vec<NaiveDate> = (0..6)
        .map(|i| today.checked_sub_days(Days::new(9 - i)).unwrap())
        .collect();
    let cfg = dir.join("batchonce.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[jobs.{JOB}]
command = ["sh", "-c", "case \"$BATCHONCE_BUSINESS_DATE\" in \"$FAIL1\"|\"$FAIL2\") if [ ! -e \"$FLAG\" ]; then echo \"input for $BATCHONCE_BUSINESS_DATE not delivered\" >&2; exit 2; fi;; esac; echo report for $BATCHONCE_BUSINESS_DATE written"]
env = {{ FAIL1 = "{fail1}", FAIL2 = "{fail2}", FLAG = "{flag}" }}
schedule = "0 1 * * *"
timezone = "UTC"
skip_dates = ["{s1}", "{s2}"]
max_attempts = 3
"#,
            fail1 = d[1],
            fail2 = d[4],
            flag = flag.display(),
            s1 = d[2],
            s2 = d[5],
        ),
    )
    .unwrap();
    run_ok(
        batchonce(&db, Some(&cfg)).current_dir(&dir).arg("migrate"),
        "migrate",
    );
    let from = d[0].to_string();
    let to = d[2].to_string();
    let out = run_ok(
        batchonce(&db, Some(&cfg))
            .current_dir(&dir)
            .args(["enqueue", JOB, "--from", &from, "--to", &to]),
        "enqueue a range",
    );
    assert!(out.contains(&format!("skipped {}", key(d[2]))), "{out}");
    run_ok(
        batchonce(&db, Some(&cfg)).current_dir(&dir).args([
            "enqueue",
            JOB,
            "--date",
            &d[4].to_string(),
        ]),
        "enqueue a date",
    );

    // The worker runs them and records the job's schedule, from which the
    // console derives the expected periods.
    let mut worker = start_worker(&db, &dir, &cfg, "w1");
    for (date, want) in [(d[0], "SUCCEEDED"), (d[1], "FAILED"), (d[4], "FAILED")] {
        wait_for_status(&db.pool, Some(&key(date)), &[want], DEADLINE).await;
    }
    wait_for_count(
        &db.pool,
        "the worker's record of the job's configuration",
        &format!("SELECT count(*) FROM batch_process_config WHERE job_name = '{JOB}'"),
        1,
        DEADLINE,
    )
    .await;

    // An operator account, hashed by the console itself.
    let mut hasher = batchonce(&db, None)
        .current_dir(&dir)
        .args(["console", "--hash-password"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(hasher.stdin.take().unwrap(), "{PASSWORD}").unwrap();
    let out = hasher.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "--hash-password: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hash = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(hash.starts_with("$argon2"), "{hash}");
    let users = dir.join("users.toml");
    std::fs::write(
        &users,
        format!(
            "[[user]]\nname = \"{OPERATOR}\"\nrole = \"operator\"\npassword_hash = \"{hash}\"\n"
        ),
    )
    .unwrap();

    let port = free_port();
    let console_log = dir.join("console.log");
    let _console = Running::spawn(
        "the console",
        batchonce(&db, None)
            .current_dir(&dir)
            .args(["--log-format", "json", "console", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--users")
            .arg(&users),
        &console_log,
        false,
    );
    wait_http("the console", port, "/healthz", &console_log, |b| {
        b.trim() == "ok"
    })
    .await;

    // The browser, with a profile of its own.
    let driver_port = free_port();
    let driver_log = dir.join("chromedriver.log");
    let _driver = Running::spawn(
        "chromedriver",
        Command::new(CHROMEDRIVER).arg(format!("--port={driver_port}")),
        &driver_log,
        true,
    );
    wait_http("chromedriver", driver_port, "/status", &driver_log, |b| {
        b.contains("\"ready\":true")
    })
    .await;
    let profile = dir.join("chromium-profile");
    std::fs::create_dir_all(&profile).unwrap();
    let mut caps = Capabilities::new();
    caps.insert("browserName".into(), "chrome".into());
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": CHROMIUM,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync",
                format!("--user-data-dir={}", profile.display()),
                "--window-size=1280,900",
            ],
        }),
    );
    let c = ClientBuilder::new(HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{driver_port}"))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "no browser session: {e}; chromedriver's log: {}",
                driver_log.display()
            )
        });
    let base = format!("http://127.0.0.1:{port}");

    // A bookmarked calendar asks to sign in first, then shows itself.
    let calendar = format!("{base}/jobs/{JOB}?from={}&to={}", d[0], d[5]);
    c.goto(&calendar).await.unwrap();
    assert_eq!(c.current_url().await.unwrap().path(), "/login");
    let login = expect(&c, "form[action='/login']", "the sign-in form").await;
    login
        .find(Locator::Css("input[name=user]"))
        .await
        .unwrap()
        .send_keys(OPERATOR)
        .await
        .unwrap();
    login
        .find(Locator::Css("input[name=password]"))
        .await
        .unwrap()
        .send_keys(PASSWORD)
        .await
        .unwrap();
    login
        .find(Locator::Css("button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    expect(&c, "table.weeks", "the calendar after signing in").await;
    let who = c.find(Locator::Css("header .who")).await.unwrap();
    assert!(
        who.text()
            .await
            .unwrap()
            .contains(&format!("{OPERATOR} (operator)")),
        "the header does not name the operator"
    );
    let want: Vec<(String, String, String)> = [
        ("a", "SUCCEEDED", d[0]),
        ("a", "FAILED", d[1]),
        ("a", "SKIPPED", d[2]),
        ("span", "MISSING", d[3]),
        ("a", "FAILED", d[4]),
        ("span", "SKIPPED", d[5]),
    ]
    .into_iter()
    .map(|(tag, class, date)| (tag.to_owned(), class.to_owned(), date.to_string()))
    .collect();
    assert_eq!(calendar_cells(&c).await, want, "the calendar's cells");
    save_png(&dir.join("calendar.png"), &c.screenshot().await.unwrap());

    // The FAILED cell opens its run; the program's error is on the page.
    c.find(Locator::Css("table.weeks a.FAILED"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    expect(&c, "h1 .badge", "the FAILED run's page").await;
    let heading = c.find(Locator::Css("h1")).await.unwrap();
    assert!(heading.text().await.unwrap().contains(&key(d[1])));
    assert_eq!(run_state(&c).await, "FAILED");
    assert!(c
        .source()
        .await
        .unwrap()
        .contains(&format!("input for {} not delivered", d[1])));

    // Stop the worker first, so that the re-run waits for the fixed input
    // rather than failing again at once. (It stops cleanly, which also
    // removes its configuration record: the calendar was read above.)
    assert!(worker.stop(), "the worker did not stop cleanly");

    let reason = "the input was redelivered; re-running the report";
    let mut rerun = None;
    for form in c.find_all(Locator::Css("form.act")).await.unwrap() {
        let action = form
            .find(Locator::Css("input[name=action]"))
            .await
            .unwrap()
            .attr("value")
            .await
            .unwrap();
        if action.as_deref() == Some("rerun") {
            rerun = Some(form);
        }
    }
    let rerun = rerun.expect("the FAILED run's page offers no re-run form");
    rerun
        .find(Locator::Css("input[name=reason]"))
        .await
        .unwrap()
        .send_keys(reason)
        .await
        .unwrap();
    let preview = rerun
        .find(Locator::Css("button[type=submit]"))
        .await
        .unwrap();
    assert_eq!(preview.text().await.unwrap(), "Preview");
    preview.click().await.unwrap();

    // The preview changes nothing until the confirmation is applied.
    let apply = expect(
        &c,
        "div.note form button[type=submit]",
        "the confirmation after Preview",
    )
    .await;
    let label = apply.text().await.unwrap();
    assert!(
        label.starts_with("Apply:") && label.contains(&key(d[1])),
        "{label}"
    );
    let status: String = sqlx::query_scalar("SELECT status FROM batch_job_run WHERE job_key = $1")
        .bind(key(d[1]))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(status, "FAILED", "the preview changed the run");
    apply.click().await.unwrap();
    let done = expect(&c, "div.done", "the message after Apply").await;
    let done = done.text().await.unwrap();
    assert!(
        done.contains("applied") && done.contains("FAILED → PENDING"),
        "{done}"
    );
    assert_eq!(
        run_state(&c).await,
        "PENDING",
        "the page says applied, but the run was not re-run"
    );

    // The other FAILED date, re-run in bulk from the run list's filter: the
    // preview names every key, one reason, one audit row per run.
    let bulk_reason = "the input was redelivered for every failed date";
    c.goto(&format!("{base}/runs?job={JOB}&status=FAILED"))
        .await
        .unwrap();
    let offer = expect(&c, "p.bulk a", "the bulk re-run offer").await;
    assert!(
        offer
            .text()
            .await
            .unwrap()
            .starts_with("Re-run all 1 shown"),
        "{:?}",
        offer.text().await
    );
    offer.click().await.unwrap();
    let form = expect(&c, "form[action='/runs/bulk/apply']", "the bulk preview").await;
    let listed = c.find(Locator::Css("main table")).await.unwrap();
    assert!(listed.text().await.unwrap().contains(&key(d[4])));
    submit_with_reason(&form, bulk_reason).await;
    let report = expect(&c, "main table", "the bulk result").await;
    assert!(report.text().await.unwrap().contains(&key(d[4])));
    assert_eq!(
        audit_rows(&db, &key(d[4])).await,
        [(
            "rerun".to_owned(),
            OPERATOR.to_owned(),
            bulk_reason.to_owned()
        )]
    );

    // The overview: one period MISSING, and runs waiting with no live
    // worker to take them, said in a banner.
    c.goto(&format!("{base}/")).await.unwrap();
    expect(&c, "div.banner", "the banners").await;
    let mut banners = Vec::new();
    for b in c.find_all(Locator::Css("div.banner")).await.unwrap() {
        banners.push(b.text().await.unwrap());
    }
    assert!(
        banners
            .iter()
            .any(|b| b.contains(JOB) && b.contains("worker")),
        "no no-worker banner for {JOB}: {banners:?}"
    );
    // D4, and the dates after D6 up to today that nobody enqueued.
    let missing_before = missing_on_overview(&c).await;
    assert!(
        missing_before >= 1,
        "MISSING on the overview: {missing_before}"
    );
    save_png(&dir.join("overview.png"), &c.screenshot().await.unwrap());

    // Pause and resume from the job's page, each audited.
    for (verb, paused) in [("pause", true), ("resume", false)] {
        c.goto(&format!("{base}/jobs/{JOB}")).await.unwrap();
        let form = expect(
            &c,
            &format!("form[action='/jobs/{JOB}/{verb}']"),
            "the pause/resume form",
        )
        .await;
        submit_with_reason(&form, &format!("{verb}: the bank's file is late")).await;
        expect(&c, "table.weeks", "the job's page after the action").await;
        let page = c.source().await.unwrap();
        assert_eq!(
            page.contains("<strong>Paused</strong> since"),
            paused,
            "after {verb}"
        );
    }
    assert_eq!(
        audit_rows(&db, &format!("{JOB}:*")).await,
        [
            (
                "pause".to_owned(),
                OPERATOR.to_owned(),
                "pause: the bank's file is late".to_owned()
            ),
            (
                "resume".to_owned(),
                OPERATOR.to_owned(),
                "resume: the bank's file is late".to_owned()
            ),
        ]
    );

    // The MISSING period, ticked on the calendar, previewed and enqueued.
    let enqueue_reason = "the producer was down that night";
    c.find(Locator::Css(&format!(
        "input[name=period][value='{}']",
        d[3]
    )))
    .await
    .unwrap()
    .click()
    .await
    .unwrap();
    c.find(Locator::Css(
        "form[action$='/enqueue/preview'] button[type=submit]",
    ))
    .await
    .unwrap()
    .click()
    .await
    .unwrap();
    let form = expect(&c, "form[action$='/enqueue/apply']", "the enqueue preview").await;
    assert!(c.source().await.unwrap().contains(&key(d[3])));
    submit_with_reason(&form, enqueue_reason).await;
    wait_for_status(&db.pool, Some(&key(d[3])), &["PENDING"], DEADLINE).await;
    c.goto(&format!("{base}/")).await.unwrap();
    expect(&c, "table.jobs", "the overview").await;
    assert_eq!(
        missing_on_overview(&c).await,
        missing_before - 1,
        "the enqueued period is still counted MISSING"
    );
    assert_eq!(
        audit_rows(&db, &key(d[3])).await,
        [(
            "enqueue".to_owned(),
            OPERATOR.to_owned(),
            enqueue_reason.to_owned()
        )]
    );

    // The input arrives; a worker runs the periods and they succeed. The
    // run's page follows by itself (its meta refresh): nothing reloads it.
    std::fs::write(&flag, "delivered\n").unwrap();
    let _worker = start_worker(&db, &dir, &cfg, "w2");
    c.goto(&format!("{base}/runs/{}", key(d[1]))).await.unwrap();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let state = match c.find(Locator::Css("h1 .badge")).await {
            Ok(e) => e.text().await.unwrap_or_default(),
            // Between two loads of the page.
            Err(_) => String::new(),
        };
        if state == "SUCCEEDED" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the run page still shows {state} after {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for date in [d[3], d[4]] {
        wait_for_status(&db.pool, Some(&key(date)), &["SUCCEEDED"], DEADLINE).await;
    }
    assert!(c.source().await.unwrap().contains(reason));
    save_png(&dir.join("run.png"), &c.screenshot().await.unwrap());

    // The audit row names the signed-in operator and the browser's address.
    let (operator, remote, action, before, after, why): (
        String,
        Option<String>,
        String,
        String,
        String,
        String,
    ) = sqlx::query_as(
        "SELECT operator, remote_addr, action, before_status, after_status, reason \
         FROM batch_operator_action WHERE job_key = $1",
    )
    .bind(key(d[1]))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (operator.as_str(), remote.as_deref(), action.as_str()),
        (OPERATOR, Some("127.0.0.1"), "rerun")
    );
    assert_eq!((before.as_str(), after.as_str()), ("FAILED", "PENDING"));
    assert_eq!(why, reason);

    c.close().await.unwrap();
    // The browser's profile is megabytes; the logs and screenshots stay.
    let _ = std::fs::remove_dir_all(&profile);
}
