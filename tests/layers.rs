//! The engine's layers hold: a module imports only from its own layer or the
//! ones below it (`src/lib.rs` lists them), and no two modules import each
//! other, directly or round a loop. The test reads every `crate::` path in
//! the code of `src/` (comments and doc comments are skipped, since they may
//! name anything), so a new upward import fails here before it reaches a
//! reviewer.

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

/// The module a file belongs to, as a node of the import graph: the top
/// module and, inside a folder, its child (`runtime::worker`), since the
/// files of one child (`worker/finish.rs`) are one module's parts.
fn node_of(rel: &Path) -> Option<(String, String)> {
    let parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let top = parts.first()?.clone();
    if top == "lib" || top == "main" {
        return None;
    }
    let node = match parts.get(1) {
        Some(child) if child != "mod" => format!("{top}::{child}"),
        _ => top.clone(),
    };
    Some((top, node))
}

/// The `crate::a` or `crate::a::b` paths named in the code of a file, as
/// (top module, node) pairs; a node is `a::b` only when `a` is a folder.
fn imports(code: &str, folders: &BTreeSet<String>) -> BTreeSet<(String, String)> {
    let mut found = BTreeSet::new();
    for line in code.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        let line = line.split(" //").next().unwrap_or(line);
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            let ident = |s: &str| -> String {
                s.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect()
            };
            let top = ident(after);
            let mut node = top.clone();
            if folders.contains(&top) {
                let tail = &after[top.len()..];
                if let Some(t) = tail.strip_prefix("::") {
                    let child = ident(t);
                    if !child.is_empty() && child.chars().next().is_some_and(char::is_lowercase) {
                        node = format!("{top}::{child}");
                    }
                }
            }
            if !top.is_empty() {
                found.insert((top, node));
            }
            rest = after;
        }
    }
    found
}

#[test]
fn no_module_imports_from_a_layer_above_it_or_round_a_loop() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let folders: BTreeSet<String> = std::fs::read_dir(&src)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();

    let mut upward = Vec::new();
    let mut unplaced = BTreeSet::new();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let Some((top, node)) = node_of(rel) else {
            continue;
        };
        let Some(own) = layer(&top) else {
            unplaced.insert(top);
            continue;
        };
        let code = std::fs::read_to_string(file).unwrap();
        for (to_top, to_node) in imports(&code, &folders) {
            let Some(theirs) = layer(&to_top) else {
                unplaced.insert(to_top);
                continue;
            };
            if to_top != top && theirs >= own {
                upward.push(format!("{} uses crate::{to_node}", rel.display()));
            }
            if to_node != node {
                graph.entry(node.clone()).or_default().insert(to_node);
            }
        }
    }
    assert!(
        unplaced.is_empty(),
        "modules without a layer in tests/layers.rs and src/lib.rs: {unplaced:?}"
    );
    assert!(
        upward.is_empty(),
        "imports from the same or a higher layer:\n{}",
        upward.join("\n")
    );

    // A depth-first search for a cycle among the module nodes.
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
        if let Some(cycle) = visit(n, &graph, &mut state, &mut stack) {
            panic!("modules import each other: {}", cycle.join(" -> "));
        }
    }
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
