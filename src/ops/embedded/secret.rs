//! The cluster's password: random, kept in a libpq password file, never
//! shown by `Debug`.

use std::fmt;

use rand::distributions::Alphanumeric;
use rand::rngs::OsRng;
use rand::Rng;

/// The only role of the cluster, the superuser `initdb` makes.
const USER: &str = "postgres";
/// 32 alphanumeric characters from the operating system's generator: about
/// 190 bits, and nothing to escape in a URL or a password file.
const LEN: usize = 32;

/// A password that `Debug` (and so any error or log built from a
/// `Cluster`) shows as `***`.
#[derive(Clone, Default, PartialEq, Eq)]
pub(super) struct Secret(String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl Secret {
    pub fn generate() -> Self {
        Self(
            OsRng
                .sample_iter(&Alphanumeric)
                .take(LEN)
                .map(char::from)
                .collect(),
        )
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The password file's text: one libpq password-file line for any host,
    /// port and database, so `PGPASSFILE=<dir>/pgpass psql -h <socket> -U
    /// postgres` works as well.
    pub fn pgpass(&self) -> String {
        format!("*:*:*:{USER}:{}\n", self.0)
    }

    /// Reads the line [`Secret::pgpass`] wrote; anything else is `None`.
    pub fn from_pgpass(text: &str) -> Option<Self> {
        let prefix = format!("*:*:*:{USER}:");
        let password = text.lines().find_map(|l| l.strip_prefix(prefix.as_str()))?;
        (password.len() >= 16 && password.bytes().all(|b| b.is_ascii_alphanumeric()))
            .then(|| Self(password.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_round_trips_and_never_shows_in_debug() {
        let s = Secret::generate();
        assert_eq!(s.expose().len(), LEN);
        assert_ne!(s, Secret::generate());
        assert_eq!(Secret::from_pgpass(&s.pgpass()), Some(s.clone()));
        assert!(!format!("{s:?}").contains(s.expose()));
        assert_eq!(Secret::from_pgpass("*:*:*:postgres:short\n"), None);
        assert_eq!(Secret::from_pgpass(""), None);
    }
}
