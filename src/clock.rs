//! The clock every time-dependent decision is made with. In production that is
//! the database's `now()`; tests pass a fixed instant instead. Queries bind
//! [`Clock::bind`] and write `COALESCE($n, now())`, so both paths run the same SQL.

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
