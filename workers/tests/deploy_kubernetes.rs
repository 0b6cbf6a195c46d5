//! The Kubernetes manifests in `deploy/kubernetes` have the structure that
//! matters: every file is a resource that `kustomization.yaml` lists, with
//! requests and limits; probes on the metrics port (the console's on its
//! `--listen` port), bound where the kubelet reaches them; a termination
//! grace period longer than the worker's `--grace`; at least two producers
//! and one exporter; a `migrate` Job; `DATABASE_URL` from a Secret; one
//! console whose users file comes from a Secret readable by its group only,
//! behind a ClusterIP Service; and a ConfigMap the binary loads. Each check
//! is also shown to catch a broken copy. None of this needs a database.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use yaml_rust2::Yaml;

mod common;

use common::deploy::*;
use common::BIN;

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

/// The file that `flag` names in container `c` of `m`: its name, the
/// mount of its folder and the pod's volume mounted there.
fn mounted_file<'a>(
    m: &'a Manifest,
    c: &'a Yaml,
    argv: &'a [String],
    flag: &str,
) -> (&'a str, &'a Yaml, &'a Yaml) {
    let file = flag_value(argv, flag).unwrap_or_else(|| panic!("{}: no {flag}", m.file));
    let path = Path::new(file);
    let dir = path.parent().unwrap().to_str().unwrap();
    let key = path.file_name().unwrap().to_str().unwrap();
    let mount = vec_of(&c["volumeMounts"], &format!("{}: volumeMounts", m.file))
        .iter()
        .find(|v| v["mountPath"].as_str() == Some(dir))
        .unwrap_or_else(|| panic!("{}: nothing mounted at {dir} for {flag}", m.file));
    let volume_name = str_of(&mount["name"], "volumeMounts.name");
    let volume = vec_of(&pod_spec(m)["volumes"], "volumes")
        .iter()
        .find(|v| v["name"].as_str() == Some(volume_name))
        .unwrap_or_else(|| panic!("{}: no volume {volume_name}", m.file));
    (key, mount, volume)
}

/// `--config` names a file of a ConfigMap volume, and that ConfigMap holds it.
fn check_config_mount(all: &[Manifest], m: &Manifest, c: &Yaml, argv: &[String]) {
    let (key, _, volume) = mounted_file(m, c, argv, "--config");
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

/// The console's `--users` file comes from a Secret volume, never from a
/// ConfigMap, since it holds password hashes; only root (the files' owner)
/// and the pod's fsGroup may read it, and the console reads it through that
/// group, since it runs as another user than root.
fn check_users_secret(m: &Manifest, c: &Yaml, argv: &[String]) {
    let (key, mount, volume) = mounted_file(m, c, argv, "--users");
    assert_eq!(
        mount["readOnly"].as_bool(),
        Some(true),
        "{}: the users mount is writable",
        m.file
    );
    let volume_name = str_of(&volume["name"], "volumes.name");
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
        let broken = edited(&texts, file, from, to);
        let all = parse_manifests(&broken);
        assert_caught(&format!("{file}: {from:?} -> {to:?}"), || {
            for (m, c, argv) in &batchonce_containers(&all) {
                check_workload(&all, m, c, argv);
            }
        });
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
    common::ok(&out);
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
