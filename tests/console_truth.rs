//! The overview and `status` tell one truth (issue 44), over HTTP and the
//! command's own output, against a real database: the same MISSING,
//! overdue, FAILED, stale, PENDING and RUNNING numbers per job from the
//! same query; no MISSING period before a job's first one; the banners for
//! a job no live worker serves and for producers that stopped ticking,
//! following the registry's promises of life; a calendar in the job's time
//! zone, in weeks, saying why a period is MISSING; a chart of the newest
//! runs with FAILED ones marked; and a page that refreshes itself.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use batchonce::config::ScopeSource;
use batchonce::queue::{self, ArchiveRequest, NewRun};
use batchonce::runtime::worker_registry::{self, Role};
use batchonce::schedule::{Covers, CronSchedule};
use batchonce::{Clock, JobConfig, JobKey, JobName, Scope};
use chrono::{DateTime, Days, NaiveDate, Utc};
use common::console::{start, Console};
use serde_json::Value;
use sqlx::PgPool;

fn name(n: &str) -> JobName {
    JobName::parse(n).unwrap()
}

fn scheduled(cron: &str, tz: chrono_tz::Tz, covers: Covers, catch_up_days: u64) -> JobConfig {
    JobConfig {
        schedule: Some(CronSchedule::parse(cron).unwrap()),
        timezone: tz,
        covers,
        catch_up: Duration::from_secs(catch_up_days * 86_400),
        ..JobConfig::default()
    }
}

/// Declares `jobs` as `batchonce migrate` does from a file.
async fn declare(pool: &PgPool, jobs: &[(&str, &JobConfig)]) {
    let map: BTreeMap<JobName, JobConfig> =
        jobs.iter().map(|(n, c)| (name(n), (*c).clone())).collect();
    queue::declare(pool, &map).await.unwrap();
}

async fn db_now(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn enqueue(pool: &PgPool, job: &str, date: NaiveDate, cfg: &JobConfig, clock: Clock) {
    let run = NewRun::new(JobKey::daily(&name(job), date), date, cfg).unwrap();
    queue::enqueue(pool, &[run], clock).await.unwrap();
}

/// The text of each `<td class="num CLASS">` of the overview's row of
/// `job`, tags stripped.
fn row_numbers(body: &str, job: &str) -> BTreeMap<String, String> {
    let start = body
        .find(&format!("<tr id=\"job-{job}\">"))
        .unwrap_or_else(|| panic!("no row for {job}: {body}"));
    let row = &body[start..start + body[start..].find("</tr>").unwrap()];
    let mut out = BTreeMap::new();
    for part in row.split("<td class=\"num ").skip(1) {
        let (class, rest) = part.split_once("\">").unwrap();
        let cell = &rest[..rest.find("</td>").unwrap()];
        let mut text = String::new();
        let mut in_tag = false;
        for ch in cell.chars() {
            match ch {
                '<' => in_tag = true,
                '>' => in_tag = false,
                c if !in_tag => text.push(c),
                _ => {}
            }
        }
        out.insert(class.to_owned(), text.trim().to_owned());
    }
    out
}

async fn status_json(pool: &PgPool) -> Value {
    serde_json::from_str(&batchonce::cli::status_output(pool, true).await.unwrap()).unwrap()
}

fn job_of<'a>(status: &'a Value, job: &str) -> &'a Value {
    status["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job_name"] == job)
        .unwrap_or_else(|| panic!("{job} not in {status}"))
}

/// A daily job (06:00 UTC, catch-up 30 days) that first ran nine days ago,
/// with two days missing, one archived, one FAILED, and two PENDING runs,
/// one of them due for ten minutes.
async fn settle(c: &Console) -> NaiveDate {
    let pool = &c.db.pool;
    let cfg = scheduled("0 6 * * *", chrono_tz::UTC, Covers::SameDay, 30);
    declare(pool, &[("settle", &cfg)]).await;
    let now = db_now(pool).await;
    let today = now.date_naive();
    let day = |n: u64| (today - Days::new(n)).to_string();
    let (d9, d8, d7, d5, d3, d2, d1) = (day(9), day(8), day(7), day(5), day(3), day(2), day(1));
    c.runs(
        "settle",
        &[
            (d9.as_str(), "SUCCEEDED", None),
            (d8.as_str(), "FAILED", Some("the bank file is empty")),
            (d7.as_str(), "SUCCEEDED", None),
            (d5.as_str(), "SUCCEEDED", None),
            (d3.as_str(), "SUCCEEDED", None),
            (d2.as_str(), "SUCCEEDED", None),
            (d1.as_str(), "SUCCEEDED", None),
        ],
    )
    .await;
    // The oldest run is archived: it still is the job's first period, and
    // its period is not MISSING.
    let moved = queue::archive(
        pool,
        &ArchiveRequest {
            before: today - Days::new(8),
            job: Some(name("settle")),
            batch: 100,
            operator: "tester".into(),
            reason: "test retention".into(),
        },
        Clock::Db,
        |_| {},
    )
    .await
    .unwrap();
    assert_eq!(moved.iter().map(|j| j.runs).sum::<i64>(), 1);
    enqueue(
        pool,
        "settle",
        today,
        &cfg,
        Clock::At(now - chrono::Duration::minutes(10)),
    )
    .await;
    enqueue(pool, "settle", today + Days::new(1), &cfg, Clock::Db).await;
    today
}

#[tokio::test]
async fn the_overview_and_status_print_the_same_numbers_from_one_query() {
    let c = start(None).await;
    let today = settle(&c).await;
    let op = c.login("alice").await;
    let overview = c.get_as(&op.cookie, "/").await.text().await.unwrap();
    let row = row_numbers(&overview, "settle");
    let st = status_json(&c.db.pool).await;
    let job = job_of(&st, "settle");
    // Days 6 and 4 are missing; day 10 is within the catch-up window but
    // before the job's first period, day 9 is archived.
    let expect = [
        ("missing", "2"),
        ("overdue", "1"),
        ("failed", "1"),
        ("stale", "0"),
        ("pending", "2"),
        ("running", "0"),
        ("workers", "0"),
    ];
    for (field, want) in expect {
        assert_eq!(row[field], want, "overview {field}: {row:?}");
        let json = if field == "missing" {
            job["missing"]["count"].clone()
        } else {
            job[field].clone()
        };
        assert_eq!(json.to_string(), want, "status --json {field}: {job}");
    }
    assert_eq!(job["missing"]["at_least"], false);
    let missing: Vec<&str> = job["missing"]["periods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["period"].as_str().unwrap())
        .collect();
    let (d6, d4) = (
        (today - Days::new(6)).to_string(),
        (today - Days::new(4)).to_string(),
    );
    assert_eq!(missing, [d6.as_str(), d4.as_str()]);
    // Why, on the page and in the text output alike.
    let why = format!("due at {d6} 06:00 UTC");
    assert!(overview.contains(&why), "{overview}");
    assert!(overview.contains("no producer is live to enqueue it"));
    let text = batchonce::cli::status_output(&c.db.pool, false)
        .await
        .unwrap();
    assert!(
        text.contains(&format!("missing: settle:{d6}: {why}")),
        "{text}"
    );
    let line = text
        .lines()
        .find(|l| l.starts_with("JOB ") && l.contains("MISSING"))
        .unwrap();
    assert!(line.contains("OVERDUE"), "{text}");
    let settle_line = text
        .lines()
        .skip_while(|l| !l.contains("MISSING"))
        .find(|l| l.starts_with("settle"))
        .unwrap();
    let cols: Vec<&str> = settle_line.split_whitespace().collect();
    assert_eq!(
        cols,
        ["settle", "2", "1", "1", "0", "2", "0", "0"],
        "{text}"
    );

    // The chart of the newest runs, the FAILED one marked not by colour
    // alone; no script anywhere.
    let row_html = &overview[overview.find("<tr id=\"job-settle\">").unwrap()..];
    let row_html = &row_html[..row_html.find("</tr>").unwrap()];
    assert!(row_html.contains("<svg class=\"chart\""), "{row_html}");
    assert!(row_html.contains("role=\"img\""));
    assert!(row_html.contains("1 FAILED"));
    assert!(row_html.contains("class=\"bar failed\""));
    assert!(row_html.contains("✕"));
    assert!(row_html.contains("FAILED, "), "the FAILED run's title");
    assert!(!overview.contains("<script"));
    // The page refreshes itself, unless told not to.
    assert!(overview.contains("<meta http-equiv=\"refresh\" content=\"10\">"));
    assert!(overview.contains("href=\"/?refresh=off\""));
    let still = c
        .get_as(&op.cookie, "/?refresh=off")
        .await
        .text()
        .await
        .unwrap();
    assert!(!still.contains("http-equiv=\"refresh\""));
    assert!(still.contains("Refresh every 10 s"));
}

#[tokio::test]
async fn the_banners_follow_the_registrys_promises_of_life() {
    let c = start(None).await;
    let pool = &c.db.pool;
    let cfg = scheduled("0 6 * * *", chrono_tz::UTC, Covers::SameDay, 3);
    declare(pool, &[("settle", &cfg), ("other", &cfg)]).await;
    let today = db_now(pool).await.date_naive();
    enqueue(pool, "settle", today, &cfg, Clock::Db).await;
    let op = c.login("alice").await;
    let page = |path: &'static str| {
        let (c, cookie) = (&c, op.cookie.clone());
        async move { c.get_as(&cookie, path).await.text().await.unwrap() }
    };
    const NO_WORKER: &str = "No live worker serves settle: 1 PENDING run waits";
    const NO_PRODUCER: &str = "No producer has ticked within three of its intervals";
    let body = page("/").await;
    assert!(body.contains(NO_WORKER), "{body}");
    assert!(body.contains(NO_PRODUCER), "{body}");
    assert!(
        !body.contains("No live worker serves other"),
        "nothing waits"
    );
    let text = batchonce::cli::status_output(pool, false).await.unwrap();
    assert!(text.contains(&format!("warning: {NO_WORKER}")), "{text}");
    assert!(text.contains("warning: No producer has ticked"), "{text}");

    // A worker that serves another job does not serve this one.
    let register = |id: &'static str, role: Role, live: u64, jobs: &'static [&'static str]| {
        let cfg = cfg.clone();
        async move {
            let names: Vec<JobName> = jobs.iter().map(|j| name(j)).collect();
            let served: Vec<(JobName, &JobConfig)> =
                names.iter().map(|n| (n.clone(), &cfg)).collect();
            worker_registry::register_process(
                pool,
                id,
                role,
                "test",
                Duration::from_secs(live),
                &served,
            )
            .await
            .unwrap();
        }
    };
    register("w-other", Role::Worker, 60, &["other"]).await;
    assert!(page("/").await.contains(NO_WORKER));
    // One that serves it, and has promised a sign of life, does.
    register("w-settle", Role::Worker, 60, &["settle"]).await;
    let body = page("/").await;
    assert!(!body.contains("No live worker serves"), "{body}");
    assert_eq!(job_of(&status_json(pool).await, "settle")["workers"], 1);
    // Once its promise has passed, it is gone, however recently seen.
    register("w-settle", Role::Worker, 0, &["settle"]).await;
    assert!(page("/").await.contains(NO_WORKER));
    // A live worker that recorded no jobs (an older release) counts as
    // serving every job.
    worker_registry::register(pool, "w-old", "old")
        .await
        .unwrap();
    let body = page("/").await;
    assert!(!body.contains("No live worker serves"), "{body}");
    assert!(body.contains("recorded no jobs"));
    worker_registry::deregister(pool, "w-old").await.unwrap();
    assert!(page("/").await.contains(NO_WORKER));
    // A due entry parked far ahead (a paused job, a partitioned parent
    // waiting) waits for no worker.
    sqlx::query("UPDATE batch_job_due SET next_run_at = '9999-12-31' WHERE job_name = 'settle'")
        .execute(pool)
        .await
        .unwrap();
    assert!(!page("/").await.contains("No live worker serves"));

    // The producer: live while its promise holds.
    register("p1", Role::Producer, 60, &["settle", "other"]).await;
    let st = status_json(pool).await;
    assert_eq!(st["producers"]["live"], 1, "{st}");
    assert!(!page("/").await.contains(NO_PRODUCER));
    register("p1", Role::Producer, 0, &["settle", "other"]).await;
    let body = page("/").await;
    assert!(body.contains(NO_PRODUCER), "{body}");
    assert!(body.contains("one was last seen"), "{body}");
    let st = status_json(pool).await;
    let kinds: Vec<&str> = st["banners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["no-producer"], "{st}");
}

#[tokio::test]
async fn the_calendar_shows_the_business_zone_in_weeks_and_why_a_period_is_missing() {
    let c = start(None).await;
    let pool = &c.db.pool;
    // Daily at 01:00 Seoul for the day before; the job first ran on
    // Tuesday 2026-09-15.
    let cfg = scheduled("0 1 * * *", chrono_tz::Asia::Seoul, Covers::PreviousDay, 3);
    declare(pool, &[("settle", &cfg)]).await;
    for d in ["2026-09-15", "2026-09-17"] {
        let date = NaiveDate::parse_from_str(d, "%Y-%m-%d").unwrap();
        enqueue(pool, "settle", date, &cfg, Clock::Db).await;
    }
    sqlx::query(
        "UPDATE batch_job_run SET status = 'SUCCEEDED', attempts = 1, finished_at = now() \
         WHERE job_name = 'settle'",
    )
    .execute(pool)
    .await
    .unwrap();
    let op = c.login("alice").await;
    let path = "/jobs/settle?from=2026-09-09&to=2026-09-20";
    let body = c.get_as(&op.cookie, path).await.text().await.unwrap();
    // Weeks from Monday: the 9th is a Wednesday, so two blank days first.
    let header = body
        .find("<th scope=\"col\">Mon</th>")
        .expect("weekday columns");
    let grid = &body[header..];
    assert!(grid.find("<th scope=\"col\">Sun</th>").unwrap() < grid.find("<td").unwrap());
    let first_week = &grid[grid.find("<tr>").unwrap()..];
    let first_week = &first_week[..first_week.find("</tr>").unwrap()];
    assert!(
        first_week.starts_with(
            "<tr><td class=\"out\"></td><td class=\"out\"></td><td class=\"none\">2026-09-09"
        ),
        "{first_week}"
    );
    // Nothing before the first period is MISSING; the 16th and the 18th to
    // the 20th are.
    for d in ["2026-09-09", "2026-09-14"] {
        assert!(!body.contains(&format!("{d}<br>MISSING")), "{d}: {body}");
    }
    for d in ["2026-09-16", "2026-09-18", "2026-09-19", "2026-09-20"] {
        assert!(body.contains(&format!("{d}<br>MISSING")), "{d}: {body}");
    }
    assert!(body.contains("2026-09-15<br>SUCCEEDED"));
    // The business day, with its UTC start on hover.
    assert!(
        body.contains("title=\"starts 2026-09-14 15:00 UTC"),
        "the 15th in Seoul starts at 15:00 UTC the day before: {body}"
    );
    // Why, written on the page under the grid.
    let list = &body[body.find("<h2>Missing periods</h2>").expect("the list")..];
    assert!(list.contains("2026-09-16"));
    assert!(
        list.contains("due at 2026-09-17 01:00 KST (2026-09-16 16:00 UTC) and no run exists"),
        "{list}"
    );
    assert!(list.contains("older than the catch-up horizon"), "{list}");
    // An operator may select the missing periods for an enqueue preview.
    let form = &body[body
        .find("<form method=\"post\" action=\"/jobs/settle/enqueue/preview\">")
        .expect("the enqueue form")..];
    let form = &form[..form.find("</form>").unwrap()];
    assert!(form.contains("name=\"csrf\" value=\""));
    assert!(form.contains("<input type=\"checkbox\" name=\"period\" value=\"2026-09-16\">"));
    assert!(
        !form.contains("value=\"2026-09-15\">"),
        "a period with a run"
    );
    assert!(form.contains("Preview enqueue of the selected periods"));
    // A viewer sees the same calendar, without the form.
    let viewer = c.login("vera").await;
    let seen = c.get_as(&viewer.cookie, path).await.text().await.unwrap();
    assert!(seen.contains("2026-09-16<br>MISSING"));
    assert!(!seen.contains("enqueue/preview") && !seen.contains("type=\"checkbox\""));

    // By default the calendar of a job with runs starts at the later of
    // its first period and 41 days back (its catch-up horizon, three days
    // here, does not narrow it: older gaps are what needs a hand).
    let body = c
        .get_as(&op.cookie, "/jobs/settle")
        .await
        .text()
        .await
        .unwrap();
    let horizon: NaiveDate =
        sqlx::query_scalar("SELECT ((now() AT TIME ZONE 'Asia/Seoul')::date - 41)")
            .fetch_one(pool)
            .await
            .unwrap();
    assert!(
        body.contains(&format!("name=\"from\" value=\"{horizon}\"")),
        "{horizon}: {body}"
    );
    // A job that first ran two days ago starts there, not 41 days back.
    let fresh = scheduled("0 1 * * *", chrono_tz::Asia::Seoul, Covers::PreviousDay, 30);
    declare(pool, &[("settle", &cfg), ("fresh", &fresh)]).await;
    let first = horizon + Days::new(1);
    enqueue(pool, "fresh", first, &fresh, Clock::Db).await;
    let body = c
        .get_as(&op.cookie, "/jobs/fresh")
        .await
        .text()
        .await
        .unwrap();
    assert!(
        body.contains(&format!("name=\"from\" value=\"{first}\"")),
        "{first}: {body}"
    );
    assert!(!body.contains(&format!("{}<br>MISSING", first - Days::new(1))));
    // The chart of the newest runs is on the calendar page too.
    assert!(body.contains("<svg class=\"chart\""), "{body}");
}

#[tokio::test]
async fn a_scoped_period_is_missing_only_without_a_run_of_any_scope() {
    let c = start(None).await;
    let pool = &c.db.pool;
    let mut cfg = scheduled("0 6 * * *", chrono_tz::UTC, Covers::SameDay, 30);
    let scopes = vec![Scope::parse("eu").unwrap(), Scope::parse("us").unwrap()];
    cfg.scopes = Some(ScopeSource::List(scopes.clone()));
    declare(pool, &[("split", &cfg)]).await;
    let today = db_now(pool).await.date_naive();
    // Days 5 (both scopes), 3 (one scope), 1 (the other) and today have
    // runs.
    for (n, scopes) in [
        (5, &scopes[..]),
        (3, &scopes[..1]),
        (1, &scopes[1..]),
        (0, &scopes[..]),
    ] {
        let date = today - Days::new(n);
        let base = JobKey::daily(&name("split"), date);
        let runs: Vec<NewRun> = scopes
            .iter()
            .map(|s| NewRun::new(base.with_scope(s).unwrap(), date, &cfg).unwrap())
            .collect();
        queue::enqueue(pool, &runs, Clock::Db).await.unwrap();
    }
    let st = status_json(pool).await;
    let job = job_of(&st, "split");
    let missing: Vec<String> = job["missing"]["periods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["period"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        missing,
        [4, 2].map(|n| (today - Days::new(n)).to_string()),
        "{job}"
    );
    let op = c.login("alice").await;
    let body = c.get_as(&op.cookie, "/").await.text().await.unwrap();
    assert_eq!(row_numbers(&body, "split")["missing"], "2");
}
