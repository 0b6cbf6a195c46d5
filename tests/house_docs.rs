//! Two house rules about documentation that a reviewer would otherwise
//! have to check by eye:
//!
//! - every module of `src/`, `workers/src/` and `batchonce-apalis/src/`
//!   opens with a `//!` of at most [`MAX_MODULE_DOC_LINES`] lines, saying
//!   what the module owns and its invariants (details belong on the item
//!   they describe, or in `docs/`);
//! - no file cites a file the repository does not hold: no tracked text
//!   file names the project's early design note (see [`MISSING_FILES`],
//!   spelt in two halves so this file does not name it), and every relative `*.md` path that a Rust
//!   file mentions is a file of the repository (its path, or the end of its
//!   path after the leading `./` and `../`, since code joins such paths to
//!   a folder of its own: `deploy().join("systemd/README.md")`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The longest a module's opening `//!` block may be.
const MAX_MODULE_DOC_LINES: usize = 40;

/// The source roots whose modules the first rule covers.
const SOURCE_ROOTS: &[&str] = &["src", "workers/src", "batchonce-apalis/src"];

/// Files that earlier designs cited but that this repository never held.
const MISSING_FILES: &[&str] = &[concat!("DESIGN", ".md")];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The `//!` lines of a file's opening block (blank lines and inner
/// attributes before it or between its lines are stepped over).
fn module_doc_lines(text: &str) -> usize {
    text.lines()
        .map(str::trim_start)
        .skip_while(|l| l.is_empty() || l.starts_with("#!["))
        .take_while(|l| l.is_empty() || l.starts_with("//!") || l.starts_with("#!["))
        .filter(|l| l.starts_with("//!"))
        .count()
}

#[test]
fn module_docs_are_at_most_forty_lines() {
    let root = root();
    let mut files = Vec::new();
    for dir in SOURCE_ROOTS {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 50, "found only {} source files", files.len());
    files.sort();
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let text = std::fs::read_to_string(f).expect("a readable source file");
            let n = module_doc_lines(&text);
            let rel = f.strip_prefix(&root).unwrap_or(f).display();
            (n > MAX_MODULE_DOC_LINES).then(|| format!("{rel}: {n} lines"))
        })
        .collect();
    assert!(
        long.is_empty(),
        "module docs longer than {MAX_MODULE_DOC_LINES} lines (say what the module owns and its \
         invariants; move details to the item they describe or to docs/):\n{}",
        long.join("\n")
    );
}

/// The repository's tracked files, or, outside a git checkout (a crate
/// tarball), every file but build output and dependencies.
fn repository_files(root: &Path) -> Vec<PathBuf> {
    let listed = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "-z"])
        .output();
    if let Ok(out) = listed {
        if out.status.success() {
            return out
                .stdout
                .split(|b| *b == 0)
                .filter(|p| !p.is_empty())
                .map(|p| PathBuf::from(String::from_utf8_lossy(p).into_owned()))
                .filter(|p| root.join(p).is_file())
                .collect();
        }
    }
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                if !(name.starts_with('.') || name.starts_with("target") || name == "node_modules")
                {
                    walk(root, &path, out);
                }
            } else if let Ok(rel) = path.strip_prefix(root) {
                out.push(rel.to_owned());
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out
}

/// The lines of a file that the rule covers: all of them, except for
/// CHANGELOG.md, whose released sections are history and keep their words.
fn current_lines(path: &Path, text: &str) -> Vec<(usize, String)> {
    let changelog = path == Path::new("CHANGELOG.md");
    let mut in_history = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if changelog && line.starts_with("## ") {
            in_history = !line.contains("Unreleased");
        }
        if !in_history {
            out.push((i + 1, line.to_owned()));
        }
    }
    out
}

/// The `*.md` paths a line names: runs of path characters ending in `.md`,
/// not part of a longer word, not absolute, not a URL's, and not a pattern
/// (`docs/*.md`, `{name}.md`).
fn md_paths(line: &str) -> Vec<String> {
    let is_path_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/');
    let chars: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i + 3 <= chars.len() {
        let ends_here = chars[i..i + 3] == ['.', 'm', 'd']
            && chars
                .get(i + 3)
                .is_none_or(|c| !(c.is_ascii_alphanumeric() || *c == '_'));
        if ends_here {
            let mut start = i;
            while start > 0 && is_path_char(chars[start - 1]) {
                start -= 1;
            }
            let before = if start > 0 { chars[start - 1] } else { ' ' };
            let path: String = chars[start..i + 3].iter().collect();
            let stem_ok = path.len() > 3 && !path.starts_with('/') && !path.ends_with("/.md");
            if stem_ok && !matches!(before, ':' | '*' | '}' | '$' | '%') {
                out.push(path);
            }
        }
        i += 1;
    }
    out
}

#[test]
fn no_file_cites_a_file_the_repository_does_not_hold() {
    let root = root();
    let files = repository_files(&root);
    assert!(files.len() > 100, "found only {} files", files.len());
    let held: Vec<String> = files
        .iter()
        .map(|f| f.to_string_lossy().replace('\\', "/"))
        .collect();
    let holds = |path: &str| {
        let mut p = path;
        while let Some(rest) = p.strip_prefix("./").or_else(|| p.strip_prefix("../")) {
            p = rest;
        }
        held.iter().any(|f| f == p || f.ends_with(&format!("/{p}")))
    };
    let mut missing = Vec::new();
    for rel in &files {
        // This test names the missing files in order to look for them.
        // Released migrations are checked too: `migrate` accepts one whose
        // comments alone were reworded, so a citation there can be fixed.
        if rel == Path::new("tests/house_docs.rs") {
            continue;
        }
        // Binary files are not read; nothing in them is a citation.
        let Ok(text) = std::fs::read_to_string(root.join(rel)) else {
            continue;
        };
        let rust = rel.extension().is_some_and(|e| e == "rs");
        for (n, line) in current_lines(rel, &text) {
            for name in MISSING_FILES {
                if line.contains(name) {
                    missing.push((rel.clone(), n, name.to_string()));
                }
            }
            if !rust {
                continue;
            }
            for path in md_paths(&line) {
                if MISSING_FILES.iter().any(|m| path.ends_with(m)) {
                    continue;
                }
                if !holds(&path) {
                    missing.push((rel.clone(), n, path));
                }
            }
        }
    }
    missing.sort();
    missing.dedup();
    let missing: Vec<String> = missing
        .iter()
        .map(|(file, n, name)| format!("{}:{n}: names {name}", file.display()))
        .collect();
    assert!(
        missing.is_empty(),
        "files cite files the repository does not hold (cite the docs/ page or ARCHITECTURE.md \
         section that holds the fact, or say it in place):\n{}",
        missing.join("\n")
    );
}

#[test]
fn md_paths_are_found_as_written() {
    assert_eq!(
        md_paths("see docs/state_machine.md, or (../docs/security.md)."),
        ["docs/state_machine.md", "../docs/security.md"]
    );
    assert_eq!(
        md_paths("every docs/*.md and {name}.md"),
        Vec::<String>::new()
    );
    assert_eq!(
        md_paths("https://example.com/README.md"),
        Vec::<String>::new()
    );
    assert_eq!(md_paths("the .mdx file, a.mdb"), Vec::<String>::new());
    assert_eq!(
        module_doc_lines("#![allow(x)]\n\n//! a\n//! b\n\nuse x;\n//! c"),
        2
    );
    assert_eq!(module_doc_lines("//! a\n\n//! b\nuse x;"), 2);
}
