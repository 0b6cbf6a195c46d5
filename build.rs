//! Rebuilds the crate when a migration is added: `sqlx::migrate!` embeds the
//! folder at compile time, and cargo would not otherwise notice a new file.
//! Also records the commit being built (`BATCHONCE_GIT_COMMIT` from the
//! environment, else `git rev-parse`) for the `batchonce_build_info` metric;
//! without either, the metric says `unknown`. The same commit ends the line
//! `batchonce --version` prints (`BATCHONCE_VERSION_LINE`).
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-env-changed=BATCHONCE_GIT_COMMIT");
    let commit = std::env::var("BATCHONCE_GIT_COMMIT")
        .ok()
        .or_else(git_commit)
        // A label value: only what a commit id holds.
        .filter(|c| !c.is_empty() && c.len() <= 40 && c.bytes().all(|b| b.is_ascii_hexdigit()));
    if let Some(c) = &commit {
        println!("cargo:rustc-env=BATCHONCE_GIT_COMMIT={c}");
    }
    // Cargo sets CARGO_PKG_VERSION for build scripts too; the fallback only
    // keeps the build going if it ever did not.
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_else(|_| "unknown".to_owned());
    let commit = commit.as_deref().unwrap_or("unknown");
    println!("cargo:rustc-env=BATCHONCE_VERSION_LINE={version} (commit {commit})");
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8(out.stdout).ok()?.trim().to_owned())
}

fn git_commit() -> Option<String> {
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    // Build again when HEAD moves: a checkout changes HEAD, a commit the
    // branch's ref (or packed-refs).
    // A path that does not exist would make cargo run this every build.
    let watch = |path: Option<String>| {
        if let Some(p) = path.filter(|p| std::path::Path::new(p).exists()) {
            println!("cargo:rerun-if-changed={p}");
        }
    };
    watch(git(&["rev-parse", "--git-path", "HEAD"]));
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch(git(&["rev-parse", "--git-path", &branch]));
    }
    watch(git(&["rev-parse", "--git-path", "packed-refs"]));
    Some(commit)
}
