//! Documentation that cannot drift: every relative link in the project's
//! Markdown (README.md, docs/, the top-level pages, deploy/'s READMEs)
//! names a file that exists, and every `#anchor` names a heading of the
//! page it points into, as GitHub renders them.

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
