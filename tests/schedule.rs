//! The business-date function against PostgreSQL's own time-zone arithmetic,
//! and its independence from the process's `TZ`.

use batchonce::schedule::{business_date, CronSchedule};
use batchonce::testing::TestDb;
use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use rand::{Rng, SeedableRng};

const ZONES: [&str; 8] = [
    "Asia/Seoul",
    "America/New_York",
    "Europe/Berlin",
    "America/Sao_Paulo",
    "Australia/Lord_Howe",
    "Pacific/Apia",
    "Asia/Kolkata",
    "UTC",
];

/// Random instants from 1970 to 2037, plus the hour around every local
/// midnight of a few DST-change dates, where errors would show.
fn samples() -> Vec<(DateTime<Utc>, &'static str)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(20260915);
    let mut out = Vec::new();
    for _ in 0..20_000 {
        let secs = rng.gen_range(0..2_145_916_800i64);
        let zone = ZONES[rng.gen_range(0..ZONES.len())];
        out.push((DateTime::from_timestamp(secs, 0).unwrap(), zone));
    }
    for zone in ZONES {
        let tz: Tz = zone.parse().unwrap();
        for day in [
            "2011-12-29",
            "2011-12-31",
            "2018-11-04",
            "2019-02-16",
            "2026-03-08",
            "2026-03-29",
            "2026-10-04",
            "2026-11-01",
        ] {
            let d = NaiveDate::parse_from_str(day, "%Y-%m-%d").unwrap();
            let (s, _) = batchonce::schedule::day_bounds(d, tz);
            for m in -90..90 {
                out.push((s + chrono::Duration::minutes(m), zone));
            }
        }
    }
    out
}

#[tokio::test]
async fn business_dates_equal_postgresqls() {
    let db = TestDb::new(&[]).await;
    let samples = samples();
    let instants: Vec<DateTime<Utc>> = samples.iter().map(|s| s.0).collect();
    let zones: Vec<&str> = samples.iter().map(|s| s.1).collect();
    let pg: Vec<NaiveDate> = sqlx::query_scalar(
        "SELECT (t AT TIME ZONE z)::date FROM unnest($1::timestamptz[], $2::text[]) WITH ORDINALITY AS u(t, z, i) ORDER BY i",
    )
    .bind(&instants)
    .bind(&zones)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let mut mismatches = Vec::new();
    for ((t, z), pg_date) in samples.iter().zip(&pg) {
        let ours = business_date(*t, z.parse().unwrap());
        if ours != *pg_date {
            mismatches.push(format!("{t} in {z}: ours {ours}, PostgreSQL {pg_date}"));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} mismatches, e.g. {:?}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(5)]
    );
}

#[test]
fn results_do_not_depend_on_the_process_time_zone() {
    let sched = CronSchedule::parse("0 1 * * *").unwrap();
    let after = DateTime::parse_from_rfc3339("2026-03-01T00:00:00Z")
        .unwrap()
        .with_timezone(&Utc);
    let upto = after + chrono::Duration::days(60);
    let compute = || {
        ZONES
            .iter()
            .map(|z| {
                let tz: Tz = z.parse().unwrap();
                let (f, _) = sched.firings(tz, after, upto, 1000);
                let dates: Vec<NaiveDate> = f.iter().map(|i| business_date(i.at, tz)).collect();
                (f, dates)
            })
            .collect::<Vec<_>>()
    };
    let baseline = compute();
    // This is the only test in this binary that touches TZ.
    for tz in [
        "Asia/Seoul",
        "America/Los_Angeles",
        "Pacific/Kiritimati",
        "UTC",
        "Invalid/Zone",
    ] {
        std::env::set_var("TZ", tz);
        assert_eq!(compute(), baseline, "results changed under TZ={tz}");
    }
    std::env::remove_var("TZ");
}

/// The SQL twin of `start_of_day` (migration 20261203000005), which an
/// application's `batchonce_enqueue_declared` uses to store a run's period,
/// agrees with the Rust rule on every day of 1995–2040 in zones whose
/// clocks change at or around midnight, skip a whole day, or shift by half
/// an hour, and on random days of 1970–2037 in every zone above. Past 2037
/// the two time-zone libraries extrapolate the rules differently (chrono-tz
/// keeps Lord Howe on summer time on 2175-09-26, PostgreSQL does not), so
/// runs of such dates enqueued from SQL may store a period shifted by the
/// DST offset; docs/command-jobs.md says so.
#[tokio::test]
async fn the_sql_start_of_day_equals_the_rust_rule() {
    let db = TestDb::new(&[]).await;
    let midnight_zones = [
        "America/Havana",
        "America/Santiago",
        "America/Asuncion",
        "America/Sao_Paulo",
        "Asia/Beirut",
        "Asia/Gaza",
        "Asia/Tehran",
        "Africa/Cairo",
        "Pacific/Apia",
        "Australia/Lord_Howe",
        "America/New_York",
        "Europe/London",
    ];
    let mut checked = 0;
    for zone in midnight_zones {
        let tz: Tz = zone.parse().unwrap();
        let rows: Vec<(NaiveDate, DateTime<Utc>)> = sqlx::query_as(
            "SELECT d::date, batchonce_start_of_day(d::date, $1) \
             FROM generate_series(DATE '1995-01-01', DATE '2040-12-31', interval '1 day') d",
        )
        .bind(zone)
        .fetch_all(&db.pool)
        .await
        .unwrap();
        for (d, sql) in rows {
            let rust = batchonce::schedule::start_of_day(d, tz);
            assert_eq!(sql, rust, "start of {d} in {zone}: SQL {sql}, Rust {rust}");
            checked += 1;
        }
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(20261203);
    for _ in 0..2_000 {
        let zone = ZONES[rng.gen_range(0..ZONES.len())];
        let d = NaiveDate::from_ymd_opt(1970, 1, 1).unwrap()
            + chrono::Days::new(rng.gen_range(0..24_800u64));
        let sql: DateTime<Utc> = sqlx::query_scalar("SELECT batchonce_start_of_day($1, $2)")
            .bind(d)
            .bind(zone)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        let rust = batchonce::schedule::start_of_day(d, zone.parse().unwrap());
        assert_eq!(sql, rust, "start of {d} in {zone}");
        checked += 1;
    }
    assert!(checked > 200_000, "{checked} days compared");
}
