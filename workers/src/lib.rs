//! The job kinds bundled with batchonce. A team adopting batchonce writes a
//! crate like this one: job kinds implementing [`batchonce::Job`], their
//! migrations, and a `main` that registers them.

pub mod settlement;

/// Every bundled job kind.
pub fn registry() -> batchonce::Registry {
    batchonce::Registry::new().register(settlement::DailySettlement)
}
