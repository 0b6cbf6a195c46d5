//! Documentation that cannot drift: every relative link in the project's
//! Markdown (README.md, docs/, the top-level pages, deploy/'s READMEs)
//! names a file that exists, and every `#anchor` names a heading of the
//! page it points into, as GitHub renders them; every `batchonce …` command
//! line names real subcommands and flags; the command-line reference is the
//! one the binary's clap definitions generate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use pulldown_cmark::{Event, HeadingLevel, Parser, Tag, TagEnd};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// The Markdown pages a reader opens.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "RELIABILITY.md",
        "BENCHMARKS.md",
    ]
    .iter()
    .map(|p| root.join(p))
    .filter(|p| p.is_file())
    .collect();
    for dir in [
        "docs",
        "deploy/systemd",
        "deploy/kubernetes",
        "examples/node-invoices",
    ] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "md") {
                pages.push(p);
            }
        }
    }
    pages.sort();
    pages
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-`
/// and `_` dropped, spaces as `-`; a repeated heading gets `-1`, `-2`, ….
fn slug(text: &str) -> String {
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page and its links (destination, line).
fn read(page: &Path) -> (BTreeSet<String>, Vec<(String, usize)>) {
    let text = std::fs::read_to_string(page).unwrap();
    let mut anchors = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut links = Vec::new();
    let mut heading: Option<String> = None;
    for (event, range) in Parser::new(&text).into_offset_iter() {
        match event {
            Event::Start(Tag::Heading { level, .. }) if level <= HeadingLevel::H6 => {
                heading = Some(String::new());
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let base = slug(&heading.take().unwrap_or_default());
                let n = seen.entry(base.clone()).or_insert(0);
                anchors.insert(if *n == 0 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                });
                *n += 1;
            }
            Event::Start(Tag::Link { dest_url, .. }) => {
                let line = text[..range.start].matches('\n').count() + 1;
                links.push((dest_url.to_string(), line));
            }
            _ => {}
        }
    }
    (anchors, links)
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let pages = pages();
    assert!(pages.len() >= 5, "no pages found: {pages:?}");
    let mut anchors: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let (own, links) = read(page);
        anchors.insert(page.clone(), own);
        for (dest, line) in links {
            if dest.contains("://") || dest.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match dest.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (dest.as_str(), None),
            };
            let target = if path.is_empty() {
                page.clone()
            } else {
                match page.parent().unwrap().join(path).canonicalize() {
                    Ok(t) => t,
                    Err(_) => {
                        broken.push(format!("{}:{line}: {dest}: no such file", page.display()));
                        continue;
                    }
                }
            };
            let Some(anchor) = anchor else { continue };
            if target.extension().is_none_or(|x| x != "md") {
                continue;
            }
            if !anchors.contains_key(&target) {
                let (a, _) = read(&target);
                anchors.insert(target.clone(), a);
            }
            if !anchors[&target].contains(anchor) {
                broken.push(format!(
                    "{}:{line}: {dest}: no heading with the anchor #{anchor}",
                    page.display()
                ));
            }
        }
    }
    assert!(checked > 0, "no relative link found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_anchor_rule_matches_github() {
    assert_eq!(slug("Exit codes"), "exit-codes");
    assert_eq!(
        slug("Operating batchonce: stale runs, fail, rerun, skip"),
        "operating-batchonce-stale-runs-fail-rerun-skip"
    );
    assert_eq!(
        slug("When an action waits for a lock: `--lock-timeout`"),
        "when-an-action-waits-for-a-lock---lock-timeout"
    );
}

/// docs/cli-reference.md is generated from the clap definitions the binary
/// parses with, so it cannot say what the binary does not. Regenerate it
/// with `BATCHONCE_UPDATE_DOCS=1 cargo test -p batchonce-workers --test docs`.
#[test]
fn the_command_line_reference_is_what_the_binary_says() {
    let path = root().join("docs/cli-reference.md");
    let generated = format!(
        "<!-- Generated from the clap definitions by workers/tests/docs.rs; do not edit. -->\n\n{}",
        clap_markdown::help_markdown_command(&batchonce::cli::command())
    );
    if std::env::var_os("BATCHONCE_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "docs/cli-reference.md differs from what the binary's clap definitions say: \
         regenerate it with BATCHONCE_UPDATE_DOCS=1 cargo test -p batchonce-workers --test docs"
    );
}

/// The `batchonce …` command lines of a page: lines of its code blocks and
/// inline code spans that start with `batchonce ` (after a `$ ` prompt or
/// `VAR=value` assignments), with the line they stand on.
fn command_lines(page: &Path) -> Vec<(String, usize)> {
    let text = std::fs::read_to_string(page).unwrap();
    let mut out = Vec::new();
    let mut in_block = false;
    for (event, range) in Parser::new(&text).into_offset_iter() {
        let line = text[..range.start].matches('\n').count() + 1;
        match event {
            Event::Start(Tag::CodeBlock(_)) => in_block = true,
            Event::End(TagEnd::CodeBlock) => in_block = false,
            Event::Text(t) if in_block => {
                for (i, l) in t.lines().enumerate() {
                    out.push((l.to_owned(), line + i));
                }
            }
            Event::Code(t) => out.push((t.to_string(), line)),
            _ => {}
        }
    }
    out.into_iter()
        .filter_map(|(l, n)| {
            let mut words = l.split_whitespace().skip_while(|w| {
                *w == "$" || *w == "sudo" || (w.contains('=') && !w.starts_with('-'))
            });
            (words.next() == Some("batchonce")).then(|| {
                // A comment ends the command.
                let cmd = l.split(" #").next().unwrap_or(&l);
                (cmd.trim().to_owned(), n)
            })
        })
        .collect()
}

/// Checks one command line against clap's tree: each subcommand (or each
/// of `a|b` alternatives) exists, and each `--flag` belongs to the command
/// it follows or is global. Placeholders (KEY, `...`) are not judged.
fn check_command(root: &clap::Command, line: &str) -> Result<(), String> {
    let globals: Vec<String> = root
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_owned))
        .collect();
    let takes_value = |cmd: &clap::Command, flag: &str| {
        cmd.get_arguments()
            .chain(root.get_arguments())
            .find(|a| a.get_long() == Some(flag))
            .is_some_and(|a| a.get_action().takes_values())
    };
    let mut path: Vec<&clap::Command> = vec![root];
    let mut words = line
        .split_whitespace()
        .skip_while(|w| *w != "batchonce")
        .skip(1)
        .map(|w| w.trim_matches(|c| c == '[' || c == ']' || c == '`'))
        .peekable();
    let mut expect_sub = true;
    while let Some(w) = words.next() {
        let current = *path.last().unwrap();
        if let Some(flag) = w.strip_prefix("--") {
            let flag = flag.split('=').next().unwrap_or(flag);
            if flag.is_empty() || flag == "help" || flag == "version" {
                continue;
            }
            let known = current.get_arguments().any(|a| a.get_long() == Some(flag))
                || globals.iter().any(|g| g == flag);
            if !known {
                return Err(format!("`{}` has no --{flag}", current.get_name()));
            }
            if !w.contains('=') && takes_value(current, flag) {
                words.next();
            }
            continue;
        }
        if w.starts_with('-') || !expect_sub {
            continue;
        }
        // A placeholder (`<command>`, `OPTIONS`, `…`) stands for any
        // subcommand; a word ending in `:` is prose quoting a log line.
        let placeholder = w.starts_with('<')
            || w == "…"
            || w == "..."
            || (w.chars().any(char::is_alphabetic) && w.chars().all(|c| !c.is_lowercase()));
        if placeholder || w.ends_with(':') {
            expect_sub = false;
            continue;
        }
        if current.get_subcommands().next().is_none() {
            expect_sub = false;
            continue;
        }
        let alternatives: Vec<&str> = w.split('|').collect();
        let mut found = None;
        for alt in &alternatives {
            match current.find_subcommand(alt) {
                Some(c) => found = found.or(Some(c)),
                None => {
                    return Err(format!(
                        "`{}` has no subcommand {alt:?}",
                        current.get_name()
                    ))
                }
            }
        }
        path.push(found.unwrap());
    }
    Ok(())
}

#[test]
fn every_command_line_in_the_docs_names_real_commands_and_flags() {
    let cli = batchonce::cli::command();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for page in pages() {
        for (line, n) in command_lines(&page) {
            checked += 1;
            if let Err(e) = check_command(&cli, &line) {
                wrong.push(format!("{}:{n}: {line}: {e}", page.display()));
            }
        }
    }
    assert!(checked > 20, "only {checked} command lines found");
    assert!(
        wrong.is_empty(),
        "command lines the binary would refuse:\n{}",
        wrong.join("\n")
    );
}

/// README.md sells, shows and links; the guide is in docs/.
#[test]
fn the_readme_stays_short() {
    let words = std::fs::read_to_string(root().join("README.md"))
        .unwrap()
        .split_whitespace()
        .count();
    assert!(
        words <= 1_800,
        "README.md has {words} words; at most 1,800: move detail into a page of docs/"
    );
}

/// ARCHITECTURE.md is a map: the detail of a module lives in its `//!`.
#[test]
fn the_architecture_map_stays_short() {
    let words = std::fs::read_to_string(root().join("ARCHITECTURE.md"))
        .unwrap()
        .split_whitespace()
        .count();
    assert!(
        words <= 5_000,
        "ARCHITECTURE.md has {words} words; at most 5,000: move a module's detail into its //! docs"
    );
}

/// BENCHMARKS.md holds the current figures and how to reproduce them; the
/// rounds that led to them stay in git (`git log -p BENCHMARKS.md`).
#[test]
fn the_benchmarks_page_stays_short() {
    let words = std::fs::read_to_string(root().join("BENCHMARKS.md"))
        .unwrap()
        .split_whitespace()
        .count();
    assert!(
        words <= 3_000,
        "BENCHMARKS.md has {words} words; at most 3,000: keep the newest figure of each scenario \
         and leave earlier rounds to git history"
    );
}
