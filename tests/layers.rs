//! The engine's layers hold: a module imports only from its own layer or the
//! ones below it (`src/lib.rs` lists them), and no two modules import each
//! other, directly or round a loop. The test reads every path in the code of
//! `src/` that starts at `crate::`, `self::` or `super::` (also inside `use`
//! groups, and `super::super::`), resolved to the module it names from the
//! file and inline module it stands in; comments and string literals are
//! skipped, since they may name anything. So a new upward import or a new
//! loop fails here before it reaches a reviewer.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layer of every top-level module, lowest first. A module missing here
/// fails the test, so a new module has to be placed in a layer.
const LAYERS: &[(&str, u8)] = &[
    ("key", 0),
    ("clock", 0),
    ("text", 0),
    ("schedule", 1),
    ("db", 1),
    ("telemetry", 1),
    ("config", 2),
    ("queue", 3),
    ("runtime", 4),
    ("console", 5),
    ("ops", 6),
    ("cli", 7),
    ("testing", 8),
];

fn layer(module: &str) -> Option<u8> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under `src/`: `config/mod.rs` is `config`,
/// `runtime/worker/finish.rs` is `runtime::worker::finish`, `lib.rs` the
/// crate's root (empty).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The graph's node of a module path: its top module and, when that module
/// is a folder with a child module of that name (a file or a folder), the
/// child (`runtime::worker`), since the files of one child
/// (`worker/finish.rs`) are one module's parts. An item's path
/// (`config::parse`, `config::tests`) is its module's node. `None` for the
/// crate's root.
fn node_of(path: &[String], children: &BTreeSet<String>) -> Option<(String, String)> {
    let top = path.first()?.clone();
    let node = match path.get(1) {
        Some(child) if children.contains(&format!("{top}::{child}")) => format!("{top}::{child}"),
        _ => top.clone(),
    };
    Some((top, node))
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
}

/// The code of a Rust file as identifiers, `::` and punctuation, without
/// comments, string and character literals, lifetimes and numbers.
fn tokens(code: &str) -> Vec<Token> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    // The end of a string literal opened at `from` (after its quote).
    let string_end = |mut j: usize| -> usize {
        while j < c.len() && c[j] != '"' {
            j += if c[j] == '\\' { 2 } else { 1 };
        }
        j + 1
    };
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            // Block comments nest in Rust.
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = string_end(i + 1);
        } else if ch == '\'' {
            if next == Some('\\') {
                // An escaped character: '\n', '\'', '\u{..}'.
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                // A lifetime or a label: its name is no path.
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            // r"…", r#"…"#, but not the raw identifier r#type.
            let hashes = c[i..].iter().take_while(|&&h| h == '#').count();
            let raw = matches!(word.as_str(), "r" | "br" | "cr") && c.get(i + hashes) == Some(&'"');
            let prefixed = matches!(word.as_str(), "b" | "c") && c.get(i) == Some(&'"');
            if raw {
                // r#"…"#: the literal ends at a quote and as many hashes.
                i += hashes + 1;
                while i < c.len() {
                    if c[i] == '"' && (1..=hashes).all(|h| c.get(i + h) == Some(&'#')) {
                        i += 1 + hashes;
                        break;
                    }
                    i += 1;
                }
            } else if prefixed {
                i = string_end(i + 1);
            } else if word == "b" && c.get(i) == Some(&'\'') {
                // A byte literal (b'x', b'\n') is read as a character next.
            } else {
                out.push(Token::Ident(word));
            }
        } else if ch == ':' && next == Some(':') {
            out.push(Token::PathSep);
            i += 2;
        } else {
            out.push(Token::Punct(ch));
            i += 1;
        }
    }
    out
}

/// Reads the path that starts at `t[*i]` (`crate::a::b`, `super::super::x`,
/// `use super::{a::B, c, self}`), resolved from `module` (the path of the
/// module it stands in), and adds every full path it names to `out`; leaves
/// `*i` after it. `prefix` is the path a group's items continue, `None` at
/// the start of a path.
fn read_path(
    t: &[Token],
    i: &mut usize,
    module: &[String],
    prefix: Option<Vec<String>>,
    out: &mut Vec<Vec<String>>,
) {
    let mut path = prefix;
    loop {
        match (t.get(*i), path.as_mut()) {
            (Some(Token::Ident(w)), None) if w == "crate" => path = Some(Vec::new()),
            (Some(Token::Ident(w)), None) if w == "self" => path = Some(module.to_vec()),
            (Some(Token::Ident(w)), None) if w == "super" => {
                let mut p = module.to_vec();
                p.pop();
                path = Some(p);
            }
            // In a group, `self` is the group's prefix.
            (Some(Token::Ident(w)), Some(_)) if w == "self" => {}
            (Some(Token::Ident(w)), Some(p)) if w == "super" => {
                p.pop();
            }
            (Some(Token::Ident(w)), Some(p)) => p.push(w.clone()),
            (Some(Token::Punct('*')), Some(_)) => {}
            (Some(Token::Punct('{')), Some(p)) => {
                let prefix = p.clone();
                *i += 1;
                loop {
                    match t.get(*i) {
                        None => return,
                        Some(Token::Punct('}')) => {
                            *i += 1;
                            return;
                        }
                        Some(Token::Punct(',')) => *i += 1,
                        Some(_) => read_path(t, i, module, Some(prefix.clone()), out),
                    }
                }
            }
            _ => {
                out.extend(path);
                *i += 1;
                return;
            }
        }
        *i += 1;
        // `a::b` goes on; `as x`, `,`, `}`, `;`, `(` end the path.
        if t.get(*i) == Some(&Token::PathSep) {
            *i += 1;
        } else {
            if let (Some(Token::Ident(w)), Some(Token::Ident(_))) = (t.get(*i), t.get(*i + 1)) {
                if w == "as" {
                    *i += 2;
                }
            }
            out.extend(path);
            return;
        }
    }
}

/// Every path of `crate::`, `self::` or `super::` in the code of the file
/// of module `file_module`, resolved to a full path from the crate's root.
/// Inline modules (`mod tests { use super::*; }`) are followed, so that
/// `super` there is the file's own module.
fn imports(code: &str, file_module: &[String]) -> Vec<Vec<String>> {
    let t = tokens(code);
    let mut out = Vec::new();
    // The inline modules open at this point, with the brace depth each
    // closes at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < t.len() {
        let module: Vec<String> = file_module
            .iter()
            .cloned()
            .chain(inline.iter().map(|(m, _)| m.clone()))
            .collect();
        match &t[i] {
            Token::Ident(w)
                if matches!(w.as_str(), "crate" | "self" | "super")
                    && t.get(i + 1) == Some(&Token::PathSep)
                    && (i == 0 || t[i - 1] != Token::PathSep)
                    // `pub(in crate::a)` is a visibility, not an import.
                    && !(i > 0 && t[i - 1] == Token::Ident("in".into())) =>
            {
                read_path(&t, &mut i, &module, None, &mut out);
                continue;
            }
            Token::Ident(w) if w == "mod" => {
                if let (Some(Token::Ident(name)), Some(Token::Punct('{'))) =
                    (t.get(i + 1), t.get(i + 2))
                {
                    depth += 1;
                    inline.push((name.clone(), depth));
                    i += 3;
                    continue;
                }
            }
            Token::Punct('{') => depth += 1,
            Token::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The imports of each file that breaks the layers, and the graph of the
/// module nodes, for the files of `src` given as (path under `src/`, code).
struct Findings {
    upward: Vec<String>,
    unplaced: BTreeSet<String>,
    graph: BTreeMap<String, BTreeSet<String>>,
}

fn check(files: &[(PathBuf, String)]) -> Findings {
    // Every module that is a file or a folder: the children a node may name.
    let children: BTreeSet<String> = files
        .iter()
        .map(|(rel, _)| module_path(rel))
        .filter(|p| p.len() >= 2)
        .map(|p| format!("{}::{}", p[0], p[1]))
        .collect();
    let mut found = Findings {
        upward: Vec::new(),
        unplaced: BTreeSet::new(),
        graph: BTreeMap::new(),
    };
    for (rel, code) in files {
        let own_path = module_path(rel);
        let Some((top, node)) = node_of(&own_path, &children) else {
            continue;
        };
        let Some(own) = layer(&top) else {
            found.unplaced.insert(top);
            continue;
        };
        for path in imports(code, &own_path) {
            let Some((to_top, to_node)) = node_of(&path, &children) else {
                continue;
            };
            let Some(theirs) = layer(&to_top) else {
                found.unplaced.insert(to_top);
                continue;
            };
            if to_top != top && theirs >= own {
                found
                    .upward
                    .push(format!("{} uses crate::{}", rel.display(), path.join("::")));
            }
            if to_node != node {
                found.graph.entry(node.clone()).or_default().insert(to_node);
            }
        }
    }
    found
}

/// A loop among the module nodes, by a depth-first search, or `None`.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let from = stack.iter().position(|s| s == n).unwrap();
                let mut cycle = stack[from..].to_vec();
                cycle.push(n.to_owned());
                return Some(cycle);
            }
            _ => {}
        }
        state.insert(n.to_owned(), 1);
        stack.push(n.to_owned());
        for m in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, graph, state, stack) {
                return Some(c);
            }
        }
        stack.pop();
        state.insert(n.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        let mut stack = Vec::new();
        if let Some(cycle) = visit(n, graph, &mut state, &mut stack) {
            return Some(cycle);
        }
    }
    None
}

fn src_files() -> Vec<(PathBuf, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let code = std::fs::read_to_string(&f).unwrap();
            (f.strip_prefix(&src).unwrap().to_owned(), code)
        })
        .collect()
}

#[test]
fn no_module_imports_from_a_layer_above_it_or_round_a_loop() {
    let found = check(&src_files());
    assert!(
        found.unplaced.is_empty(),
        "modules without a layer in tests/layers.rs and src/lib.rs: {:?}",
        found.unplaced
    );
    assert!(
        found.upward.is_empty(),
        "imports from the same or a higher layer:\n{}",
        found.upward.join("\n")
    );
    if let Some(cycle) = cycle(&found.graph) {
        panic!("modules import each other: {}", cycle.join(" -> "));
    }
}

/// The reader resolves what the layers test relies on: `super::` and
/// `self::` from the file and the inline module they stand in, groups,
/// renames and globs, and nothing in comments or literals.
#[test]
fn the_reader_resolves_relative_paths_and_groups() {
    let code = r##"
        //! crate::ops in a module doc
        use super::{a::B, c, self as d};
        use super::super::queue::Run;
        use self::inner::X;
        use crate::{config::{self, JobConfig}, key::*};
        fn f() -> &'static str { let _ = 'x'; /* crate::cli */ "crate::console" }
        fn g<'a>() { r#"super::hidden"#; b'"'; }
        pub(in crate::runtime) fn h() {}
        mod tests {
            use super::*;
            use super::super::job_table as jt;
        }
    "##;
    let module: Vec<String> = ["config", "command"].map(String::from).to_vec();
    let got: BTreeSet<String> = imports(code, &module)
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    let want: BTreeSet<String> = [
        "config::a::B",
        "config::c",
        "config",
        "queue::Run",
        "config::command::inner::X",
        "config",
        "config::JobConfig",
        "key",
        "config::command",
        "config::job_table",
    ]
    .map(String::from)
    .into_iter()
    .collect();
    assert_eq!(got, want);
}

/// The loop check fails on a loop that only `super::` paths make, as
/// `config/command.rs` and `config/job_table.rs` once had.
#[test]
fn a_loop_through_super_paths_is_caught() {
    let files = [
        ("config/mod.rs", "mod command; mod job_table;"),
        ("config/command.rs", "use super::job_table::as_int;"),
        (
            "config/job_table.rs",
            "use super::{command::apply, JobConfig};",
        ),
    ]
    .map(|(f, c)| (PathBuf::from(f), c.to_owned()));
    let found = check(&files);
    let graph: Vec<String> = found
        .graph
        .iter()
        .flat_map(|(from, to)| to.iter().map(move |t| format!("{from} -> {t}")))
        .collect();
    assert_eq!(
        graph,
        [
            "config::command -> config::job_table",
            "config::job_table -> config",
            "config::job_table -> config::command",
        ]
    );
    let cycle = cycle(&found.graph).expect("the loop is not caught");
    assert!(
        cycle.contains(&"config::command".to_owned())
            && cycle.contains(&"config::job_table".to_owned()),
        "{cycle:?}"
    );
    // And an import from a higher layer through `super::super::`.
    let files = [(
        PathBuf::from("config/command.rs"),
        "use super::super::queue::Run;".to_owned(),
    )];
    assert_eq!(
        check(&files).upward,
        ["config/command.rs uses crate::queue::Run"]
    );
}

#[test]
fn every_module_of_lib_rs_has_a_layer() {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let declared: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';'))
        .collect();
    assert!(declared.len() >= 10, "src/lib.rs declares {declared:?}");
    for m in declared {
        assert!(
            layer(m).is_some(),
            "src/lib.rs declares `{m}`, which tests/layers.rs places in no layer"
        );
    }
}
