//! Output shared by several commands.

use crate::text::escape_for_terminal as esc;

pub(super) fn distinct_fingerprints(d: &crate::worker_registry::ConfigDrift) -> usize {
    let mut f: Vec<&str> = d.processes.iter().map(|p| p.fingerprint.as_str()).collect();
    f.dedup();
    f.len()
}

/// Prints which live processes disagree about which jobs, and on which keys.
pub(super) fn print_drift(drift: &[crate::worker_registry::ConfigDrift]) {
    if drift.is_empty() {
        println!("configuration drift: none (live processes agree)");
        return;
    }
    for d in drift {
        println!(
            "configuration drift: {} is run with {} different configurations; keys that differ: {}",
            esc(&d.job_name),
            distinct_fingerprints(d),
            esc(&d.keys.join(", "))
        );
        for p in &d.processes {
            println!(
                "  {}  {} {} on {}",
                esc(&p.fingerprint),
                esc(&p.role),
                esc(&p.process_id),
                esc(&p.host)
            );
        }
    }
}
