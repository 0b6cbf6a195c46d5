//! Stored text reaches an operator's terminal as text (issue 16, item 3):
//! a run whose error message, worker id and session names hold escape
//! sequences, a bell and a bidi override prints them escaped in `runs show`,
//! `runs list`, `runs stale` and `status`, and their `--json` output is the
//! same data with those characters as `\u` escapes.

use std::process::Command;
use std::time::Duration;

use batchonce::queue::{self, ClaimSpec, Finish, NewRun};
use batchonce::testing::TestDb;
use batchonce::{Clock, JobKey, JobName};
use chrono::NaiveDate;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");

/// What a program printed before it failed: clear the screen, retitle the
/// terminal, ring the bell, and turn the rest of the line around.
const PROGRAM_SAID: &str = "stderr: \u{1b}[2J\u{1b}]0;pwned\u{7} total \u{202e}0001$ due";
/// A worker id with colours and a C1 control sequence introducer.
const WORKER: &str = "w\u{1b}[31m-red\u{9b}0m";

/// The characters a terminal would act on; none may reach stdout raw.
fn raw_controls(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| {
            (c.is_control() && c != '\n')
                || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect()
}

fn run(db: &TestDb, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .env("DATABASE_URL", &db.url)
        .env_remove("BATCHONCE_CONFIG")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn stored_control_characters_print_escaped() {
    let db = TestDb::new(&batchonce_workers::migrations()).await;
    let date = NaiveDate::from_ymd_opt(2026, 9, 15).unwrap();
    let key = JobKey::parse("daily-settlement:2026-09-15").unwrap();
    let running = JobKey::parse("daily-settlement:2026-09-16").unwrap();
    let cfg = batchonce::JobConfig {
        max_attempts: 1,
        stale_after: Duration::from_secs(1),
        lease_ttl: Duration::from_secs(1),
        ..Default::default()
    };
    let runs = [
        NewRun::new(key.clone(), date, &cfg).unwrap(),
        NewRun::new(running.clone(), date.succ_opt().unwrap(), &cfg).unwrap(),
    ];
    queue::enqueue(&db.pool, &runs, Clock::Db).await.unwrap();
    let spec = ClaimSpec {
        job: JobName::parse("daily-settlement").unwrap(),
        lease_ttl: Duration::from_secs(1),
    };
    let leases = queue::claim(&db.pool, WORKER, &[spec], 2, Clock::Db)
        .await
        .unwrap();
    let failed = leases.iter().find(|l| l.key == key).unwrap();
    queue::finish(
        &db.pool,
        &failed.fence(),
        &Finish::Fatal {
            error: format!("`sh` exited 2; last output: {PROGRAM_SAID}"),
        },
        Clock::Db,
    )
    .await
    .unwrap();
    // The other run stays RUNNING past its lease and stale_after: `runs
    // stale` and `status` name it and its worker.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let show = run(&db, &["runs", "show", key.as_str()]);
    assert!(
        show.contains("\\x1b[2J\\x1b]0;pwned\\x07 total \\u{202e}0001$ due"),
        "{show}"
    );
    assert!(show.contains("w\\x1b[31m-red\\u{9b}0m"), "{show}");
    let list = run(&db, &["runs", "list"]);
    let stale = run(&db, &["runs", "stale"]);
    assert!(stale.contains("by w\\x1b[31m-red\\u{9b}0m"), "{stale}");
    let status = run(&db, &["status"]);
    for (what, text) in [
        ("runs show", &show),
        ("runs list", &list),
        ("runs stale", &stale),
        ("status", &status),
    ] {
        assert_eq!(raw_controls(text), Vec::<char>::new(), "{what}:\n{text}");
    }

    // --json: the same values, every such character a \u escape.
    for args in [
        &["--json", "runs", "show", key.as_str()][..],
        &["--json", "runs", "list"],
        &["--json", "runs", "stale"],
        &["--json", "status"],
    ] {
        let text = run(&db, args);
        assert_eq!(raw_controls(&text), Vec::<char>::new(), "{args:?}:\n{text}");
        assert!(
            serde_json::from_str::<serde_json::Value>(&text).is_ok(),
            "{text}"
        );
    }
    let shown: serde_json::Value =
        serde_json::from_str(&run(&db, &["--json", "runs", "show", key.as_str()])).unwrap();
    assert!(
        shown["run"]["error_message"]
            .as_str()
            .unwrap()
            .ends_with(PROGRAM_SAID),
        "{shown}"
    );
    assert_eq!(shown["attempts"][0]["worker_id"], WORKER);
}
