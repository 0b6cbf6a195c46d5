//! The job kinds bundled with batchonce, as samples to copy. A team adopting
//! batchonce writes a crate like this one: job kinds implementing
//! [`batchonce::Job`], their migrations, and a `main` that registers them.
//! (Scripts in other languages need no crate: they are command jobs,
//! declared in `batchonce.toml`.) Registering a kind does not run it: a
//! deployment runs only the jobs its configuration declares, and the demo
//! declares these three for itself.
//!
//! Each sample shows one pattern; start from the one closest to your job:
//!
//! - `settlement.rs` (`daily-settlement`): read a business period's source
//!   rows, write one item per source row in fenced, keyset-paginated
//!   chunks, then a summary; the item key is the order, so an order is
//!   settled once, ever.
//! - `notification/` (`notification-send`): call an outside provider once
//!   per item, with an idempotency key stored before the call and a fenced
//!   mark after it; where exactly-once stops is said in RELIABILITY.md.
//! - `inventory.rs` (`inventory-sync`): a frequent job whose writes are
//!   versioned upserts, so a late or overlapping run never moves data back.
//!
//! `registry()` holds every bundled kind (`DailySettlement`,
//! `NotificationSend::new()`, `InventorySync`), and `migrations()` their
//! `Migrator`s, which the tests pass to `TestDb::new`.

pub mod inventory;
pub mod notification;
pub mod settlement;

/// Every bundled job kind.
pub fn registry() -> batchonce::Registry {
    batchonce::Registry::new()
        .register(settlement::DailySettlement)
        .register(notification::NotificationSend::new())
        .register(inventory::InventorySync)
}

/// Every bundled job kind's migrations (what `batchonce migrate` applies
/// besides the engine's).
pub fn migrations() -> Vec<&'static sqlx::migrate::Migrator> {
    registry().migrations()
}
