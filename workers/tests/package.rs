//! The Debian package's metadata stays in step with what it packages:
//! `[package.metadata.deb]` in workers/Cargo.toml installs every unit of
//! deploy/systemd, from that folder, without enabling or starting any, and
//! each runs the binary where the package installs it; the example
//! configuration loads as the binary loads it, and the
//! environment files the units require are there; the maintainer scripts
//! are executable shell scripts that parse. Building, installing and purging
//! the package itself is `.ci/package`'s job (docs/deployment.md).
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `[package.metadata.deb]` table of workers/Cargo.toml.
fn metadata() -> toml::Table {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let mut manifest: toml::Table = std::fs::read_to_string(path).unwrap().parse().unwrap();
    let deb = manifest
        .remove("package")
        .and_then(|mut p| p.as_table_mut()?.remove("metadata"))
        .and_then(|mut m| m.as_table_mut()?.remove("deb"))
        .expect("workers/Cargo.toml has no [package.metadata.deb]");
    match deb {
        toml::Value::Table(t) => t,
        other => panic!("[package.metadata.deb] is not a table: {other}"),
    }
}

/// A path of the metadata, which is relative to workers/.
fn in_crate(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// An asset: its source (relative to workers/) and where it is installed.
struct Asset {
    source: String,
    dest: String,
}

impl Asset {
    /// The installed file's path, without the leading `/`.
    fn installed(&self) -> String {
        if self.dest.ends_with('/') {
            let name = Path::new(&self.source).file_name().unwrap();
            format!("{}{}", self.dest, name.to_string_lossy())
        } else {
            self.dest.clone()
        }
    }
}

fn assets(deb: &toml::Table) -> Vec<Asset> {
    deb["assets"]
        .as_array()
        .expect("assets is a list")
        .iter()
        .map(|a| match a {
            toml::Value::Array(v) => Asset {
                source: v[0].as_str().unwrap().to_owned(),
                dest: v[1].as_str().unwrap().to_owned(),
            },
            toml::Value::Table(t) => Asset {
                source: t["source"].as_str().unwrap().to_owned(),
                dest: t["dest"].as_str().unwrap().to_owned(),
            },
            other => panic!("an asset is neither a list nor a table: {other}"),
        })
        .collect()
}

/// The `systemd-units` entries (one table, or a list of them).
fn systemd_units(deb: &toml::Table) -> Vec<toml::Table> {
    match deb.get("systemd-units") {
        None => Vec::new(),
        Some(toml::Value::Table(t)) => vec![t.clone()],
        Some(toml::Value::Array(v)) => v
            .iter()
            .map(|t| t.as_table().expect("a systemd-units entry").clone())
            .collect(),
        Some(other) => panic!("systemd-units is {other}"),
    }
}

const UNITS_DIR: &str = "usr/lib/systemd/system/";

/// Every unit file the package installs, by file name, with its source: the
/// assets under usr/lib/systemd/system, and the unit each `systemd-units`
/// entry finds by its `unit-name` in its `unit-scripts` folder.
fn packaged_units(deb: &toml::Table) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = assets(deb)
        .iter()
        .filter_map(|a| {
            let installed = a.installed();
            let name = installed.strip_prefix(UNITS_DIR)?;
            Some((name.to_owned(), in_crate(&a.source)))
        })
        .collect();
    for entry in systemd_units(deb) {
        let name = entry
            .get("unit-name")
            .and_then(toml::Value::as_str)
            .expect("each systemd-units entry names its unit (unit-name)");
        let dir = entry["unit-scripts"].as_str().expect("unit-scripts");
        let file = format!("{name}.service");
        let source = in_crate(dir).join(&file);
        assert!(source.is_file(), "{} is missing", source.display());
        out.push((file, source));
    }
    out
}

fn service_files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".service"))
        .collect()
}

#[test]
fn the_package_installs_every_unit_of_deploy_systemd_and_starts_none() {
    let deb = metadata();
    let packaged = packaged_units(&deb);
    let names: BTreeSet<String> = packaged.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(
        names.len(),
        packaged.len(),
        "a unit is packaged twice: {packaged:?}"
    );
    assert_eq!(
        names,
        service_files(&repo().join("deploy/systemd")),
        "the package's units (workers/Cargo.toml) are not those of deploy/systemd"
    );
    // One set of units: the package installs deploy/systemd's files, not
    // copies of them.
    for (name, source) in &packaged {
        assert_eq!(
            source.canonicalize().unwrap(),
            repo()
                .join("deploy/systemd")
                .join(name)
                .canonicalize()
                .unwrap(),
            "{name} is not packaged from deploy/systemd"
        );
    }
    // An operator configures the database before any unit runs, and a
    // worker of a new release refuses to start before `migrate`: nothing is
    // enabled, started or restarted by the package.
    let entries = systemd_units(&deb);
    assert!(!entries.is_empty(), "no systemd-units entry");
    for entry in entries {
        for key in ["enable", "start", "restart-after-upgrade"] {
            assert_eq!(
                entry.get(key).and_then(toml::Value::as_bool),
                Some(false),
                "systemd-units {:?}: {key} must be false",
                entry.get("unit-name")
            );
        }
    }
    assert!(
        deb["depends"].as_str().unwrap().contains("$auto"),
        "Depends must include $auto (the shared libraries of the binary)"
    );
    let binary = assets(&deb)
        .into_iter()
        .find(|a| a.source == "target/release/batchonce")
        .expect("the binary is an asset");
    assert_eq!(binary.installed(), "usr/bin/batchonce");
    // The units run the binary where the package puts it (and where
    // deploy/systemd/README.md installs it by hand).
    let program = format!("/{}", binary.installed());
    for (name, source) in &packaged {
        let text = std::fs::read_to_string(source).unwrap();
        let mut runs = 0;
        for line in text.lines().filter(|l| l.starts_with("Exec")) {
            let (_, command) = line.split_once('=').unwrap();
            let first = command.split_whitespace().next().unwrap_or_default();
            if Path::new(first).file_name() == Some("batchonce".as_ref()) {
                assert_eq!(first, program, "{name}: {line}");
                runs += 1;
            }
        }
        assert!(runs > 0, "{name} runs no batchonce");
    }
}

/// The files the package installs under /etc/batchonce, by file name.
fn etc_files(deb: &toml::Table) -> Vec<(String, PathBuf)> {
    assets(deb)
        .iter()
        .filter_map(|a| {
            let installed = a.installed();
            let name = installed.strip_prefix("etc/batchonce/")?;
            Some((name.to_owned(), in_crate(&a.source)))
        })
        .collect()
}

#[test]
fn the_example_configuration_loads_as_the_binary_loads_it() {
    let deb = metadata();
    let etc = etc_files(&deb);
    let (_, toml_path) = etc
        .iter()
        .find(|(n, _)| n == "batchonce.toml")
        .expect("the package installs no /etc/batchonce/batchonce.toml");
    // What `batchonce --config FILE` does (load_config in src/cli/mod.rs).
    let kinds = batchonce_workers::registry().default_configs();
    let config = batchonce::Config::load(toml_path, &kinds)
        .unwrap_or_else(|e| panic!("{}: {e}", toml_path.display()));
    assert!(
        !config.jobs.is_empty(),
        "the example configuration declares no job, so a worker would exit"
    );
    // And a key that does not exist fails the same load, so this can.
    let text = std::fs::read_to_string(toml_path).unwrap();
    let header = text
        .lines()
        .find(|l| l.starts_with("[jobs."))
        .expect("a [jobs.NAME] table");
    let broken = text.replacen(header, &format!("{header}\nbogus = 1"), 1);
    let err = batchonce::Config::parse(&broken, "broken.toml", &kinds)
        .expect_err("a made-up key was accepted");
    assert!(err.to_string().contains("bogus"), "{err}");

    // Every environment file a unit requires (no `-` prefix) is installed,
    // worker-1.env standing for the template's instance files.
    let names: BTreeSet<&str> = etc.iter().map(|(n, _)| n.as_str()).collect();
    for (unit, source) in packaged_units(&deb) {
        let text = std::fs::read_to_string(&source).unwrap();
        for line in text.lines() {
            let Some(file) = line.strip_prefix("EnvironmentFile=") else {
                continue;
            };
            if file.starts_with('-') {
                continue;
            }
            let name = file
                .strip_prefix("/etc/batchonce/")
                .unwrap_or_else(|| panic!("{unit}: {file} is outside /etc/batchonce"))
                .replace("%i", "1");
            assert!(
                names.contains(name.as_str()),
                "{unit} requires {file}, which the package does not install"
            );
        }
    }
    let env = |name: &str| {
        let (_, path) = etc.iter().find(|(n, _)| n == name).unwrap();
        std::fs::read_to_string(path).unwrap()
    };
    assert!(
        env("batchonce.env")
            .lines()
            .any(|l| l.starts_with("DATABASE_URL=postgres://")),
        "batchonce.env sets no DATABASE_URL"
    );
    assert!(
        env("worker-1.env")
            .lines()
            .any(|l| l.starts_with("BATCHONCE_METRICS_ADDR=127.0.0.1:")),
        "worker-1.env sets no loopback BATCHONCE_METRICS_ADDR"
    );
}

#[test]
fn the_maintainer_scripts_are_executable_and_parse() {
    use std::os::unix::fs::PermissionsExt;
    let deb = metadata();
    let dir = in_crate(
        deb["maintainer-scripts"]
            .as_str()
            .expect("maintainer-scripts"),
    );
    let mut found = Vec::new();
    for name in ["preinst", "postinst", "prerm", "postrm", "config"] {
        let path = dir.join(name);
        if !path.exists() {
            continue;
        }
        found.push(name);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o111, 0o111, "{name} is not executable: {mode:o}");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("#!/bin/sh\n"), "{name}: not #!/bin/sh");
        assert!(text.contains("\nset -e\n"), "{name}: no set -e");
        // cargo-deb puts the units' fragments in place of the token, in
        // comments too, so it must stand once, on a line of its own.
        assert_eq!(
            text.matches("#DEBHELPER#").count(),
            1,
            "{name}: #DEBHELPER# must appear exactly once"
        );
        assert!(
            text.contains("\n#DEBHELPER#\n"),
            "{name}: #DEBHELPER# inline"
        );
        for shell in ["sh", "bash"] {
            let out = Command::new(shell).arg("-n").arg(&path).output().unwrap();
            assert!(
                out.status.success(),
                "{shell} -n {name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    assert_eq!(found, ["postinst", "prerm", "postrm"]);
}
