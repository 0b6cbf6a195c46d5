//! The NetworkPolicies in `deploy/kubernetes` isolate every batchonce pod
//! for ingress and admit only the scraper, to the metrics ports, and only
//! the ingress controller, to the console's port; each way of getting that
//! wrong (a selector, a policy type, a port, a missing `from`, the dash that
//! turns AND into OR) is shown to be caught. None of this needs a database.

use std::collections::{BTreeMap, BTreeSet};

mod common;

use common::deploy::*;

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
        let broken = edited(&texts, file, from, to);
        let all = parse_manifests(&broken);
        assert_caught(&format!("{file}: {from:?} -> {to:?}"), || {
            check_network_policy(&all)
        });
    }
}
