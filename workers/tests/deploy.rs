//! The deployment files in `deploy/`: the Kubernetes manifests have the
//! structure that matters (probes on the metrics port, a termination grace
//! period longer than the worker's `--grace`, at least two producers, a
//! `migrate` Job, one console whose users file comes from a Secret, behind
//! a ClusterIP Service, NetworkPolicies that admit only the scraper and
//! only to the metrics port, and only the ingress controller and only to the
//! console's port), the systemd units have the settings that matter, every
//! `batchonce` command line in them uses only subcommands and flags that the
//! binary's `--help` lists, the long-running ones start and answer their
//! probes, and `systemd-analyze verify` accepts the units where it is
//! installed. None of this needs a database.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use yaml_rust2::{Yaml, YamlLoader};

const BIN: &str = env!("CARGO_BIN_EXE_batchonce");

/// A database that refuses every connection, so that nothing here touches
/// a real one: the processes must start, serve /healthz and stop anyway.
const NO_DATABASE: &str = "postgres://127.0.0.1:1/none";

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// A fresh folder under the target directory for one test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "deploy-{name}-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The files of a folder with one of the given extensions, sorted.
fn files(dir: &Path, exts: &[&str]) -> Vec<PathBuf> {
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

fn file_name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

// ---------------------------------------------------------------------------
// Durations

/// Seconds in a duration as humantime (`--grace 20s`) or systemd
/// (`TimeoutStopSec=1min 30s`) write it. A bare number is seconds in both.
fn seconds(text: &str) -> f64 {
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

#[test]
fn durations_parse_as_both_tools_write_them() {
    assert_eq!(seconds("20s"), 20.0);
    assert_eq!(seconds("45"), 45.0);
    assert_eq!(seconds("1min 30s"), 90.0);
    assert_eq!(seconds("1m30s"), 90.0);
    assert_eq!(seconds("2h"), 7200.0);
    assert_eq!(seconds("500ms"), 0.5);
}

// ---------------------------------------------------------------------------
// The command-line checker

/// An option as `--help` prints it: `--grace <GRACE>` takes a value,
/// `--no-listen` does not.
#[derive(Debug, Default)]
struct Help {
    /// Long and short options, with whether each takes a value.
    options: HashMap<String, bool>,
    /// The subcommands under `Commands:`.
    commands: BTreeSet<String>,
    /// Whether the usage line names a positional argument (`<JOB>`).
    positional: bool,
}

fn parse_help(text: &str) -> Help {
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
fn help_of(args: &[&str]) -> std::sync::Arc<Help> {
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
fn command_line_problems(argv: &[String]) -> Vec<String> {
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
fn split_option(word: &str) -> (&str, bool) {
    match word.split_once('=') {
        Some((name, _)) => (name, true),
        None => (word, false),
    }
}

fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_owned).collect()
}

#[test]
fn the_checker_reports_made_up_flags_and_subcommands() {
    // The checker must be able to fail, or its silence below proves nothing.
    let refused = [
        (
            "worker --made-up-flag",
            "--made-up-flag is not in `batchonce worker --help`",
        ),
        (
            "--no-such-global worker",
            "--no-such-global is not in `batchonce --help`",
        ),
        (
            "--config /x wroker",
            "subcommand wroker is not in `batchonce --help`",
        ),
        ("worker --grace", "--grace has no value"),
        (
            "worker --grace 20 s",
            "`batchonce worker` takes no argument \"s\"",
        ),
        // --once exists for produce, not for worker.
        (
            "worker --once",
            "--once is not in `batchonce worker --help`",
        ),
    ];
    for (line, want) in refused {
        assert_eq!(command_line_problems(&words(line)), [want], "{line}");
    }
    // And it accepts what the binary accepts: global options before or
    // after the subcommand, inline values, flags and positional arguments.
    for ok in [
        "--config /etc/batchonce/batchonce.toml worker --worker-id a-1 --grace 20s --no-listen",
        "worker --config=/x --log-format json --metrics-addr=0.0.0.0:9464",
        "produce --once --json",
        "enqueue daily-settlement --date 2026-09-15",
        "migrate",
    ] {
        assert_eq!(
            command_line_problems(&words(ok)),
            Vec::<String>::new(),
            "{ok}"
        );
    }
}

// ---------------------------------------------------------------------------
// Kubernetes

struct Manifest {
    file: String,
    doc: Yaml,
}

/// The files under deploy/kubernetes, with their text.
fn manifest_texts() -> Vec<(String, String)> {
    files(&deploy().join("kubernetes"), &["yaml", "yml"])
        .iter()
        .map(|p| (file_name(p), std::fs::read_to_string(p).unwrap()))
        .collect()
}

/// Every YAML document of the files; a file may hold several.
fn parse_manifests(texts: &[(String, String)]) -> Vec<Manifest> {
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

fn manifests() -> Vec<Manifest> {
    parse_manifests(&manifest_texts())
}

fn str_of<'a>(y: &'a Yaml, what: &str) -> &'a str {
    y.as_str()
        .unwrap_or_else(|| panic!("{what}: expected a string, found {y:?}"))
}

fn vec_of<'a>(y: &'a Yaml, what: &str) -> &'a [Yaml] {
    y.as_vec()
        .unwrap_or_else(|| panic!("{what}: expected a list, found {y:?}"))
}

fn kind(m: &Manifest) -> &str {
    str_of(&m.doc["kind"], &format!("{}: kind", m.file))
}

fn name(m: &Manifest) -> &str {
    str_of(
        &m.doc["metadata"]["name"],
        &format!("{}: metadata.name", m.file),
    )
}

/// The one manifest of a kind and name.
fn find<'a>(all: &'a [Manifest], want_kind: &str, want_name: &str) -> &'a Manifest {
    let found: Vec<&Manifest> = all
        .iter()
        .filter(|m| kind(m) == want_kind && m.doc["metadata"]["name"].as_str() == Some(want_name))
        .collect();
    assert_eq!(found.len(), 1, "expected one {want_kind} {want_name}");
    found[0]
}

/// A container's `batchonce` command line: `command` and `args` together,
/// without the program, or None if the container runs something else.
fn container_argv(file: &str, c: &Yaml) -> Option<Vec<String>> {
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
fn flag_value<'a>(argv: &'a [String], flag: &str) -> Option<&'a str> {
    argv.iter().enumerate().find_map(|(i, w)| {
        if w == flag {
            argv.get(i + 1).map(String::as_str)
        } else {
            w.strip_prefix(flag).and_then(|rest| rest.strip_prefix('='))
        }
    })
}

fn subcommand(argv: &[String]) -> &str {
    let top = help_of(&[]);
    argv.iter()
        .find(|w| top.commands.contains(w.as_str()))
        .map(String::as_str)
        .unwrap_or_else(|| panic!("no subcommand in {argv:?}"))
}

fn pod_spec(m: &Manifest) -> &Yaml {
    let spec = &m.doc["spec"]["template"]["spec"];
    assert!(spec.is_hash(), "{}: no spec.template.spec", m.file);
    spec
}

/// Every container of every workload, with its batchonce argv.
fn batchonce_containers(all: &[Manifest]) -> Vec<(&Manifest, &Yaml, Vec<String>)> {
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

#[test]
fn every_manifest_is_a_resource_and_kustomization_lists_them_all() {
    let all = manifests();
    let mut kinds = BTreeMap::<String, usize>::new();
    for m in &all {
        assert!(
            m.doc["apiVersion"].as_str().is_some(),
            "{}: no apiVersion",
            m.file
        );
        *kinds.entry(kind(m).to_owned()).or_default() += 1;
        if kind(m) != "Kustomization" {
            assert!(!name(m).is_empty(), "{}: empty metadata.name", m.file);
        }
    }
    assert_eq!(kinds.get("Deployment"), Some(&4), "{kinds:?}");
    assert_eq!(kinds.get("Job"), Some(&1), "{kinds:?}");
    assert_eq!(kinds.get("ConfigMap"), Some(&1), "{kinds:?}");
    assert_eq!(kinds.get("Service"), Some(&1), "{kinds:?}");
    assert_eq!(kinds.get("Kustomization"), Some(&1), "{kinds:?}");
    assert_eq!(kinds.get("NetworkPolicy"), Some(&2), "{kinds:?}");

    // kustomization.yaml must list every other file, and only files that
    // exist, so that `kubectl apply -k` applies what this test checks.
    let kustomization = all.iter().find(|m| kind(m) == "Kustomization").unwrap();
    let listed: BTreeSet<String> = vec_of(&kustomization.doc["resources"], "resources")
        .iter()
        .map(|r| str_of(r, "a resource").to_owned())
        .collect();
    let present: BTreeSet<String> = all
        .iter()
        .filter(|m| kind(m) != "Kustomization")
        .map(|m| m.file.clone())
        .collect();
    assert_eq!(listed, present, "kustomization.yaml resources");

    // Every workload runs batchonce and has requests and limits.
    for (m, c, _) in batchonce_containers(&all) {
        for field in ["requests", "limits"] {
            for r in ["cpu", "memory"] {
                assert!(
                    !c["resources"][field][r].is_badvalue(),
                    "{}: resources.{field}.{r} missing",
                    m.file
                );
            }
        }
    }
}

/// The port of a `--metrics-addr` value such as `0.0.0.0:9464`.
fn port_of(addr: &str) -> i64 {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {addr:?}"))
}

/// A container's port as a probe or a Service names it: a number, or the
/// name of one of the container's `ports`.
fn container_port(m: &Manifest, c: &Yaml, port: &Yaml, what: &str) -> i64 {
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

/// Probes on /healthz (liveness) and `readiness` at the port of the address
/// that `addr_flag` gives (`--metrics-addr`, or the console's `--listen`),
/// which binds to every address, since the kubelet probes from outside the
/// pod's loopback interface. Returns that port.
fn check_probes(m: &Manifest, c: &Yaml, argv: &[String], addr_flag: &str, readiness: &str) -> i64 {
    let addr = flag_value(argv, addr_flag).unwrap_or_else(|| panic!("{}: no {addr_flag}", m.file));
    assert!(
        addr.starts_with("0.0.0.0:") || addr.starts_with("[::]:"),
        "{}: {addr_flag} {addr} cannot be reached by the kubelet's probes",
        m.file
    );
    let port = port_of(addr);
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", readiness)] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{}: {probe}", m.file);
        // A named port must name the container port of the address.
        let probe_port = container_port(m, c, &get["port"], &format!("{probe}.httpGet.port"));
        assert_eq!(probe_port, port, "{}: {probe} port", m.file);
    }
    port
}

/// `--config` names a file of a ConfigMap volume, and that ConfigMap holds it.
fn check_config_mount(all: &[Manifest], m: &Manifest, c: &Yaml, argv: &[String]) {
    let config = flag_value(argv, "--config").unwrap_or_else(|| panic!("{}: no --config", m.file));
    let path = Path::new(config);
    let dir = path.parent().unwrap().to_str().unwrap();
    let key = path.file_name().unwrap().to_str().unwrap();
    let mount = vec_of(&c["volumeMounts"], &format!("{}: volumeMounts", m.file))
        .iter()
        .find(|v| v["mountPath"].as_str() == Some(dir))
        .unwrap_or_else(|| panic!("{}: nothing mounted at {dir}", m.file));
    let volume_name = str_of(&mount["name"], "volumeMounts.name");
    let volume = vec_of(&pod_spec(m)["volumes"], "volumes")
        .iter()
        .find(|v| v["name"].as_str() == Some(volume_name))
        .unwrap_or_else(|| panic!("{}: no volume {volume_name}", m.file));
    let map_name = str_of(&volume["configMap"]["name"], "volume's configMap.name");
    let map = find(all, "ConfigMap", map_name);
    assert!(
        map.doc["data"][key].as_str().is_some(),
        "ConfigMap {map_name} has no {key}"
    );
}

/// `DATABASE_URL` comes from a Secret, never from the manifest.
fn check_database_url(m: &Manifest, c: &Yaml) {
    let env = vec_of(&c["env"], &format!("{}: env", m.file));
    let url = env
        .iter()
        .find(|e| e["name"].as_str() == Some("DATABASE_URL"))
        .unwrap_or_else(|| panic!("{}: no DATABASE_URL", m.file));
    assert!(
        url["value"].is_badvalue(),
        "{}: DATABASE_URL in clear",
        m.file
    );
    assert!(
        url["valueFrom"]["secretKeyRef"]["name"].as_str().is_some(),
        "{}: DATABASE_URL not from a Secret",
        m.file
    );
}

/// A pod name as a Deployment's ReplicaSet generates it: the ReplicaSet is
/// `<deployment>-<pod-template-hash>` (at most 10 characters), and its pods
/// get a random 5-character suffix after a prefix cut to 58 characters.
fn pod_name(deployment: &str) -> String {
    let prefix: String = format!("{deployment}-7d9f8c6b5d-")
        .chars()
        .take(58)
        .collect();
    format!("{prefix}x2x4z")
}

/// The console's `--users` file comes from a Secret volume, never from a
/// ConfigMap, since it holds password hashes; only root (the files' owner)
/// and the pod's fsGroup may read it, and the console reads it through that
/// group, since it runs as another user than root.
fn check_users_secret(m: &Manifest, c: &Yaml, argv: &[String]) {
    let users = flag_value(argv, "--users").unwrap_or_else(|| panic!("{}: no --users", m.file));
    let path = Path::new(users);
    let dir = path.parent().unwrap().to_str().unwrap();
    let key = path.file_name().unwrap().to_str().unwrap();
    let mount = vec_of(&c["volumeMounts"], &format!("{}: volumeMounts", m.file))
        .iter()
        .find(|v| v["mountPath"].as_str() == Some(dir))
        .unwrap_or_else(|| panic!("{}: nothing mounted at {dir} for --users", m.file));
    assert_eq!(
        mount["readOnly"].as_bool(),
        Some(true),
        "{}: the users mount is writable",
        m.file
    );
    let volume_name = str_of(&mount["name"], "volumeMounts.name");
    let volume = vec_of(&pod_spec(m)["volumes"], "volumes")
        .iter()
        .find(|v| v["name"].as_str() == Some(volume_name))
        .unwrap_or_else(|| panic!("{}: no volume {volume_name}", m.file));
    let secret = &volume["secret"];
    assert!(
        secret["secretName"].as_str().is_some(),
        "{}: the users file (password hashes) does not come from a Secret: volume {volume_name} is no Secret volume",
        m.file
    );
    // Without items the Secret's keys are the file names.
    if !secret["items"].is_badvalue() {
        assert!(
            vec_of(&secret["items"], "items")
                .iter()
                .any(|i| i["path"].as_str() == Some(key)),
            "{}: the Secret's items give no {key}",
            m.file
        );
    }
    // Kubernetes' default is 0644. A mode with a leading 0 is octal for
    // Kubernetes (YAML 1.1) but decimal here (YAML 1.2), so the manifest
    // writes it in decimal; a value above 0777 is such a mix-up.
    let mode = secret["defaultMode"].as_i64().unwrap_or(0o644);
    assert!(
        (0..=0o777).contains(&mode),
        "{}: defaultMode {mode} is not a file mode",
        m.file
    );
    assert_eq!(
        mode & 0o007,
        0,
        "{}: defaultMode {mode:o} lets every user of the container read the password hashes",
        m.file
    );
    let fs_group = pod_spec(m)["securityContext"]["fsGroup"].as_i64();
    assert!(
        fs_group.is_some() && mode & 0o040 != 0,
        "{}: the users file is root's, mode {mode:o}, and no fsGroup with read access lets the console's user read it",
        m.file
    );
}

/// The Service in front of the console: exactly one selects its pods, and
/// no other workload's; it stays inside the cluster (ClusterIP: browsers
/// come through an HTTPS ingress); every port reaches `port`, the console's
/// `--listen` port.
fn check_console_service(all: &[Manifest], m: &Manifest, c: &Yaml, port: i64) {
    let pod_labels = |w: &Manifest| label_map(&w.doc["spec"]["template"]["metadata"]["labels"]);
    let selects = |s: &Manifest, labels: &BTreeMap<String, String>| {
        let selector = label_map(&s.doc["spec"]["selector"]);
        !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    };
    let labels = pod_labels(m);
    let services: Vec<&Manifest> = all
        .iter()
        .filter(|s| kind(s) == "Service" && selects(s, &labels))
        .collect();
    assert_eq!(
        services.len(),
        1,
        "{}: expected one Service for the console's pods",
        m.file
    );
    let s = services[0];
    for (other, _, _) in batchonce_containers(all) {
        if name(other) != name(m) {
            assert!(
                !selects(s, &pod_labels(other)),
                "{}: Service {} also sends its traffic to {}",
                s.file,
                name(s),
                name(other)
            );
        }
    }
    let spec = &s.doc["spec"];
    let service_type = spec["type"].as_str().unwrap_or("ClusterIP");
    assert_eq!(
        service_type, "ClusterIP",
        "{}: the console is exposed beyond the cluster; use an HTTPS ingress",
        s.file
    );
    let ports = vec_of(&spec["ports"], &format!("{}: Service ports", s.file));
    assert!(!ports.is_empty(), "{}: a Service without ports", s.file);
    for p in ports {
        // Without targetPort, the Service's port is the container's.
        let target = if p["targetPort"].is_badvalue() {
            &p["port"]
        } else {
            &p["targetPort"]
        };
        let target = container_port(m, c, target, "the Service's targetPort");
        assert_eq!(
            target, port,
            "{}: the Service does not reach the console's port",
            s.file
        );
    }
}

/// The checks of one container that runs batchonce; panics on the first
/// problem. Returns the subcommand.
fn check_workload<'a>(all: &[Manifest], m: &Manifest, c: &Yaml, argv: &'a [String]) -> &'a str {
    let sub = subcommand(argv);
    if sub != "console" {
        check_config_mount(all, m, c, argv);
    }
    check_database_url(m, c);
    match sub {
        "worker" => {
            assert_eq!(kind(m), "Deployment", "{}", m.file);
            check_probes(m, c, argv, "--metrics-addr", "/readyz");
            // The kubelet sends SIGKILL when this period ends, so it
            // must leave the worker its --grace and then some.
            let grace = seconds(flag_value(argv, "--grace").unwrap_or("20s"));
            let period = pod_spec(m)["terminationGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(30) as f64;
            assert!(
                period > grace,
                "{}: terminationGracePeriodSeconds {period} <= --grace {grace}",
                m.file
            );
            // The worker id is the pod's name, through the downward API.
            assert_eq!(flag_value(argv, "--worker-id"), Some("$(POD_NAME)"));
            let pod_env = vec_of(&c["env"], "env")
                .iter()
                .find(|e| e["name"].as_str() == Some("POD_NAME"))
                .unwrap_or_else(|| panic!("{}: no POD_NAME", m.file));
            assert_eq!(
                pod_env["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
                Some("metadata.name")
            );
        }
        "produce" => {
            assert_eq!(kind(m), "Deployment", "{}", m.file);
            check_probes(m, c, argv, "--metrics-addr", "/readyz");
            assert!(!argv.iter().any(|w| w == "--once"), "{}", m.file);
            let replicas = m.doc["spec"]["replicas"].as_i64().unwrap_or(1);
            assert!(replicas >= 2, "{}: {replicas} producer(s)", m.file);
        }
        "exporter" => {
            assert_eq!(kind(m), "Deployment", "{}", m.file);
            check_probes(m, c, argv, "--metrics-addr", "/readyz");
            // One exporter per deployment, or every series doubles.
            assert_eq!(m.doc["spec"]["replicas"].as_i64(), Some(1), "{}", m.file);
        }
        "console" => {
            assert_eq!(kind(m), "Deployment", "{}", m.file);
            // It has no /readyz: /healthz, which needs no sign-in, is both.
            let port = check_probes(m, c, argv, "--listen", "/healthz");
            // The sessions live in the process's memory: a second replica,
            // even for the moment of a rolling update, would not know the
            // first one's sessions.
            assert_eq!(m.doc["spec"]["replicas"].as_i64(), Some(1), "{}", m.file);
            assert_eq!(
                m.doc["spec"]["strategy"]["type"].as_str(),
                Some("Recreate"),
                "{}: a rollout would run two consoles",
                m.file
            );
            check_users_secret(m, c, argv);
            // Browsers reach it through an HTTPS ingress: its cookies are
            // marked Secure, said in so many words.
            assert!(
                argv.iter().any(|w| w == "--secure-cookies")
                    && !argv.iter().any(|w| w == "--no-secure-cookies"),
                "{}: the console's cookies are not marked Secure (--secure-cookies)",
                m.file
            );
            // It reads everything from the database: a configuration file
            // would only be one more thing to keep in step.
            assert_eq!(flag_value(argv, "--config"), None, "{}", m.file);
            if let Some(volumes) = pod_spec(m)["volumes"].as_vec() {
                assert!(
                    volumes.iter().all(|v| v["configMap"].is_badvalue()),
                    "{}: the console mounts a ConfigMap it does not read",
                    m.file
                );
            }
            check_console_service(all, m, c, port);
        }
        "migrate" => {
            assert_eq!(kind(m), "Job", "{}", m.file);
            assert!(
                m.doc["spec"]["backoffLimit"].as_i64().is_some(),
                "{}: no backoffLimit",
                m.file
            );
            let restart = pod_spec(m)["restartPolicy"].as_str();
            assert!(
                matches!(restart, Some("Never" | "OnFailure")),
                "{}: restartPolicy {restart:?}",
                m.file
            );
        }
        other => panic!("{}: unexpected subcommand {other}", m.file),
    }
    sub
}

#[test]
fn the_kubernetes_workloads_are_configured_as_the_code_needs() {
    let all = manifests();
    let mut seen = BTreeSet::new();
    for (m, c, argv) in &batchonce_containers(&all) {
        seen.insert(check_workload(&all, m, c, argv).to_owned());
    }
    let want: BTreeSet<String> = ["worker", "produce", "exporter", "migrate", "console"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(seen, want);
}

#[test]
fn the_workload_checks_catch_a_broken_manifest() {
    // Each edit breaks what one check is there for; the checks must panic
    // on every one, or their passing above proves nothing. The panics'
    // messages show in the output.
    let texts = manifest_texts();
    for (file, from, to) in [
        (
            "worker-deployment.yaml",
            "terminationGracePeriodSeconds: 45",
            "terminationGracePeriodSeconds: 20",
        ),
        ("worker-deployment.yaml", "path: /readyz", "path: /healthz"),
        (
            "worker-deployment.yaml",
            "- 0.0.0.0:9464",
            "- 127.0.0.1:9464",
        ),
        ("worker-deployment.yaml", "port: 9464", "port: 8080"),
        ("worker-deployment.yaml", "- $(POD_NAME)", "- $(HOSTNAME)"),
        ("producer-deployment.yaml", "replicas: 2", "replicas: 1"),
        ("producer-deployment.yaml", "- produce", "- worker"),
        (
            "migrate-job.yaml",
            "restartPolicy: Never",
            "restartPolicy: Always",
        ),
        ("configmap.yaml", "batchonce.toml: |", "other.toml: |"),
        // The console: out of the probes' reach, probed elsewhere, on the
        // path that only a signed-in user gets, or two of them.
        (
            "console-deployment.yaml",
            "- 0.0.0.0:8470",
            "- 127.0.0.1:8470",
        ),
        (
            "console-deployment.yaml",
            "              port: 8470",
            "              port: 9464",
        ),
        ("console-deployment.yaml", "path: /healthz", "path: /runs"),
        ("console-deployment.yaml", "replicas: 1", "replicas: 2"),
        (
            "console-deployment.yaml",
            "type: Recreate",
            "type: RollingUpdate",
        ),
        // Its users file: from the ConfigMap, readable by everyone, not by
        // the console, or not where --users looks.
        (
            "console-deployment.yaml",
            "secret:\n            secretName: batchonce-console-users",
            "configMap:\n            name: batchonce-config",
        ),
        ("console-deployment.yaml", "defaultMode: 288", "defaultMode: 292"),
        // Its cookies sent over plain HTTP too.
        (
            "console-deployment.yaml",
            "- --secure-cookies",
            "- --no-secure-cookies",
        ),
        ("console-deployment.yaml", "            - --secure-cookies\n", ""),
        ("console-deployment.yaml", "        fsGroup: 10001\n", ""),
        (
            "console-deployment.yaml",
            "- /etc/batchonce-console/users.toml",
            "- /etc/batchonce/users.toml",
        ),
        // The ConfigMap it does not need.
        (
            "console-deployment.yaml",
            "      volumes:\n",
            "      volumes:\n        - name: config\n          configMap:\n            name: batchonce-config\n",
        ),
        // Its Service: on another port, open beyond the cluster, or in
        // front of every batchonce pod.
        ("console-deployment.yaml", "targetPort: http", "targetPort: 9464"),
        (
            "console-deployment.yaml",
            "type: ClusterIP",
            "type: LoadBalancer",
        ),
        (
            "console-deployment.yaml",
            "  selector:\n    app.kubernetes.io/name: batchonce\n    app.kubernetes.io/component: console\n",
            "  selector:\n    app.kubernetes.io/name: batchonce\n",
        ),
    ] {
        let broken: Vec<(String, String)> = texts
            .iter()
            .map(|(f, t)| {
                if f == file {
                    assert!(t.contains(from), "{file} has no {from:?}");
                    (f.clone(), t.replace(from, to))
                } else {
                    (f.clone(), t.clone())
                }
            })
            .collect();
        let all = parse_manifests(&broken);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for (m, c, argv) in &batchonce_containers(&all) {
                check_workload(&all, m, c, argv);
            }
        }));
        assert!(caught.is_err(), "{file}: {from:?} -> {to:?} was not caught");
    }
}

#[test]
fn the_configmap_holds_a_configuration_the_binary_loads() {
    let all = manifests();
    let map = find(&all, "ConfigMap", "batchonce-config");
    let text = str_of(&map.doc["data"]["batchonce.toml"], "batchonce.toml");
    let dir = scratch("config");
    let path = dir.join("batchonce.toml");
    std::fs::write(&path, text).unwrap();
    // `roles` prints SQL without a database, but loads the configuration
    // first like every command, so a key that does not exist fails here.
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .arg("roles")
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // And the same file with a made-up key in one of its tables does fail,
    // naming the key, so the check above can. The key goes inside the
    // existing table: a second `[jobs.daily-settlement]` header would fail
    // as a duplicate table, whatever the key.
    const HEADER: &str = "[jobs.daily-settlement]\n";
    assert!(
        text.contains(HEADER),
        "the ConfigMap configures no settlement"
    );
    std::fs::write(
        &path,
        text.replacen(HEADER, &format!("{HEADER}bogus = 1\n"), 1),
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .arg("roles")
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("bogus"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `matchLabels` map (empty when absent).
fn label_map(y: &Yaml) -> BTreeMap<String, String> {
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

/// One NetworkPolicy, checked on its own: it has a pod selector, isolates
/// its pods for ingress, and every rule admits only peers that name both a
/// namespace and its pods (one peer, so a pod must match both), no address
/// block, and only single TCP ports. Returns its selector and the ports it
/// admits.
fn check_policy_rules(p: &Manifest) -> (BTreeMap<String, String>, BTreeSet<i64>) {
    let spec = &p.doc["spec"];
    let selector = label_map(&spec["podSelector"]["matchLabels"]);
    assert!(
        !selector.is_empty(),
        "{} {}: podSelector has no labels",
        p.file,
        name(p)
    );
    let types: Vec<&str> = vec_of(&spec["policyTypes"], "policyTypes")
        .iter()
        .map(|t| str_of(t, "a policy type"))
        .collect();
    assert!(
        types.contains(&"Ingress"),
        "{} {}: policyTypes {types:?} do not isolate ingress",
        p.file,
        name(p)
    );
    let rules = vec_of(&spec["ingress"], &format!("{}: ingress", p.file));
    assert!(
        !rules.is_empty(),
        "{} {}: no rule admits anyone",
        p.file,
        name(p)
    );
    let mut admitted = BTreeSet::new();
    for r in rules {
        // An absent or empty `from` admits every source, absent `ports`
        // every port.
        let from = vec_of(&r["from"], &format!("{}: a rule's from", p.file));
        assert!(!from.is_empty(), "{}: a rule admits every source", p.file);
        for peer in from {
            assert!(peer["ipBlock"].is_badvalue(), "{}: an ipBlock peer", p.file);
            // Both in one peer: a pod must match both (two peers, either).
            for sel in ["namespaceSelector", "podSelector"] {
                assert!(
                    !label_map(&peer[sel]["matchLabels"]).is_empty(),
                    "{} {}: a peer without {sel} labels admits more than one kind of pod",
                    p.file,
                    name(p)
                );
            }
        }
        let ports = vec_of(&r["ports"], &format!("{}: a rule's ports", p.file));
        assert!(!ports.is_empty(), "{}: a rule admits every port", p.file);
        for port in ports {
            assert_eq!(port["protocol"].as_str().unwrap_or("TCP"), "TCP");
            assert!(port["endPort"].is_badvalue(), "{}: a port range", p.file);
            let n = port["port"]
                .as_i64()
                .unwrap_or_else(|| panic!("{}: port {:?} is not a number", p.file, port["port"]));
            admitted.insert(n);
        }
    }
    (selector, admitted)
}

/// The NetworkPolicies: every batchonce pod is isolated for ingress, and
/// the ports it serves are admitted, by two policies with peers of their
/// own. The scraper's selects every batchonce pod and admits exactly the
/// metrics ports of the workloads; the console's selects the console's pods
/// and no others and admits exactly the port of its `--listen`. So the
/// scraper never reaches the console, nor the console's users (the ingress
/// controller) the unauthenticated metrics. Panics on the first problem.
fn check_network_policy(all: &[Manifest]) {
    let policies: Vec<(&Manifest, BTreeMap<String, String>, BTreeSet<i64>)> = all
        .iter()
        .filter(|m| kind(m) == "NetworkPolicy")
        .map(|p| {
            let (selector, admitted) = check_policy_rules(p);
            (p, selector, admitted)
        })
        .collect();
    assert_eq!(
        policies.len(),
        2,
        "expected two NetworkPolicies, the scraper's and the console's"
    );
    // What each workload serves, and which policies select its pods.
    let mut metrics_ports = BTreeSet::new();
    let mut console_ports = BTreeSet::new();
    let mut selected_by: Vec<BTreeSet<String>> = vec![BTreeSet::new(); policies.len()];
    let workloads = batchonce_containers(all);
    for (m, _, argv) in &workloads {
        let labels = label_map(&m.doc["spec"]["template"]["metadata"]["labels"]);
        let mut selected = false;
        let mut admitted = BTreeSet::<i64>::new();
        for (i, (_, selector, ports)) in policies.iter().enumerate() {
            if selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
                selected = true;
                selected_by[i].insert(name(m).to_owned());
                admitted.extend(ports);
            }
        }
        assert!(
            selected,
            "{}: its pods {labels:?} are selected by no NetworkPolicy, so every pod may connect to them",
            m.file
        );
        let mut serves = Vec::new();
        if let Some(addr) = flag_value(argv, "--metrics-addr") {
            metrics_ports.insert(port_of(addr));
            serves.push(("--metrics-addr", port_of(addr)));
        }
        if subcommand(argv) == "console" {
            let addr = flag_value(argv, "--listen").unwrap_or("127.0.0.1:8470");
            console_ports.insert(port_of(addr));
            serves.push(("--listen", port_of(addr)));
        }
        for (flag, port) in serves {
            assert!(
                admitted.contains(&port),
                "{}: no NetworkPolicy admits anyone to its {flag} port {port}",
                m.file
            );
        }
    }
    let all_workloads: BTreeSet<String> = workloads
        .iter()
        .map(|(m, _, _)| name(m).to_owned())
        .collect();
    let consoles: BTreeSet<String> = workloads
        .iter()
        .filter(|(_, _, argv)| subcommand(argv) == "console")
        .map(|(m, _, _)| name(m).to_owned())
        .collect();
    let (mut scraper, mut console) = (0, 0);
    for ((p, _, admitted), selected) in policies.iter().zip(&selected_by) {
        if !consoles.is_empty() && *selected == consoles {
            console += 1;
            assert_eq!(
                *admitted,
                console_ports,
                "{} {}: the ports admitted are not the console's",
                p.file,
                name(p)
            );
        } else {
            scraper += 1;
            assert_eq!(
                *selected,
                all_workloads,
                "{} {}: selects neither the console alone nor every workload",
                p.file,
                name(p)
            );
            assert_eq!(
                *admitted,
                metrics_ports,
                "{} {}: the ports admitted are not the metrics ports",
                p.file,
                name(p)
            );
        }
    }
    assert_eq!(
        (scraper, console),
        (1, 1),
        "one policy for the scraper and one for the console"
    );
}

#[test]
fn the_network_policies_admit_only_the_scraper_and_the_ingress_controller() {
    check_network_policy(&manifests());
}

#[test]
fn the_network_policy_check_catches_a_broken_policy() {
    let texts = manifest_texts();
    let policy = "networkpolicy.yaml";
    for (file, from, to) in [
        // The scraper's policy selects pods that do not exist.
        (
            policy,
            "      app.kubernetes.io/name: batchonce\n  policyTypes:",
            "      app.kubernetes.io/name: batchonce-db\n  policyTypes:",
        ),
        // Isolates egress only, so ingress stays open.
        (
            policy,
            "    - Ingress\n  ingress:\n    - from:\n        - namespaceSelector:\n            matchLabels:\n              batchonce.example/metrics-scraper",
            "    - Egress\n  ingress:\n    - from:\n        - namespaceSelector:\n            matchLabels:\n              batchonce.example/metrics-scraper",
        ),
        // Another port than the metrics one.
        (policy, "port: 9464", "port: 8080"),
        // No ports: every port.
        (
            policy,
            "      ports:\n        # The port of --metrics-addr in the Deployments.\n        - protocol: TCP\n          port: 9464\n",
            "",
        ),
        // No `from`: every source.
        (
            policy,
            "    - from:\n        - namespaceSelector:\n            matchLabels:\n              batchonce.example/metrics-scraper: \"true\"\n          podSelector:\n            matchLabels:\n              app.kubernetes.io/name: prometheus\n      ports:",
            "    - ports:",
        ),
        // The dash that turns AND into OR: every pod of the namespace.
        (
            policy,
            "          podSelector:\n            matchLabels:\n              app.kubernetes.io/name: prometheus",
            "        - podSelector:\n            matchLabels:\n              app.kubernetes.io/name: prometheus",
        ),
        // A workload moves its metrics port and the policy does not follow.
        (
            "worker-deployment.yaml",
            "- 0.0.0.0:9464",
            "- 0.0.0.0:9465",
        ),
        // The scraper may reach the console too.
        (
            policy,
            "          port: 9464\n",
            "          port: 9464\n        - protocol: TCP\n          port: 8470\n",
        ),
        // The console's policy: another port than the console's.
        (policy, "port: 8470", "port: 8080"),
        // ... selects the workers instead of the console, which no policy
        // then admits anyone to.
        (
            policy,
            "      app.kubernetes.io/component: console\n  policyTypes:",
            "      app.kubernetes.io/component: worker\n  policyTypes:",
        ),
        // ... selects every batchonce pod, so the ingress controller
        // reaches the workers.
        (
            policy,
            "      app.kubernetes.io/name: batchonce\n      app.kubernetes.io/component: console\n  policyTypes:",
            "      app.kubernetes.io/name: batchonce\n  policyTypes:",
        ),
        // ... isolates egress only, so anyone reaches the console.
        (
            policy,
            "    - Ingress\n  ingress:\n    - from:\n        - namespaceSelector:\n            matchLabels:\n              batchonce.example/console-ingress",
            "    - Egress\n  ingress:\n    - from:\n        - namespaceSelector:\n            matchLabels:\n              batchonce.example/console-ingress",
        ),
        // ... the dash: every pod of the ingress controller's namespace.
        (
            policy,
            "          podSelector:\n            matchLabels:\n              app.kubernetes.io/name: ingress-nginx",
            "        - podSelector:\n            matchLabels:\n              app.kubernetes.io/name: ingress-nginx",
        ),
        // The console moves its port and the policy does not follow.
        (
            "console-deployment.yaml",
            "- 0.0.0.0:8470",
            "- 0.0.0.0:8471",
        ),
    ] {
        let broken: Vec<(String, String)> = texts
            .iter()
            .map(|(f, t)| {
                if f == file {
                    assert!(t.contains(from), "{file} has no {from:?}");
                    (f.clone(), t.replace(from, to))
                } else {
                    (f.clone(), t.clone())
                }
            })
            .collect();
        let all = parse_manifests(&broken);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check_network_policy(&all);
        }));
        assert!(caught.is_err(), "{file}: {from:?} -> {to:?} was not caught");
    }
}

// ---------------------------------------------------------------------------
// systemd

/// A unit file: each `Key=value` of each section, in order. Comments and
/// line continuations are handled as systemd does.
struct Unit {
    file: String,
    entries: Vec<(String, String, String)>,
}

impl Unit {
    fn parse(file: &str, text: &str) -> Unit {
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

    fn all(&self, section: &str, key: &str) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|(s, k, _)| s == section && k == key)
            .map(|(_, _, v)| v.as_str())
            .collect()
    }

    /// The last value of a setting, which is the one systemd uses.
    fn get(&self, section: &str, key: &str) -> Option<&str> {
        self.all(section, key).last().copied()
    }

    fn service(&self, key: &str) -> &str {
        self.get("Service", key)
            .unwrap_or_else(|| panic!("{}: no {key}=", self.file))
    }

    /// The `batchonce` command lines of its Exec*= settings, without the
    /// program and without systemd's prefixes (`-`, `@`, `+`, `!`, `:`).
    fn command_lines(&self) -> Vec<Vec<String>> {
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
fn unit_texts() -> Vec<(String, String)> {
    files(&deploy().join("systemd"), &["service"])
        .iter()
        .map(|p| (file_name(p), std::fs::read_to_string(p).unwrap()))
        .collect()
}

fn parse_units(texts: &[(String, String)]) -> Vec<Unit> {
    let all: Vec<Unit> = texts.iter().map(|(f, t)| Unit::parse(f, t)).collect();
    assert!(!all.is_empty(), "no units under deploy/systemd");
    all
}

fn units() -> Vec<Unit> {
    parse_units(&unit_texts())
}

fn systemd_readme() -> String {
    std::fs::read_to_string(deploy().join("systemd/README.md")).unwrap()
}

fn unit<'a>(all: &'a [Unit], file: &str) -> &'a Unit {
    all.iter()
        .find(|u| u.file == file)
        .unwrap_or_else(|| panic!("no {file}"))
}

/// The settings the code needs in the units; panics on the first problem.
/// `readme` is deploy/systemd/README.md, which must tell how to install
/// each of them.
fn check_units(all: &[Unit], readme: &str) {
    for u in all {
        let lines = u.command_lines();
        assert_eq!(lines.len(), 1, "{}: one batchonce ExecStart", u.file);
        let argv = &lines[0];
        if subcommand(argv) == "console" {
            // It reads everything from the database, and runs as a user of
            // its own, which could not read batchonce.toml.
            assert_eq!(flag_value(argv, "--config"), None, "{}", u.file);
        } else {
            assert_eq!(
                flag_value(argv, "--config"),
                Some("/etc/batchonce/batchonce.toml"),
                "{}",
                u.file
            );
        }
        assert!(
            readme.contains(&u.file),
            "deploy/systemd/README.md does not mention {}",
            u.file
        );
        assert!(
            u.all("Service", "EnvironmentFile")
                .contains(&"/etc/batchonce/batchonce.env"),
            "{}: DATABASE_URL comes from /etc/batchonce/batchonce.env",
            u.file
        );
        let user = u.service("User");
        assert!(user != "root" && user != "0", "{}: User={user}", u.file);
        assert_eq!(u.service("NoNewPrivileges"), "true", "{}", u.file);
        assert_eq!(u.service("ProtectSystem"), "strict", "{}", u.file);
    }

    let worker = unit(all, "batchonce-worker@.service");
    let argv = &worker.command_lines()[0];
    assert_eq!(subcommand(argv), "worker");
    // The host name and the instance make a worker id that is unique and
    // stable across restarts.
    assert_eq!(flag_value(argv, "--worker-id"), Some("%H-%i"));
    assert_eq!(worker.service("KillSignal"), "SIGTERM");
    assert_eq!(worker.service("KillMode"), "mixed");
    assert_eq!(worker.service("Restart"), "on-failure");
    let grace = seconds(flag_value(argv, "--grace").unwrap_or("20s"));
    let stop = seconds(worker.service("TimeoutStopSec"));
    assert!(stop > grace, "TimeoutStopSec {stop} <= --grace {grace}");
    // Each instance needs its own metrics port: the address is a variable
    // that an EnvironmentFile named after the instance defines, and the
    // install steps of deploy/systemd/README.md write that file.
    let addr = flag_value(argv, "--metrics-addr").expect("worker --metrics-addr");
    let var = addr
        .strip_prefix("${")
        .and_then(|a| a.strip_suffix('}'))
        .unwrap_or_else(|| panic!("--metrics-addr {addr} is the same for every instance"));
    assert!(
        worker
            .all("Service", "EnvironmentFile")
            .iter()
            .any(|f| f.contains("%i") && !f.starts_with('-')),
        "no required per-instance EnvironmentFile"
    );
    assert!(readme.contains(&format!("{var}=127.0.0.1:")), "README.md");

    let producer = unit(all, "batchonce-producer.service");
    let argv = &producer.command_lines()[0];
    assert_eq!(subcommand(argv), "produce");
    assert!(!argv.iter().any(|w| w == "--once"));
    assert_eq!(producer.service("Restart"), "on-failure");

    let migrate = unit(all, "batchonce-migrate.service");
    assert_eq!(subcommand(&migrate.command_lines()[0]), "migrate");
    assert_eq!(migrate.service("Type"), "oneshot");

    let console = unit(all, "batchonce-console.service");
    let argv = &console.command_lines()[0];
    assert_eq!(subcommand(argv), "console");
    // It signs users in over plain HTTP: loopback only, behind a proxy
    // that terminates HTTPS or an SSH tunnel.
    let listen = flag_value(argv, "--listen").unwrap_or("127.0.0.1:8470");
    let addr: std::net::SocketAddr = listen
        .parse()
        .unwrap_or_else(|e| panic!("{}: --listen {listen}: {e}", console.file));
    assert!(
        addr.ip().is_loopback(),
        "{}: --listen {listen} is reachable from other hosts",
        console.file
    );
    // The users file (password hashes) is a credential: systemd reads it
    // as root and hands the console a copy in %d that only its user reads.
    let users = flag_value(argv, "--users").expect("console --users");
    let credential = users.strip_prefix("%d/").unwrap_or_else(|| {
        panic!(
            "{}: --users {users} is not a credential (%d/NAME)",
            console.file
        )
    });
    assert!(
        console
            .all("Service", "LoadCredential")
            .iter()
            .any(|c| c.split_once(':').map(|(n, _)| n) == Some(credential)),
        "{}: no LoadCredential={credential}:…",
        console.file
    );
    // Not the workers' user, whose command jobs run any program.
    assert_ne!(
        console.service("User"),
        worker.service("User"),
        "{}: the workers' command jobs could read its users file",
        console.file
    );
    assert_eq!(console.service("Restart"), "on-failure");
    // Its working directory is an empty one of its own, where no stray
    // batchonce.toml is read.
    let dir = console.service("WorkingDirectory");
    let own: Vec<String> = [("RuntimeDirectory", "/run"), ("StateDirectory", "/var/lib")]
        .iter()
        .filter_map(|(key, base)| console.get("Service", key).map(|d| format!("{base}/{d}")))
        .collect();
    assert!(
        own.iter().any(|d| d == dir),
        "{}: WorkingDirectory={dir} is none of its own directories {own:?}",
        console.file
    );
}

#[test]
fn the_systemd_units_are_configured_as_the_code_needs() {
    check_units(&units(), &systemd_readme());
}

#[test]
fn the_unit_checks_catch_a_broken_unit() {
    let texts = unit_texts();
    let readme = systemd_readme();
    let worker = "batchonce-worker@.service";
    let console = "batchonce-console.service";
    for (file, from, to) in [
        (worker, "TimeoutStopSec=45s", "TimeoutStopSec=15s"),
        (worker, "KillMode=mixed", "KillMode=control-group"),
        (console, "--listen 127.0.0.1:8470", "--listen 0.0.0.0:8470"),
        (
            console,
            "--users %d/users.toml",
            "--users /etc/batchonce/console-users.toml",
        ),
        (
            console,
            "LoadCredential=users.toml:",
            "LoadCredential=console-users.toml:",
        ),
        (console, "User=batchonce-console", "User=batchonce"),
        (
            console,
            "ExecStart=/usr/local/bin/batchonce console",
            "ExecStart=/usr/local/bin/batchonce --config /etc/batchonce/batchonce.toml console",
        ),
        (
            console,
            "WorkingDirectory=/run/batchonce-console",
            "WorkingDirectory=/",
        ),
    ] {
        let broken: Vec<(String, String)> = texts
            .iter()
            .map(|(f, t)| {
                if f == file {
                    assert!(t.contains(from), "{file} has no {from:?}");
                    (f.clone(), t.replace(from, to))
                } else {
                    (f.clone(), t.clone())
                }
            })
            .collect();
        let all = parse_units(&broken);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check_units(&all, &readme);
        }));
        assert!(caught.is_err(), "{file}: {from:?} -> {to:?} was not caught");
    }
    // And a unit the README does not mention.
    let caught = std::panic::catch_unwind(|| {
        check_units(&units(), &readme.replace(console, "the console's unit"));
    });
    assert!(
        caught.is_err(),
        "a unit missing from the README was not caught"
    );
}

// ---------------------------------------------------------------------------
// Every command line, against the binary

/// A `batchonce` command line of a manifest or a unit.
struct Line {
    /// The file it comes from, for messages.
    source: String,
    /// The Deployment or Job that runs it, for a manifest.
    workload: Option<String>,
    argv: Vec<String>,
}

/// Every `batchonce` command line of the manifests and the units.
fn all_command_lines() -> Vec<Line> {
    let all = manifests();
    let mut out: Vec<Line> = batchonce_containers(&all)
        .into_iter()
        .map(|(m, _, argv)| Line {
            source: format!("kubernetes/{}", m.file),
            workload: Some(name(m).to_owned()),
            argv,
        })
        .collect();
    for u in units() {
        for argv in u.command_lines() {
            out.push(Line {
                source: format!("systemd/{}", u.file),
                workload: None,
                argv,
            });
        }
    }
    out
}

#[test]
fn every_command_line_uses_subcommands_and_flags_the_binary_has() {
    let lines = all_command_lines();
    // Five workloads in Kubernetes and four units, or the extraction
    // missed some and the check below would pass on nothing.
    let sources: Vec<&str> = lines.iter().map(|l| l.source.as_str()).collect();
    assert_eq!(lines.len(), 9, "{sources:?}");
    let mut failures = Vec::new();
    for line in &lines {
        for problem in command_line_problems(&line.argv) {
            failures.push(format!("{}: {problem}", line.source));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A free port on the loopback interface.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The status code of a GET, or None if nothing answers.
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    answer.split_whitespace().nth(1)?.parse().ok()
}

fn stop(child: &mut Child) -> std::process::ExitStatus {
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("no exit within 20s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs a long-running command line as it is written, except for the
/// metrics address (a free loopback port, so that parallel tests never
/// compete for 9464), the configuration file (the ConfigMap's) and the
/// database (one that refuses connections). It must serve `/healthz` (200)
/// and `/readyz` (503 without a database), which the probes rely on, and
/// exit 0 on SIGTERM.
fn start_and_probe(source: &str, argv: &[String], config: &Path) {
    let port = free_port();
    let mut argv = argv.to_vec();
    for (flag, value) in [
        ("--metrics-addr", format!("127.0.0.1:{port}")),
        ("--config", config.display().to_string()),
    ] {
        let i = argv
            .iter()
            .position(|w| w == flag)
            .unwrap_or_else(|| panic!("{source}: no {flag}"));
        argv[i + 1] = value;
    }
    let mut child = Command::new(BIN)
        .args(&argv)
        .env("DATABASE_URL", NO_DATABASE)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let healthz = wait_for_healthz(&mut child, port, source, &argv);
    let readyz = http_status(port, "/readyz");
    let status = stop(&mut child);
    assert_eq!(healthz, 200, "{source}: /healthz");
    assert_eq!(readyz, Some(503), "{source}: /readyz without a database");
    assert!(status.success(), "{source}: SIGTERM gave {status}");
}

/// Waits (30 s at most) for a started command line's `/healthz`; its
/// status. A process that exits first fails the test with its stderr.
fn wait_for_healthz(child: &mut Child, port: u16, source: &str, argv: &[String]) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            panic!("{source}: {argv:?} exited with {status}: {err}");
        }
        if let Some(code) = http_status(port, "/healthz") {
            return code;
        }
        assert!(Instant::now() < deadline, "{source}: no /healthz in 30s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A users file with one operator, its hash made by the binary itself, as
/// the install steps make it.
fn console_users_file(dir: &Path) -> PathBuf {
    let mut child = Command::new(BIN)
        .args(["console", "--hash-password"])
        .env_remove("DATABASE_URL")
        .env_remove("BATCHONCE_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"correct horse battery staple\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "--hash-password: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hash = String::from_utf8(out.stdout).unwrap();
    let path = dir.join("console-users.toml");
    std::fs::write(
        &path,
        format!(
            "[[user]]\nname = \"alice\"\nrole = \"operator\"\npassword_hash = \"{}\"\n",
            hash.trim()
        ),
    )
    .unwrap();
    path
}

/// Runs a console command line as it is written, except for the address
/// (a free loopback port), the users file (`users`) and the database (one
/// that refuses connections), in an empty working directory as the unit
/// and the pod give it. It must serve `/healthz` (200) without signing in,
/// which the probes rely on, send a browser that has not signed in to the
/// sign-in page, and exit 0 on SIGTERM.
fn start_console_and_probe(source: &str, argv: &[String], users: &Path, cwd: &Path) {
    let port = free_port();
    let mut argv = argv.to_vec();
    for (flag, value) in [
        ("--listen", format!("127.0.0.1:{port}")),
        ("--users", users.display().to_string()),
    ] {
        let i = argv
            .iter()
            .position(|w| w == flag)
            .unwrap_or_else(|| panic!("{source}: no {flag}"));
        argv[i + 1] = value;
    }
    let mut child = Command::new(BIN)
        .args(&argv)
        .current_dir(cwd)
        .env("DATABASE_URL", NO_DATABASE)
        .env_remove("BATCHONCE_CONFIG")
        .env_remove("BATCHONCE_CONSOLE_USERS")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let healthz = wait_for_healthz(&mut child, port, source, &argv);
    let overview = http_status(port, "/");
    let status = stop(&mut child);
    assert_eq!(healthz, 200, "{source}: /healthz");
    assert_eq!(overview, Some(303), "{source}: / without signing in");
    assert!(status.success(), "{source}: SIGTERM gave {status}");
}

#[test]
fn the_long_running_command_lines_start_and_answer_their_probes() {
    let all = manifests();
    let map = find(&all, "ConfigMap", "batchonce-config");
    let dir = scratch("probe");
    let config = dir.join("batchonce.toml");
    std::fs::write(
        &config,
        str_of(&map.doc["data"]["batchonce.toml"], "batchonce.toml"),
    )
    .unwrap();
    let users = console_users_file(&dir);
    let empty = dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    let mut runs = Vec::new();
    for line in all_command_lines() {
        if subcommand(&line.argv) == "migrate" {
            // migrate needs a database; its flags were checked above.
            continue;
        }
        // What the kubelet and systemd substitute before the process starts.
        let pod = pod_name(line.workload.as_deref().unwrap_or("none"));
        let argv: Vec<String> = line
            .argv
            .iter()
            .map(|w| {
                w.replace("$(POD_NAME)", &pod)
                    .replace("%H", &host)
                    .replace("%i", "1")
                    .replace("${BATCHONCE_METRICS_ADDR}", "127.0.0.1:9464")
            })
            .collect();
        runs.push((line.source, argv));
    }
    // Each process takes a few seconds to stop without a database, so they
    // run side by side; a panic in one thread fails the test.
    std::thread::scope(|scope| {
        for (source, argv) in &runs {
            let (config, users, empty) = (&config, &users, &empty);
            scope.spawn(move || {
                if subcommand(argv) == "console" {
                    start_console_and_probe(source, argv, users, empty)
                } else {
                    start_and_probe(source, argv, config)
                }
            });
        }
    });
    let started = runs.len();
    assert_eq!(started, 7, "four Deployments and three units run for good");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------
// systemd-analyze

/// Whether this is a CI run, where a missing tool fails the test.
fn ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false")
}

/// `systemd-analyze verify` on `units`: its exit status and its stderr.
fn systemd_verify(units: &[PathBuf]) -> (std::process::ExitStatus, String) {
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(units)
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn systemd_analyze_verifies_the_units() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            !ci(),
            "CI=true, but systemd-analyze is missing: .ci/run must install Debian's systemd package"
        );
        eprintln!("skipped: systemd-analyze not installed (it comes with systemd)");
        return;
    }
    // verify checks that the program exists, so the copies point at the
    // binary under test; and a template is only verified as an instance.
    let dir = scratch("systemd");
    let mut copies = Vec::new();
    for path in files(&deploy().join("systemd"), &["service"]) {
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("/usr/local/bin/batchonce", BIN);
        let name = file_name(&path).replace("@.service", "@1.service");
        let copy = dir.join(&name);
        std::fs::write(&copy, text).unwrap();
        copies.push(copy);
    }
    let (status, err) = systemd_verify(&copies);
    // verify exits 0 even for an unknown setting, which it only reports on
    // stderr; any line about these units is a failure. Lines about the
    // machine's own units are not ours to fix.
    let ours = |err: &str| -> Vec<String> {
        err.lines()
            .filter(|l| l.contains("batchonce") || l.contains(&*dir.to_string_lossy()))
            .map(str::to_owned)
            .collect()
    };
    assert!(status.success() && ours(&err).is_empty(), "{err}");
    // The check can fail here: the same units with an unknown setting are
    // reported, so a systemd-analyze that verified nothing (one that cannot
    // work in this environment) would not pass the units above.
    let broken: Vec<PathBuf> = copies
        .iter()
        .map(|c| {
            let text = std::fs::read_to_string(c).unwrap().replacen(
                "[Service]\n",
                "[Service]\nFrobnicate=yes\n",
                1,
            );
            let name = dir.join(format!("broken-{}", file_name(c)));
            std::fs::write(&name, text).unwrap();
            name
        })
        .collect();
    let (_, err) = systemd_verify(&broken);
    for b in &broken {
        assert!(
            ours(&err)
                .iter()
                .any(|l| l.contains(&*file_name(b)) && l.contains("Frobnicate")),
            "systemd-analyze verify did not report the unknown key in {}: {err}",
            b.display()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
