//! What the tests of `deploy/` share (`deploy_kubernetes.rs`,
//! `deploy_network_policy.rs`, `deploy_systemd.rs`,
//! `deploy_command_lines.rs`): the files read and parsed (the Kubernetes
//! manifests as YAML, the systemd units as settings), the `batchonce`
//! command lines in them, a checker of a command line against the binary's
//! `--help`, durations as both tools write them, and broken copies of the
//! files for the tests that show a check can fail. None of it needs a
//! database.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use yaml_rust2::{Yaml, YamlLoader};

use super::process::BIN;

/// A database that refuses every connection, so that nothing here touches
/// a real one: the processes must start, serve /healthz and stop anyway.
pub const NO_DATABASE: &str = "postgres://127.0.0.1:1/none";

pub fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// A fresh folder under the target directory for one test's files.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "deploy-{name}-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The files of a folder with one of the given extensions, sorted.
pub fn files(dir: &Path, exts: &[&str]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| exts.contains(&e))
        })
        .collect();
    out.sort();
    out
}

pub fn file_name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

/// Seconds in a duration as humantime (`--grace 20s`) or systemd
/// (`TimeoutStopSec=1min 30s`) write it. A bare number is seconds in both.
pub fn seconds(text: &str) -> f64 {
    let text = text.trim();
    if let Ok(n) = text.parse::<f64>() {
        return n;
    }
    let mut total = 0.0;
    let mut rest = text;
    while !rest.is_empty() {
        rest = rest.trim_start();
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n: f64 = rest[..digits]
            .parse()
            .unwrap_or_else(|_| panic!("bad duration {text:?}"));
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let factor = match &rest[..unit_len] {
            "ms" | "msec" => 0.001,
            "" | "s" | "sec" | "secs" => 1.0,
            "m" | "min" | "mins" => 60.0,
            "h" | "hr" | "hour" | "hours" => 3600.0,
            other => panic!("unknown unit {other:?} in duration {text:?}"),
        };
        total += n * factor;
        rest = &rest[unit_len..];
    }
    total
}

/// An option as `--help` prints it: `--grace <GRACE>` takes a value,
/// `--no-listen` does not.
#[derive(Debug, Default)]
pub struct Help {
    /// Long and short options, with whether each takes a value.
    pub options: HashMap<String, bool>,
    /// The subcommands under `Commands:`.
    pub commands: BTreeSet<String>,
    /// Whether the usage line names a positional argument (`<JOB>`).
    pub positional: bool,
}

pub fn parse_help(text: &str) -> Help {
    let mut help = Help::default();
    let mut in_commands = false;
    for line in text.lines() {
        if let Some(usage) = line.strip_prefix("Usage: ") {
            help.positional = usage
                .split_whitespace()
                .any(|w| w.starts_with('<') && w != "<COMMAND>");
        }
        if line.trim_end() == "Commands:" {
            in_commands = true;
            continue;
        }
        if in_commands {
            match line.strip_prefix("  ") {
                Some(entry) if !entry.starts_with(' ') => {
                    if let Some(name) = entry.split_whitespace().next() {
                        help.commands.insert(name.to_owned());
                    }
                    continue;
                }
                Some(_) => continue,
                None => in_commands = false,
            }
        }
        // clap prints an option as `  -h, --help` or `      --grace <GRACE>`,
        // the description after it or on the next line.
        let trimmed = line.trim_start();
        if !trimmed.starts_with('-') {
            continue;
        }
        let words: Vec<&str> = trimmed.split_whitespace().collect();
        let mut i = 0;
        while i < words.len() && words[i].starts_with('-') {
            let name = words[i].trim_end_matches(',');
            let takes_value = words.get(i + 1).is_some_and(|w| w.starts_with('<'));
            help.options.insert(name.to_owned(), takes_value);
            i += if takes_value { 2 } else { 1 };
        }
    }
    help
}

/// `batchonce [ARGS] --help`, parsed. Each distinct call runs once per
/// test process.
pub fn help_of(args: &[&str]) -> std::sync::Arc<Help> {
    use std::sync::{Arc, Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<HashMap<Vec<String>, Arc<Help>>>> = OnceLock::new();
    let key: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(h) = cache.lock().unwrap().get(&key) {
        return h.clone();
    }
    let out = Command::new(BIN)
        .args(args)
        .arg("--help")
        .env_remove("DATABASE_URL")
        .env_remove("BATCHONCE_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "batchonce {args:?} --help failed");
    let help = Arc::new(parse_help(&String::from_utf8_lossy(&out.stdout)));
    cache.lock().unwrap().insert(key, help.clone());
    help
}

/// The problems of one command line, `argv` being what follows the program
/// name: options that `batchonce --help` does not list before the
/// subcommand, a subcommand it does not list, options that
/// `batchonce <subcommand> --help` does not list, an option without its
/// value, and a stray word where the subcommand takes no positional
/// argument. Empty when the binary accepts every word of it.
pub fn command_line_problems(argv: &[String]) -> Vec<String> {
    let top = help_of(&[]);
    let mut problems = Vec::new();
    let mut i = 0;
    // Global options, such as --config, may come before the subcommand.
    while i < argv.len() && argv[i].starts_with('-') {
        let (name, inline) = split_option(&argv[i]);
        match top.options.get(name) {
            None => problems.push(format!("{name} is not in `batchonce --help`")),
            Some(true) if !inline => i += 1,
            Some(_) => {}
        }
        i += 1;
    }
    let Some(sub) = argv.get(i) else {
        problems.push("no subcommand".into());
        return problems;
    };
    if !top.commands.contains(sub.as_str()) {
        problems.push(format!("subcommand {sub} is not in `batchonce --help`"));
        return problems;
    }
    let help = help_of(&[sub]);
    i += 1;
    while i < argv.len() {
        let word = &argv[i];
        if word.starts_with('-') {
            let (name, inline) = split_option(word);
            match help.options.get(name) {
                None => problems.push(format!("{name} is not in `batchonce {sub} --help`")),
                Some(true) if !inline => {
                    if argv.get(i + 1).is_none() {
                        problems.push(format!("{name} has no value"));
                    }
                    i += 1;
                }
                Some(_) => {}
            }
        } else if !help.positional {
            problems.push(format!("`batchonce {sub}` takes no argument {word:?}"));
        }
        i += 1;
    }
    problems
}

/// `--name=value` is `--name` with its value inline.
pub fn split_option(word: &str) -> (&str, bool) {
    match word.split_once('=') {
        Some((name, _)) => (name, true),
        None => (word, false),
    }
}

pub fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_owned).collect()
}

pub struct Manifest {
    pub file: String,
    pub doc: Yaml,
}

/// The files under deploy/kubernetes, with their text.
pub fn manifest_texts() -> Vec<(String, String)> {
    files(&deploy().join("kubernetes"), &["yaml", "yml"])
        .iter()
        .map(|p| (file_name(p), std::fs::read_to_string(p).unwrap()))
        .collect()
}

/// Every YAML document of the files; a file may hold several.
pub fn parse_manifests(texts: &[(String, String)]) -> Vec<Manifest> {
    let mut out = Vec::new();
    for (file, text) in texts {
        let docs =
            YamlLoader::load_from_str(text).unwrap_or_else(|e| panic!("{file}: not YAML: {e}"));
        for doc in docs {
            // An empty document between two `---` is not a resource.
            if !doc.is_null() {
                out.push(Manifest {
                    file: file.clone(),
                    doc,
                });
            }
        }
    }
    assert!(!out.is_empty(), "no manifests under deploy/kubernetes");
    out
}

pub fn manifests() -> Vec<Manifest> {
    parse_manifests(&manifest_texts())
}

pub fn str_of<'a>(y: &'a Yaml, what: &str) -> &'a str {
    y.as_str()
        .unwrap_or_else(|| panic!("{what}: expected a string, found {y:?}"))
}

pub fn vec_of<'a>(y: &'a Yaml, what: &str) -> &'a [Yaml] {
    y.as_vec()
        .unwrap_or_else(|| panic!("{what}: expected a list, found {y:?}"))
}

pub fn kind(m: &Manifest) -> &str {
    str_of(&m.doc["kind"], &format!("{}: kind", m.file))
}

pub fn name(m: &Manifest) -> &str {
    str_of(
        &m.doc["metadata"]["name"],
        &format!("{}: metadata.name", m.file),
    )
}

/// The one manifest of a kind and name.
pub fn find<'a>(all: &'a [Manifest], want_kind: &str, want_name: &str) -> &'a Manifest {
    let found: Vec<&Manifest> = all
        .iter()
        .filter(|m| kind(m) == want_kind && m.doc["metadata"]["name"].as_str() == Some(want_name))
        .collect();
    assert_eq!(found.len(), 1, "expected one {want_kind} {want_name}");
    found[0]
}

/// A container's `batchonce` command line: `command` and `args` together,
/// without the program, or None if the container runs something else.
pub fn container_argv(file: &str, c: &Yaml) -> Option<Vec<String>> {
    let mut all = Vec::new();
    for field in ["command", "args"] {
        if c[field].is_badvalue() {
            continue;
        }
        for w in vec_of(&c[field], &format!("{file}: {field}")) {
            // Kubernetes refuses numbers here: every word must be a string.
            all.push(str_of(w, &format!("{file}: a word of {field}")).to_owned());
        }
    }
    let program = all.first()?;
    if Path::new(program).file_name()? != "batchonce" {
        return None;
    }
    Some(all[1..].to_vec())
}

/// The value that follows `flag` in an argv (`--flag value` or `--flag=value`).
pub fn flag_value<'a>(argv: &'a [String], flag: &str) -> Option<&'a str> {
    argv.iter().enumerate().find_map(|(i, w)| {
        if w == flag {
            argv.get(i + 1).map(String::as_str)
        } else {
            w.strip_prefix(flag).and_then(|rest| rest.strip_prefix('='))
        }
    })
}

pub fn subcommand(argv: &[String]) -> &str {
    let top = help_of(&[]);
    argv.iter()
        .find(|w| top.commands.contains(w.as_str()))
        .map(String::as_str)
        .unwrap_or_else(|| panic!("no subcommand in {argv:?}"))
}

pub fn pod_spec(m: &Manifest) -> &Yaml {
    let spec = &m.doc["spec"]["template"]["spec"];
    assert!(spec.is_hash(), "{}: no spec.template.spec", m.file);
    spec
}

/// Every container of every workload, with its batchonce argv.
pub fn batchonce_containers(all: &[Manifest]) -> Vec<(&Manifest, &Yaml, Vec<String>)> {
    let mut out = Vec::new();
    for m in all {
        if !matches!(
            kind(m),
            "Deployment" | "Job" | "StatefulSet" | "DaemonSet" | "CronJob"
        ) {
            continue;
        }
        for list in ["initContainers", "containers"] {
            let containers = &pod_spec(m)[list];
            if containers.is_badvalue() {
                continue;
            }
            for c in vec_of(containers, &format!("{}: {list}", m.file)) {
                if let Some(argv) = container_argv(&m.file, c) {
                    out.push((m, c, argv));
                }
            }
        }
    }
    out
}

/// The port of a `--metrics-addr` value such as `0.0.0.0:9464`.
pub fn port_of(addr: &str) -> i64 {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {addr:?}"))
}

/// A container's port as a probe or a Service names it: a number, or the
/// name of one of the container's `ports`.
pub fn container_port(m: &Manifest, c: &Yaml, port: &Yaml, what: &str) -> i64 {
    match port {
        Yaml::Integer(p) => *p,
        Yaml::String(named) => vec_of(&c["ports"], "ports")
            .iter()
            .find(|p| p["name"].as_str() == Some(named))
            .and_then(|p| p["containerPort"].as_i64())
            .unwrap_or_else(|| panic!("{}: {what} names port {named}", m.file)),
        other => panic!("{}: {what} is {other:?}", m.file),
    }
}

/// A `matchLabels` map (empty when absent).
pub fn label_map(y: &Yaml) -> BTreeMap<String, String> {
    let Some(h) = y.as_hash() else {
        return BTreeMap::new();
    };
    h.iter()
        .map(|(k, v)| {
            let value = match v {
                Yaml::String(s) => s.clone(),
                // Kubernetes wants strings; a YAML true or 1 is a mistake.
                other => panic!("label {k:?}: {other:?} is not a string"),
            };
            (str_of(k, "a label name").to_owned(), value)
        })
        .collect()
}

/// A unit file: each `Key=value` of each section, in order. Comments and
/// line continuations are handled as systemd does.
pub struct Unit {
    pub file: String,
    pub entries: Vec<(String, String, String)>,
}

impl Unit {
    pub fn parse(file: &str, text: &str) -> Unit {
        let mut entries = Vec::new();
        let mut section = String::new();
        let mut pending = String::new();
        for line in text.lines() {
            let line = line.trim();
            if pending.is_empty() && (line.is_empty() || line.starts_with(['#', ';'])) {
                continue;
            }
            if let Some(cont) = line.strip_suffix('\\') {
                pending.push_str(cont);
                pending.push(' ');
                continue;
            }
            let line = format!("{pending}{line}");
            pending.clear();
            if line.starts_with('[') {
                section = line.trim_matches(['[', ']']).to_owned();
            } else if let Some((k, v)) = line.split_once('=') {
                entries.push((section.clone(), k.trim().to_owned(), v.trim().to_owned()));
            } else {
                panic!("{file}: not a setting: {line}");
            }
        }
        Unit {
            file: file.to_owned(),
            entries,
        }
    }

    pub fn all(&self, section: &str, key: &str) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|(s, k, _)| s == section && k == key)
            .map(|(_, _, v)| v.as_str())
            .collect()
    }

    /// The last value of a setting, which is the one systemd uses.
    pub fn get(&self, section: &str, key: &str) -> Option<&str> {
        self.all(section, key).last().copied()
    }

    pub fn service(&self, key: &str) -> &str {
        self.get("Service", key)
            .unwrap_or_else(|| panic!("{}: no {key}=", self.file))
    }

    /// The `batchonce` command lines of its Exec*= settings, without the
    /// program and without systemd's prefixes (`-`, `@`, `+`, `!`, `:`).
    pub fn command_lines(&self) -> Vec<Vec<String>> {
        self.entries
            .iter()
            .filter(|(s, k, _)| s == "Service" && k.starts_with("Exec"))
            .filter_map(|(_, _, v)| {
                let argv = words(v.trim_start_matches(['-', '@', '+', '!', ':']));
                let program = argv.first()?;
                (Path::new(program).file_name()? == "batchonce").then(|| argv[1..].to_vec())
            })
            .collect()
    }
}

/// The files under deploy/systemd, with their text.
pub fn unit_texts() -> Vec<(String, String)> {
    files(&deploy().join("systemd"), &["service"])
        .iter()
        .map(|p| (file_name(p), std::fs::read_to_string(p).unwrap()))
        .collect()
}

pub fn parse_units(texts: &[(String, String)]) -> Vec<Unit> {
    let all: Vec<Unit> = texts.iter().map(|(f, t)| Unit::parse(f, t)).collect();
    assert!(!all.is_empty(), "no units under deploy/systemd");
    all
}

pub fn units() -> Vec<Unit> {
    parse_units(&unit_texts())
}

/// `texts` with one edit in `file`, `from` (which it must hold) replaced
/// by `to`: a broken copy of the files, for the tests that show a check
/// catches what it is there for.
pub fn edited(
    texts: &[(String, String)],
    file: &str,
    from: &str,
    to: &str,
) -> Vec<(String, String)> {
    texts
        .iter()
        .map(|(f, t)| {
            if f == file {
                assert!(t.contains(from), "{file} has no {from:?}");
                (f.clone(), t.replace(from, to))
            } else {
                (f.clone(), t.clone())
            }
        })
        .collect()
}

/// Fails the test unless `check` panics: a check that cannot fail on a
/// broken copy proves nothing by passing on the real files.
pub fn assert_caught(what: &str, check: impl FnOnce()) {
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(check));
    assert!(caught.is_err(), "{what} was not caught");
}

/// `argv` with the value after each of `flags` replaced; `source` names
/// the command line's file when a flag is missing.
pub fn with_values(source: &str, argv: &[String], flags: &[(&str, String)]) -> Vec<String> {
    let mut argv = argv.to_vec();
    for (flag, value) in flags {
        let i = argv
            .iter()
            .position(|w| w == flag)
            .unwrap_or_else(|| panic!("{source}: no {flag}"));
        argv[i + 1] = value.clone();
    }
    argv
}
