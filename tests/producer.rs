//! The producer against real PostgreSQL: catch-up after downtime, the
//! catch-up bound, business calendars, sub-daily periods, disabled jobs.

use std::collections::BTreeMap;
use std::time::Duration;

use batchonce::config::Config;
use batchonce::queue::{self, ClaimSpec};
use batchonce::runtime::producer;
use batchonce::schedule::{Covers, CronSchedule};
use batchonce::testing::TestDb;
use batchonce::{Clock, JobConfig, JobName};
use chrono::{DateTime, Utc};
use sqlx::PgPool;

fn at(s: &str) -> Clock {
    Clock::At(DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc))
}

fn job(name: &str) -> JobName {
    JobName::parse(name).unwrap()
}

fn settlement() -> JobConfig {
    JobConfig {
        timezone: chrono_tz::Asia::Seoul,
        schedule: Some(CronSchedule::parse("0 1 * * *").unwrap()),
        covers: Covers::PreviousDay,
        catch_up: Duration::from_secs(7 * 86_400),
        ..JobConfig::default()
    }
}

fn config(jobs: Vec<(&str, JobConfig)>) -> Config {
    let map: BTreeMap<JobName, JobConfig> = jobs.into_iter().map(|(n, c)| (job(n), c)).collect();
    Config::defaults(&map)
}

async fn keys(pool: &PgPool) -> Vec<(String, String)> {
    sqlx::query_as("SELECT job_key, status FROM batch_job_run ORDER BY job_key")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn catch_up_after_downtime_enqueues_each_missed_period_once() {
    let db = TestDb::new(&[]).await;
    let cfg = config(vec![("daily-settlement", settlement())]);
    // 02:00 KST on the 15th: the 01:00 firing covered the 14th.
    let r = producer::tick(&db.pool, &cfg, at("2026-09-15T02:00:00+09:00"))
        .await
        .unwrap();
    assert_eq!(
        r[0].enqueued.len(),
        7,
        "a first tick catches up the whole window"
    );
    assert_eq!(r[0].enqueued.last().unwrap(), "daily-settlement:2026-09-14");
    // The same tick again: all duplicates.
    let r = producer::tick(&db.pool, &cfg, at("2026-09-15T02:00:15+09:00"))
        .await
        .unwrap();
    assert_eq!((r[0].enqueued.len(), r[0].duplicates), (0, 7));
    // Three days of downtime, then a tick: exactly the three missed days.
    let r = producer::tick(&db.pool, &cfg, at("2026-09-18T01:00:00+09:00"))
        .await
        .unwrap();
    assert_eq!(
        r[0].enqueued,
        vec![
            "daily-settlement:2026-09-15",
            "daily-settlement:2026-09-16",
            "daily-settlement:2026-09-17"
        ]
    );
    // Just before 01:00 the 18th's firing has not happened: nothing new.
    let k = keys(&db.pool).await;
    assert_eq!(k.len(), 10);
    assert!(k.iter().all(|(_, s)| s == "PENDING"));
}

#[tokio::test]
async fn catch_up_is_bounded_by_its_window() {
    let db = TestDb::new(&[]).await;
    let cfg = config(vec![("daily-settlement", settlement())]);
    producer::tick(&db.pool, &cfg, at("2026-09-01T02:00:00+09:00"))
        .await
        .unwrap();
    // 30 days down with a 7-day window: only the last 7 days are enqueued.
    let r = producer::tick(&db.pool, &cfg, at("2026-10-01T02:00:00+09:00"))
        .await
        .unwrap();
    assert_eq!(r[0].enqueued.len(), 7);
    assert_eq!(r[0].enqueued[0], "daily-settlement:2026-09-24");
    assert!(r[0].window_start.is_some());
}

#[tokio::test]
async fn business_calendar_records_skipped_runs_with_the_reason() {
    let db = TestDb::new(&[]).await;
    let mut c = settlement();
    c.skip_dates = vec![chrono::NaiveDate::from_ymd_opt(2026, 9, 10).unwrap()];
    c.skip_weekdays = vec![chrono::Weekday::Sat, chrono::Weekday::Sun];
    let cfg = config(vec![("daily-settlement", c)]);
    let r = producer::tick(&db.pool, &cfg, at("2026-09-15T02:00:00+09:00"))
        .await
        .unwrap();
    // 09-08 .. 09-14: the 10th (date), 12th and 13th (weekend) are skipped.
    assert_eq!(
        r[0].skipped,
        vec![
            "daily-settlement:2026-09-10",
            "daily-settlement:2026-09-12",
            "daily-settlement:2026-09-13"
        ]
    );
    assert_eq!(r[0].enqueued.len(), 4);
    let (why, finished): (String, Option<DateTime<Utc>>) = sqlx::query_as(
        "SELECT error_message, finished_at FROM batch_job_run WHERE job_key = 'daily-settlement:2026-09-12'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(why.contains("skip_weekdays"), "{why}");
    assert!(finished.is_some());
    // Skipped runs are never claimed.
    let spec = [ClaimSpec {
        job: job("daily-settlement"),
        lease_ttl: Duration::from_secs(30),
    }];
    let leases = queue::claim(&db.pool, "w", &spec, 100, at("2026-09-15T03:00:00+09:00"))
        .await
        .unwrap();
    assert_eq!(leases.len(), 4);
}

#[tokio::test]
async fn sub_daily_jobs_get_minute_keys_and_disabled_jobs_nothing() {
    let db = TestDb::new(&[]).await;
    let sync = JobConfig {
        timezone: chrono_tz::Asia::Seoul,
        schedule: Some(CronSchedule::parse("*/15 * * * *").unwrap()),
        covers: Covers::Firing,
        catch_up: Duration::from_secs(3600),
        ..JobConfig::default()
    };
    let off = JobConfig {
        enabled: false,
        ..settlement()
    };
    let cfg = config(vec![("inventory-sync", sync), ("daily-settlement", off)]);
    let r = producer::tick(&db.pool, &cfg, at("2026-09-15T10:20:00+09:00"))
        .await
        .unwrap();
    assert_eq!(r.len(), 1, "the disabled job is not produced");
    assert_eq!(
        r[0].enqueued,
        vec![
            "inventory-sync:2026-09-15T09:30",
            "inventory-sync:2026-09-15T09:45",
            "inventory-sync:2026-09-15T10:00",
            "inventory-sync:2026-09-15T10:15"
        ]
    );
    let date: chrono::NaiveDate = sqlx::query_scalar(
        "SELECT business_date FROM batch_job_run WHERE job_key = 'inventory-sync:2026-09-15T10:15'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(date.to_string(), "2026-09-15");
    // enqueue-by-date for a sub-daily job takes every firing of that local date.
    let c = cfg.job(&job("inventory-sync")).unwrap();
    let p = producer::periods_for_dates(c, &[date]).unwrap();
    assert_eq!(p.len(), 96);
    assert_eq!(p[0].key_part(), "2026-09-15T00:00");
}

#[test]
fn backfill_ranges_are_bounded() {
    let d = |s| chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap();
    assert_eq!(
        producer::date_range(d("2026-09-01"), d("2026-09-03"))
            .unwrap()
            .len(),
        3
    );
    assert!(producer::date_range(d("2026-09-03"), d("2026-09-01"))
        .unwrap_err()
        .contains("before"));
    assert!(producer::date_range(d("2025-01-01"), d("2026-09-01"))
        .unwrap_err()
        .contains("limit is 366"));
}

fn keys_of(plan: &producer::JobPlan) -> Vec<String> {
    plan.runs.iter().map(|r| r.key.to_string()).collect()
}

fn utc(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

#[test]
fn a_window_crossing_1970_plans_only_dates_in_range() {
    let name = job("daily-settlement");
    // 01:00 in Seoul covering the day before, a 7-day window from
    // 1970-01-03 02:00 KST: the firings of 1969 are clamped away.
    let p = producer::plan(&name, &settlement(), utc("1970-01-03T02:00:00+09:00"))
        .unwrap()
        .unwrap();
    assert_eq!(
        keys_of(&p),
        vec!["daily-settlement:1970-01-01", "daily-settlement:1970-01-02"]
    );
    assert_eq!(p.window_start, utc("1970-01-01T00:00:00Z"));
    // West of UTC an in-range instant can still be a 1969 local date: the
    // 20:00 firing of 1969-12-31 in New York is 1970-01-01T01:00Z.
    let evening = JobConfig {
        timezone: chrono_tz::America::New_York,
        schedule: Some(CronSchedule::parse("0 20 * * *").unwrap()),
        covers: Covers::SameDay,
        catch_up: Duration::from_secs(3 * 86_400),
        ..JobConfig::default()
    };
    let p = producer::plan(&name, &evening, utc("1970-01-02T02:00:00Z"))
        .unwrap()
        .unwrap();
    assert_eq!(keys_of(&p), vec!["daily-settlement:1970-01-01"]);
    // A clamped window still takes a firing at its first instant.
    let quarters = JobConfig {
        schedule: Some(CronSchedule::parse("*/15 * * * *").unwrap()),
        covers: Covers::Firing,
        catch_up: Duration::from_secs(3600),
        ..JobConfig::default()
    };
    let p = producer::plan(&name, &quarters, utc("1970-01-01T00:10:00Z"))
        .unwrap()
        .unwrap();
    assert_eq!(keys_of(&p), vec!["daily-settlement:1970-01-01T00:00"]);
    // Wholly before the range: nothing.
    let p = producer::plan(&name, &settlement(), utc("1969-06-01T00:00:00Z"))
        .unwrap()
        .unwrap();
    assert!(p.runs.is_empty());
}

#[test]
fn the_last_day_of_the_range_is_planned_and_nothing_after_it() {
    let name = job("daily-settlement");
    // The 01:00 KST firing of 2200-01-01 (2199-12-31T16:00Z) covers 2199-12-31.
    let p = producer::plan(&name, &settlement(), utc("2200-01-01T01:30:00+09:00"))
        .unwrap()
        .unwrap();
    assert_eq!(
        keys_of(&p).last().map(String::as_str),
        Some("daily-settlement:2199-12-31")
    );
    assert_eq!(p.runs.len(), 7);
    // East of UTC an in-range instant can be a 2200 local date: 08:00 KST
    // on 2200-01-01 is 2199-12-31T23:00Z.
    let morning = JobConfig {
        timezone: chrono_tz::Asia::Seoul,
        schedule: Some(CronSchedule::parse("0 8 * * *").unwrap()),
        covers: Covers::SameDay,
        catch_up: Duration::from_secs(3 * 86_400),
        ..JobConfig::default()
    };
    // The window's three firings cover 2199-12-30, 2199-12-31 and
    // 2200-01-01; the last is not planned.
    let p = producer::plan(&name, &morning, utc("2199-12-31T23:30:00Z"))
        .unwrap()
        .unwrap();
    assert_eq!(
        keys_of(&p),
        vec!["daily-settlement:2199-12-30", "daily-settlement:2199-12-31"]
    );
    // Past the range, and at the ends of chrono's range: nothing, no panic.
    for now in [
        utc("2200-01-08T00:00:00Z"),
        utc("4999-06-01T00:00:00Z"),
        DateTime::<Utc>::MAX_UTC,
        DateTime::<Utc>::MIN_UTC,
    ] {
        assert!(
            producer::plan(&name, &morning, now)
                .unwrap()
                .unwrap()
                .runs
                .is_empty(),
            "{now}"
        );
    }
}

#[tokio::test]
async fn enqueue_and_produce_agree_on_the_edges_of_the_date_range() {
    let db = TestDb::new(&[]).await;
    let name = job("daily-settlement");
    let cfg = config(vec![("daily-settlement", settlement())]);
    let c = cfg.job(&name).unwrap();
    // The way `enqueue --date D` goes: parse_date, then the producer's keys.
    let by_hand = |date: &str| -> Result<Vec<queue::NewRun>, batchonce::key::KeyError> {
        let d = batchonce::key::parse_date(date)?;
        let periods = producer::periods_for_dates(c, &[d]).unwrap();
        Ok(producer::runs_for_periods(&name, c, &periods).unwrap())
    };
    for (now, first_in, first_out) in [
        ("1970-01-03T02:00:00+09:00", "1970-01-01", "1969-12-31"),
        ("2200-01-01T01:30:00+09:00", "2199-12-31", "2200-01-01"),
    ] {
        let r = producer::tick(&db.pool, &cfg, at(now)).await.unwrap();
        let produced = format!("daily-settlement:{first_in}");
        assert!(r[0].enqueued.contains(&produced), "{now}: {r:?}");
        // The edge date the producer enqueued is accepted by hand, as a
        // duplicate; the one beyond it is refused by hand and was never
        // produced.
        let runs = by_hand(first_in).unwrap();
        let again = queue::enqueue(&db.pool, &runs, Clock::Db).await.unwrap();
        assert!(again.enqueued.is_empty(), "{first_in} was not a duplicate");
        assert!(matches!(
            by_hand(first_out),
            Err(batchonce::key::KeyError::DateRange(_))
        ));
    }
    let outside: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM batch_job_run \
         WHERE business_date NOT BETWEEN '1970-01-01' AND '2199-12-31'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(outside, 0);
}
