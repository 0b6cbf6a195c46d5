//! The clock every time-dependent decision is made with. In production that is
//! the database's `now()`; tests pass a fixed instant instead. Queries bind
//! [`Clock::bind`] and write `COALESCE($n, now())`, so both paths run the same SQL.
//!
//! `Clock::Db` (the default) and `Clock::At(instant)`. `Clock::bind()` gives `NULL` for `Db` and
//! the instant for `At`. Every query writes `COALESCE($n, now())`, or `COALESCE($n,
//! clock_timestamp())` where the time of the statement rather than of the transaction's start
//! matters (the lease extension in `FencedTx::commit`), so tests and production run the same SQL.

use chrono::{DateTime, Utc};

/// Which "now" a query uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Clock {
    /// The database server's `now()` (the transaction start time).
    #[default]
    Db,
    /// A fixed instant, for tests and simulations.
    At(DateTime<Utc>),
}

impl Clock {
    /// The value to bind: `NULL` means "use the database clock".
    pub fn bind(self) -> Option<DateTime<Utc>> {
        match self {
            Self::Db => None,
            Self::At(t) => Some(t),
        }
    }
}
