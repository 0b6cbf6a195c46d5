//! Issue 42, items 4, 5 (the end of a session) and 7, with real logins of
//! `batchonce roles`: a function planted in the schema by a login that may
//! create there runs as the migrator until `roles --apply` takes CREATE
//! away (and `preflight` warns before); the migrator cannot rewrite,
//! silence or unlock the audit trail, which `<prefix>_guard` owns; only
//! `<prefix>_terminator` may end other sessions; every function of the
//! schema pins its search path but the two inlined ones; and the table of
//! rights in docs/security.md is what the catalog says.

use std::collections::BTreeSet;
use std::process::{Command, Output, Stdio};

use batchonce::testing::TestDb;
use sqlx::PgPool;

mod common;

use common::ok;

use common::logins::Logins;

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");

/// A function of the schema: name, signature, settings, body, whether it is
/// SQL, whether it runs as its owner, and the owner.
type FunctionRow = (String, String, Vec<String>, String, bool, bool, String);

/// A table and a role's rights on it: select, insert, update, delete, a
/// truncate it does not own, and the columns it may not read when it reads
/// only some.
type TableRights = (String, bool, bool, bool, bool, bool, Option<Vec<String>>);

fn run(url: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .env("DATABASE_URL", url)
        .env("BATCHONCE_CONFIG", common::samples_config())
        .env("RUST_LOG", "error")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

async fn exec(pool: &PgPool, sql: &str) {
    sqlx::raw_sql(sql)
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// `sql` fails with a privilege error (one of `want`), not any error.
async fn refused(pool: &PgPool, sql: &str, want: &[&str]) {
    let err = match sqlx::raw_sql(sql).execute(pool).await {
        Ok(_) => panic!("{sql}: was allowed"),
        Err(e) => e.to_string(),
    };
    assert!(want.iter().any(|w| err.contains(w)), "{sql}: {err}");
}

/// The `warn` lines of `batchonce preflight` against `url`.
fn preflight_warnings(url: &str) -> Vec<String> {
    let out = run(url, &["preflight", "--processes", "2"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("warn"))
        .map(str::to_owned)
        .collect()
}

async fn terminate_exists(pool: &PgPool) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_proc WHERE proname = 'batchonce_operator_terminate'
                          AND pronamespace = current_schema()::regnamespace)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Item 4 on a database set up as PostgreSQL 14 sets one up (`PUBLIC` may
/// create in `public`): a producer login plants a `starts_with(varchar,
/// text)`, a better match for the call in the run table's validation
/// trigger than pg_catalog's, and enqueues; the trigger runs inside the
/// SECURITY DEFINER enqueue, so the planted code ran as the migrator. After
/// `roles --apply`, no role but the migrator may create in the schema, and
/// `preflight` warned before and is quiet after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_planted_in_the_schema_ran_as_the_migrator_until_roles_apply() {
    let db = TestDb::empty().await;
    let admin = &db.pool;
    exec(admin, "GRANT CREATE ON SCHEMA public TO PUBLIC").await;
    let logins = Logins::apply(BIN, &db, common::samples_config()).await;
    // What an earlier release's `roles --apply` left behind: it never
    // revoked PUBLIC's CREATE (this one does, hence granted again here).
    exec(admin, "GRANT CREATE ON SCHEMA public TO PUBLIC").await;
    let warned = preflight_warnings(&db.url);
    assert!(
        warned
            .iter()
            .any(|l| l.starts_with("warn  PUBLIC may CREATE in schema public")),
        "preflight did not warn: {warned:?}"
    );
    assert_eq!(warned.len(), 1, "{warned:?}");

    let producer = logins.pool("producer").await;
    exec(
        &producer,
        "CREATE TABLE public.stolen_marker (who text);
         GRANT INSERT ON public.stolen_marker TO PUBLIC;
         CREATE FUNCTION public.starts_with(varchar, text) RETURNS boolean
         LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO public.stolen_marker VALUES (current_user::text);
             RETURN pg_catalog.starts_with($1::text, $2);
         END $$;",
    )
    .await;
    ok(&run(
        &logins.url("producer"),
        &["enqueue", "daily-settlement", "--date", "2026-09-15"],
    ));
    let who: Vec<String> = sqlx::query_scalar("SELECT who FROM stolen_marker")
        .fetch_all(admin)
        .await
        .unwrap();
    assert!(
        who.contains(&logins.role("migrator")),
        "the escalation did not reproduce: the planted function ran as {who:?}"
    );
    exec(
        admin,
        "DROP FUNCTION public.starts_with(varchar, text); DROP TABLE public.stolen_marker",
    )
    .await;

    ok(&run(
        &db.url,
        &["roles", "--prefix", &logins.prefix, "--apply"],
    ));
    let denied = ["permission denied for schema public"];
    for part in [
        "producer", "worker", "operator", "readonly", "program", "console",
    ] {
        let pool = logins.pool(part).await;
        refused(
            &pool,
            "CREATE FUNCTION public.starts_with(varchar, text) RETURNS boolean
             LANGUAGE sql AS 'SELECT true'",
            &denied,
        )
        .await;
        refused(
            &pool,
            "CREATE OPERATOR public.|| (LEFTARG = varchar, RIGHTARG = text,
                                        FUNCTION = pg_catalog.textcat)",
            &denied,
        )
        .await;
        refused(
            &pool,
            "CREATE TABLE public.stolen_marker (who text)",
            &denied,
        )
        .await;
        pool.close().await;
    }
    let warned = preflight_warnings(&db.url);
    assert!(warned.is_empty(), "{warned:?}");
    // The migrator still creates (the next migration needs it).
    let migrator = logins.pool("migrator").await;
    exec(&migrator, "CREATE TABLE public.migrator_may (x int)").await;
    ok(&run(
        &logins.url("producer"),
        &["enqueue", "daily-settlement", "--date", "2026-09-16"],
    ));
}

/// Item 7: after `roles --apply` the audit table and its triggers'
/// functions belong to `<prefix>_guard`, which no login holds: the
/// migrator (the owner of everything else) may add audit rows, stamped
/// with its login and the database's time, and nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_migrator_cannot_rewrite_or_silence_the_audit_trail() {
    let db = TestDb::empty().await;
    let admin = &db.pool;
    let logins = Logins::apply(BIN, &db, common::samples_config()).await;
    let key = "daily-settlement:2026-09-15";
    ok(&run(
        &logins.url("producer"),
        &["enqueue", "daily-settlement", "--date", "2026-09-15"],
    ));
    // The operator's audited action still writes its row (the migrator's
    // SECURITY DEFINER function inserts into guard's table).
    ok(&run(
        &logins.url("operator"),
        &[
            "runs",
            "skip",
            key,
            "--reason",
            "holiday",
            "--operator",
            "ops",
        ],
    ));
    let migrator = logins.pool("migrator").await;
    sqlx::query(
        "INSERT INTO batch_operator_action
             (operator, action, job_key, reason, before_status, after_status, at, session_user_name)
         VALUES ('m', 'rerun', $1, 'forged', 'SKIPPED', 'SKIPPED', '2000-01-01', 'someone else')",
    )
    .bind(key)
    .execute(&migrator)
    .await
    .unwrap();
    let (who, recent): (String, bool) = sqlx::query_as(
        "SELECT session_user_name, at > now() - interval '1 hour' FROM batch_operator_action
         WHERE reason = 'forged'",
    )
    .fetch_one(admin)
    .await
    .unwrap();
    assert_eq!(
        (who.as_str(), recent),
        (logins.role("migrator").as_str(), true)
    );

    let trail =
        "SELECT count(*), md5(string_agg(a::text, '|' ORDER BY id)) FROM batch_operator_action a";
    let before: (i64, String) = sqlx::query_as(trail).fetch_one(admin).await.unwrap();
    assert_eq!(before.0, 2);
    let (m, guard) = (logins.role("migrator"), logins.role("guard"));
    let attempts = [
        "ALTER TABLE batch_operator_action DISABLE TRIGGER batch_operator_action_no_change"
            .to_owned(),
        "ALTER TABLE batch_operator_action DISABLE TRIGGER ALL".to_owned(),
        "ALTER TABLE batch_operator_action ADD COLUMN forged text".to_owned(),
        "ALTER TABLE batch_operator_action RENAME TO old_audit".to_owned(),
        format!("ALTER TABLE batch_operator_action OWNER TO {m}"),
        "DROP TABLE batch_operator_action".to_owned(),
        "DROP TABLE batch_operator_action CASCADE".to_owned(),
        "TRUNCATE batch_operator_action".to_owned(),
        "UPDATE batch_operator_action SET reason = 'rewritten'".to_owned(),
        "DELETE FROM batch_operator_action".to_owned(),
        "DROP TRIGGER batch_operator_action_stamp ON batch_operator_action".to_owned(),
        "CREATE TRIGGER forged BEFORE INSERT ON batch_operator_action
         FOR EACH ROW EXECUTE FUNCTION batch_job_run_validate()"
            .to_owned(),
        "CREATE OR REPLACE FUNCTION batch_operator_action_stamp() RETURNS trigger
         LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$"
            .to_owned(),
        "CREATE OR REPLACE FUNCTION batch_operator_action_append_only() RETURNS trigger
         LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$"
            .to_owned(),
        "ALTER FUNCTION batch_operator_action_stamp() RESET ALL".to_owned(),
        "DROP FUNCTION batch_operator_action_append_only() CASCADE".to_owned(),
        "SET session_replication_role = replica".to_owned(),
        format!("SET ROLE {guard}"),
        format!("GRANT {guard} TO {m}"),
    ];
    for sql in &attempts {
        refused(
            &migrator,
            sql,
            &["must be owner", "permission denied", "admin option"],
        )
        .await;
    }
    let after: (i64, String) = sqlx::query_as(trail).fetch_one(admin).await.unwrap();
    assert_eq!(before, after, "the audit trail changed");
    let (owner, login, members): (String, bool, i64) = sqlx::query_as(
        "SELECT c.relowner::regrole::text, r.rolcanlogin,
                (SELECT count(*) FROM pg_auth_members a WHERE a.roleid = r.oid)
         FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner
         WHERE c.oid = 'batch_operator_action'::regclass",
    )
    .fetch_one(admin)
    .await
    .unwrap();
    assert_eq!((owner.as_str(), login, members), (guard.as_str(), false, 0));
    // Guard owns no code that runs as it: a function of its own that read
    // the migrator's tables could be made to run the migrator's code.
    let definers: Vec<String> = sqlx::query_scalar(
        "SELECT oid::regprocedure::text FROM pg_proc WHERE proowner = $1::regrole AND prosecdef",
    )
    .bind(&guard)
    .fetch_all(admin)
    .await
    .unwrap();
    assert!(definers.is_empty(), "{definers:?}");
}

/// An administrator that is no superuser (`CREATEROLE`, a member of the
/// migrator, the database's owner) applies the roles as well: the audit
/// table becomes guard's, and afterwards the administrator holds neither
/// guard nor terminator, and neither may create in the schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_administrator_that_is_no_superuser_applies_the_roles() {
    let db = TestDb::empty().await;
    let su = &db.pool;
    let logins = Logins::apply(BIN, &db, common::samples_config()).await;
    let (m, guard, term) = (
        logins.role("migrator"),
        logins.role("guard"),
        logins.role("terminator"),
    );
    let admin = format!("{}_admin", logins.prefix);
    let password = format!("pw{:016x}", rand::random::<u64>());
    exec(
        su,
        &format!(
            "CREATE ROLE {admin} LOGIN CREATEROLE PASSWORD '{password}';
             GRANT {m} TO {admin};
             ALTER DATABASE {} OWNER TO {admin};
             ALTER TABLE batch_operator_action OWNER TO {m};
             ALTER FUNCTION batch_operator_action_append_only() OWNER TO {m};
             ALTER FUNCTION batch_operator_action_stamp() OWNER TO {m};",
            db.name
        ),
    )
    .await;
    let mut url = url::Url::parse(&db.url).unwrap();
    url.set_username(&admin).unwrap();
    url.set_password(Some(&password)).unwrap();
    ok(&run(
        url.as_str(),
        &["roles", "--prefix", &logins.prefix, "--apply"],
    ));
    let (owner, members, creates): (String, i64, bool) = sqlx::query_as(
        "SELECT (SELECT relowner::regrole::text FROM pg_class
                 WHERE oid = 'batch_operator_action'::regclass),
                (SELECT count(*) FROM pg_auth_members WHERE roleid IN ($1::regrole, $2::regrole)),
                has_schema_privilege($1, 'public', 'CREATE')
                    OR has_schema_privilege($2, 'public', 'CREATE')",
    )
    .bind(&guard)
    .bind(&term)
    .fetch_one(su)
    .await
    .unwrap();
    assert_eq!(
        (owner.as_str(), members, creates),
        (guard.as_str(), 0, false)
    );
}

/// Item 5, the end of a session: the operator and console roles lose
/// `pg_signal_backend` once `batchonce_operator_terminate` exists, which
/// `<prefix>_terminator` (held by no login) owns and they may call; on a
/// schema without it they keep it (an earlier release's `--terminate-blocker`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_terminator_may_end_sessions() {
    let db = TestDb::empty().await;
    let admin = &db.pool;
    let logins = Logins::apply(BIN, &db, common::samples_config()).await;
    let signals = |role: String| async move {
        sqlx::query_scalar::<_, bool>("SELECT pg_has_role($1, 'pg_signal_backend', 'MEMBER')")
            .bind(role)
            .fetch_one(admin)
            .await
            .unwrap()
    };
    let stand_in = !terminate_exists(admin).await;
    if stand_in {
        // Without the audited function, the operator keeps its old way.
        assert!(signals(logins.role("operator")).await);
        assert!(signals(logins.role("console")).await);
        // A stand-in for the function a migration adds, as the migrator
        // creates it; `roles --apply` hands it to the terminator.
        exec(
            &logins.pool("migrator").await,
            "CREATE FUNCTION batchonce_operator_terminate(p_pid integer) RETURNS boolean
             LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp
             AS 'SELECT pg_catalog.pg_terminate_backend(p_pid)'",
        )
        .await;
        ok(&run(
            &db.url,
            &["roles", "--prefix", &logins.prefix, "--apply"],
        ));
    }
    for part in ["operator", "console"] {
        assert!(!signals(logins.role(part)).await, "{part}");
        let may: bool = sqlx::query_scalar(
            "SELECT bool_and(has_function_privilege($1, oid, 'EXECUTE')) FROM pg_proc
             WHERE proname = 'batchonce_operator_terminate'",
        )
        .bind(logins.role(part))
        .fetch_one(admin)
        .await
        .unwrap();
        assert!(may, "{part} may not call batchonce_operator_terminate");
    }
    assert!(signals(logins.role("terminator")).await);
    for part in [
        "migrator", "producer", "worker", "readonly", "program", "guard",
    ] {
        assert!(!signals(logins.role(part)).await, "{part}");
    }
    let (owners, members): (Vec<String>, i64) = sqlx::query_as(
        "SELECT array_agg(DISTINCT proowner::regrole::text),
                (SELECT count(*) FROM pg_auth_members WHERE roleid = $1::regrole)
         FROM pg_proc WHERE proname = 'batchonce_operator_terminate'",
    )
    .bind(logins.role("terminator"))
    .fetch_one(admin)
    .await
    .unwrap();
    assert_eq!((owners, members), (vec![logins.role("terminator")], 0));

    // A session of another role: the operator cannot end it by itself.
    let victim = logins.pool("readonly").await;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&victim)
        .await
        .unwrap();
    let operator = logins.pool("operator").await;
    let err = sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&operator)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("pg_signal_backend"), "{err}");
    if stand_in {
        // Through the function the terminator's privilege does.
        let ended: bool = sqlx::query_scalar("SELECT batchonce_operator_terminate($1)")
            .bind(pid)
            .fetch_one(&operator)
            .await
            .unwrap();
        assert!(ended);
    }
}

/// The two functions left unpinned so that the planter inlines them (a SET
/// clause makes a SQL function a call per row): `batchonce_new_token`, drawn
/// once per claimed run, and `batchonce_partition`, called once per item of
/// a partition's scan. Each names only pg_catalog's functions, operators
/// and types (migrations 20261206000001 and 20261204000002).
const INLINED: [&str; 2] = ["batchonce_new_token", "batchonce_partition"];

/// The identifiers an inlined body may use unqualified: SQL keywords the
/// grammar itself maps to pg_catalog's types, and the functions' own
/// parameters.
const BARE_OK: [&str; 5] = ["select", "bit", "integer", "p_item_key", "p_partitions"];

/// Whether `src` names anything that a search path could resolve: every
/// call, cast and operator must be pg_catalog's by name or by keyword.
fn only_pg_catalog(src: &str) -> Result<(), String> {
    // String literals first: their text is not a name.
    let mut text = String::new();
    let mut in_literal = false;
    for ch in src.chars() {
        if ch == '\'' {
            in_literal = !in_literal;
            text.push(' ');
        } else if !in_literal {
            text.push(ch);
        }
    }
    let mut rest = text.replace('\n', " ");
    while let Some(at) = rest.find("OPERATOR(pg_catalog.") {
        let end = rest[at..].find(')').ok_or("unclosed OPERATOR(")? + at;
        rest.replace_range(at..=end, " ");
    }
    let chars: Vec<char> = rest.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let ch = chars[i];
        if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if word == "pg_catalog" && chars.get(i) == Some(&'.') {
                // Skip the qualified name that follows.
                i += 1;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            } else if !BARE_OK.contains(&word.to_lowercase().as_str()) {
                return Err(format!("unqualified name {word:?}"));
            }
        } else if ch == ':' && chars.get(i + 1) == Some(&':') {
            i += 2;
        } else if "+-*/<>=~!@#%^&|`?".contains(ch) {
            return Err(format!("unqualified operator {ch:?}"));
        } else {
            i += 1;
        }
    }
    Ok(())
}

/// Item 4 (a): after every migration (the bundled kinds' too) and `roles
/// --apply`, every function of the schema pins its search path, to the
/// schema or, for the audit table's trigger functions, to pg_catalog,
/// except the two inlined ones, whose bodies name nothing a path resolves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_function_is_pinned_but_the_two_inlined_ones() {
    // The checker itself refuses what it must.
    for bad in [
        "SELECT md5(p_item_key)",
        "SELECT pg_catalog.md5(p_item_key) + 1",
        "SELECT p_item_key::text",
    ] {
        assert!(only_pg_catalog(bad).is_err(), "{bad}");
    }
    let db = TestDb::empty().await;
    let admin = &db.pool;
    let logins = Logins::apply(BIN, &db, common::samples_config()).await;
    let rows: Vec<FunctionRow> = sqlx::query_as(
        "SELECT p.proname::text, p.oid::regprocedure::text, coalesce(p.proconfig, '{}'),
                p.prosrc, p.prolang = (SELECT l.oid FROM pg_language l WHERE l.lanname = 'sql'), p.prosecdef, p.proowner::regrole::text
         FROM pg_proc p
         WHERE p.pronamespace = current_schema()::regnamespace AND p.prokind IN ('f', 'p')
           AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
                             AND d.objid = p.oid AND d.deptype = 'e')
         ORDER BY 2",
    )
    .fetch_all(admin)
    .await
    .unwrap();
    assert!(rows.len() > 20, "only {} functions", rows.len());
    let path = |config: &[String]| {
        config
            .iter()
            .find_map(|c| c.strip_prefix("search_path=").map(str::to_owned))
    };
    let mut unpinned = Vec::new();
    let mut wrong = Vec::new();
    for (name, signature, config, src, sql, definer, owner) in &rows {
        match path(config) {
            None => {
                unpinned.push(name.clone());
                if INLINED.contains(&name.as_str()) {
                    assert!(*sql && !*definer && config.is_empty(), "{signature}");
                    if let Err(e) = only_pg_catalog(src) {
                        panic!("{signature} names what a search path resolves: {e}\n{src}");
                    }
                }
            }
            Some(p) if p == "public, pg_temp" => {}
            Some(p) if p == "pg_catalog, pg_temp" && *owner == logins.role("guard") => {}
            Some(p) => wrong.push(format!("{signature}: {p} (owner {owner})")),
        }
    }
    assert_eq!(unpinned, INLINED, "unpinned functions");
    assert!(wrong.is_empty(), "{wrong:?}");
}

/// One row of the table of rights in docs/security.md, its cells as sets of
/// names (the role's tables or functions).
struct DocRow {
    role: String,
    cells: Vec<String>,
}

const COLUMNS: [&str; 6] = [
    "reads",
    "inserts",
    "updates",
    "deletes",
    "executes",
    "member of",
];

fn doc_rows() -> Vec<DocRow> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/security.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let marker = "<!-- role-rights:";
    let at = text
        .find(marker)
        .expect("the role-rights marker in docs/security.md");
    let mut lines = text[at..].lines().skip(1);
    let header = lines.next().unwrap();
    let cols: Vec<&str> = header.split('|').map(str::trim).collect();
    assert_eq!(&cols[2..8], &COLUMNS, "the table's columns");
    lines
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<String> = l
                .trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_owned())
                .collect();
            assert_eq!(cells.len(), 7, "{l}");
            DocRow {
                role: cells[0].trim_matches('`').to_owned(),
                cells: cells[1..].to_vec(),
            }
        })
        .collect()
}

/// What the names of one cell stand for.
struct Universe {
    tables: BTreeSet<String>,
    kinds: BTreeSet<String>,
    outputs: BTreeSet<String>,
    functions: BTreeSet<String>,
    terminate: bool,
}

/// A cell's set: comma-separated terms, left to right; `not` removes;
/// `†` counts only without `batchonce_operator_terminate`, `‡` only with it,
/// `§` only while the schema has the function (`migrate --contract` drops it).
fn cell_set(cell: &str, u: &Universe, problems: &mut Vec<String>) -> BTreeSet<String> {
    let mut set = BTreeSet::new();
    if cell == "—" {
        return set;
    }
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, ch) in cell.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&cell[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&cell[start..]);
    for term in terms {
        let mut term = term.trim();
        if let Some(t) = term.strip_suffix('†') {
            if u.terminate {
                continue;
            }
            term = t;
        } else if let Some(t) = term.strip_suffix('‡') {
            if !u.terminate {
                continue;
            }
            term = t;
        } else if let Some(t) = term.strip_suffix('§') {
            if !u.functions.contains(t.trim_matches('`')) {
                continue;
            }
            term = t;
        }
        match term {
            "every table" => set.extend(u.tables.iter().cloned()),
            "kinds' tables" => set.extend(u.kinds.iter().cloned()),
            "output tables" => set.extend(u.outputs.iter().cloned()),
            "every function" => set.extend(u.functions.iter().cloned()),
            _ => {
                let (remove, term) = match term.strip_prefix("not ") {
                    Some(t) => (true, t),
                    None => (false, term),
                };
                // `table` (not `column`, …): every column but those.
                let (name, except) = match term.split_once(" (not ") {
                    Some((n, cols)) => (n, Some(cols.trim_end_matches(')'))),
                    None => (term, None),
                };
                let name = name.trim_matches('`').to_owned();
                let known = u.tables.contains(&name)
                    || u.functions.contains(&name)
                    || name.starts_with("pg_");
                if !known && !remove {
                    problems.push(format!("the docs name {name:?}, which the schema lacks"));
                }
                let entry = match except {
                    Some(cols) => {
                        let cols: Vec<&str> = cols
                            .split(',')
                            .map(|c| c.trim().trim_matches('`'))
                            .collect();
                        format!("{name}(-{})", cols.join(",-"))
                    }
                    None => name,
                };
                if remove {
                    set.remove(&entry);
                } else {
                    set.insert(entry);
                }
            }
        }
    }
    set
}

/// The catalog's answer for one role (`public` for PUBLIC), column by
/// column as the docs' table has them.
async fn catalog_sets(pool: &PgPool, role: &str) -> Vec<BTreeSet<String>> {
    let tables: Vec<TableRights> = sqlx::query_as(
        "SELECT c.relname::text,
                has_table_privilege($1, c.oid, 'SELECT'),
                has_table_privilege($1, c.oid, 'INSERT'),
                has_table_privilege($1, c.oid, 'UPDATE'),
                has_table_privilege($1, c.oid, 'DELETE'),
                has_table_privilege($1, c.oid, 'TRUNCATE')
                    AND c.relowner IS DISTINCT FROM (SELECT r.oid FROM pg_roles r WHERE r.rolname = $1),
                CASE WHEN has_any_column_privilege($1, c.oid, 'SELECT')
                      AND NOT has_table_privilege($1, c.oid, 'SELECT')
                     THEN ARRAY(SELECT a.attname::text FROM pg_attribute a
                                WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                                  AND NOT has_column_privilege($1, c.oid, a.attnum, 'SELECT')
                                ORDER BY a.attname)
                END
         FROM pg_class c
         WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')",
    )
    .bind(role)
    .fetch_all(pool)
    .await
    .unwrap();
    let mut sets = vec![BTreeSet::new(); 6];
    for (name, select, insert, update, delete, foreign_truncate, hidden) in tables {
        assert!(
            !foreign_truncate,
            "{role} may truncate {name}, which it does not own"
        );
        if select {
            sets[0].insert(name.clone());
        } else if let Some(hidden) = hidden {
            sets[0].insert(format!("{name}(-{})", hidden.join(",-")));
        }
        for (i, has) in [(1, insert), (2, update), (3, delete)] {
            if has {
                sets[i].insert(name.clone());
            }
        }
    }
    let executes: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT p.proname::text FROM pg_proc p
         WHERE p.pronamespace = current_schema()::regnamespace AND p.prokind IN ('f', 'p')
           AND has_function_privilege($1, p.oid, 'EXECUTE')",
    )
    .bind(role)
    .fetch_all(pool)
    .await
    .unwrap();
    sets[4].extend(executes);
    if role != "public" {
        let member_of: Vec<String> = sqlx::query_scalar(
            "SELECT roleid::regrole::text FROM pg_auth_members WHERE member = $1::regrole",
        )
        .bind(role)
        .fetch_all(pool)
        .await
        .unwrap();
        sets[5].extend(member_of);
    }
    sets
}

/// The Done-when of issue 42: the table of rights in docs/security.md, as
/// written, is what `roles --apply` left in the catalog, role by role and
/// privilege by privilege (what `PUBLIC` may execute is everyone's, so it
/// is counted in the `PUBLIC` row only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_role_table_of_the_docs_is_the_catalog() {
    let db = TestDb::empty().await;
    let admin = &db.pool;
    let logins = Logins::apply(BIN, &db, common::samples_config()).await;
    let tables: BTreeSet<String> = sqlx::query_scalar(
        "SELECT relname::text FROM pg_class
         WHERE relnamespace = current_schema()::regnamespace AND relkind IN ('r', 'p')",
    )
    .fetch_all(admin)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let functions: BTreeSet<String> = sqlx::query_scalar(
        "SELECT DISTINCT proname::text FROM pg_proc
         WHERE pronamespace = current_schema()::regnamespace AND prokind IN ('f', 'p')",
    )
    .fetch_all(admin)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let engine: BTreeSet<String> = batchonce::ops::roles::ENGINE_TABLES
        .iter()
        .map(|t| t.to_string())
        .collect();
    let universe = Universe {
        kinds: tables.difference(&engine).cloned().collect(),
        outputs: batchonce_workers::registry()
            .output_tables()
            .iter()
            .map(|t| t.to_string())
            .collect(),
        tables,
        functions,
        terminate: terminate_exists(admin).await,
    };
    let rows = doc_rows();
    let roles: Vec<&str> = rows.iter().map(|r| r.role.as_str()).collect();
    assert_eq!(
        roles,
        [
            "PUBLIC",
            "batchonce_migrator",
            "batchonce_producer",
            "batchonce_worker",
            "batchonce_operator",
            "batchonce_readonly",
            "batchonce_program",
            "batchonce_console",
            "batchonce_guard",
            "batchonce_terminator",
        ],
        "the table's roles"
    );
    let public = catalog_sets(admin, "public").await;
    let mut problems = Vec::new();
    for row in &rows {
        let role = match row.role.strip_prefix("batchonce_") {
            Some(part) => logins.role(part),
            None => "public".to_owned(),
        };
        let mut actual = catalog_sets(admin, &role).await;
        for (i, column) in COLUMNS.iter().enumerate() {
            let mut want = cell_set(&row.cells[i], &universe, &mut problems);
            if role != "public" && i == 4 {
                // Everyone's functions are the PUBLIC row's.
                want.retain(|f| !public[4].contains(f));
                actual[4].retain(|f| !public[4].contains(f));
            }
            if i == 5 {
                // Memberships name the roles of this prefix the docs call batchonce_.
                actual[5] = actual[5]
                    .iter()
                    .map(|m| m.replace(&format!("{}_", logins.prefix), "batchonce_"))
                    .collect();
            }
            if want != actual[i] {
                problems.push(format!(
                    "{} {column}: the docs say {:?}, the catalog {:?} (missing from the docs: {:?}; not granted: {:?})",
                    row.role,
                    want,
                    actual[i],
                    actual[i].difference(&want).collect::<Vec<_>>(),
                    want.difference(&actual[i]).collect::<Vec<_>>(),
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/security.md and the catalog differ:\n{}",
        problems.join("\n")
    );
}
