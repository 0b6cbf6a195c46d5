//! `sql/functions/` holds the current definition of every SQL function of the
//! engine, one file per function (`NAME.sql`, overloads one after another),
//! as `pg_get_functiondef` prints it after the engine's migrations and
//! `migrate --contract`: the one place to read what the database runs,
//! instead of the latest `CREATE OR REPLACE` among the migrations. Trigger
//! functions are included; functions that belong to an extension are not.
//!
//! This test compares the folder with such a database and fails, naming each
//! difference, when they differ. After changing a function in a new
//! migration, regenerate the folder:
//! `BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use batchonce::testing::TestDb;

const BLESS: &str = "BATCHONCE_BLESS=1 cargo test -p batchonce --test sql_functions";

fn folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("sql/functions")
}

/// Each file's text: a header saying where it comes from, then the
/// definitions of the function's overloads, in signature order.
fn file_text(definitions: &[String]) -> String {
    let mut text = format!(
        "-- Generated from the database after `batchonce migrate --contract` by\n\
         -- `{BLESS}`; do not edit.\n"
    );
    for d in definitions {
        text.push('\n');
        text.push_str(d.trim_end());
        text.push('\n');
    }
    text
}

#[tokio::test]
async fn the_folder_holds_the_definition_of_every_function() {
    let db = TestDb::new(&[]).await;
    batchonce::ops::contract::run(&db.pool).await.unwrap();
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT p.proname::text, pg_get_functiondef(p.oid) FROM pg_proc p \
         WHERE p.pronamespace = current_schema()::regnamespace AND p.prokind IN ('f', 'p') \
           AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass \
                           AND d.objid = p.oid AND d.deptype = 'e') \
         ORDER BY 1, p.oid::regprocedure::text",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let mut want: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, def) in rows {
        want.entry(name).or_default().push(def);
    }
    let want: BTreeMap<String, String> = want
        .into_iter()
        .map(|(name, defs)| (format!("{name}.sql"), file_text(&defs)))
        .collect();
    assert!(want.len() > 40, "too few functions: {:?}", want.keys());

    let dir = folder();
    let mut have: BTreeMap<String, String> = BTreeMap::new();
    if dir.is_dir() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            have.insert(name, std::fs::read_to_string(&path).unwrap_or_default());
        }
    }

    if std::env::var_os("BATCHONCE_BLESS").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(&dir).unwrap();
        for name in have.keys().filter(|n| !want.contains_key(*n)) {
            std::fs::remove_file(dir.join(name)).unwrap();
        }
        for (name, text) in &want {
            if have.get(name) != Some(text) {
                std::fs::write(dir.join(name), text).unwrap();
            }
        }
        return;
    }

    let mut problems = Vec::new();
    for name in want.keys().filter(|n| !have.contains_key(*n)) {
        problems.push(format!(
            "{name}: the database has this function, the folder no file"
        ));
    }
    for name in have.keys().filter(|n| !want.contains_key(*n)) {
        problems.push(format!("{name}: a file for a function the database lacks"));
    }
    for (name, text) in &want {
        if let Some(old) = have.get(name) {
            if old != text {
                let line = old
                    .lines()
                    .zip(text.lines())
                    .position(|(a, b)| a != b)
                    .unwrap_or_else(|| old.lines().count().min(text.lines().count()));
                problems.push(format!(
                    "{name}: differs from the database's definition from line {}",
                    line + 1
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "sql/functions/ is not the migrated and contracted database's functions:\n{}\n\
         Regenerate it with `{BLESS}` and review the diff.",
        problems.join("\n")
    );
}
