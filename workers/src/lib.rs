//! The job kinds bundled with batchonce. A team adopting batchonce writes a
//! crate like this one: job kinds implementing [`batchonce::Job`], their
//! migrations, and a `main` that registers them. (Scripts in other languages
//! need no crate: they are command jobs, declared in `batchonce.toml`.)
//!
//! `registry()` with every bundled kind (`DailySettlement`, `NotificationSend::new()`,
//! `InventorySync`), and `migrations()`, their `Migrator`s, which the tests pass to `TestDb::new`.

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
