//! Rebuilds the crate when a migration is added: `sqlx::migrate!` embeds the
//! folder at compile time, and cargo would not otherwise notice a new file.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
