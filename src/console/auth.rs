//! Who may use the console: the users file (name, role, argon2 password
//! hash), the optional trusted reverse-proxy header, sessions, CSRF tokens
//! and the login rate limit. Nothing here touches the database.
//!
//! - A session is a random 256-bit id in an `HttpOnly`, `SameSite=Strict`
//!   cookie (`Secure` when the console is served over TLS), kept in this
//!   process's memory: a restart logs everyone out, and replicas need
//!   sticky sessions. Each session has its own CSRF token, which every
//!   form carries and every POST must return.
//! - The login form is protected by a double-submit token (a cookie and a
//!   form field that must match), so another site cannot log a browser in
//!   as someone else.
//! - Failed logins are limited per remote address and per user name; an
//!   unknown name costs the same argon2 verification as a known one.
//! - The proxy header is believed only with the shared secret in
//!   `X-Batchonce-Proxy-Secret`, and only for names the users file lists
//!   (which gives their role).

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use rand::RngCore;
use subtle::ConstantTimeEq;

/// What a console user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Sees everything.
    Viewer,
    /// Sees everything and may fail, re-run and skip runs.
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Viewer => "viewer",
            Self::Operator => "operator",
        }
    }
}

/// A signed-in console user.
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub role: Role,
}

/// Why the users file or the console's security options were refused.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("cannot read the users file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("users file {path}: {message}")]
    Invalid { path: String, message: String },
    #[error("cannot hash the password: {0}")]
    Hash(String),
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct UsersFile {
    #[serde(default)]
    user: Vec<UserEntry>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct UserEntry {
    name: String,
    role: String,
    /// Absent for a user who signs in only through the proxy.
    password_hash: Option<String>,
}

struct Account {
    role: Role,
    hash: Option<String>,
}

/// The operator's users: name → role and password hash.
pub struct Users {
    accounts: HashMap<String, Account>,
}

/// A user name: 1–64 letters, digits and `._@-`, so it is safe in a log
/// line, an audit row and a page.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '@' | '-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid user name {:?}: use 1 to 64 of A-Z, a-z, 0-9 and . _ @ -",
            crate::text::truncate(name)
        ))
    }
}

impl Users {
    /// Reads and checks the users file: every name valid and listed once,
    /// every role `viewer` or `operator`, every hash an argon2 PHC string.
    pub fn load(path: &Path) -> Result<Self, AuthError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&text).map_err(|message| AuthError::Invalid {
            path: shown,
            message,
        })
    }

    /// [`Users::load`] on the file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: UsersFile = toml::from_str(text).map_err(|e| e.message().to_owned())?;
        let mut accounts = HashMap::new();
        for u in file.user {
            check_name(&u.name)?;
            let role = match u.role.as_str() {
                "viewer" => Role::Viewer,
                "operator" => Role::Operator,
                other => {
                    return Err(format!(
                        "user {}: role {:?} is neither viewer nor operator",
                        u.name,
                        crate::text::truncate(other)
                    ))
                }
            };
            if let Some(h) = &u.password_hash {
                let parsed = PasswordHash::new(h).map_err(|e| {
                    format!(
                        "user {}: password_hash is not a PHC string ({e}); make one with `batchonce console --hash-password`",
                        u.name
                    )
                })?;
                if !parsed.algorithm.as_str().starts_with("argon2") {
                    return Err(format!(
                        "user {}: password_hash is not an argon2 hash",
                        u.name
                    ));
                }
            }
            let account = Account {
                role,
                hash: u.password_hash,
            };
            if accounts.insert(u.name.clone(), account).is_some() {
                return Err(format!("user {} is listed twice", u.name));
            }
        }
        Ok(Self { accounts })
    }

    /// Users made in memory (the demo's one-time login).
    pub fn from_hashes(list: &[(&str, Role, String)]) -> Self {
        let accounts = list
            .iter()
            .map(|(n, role, hash)| {
                (
                    (*n).to_owned(),
                    Account {
                        role: *role,
                        hash: Some(hash.clone()),
                    },
                )
            })
            .collect();
        Self { accounts }
    }

    pub fn is_empty(&self) -> bool {
        self.accounts.is_empty()
    }

    /// The user, if `password` is theirs. Always runs one argon2
    /// verification, so an unknown name answers as slowly as a known one.
    pub fn verify(&self, name: &str, password: &str) -> Option<User> {
        let account = self.accounts.get(name);
        let hash = account
            .and_then(|a| a.hash.as_deref())
            .unwrap_or(DUMMY_HASH);
        let parsed = PasswordHash::new(hash).ok()?;
        let ok = Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok();
        match account {
            Some(a) if ok && a.hash.is_some() => Some(User {
                name: name.to_owned(),
                role: a.role,
            }),
            _ => None,
        }
    }

    /// The role of a user the proxy vouched for, if the file lists them.
    pub fn proxied(&self, name: &str) -> Option<User> {
        self.accounts.get(name).map(|a| User {
            name: name.to_owned(),
            role: a.role,
        })
    }
}

/// The argon2id hash of a password nobody knows, verified when the name is
/// unknown so that the answer takes as long.
const DUMMY_HASH: &str =
    "$argon2id$v=19$m=19456,t=2,p=1$YmF0Y2hvbmNlZHVtbXk$0d7WBu3n3qR5Q+e2X2JbIhV1uT0g3h6g0b4v7xj2aQk";

/// An argon2id PHC string for `password` (the crate's default parameters,
/// a random salt), for the users file.
pub fn hash_password(password: &str) -> Result<String, AuthError> {
    let mut salt = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut salt);
    let salt = SaltString::encode_b64(&salt).map_err(|e| AuthError::Hash(e.to_string()))?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| AuthError::Hash(e.to_string()))
}

/// A random token: 32 bytes from the operating system, as hex.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether two secrets are equal, in time that does not depend on where
/// they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// One signed-in browser.
#[derive(Debug, Clone)]
pub struct Session {
    pub user: User,
    pub csrf: String,
    /// Set for a session the proxy header opened.
    pub proxied: bool,
    created: Instant,
    last_used: Instant,
}

/// How long a session lasts without use, and at most.
const SESSION_IDLE: Duration = Duration::from_secs(60 * 60);
const SESSION_MAX: Duration = Duration::from_secs(12 * 60 * 60);
/// At most this many sessions are kept; the oldest go first.
const MAX_SESSIONS: usize = 10_000;

/// The sessions of this process.
#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    /// Opens a session for `user`; returns its id.
    pub fn open(&self, user: User, proxied: bool) -> String {
        let id = random_token();
        let now = Instant::now();
        let session = Session {
            user,
            csrf: random_token(),
            proxied,
            created: now,
            last_used: now,
        };
        let mut map = self.lock();
        map.retain(|_, s| live(s, now));
        if map.len() >= MAX_SESSIONS {
            if let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        map.insert(id.clone(), session);
        id
    }

    /// The live session of `id`, marked as used.
    pub fn get(&self, id: &str) -> Option<Session> {
        let now = Instant::now();
        let mut map = self.lock();
        match map.get_mut(id) {
            Some(s) if live(s, now) => {
                s.last_used = now;
                Some(s.clone())
            }
            Some(_) => {
                map.remove(id);
                None
            }
            None => None,
        }
    }

    pub fn close(&self, id: &str) {
        self.lock().remove(id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        // A panic while holding the lock leaves a map that is still
        // consistent (every change is one insert or remove), so a poisoned
        // lock is taken over rather than failing every later request.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn live(s: &Session, now: Instant) -> bool {
    now.duration_since(s.last_used) < SESSION_IDLE && now.duration_since(s.created) < SESSION_MAX
}

/// Failed logins allowed per remote address and per user name in
/// [`LOGIN_WINDOW`].
pub const MAX_FAILED_LOGINS: usize = 5;
pub const LOGIN_WINDOW: Duration = Duration::from_secs(5 * 60);

/// Counts failed logins per remote address and per user name.
#[derive(Default)]
pub struct LoginLimiter {
    failures: Mutex<HashMap<String, VecDeque<Instant>>>,
}

impl LoginLimiter {
    /// `Some(wait)` when `addr` or `name` failed too often lately.
    pub fn blocked(&self, addr: &str, name: &str) -> Option<Duration> {
        let now = Instant::now();
        let mut map = self.lock();
        let mut wait = None;
        for k in [format!("addr:{addr}"), format!("user:{name}")] {
            if let Some(q) = map.get_mut(&k) {
                while q
                    .front()
                    .is_some_and(|t| now.duration_since(*t) >= LOGIN_WINDOW)
                {
                    q.pop_front();
                }
                if q.len() >= MAX_FAILED_LOGINS {
                    let until = q[q.len() - MAX_FAILED_LOGINS] + LOGIN_WINDOW;
                    let w = until.saturating_duration_since(now);
                    wait = Some(wait.map_or(w, |x: Duration| x.max(w)));
                }
            }
        }
        wait
    }

    pub fn failed(&self, addr: &str, name: &str) {
        let now = Instant::now();
        let mut map = self.lock();
        // Bounded: entries older than the window are dropped on the way.
        if map.len() > 100_000 {
            map.retain(|_, q| {
                q.back()
                    .is_some_and(|t| now.duration_since(*t) < LOGIN_WINDOW)
            });
        }
        for k in [format!("addr:{addr}"), format!("user:{name}")] {
            let q = map.entry(k).or_default();
            q.push_back(now);
            while q.len() > MAX_FAILED_LOGINS {
                q.pop_front();
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, VecDeque<Instant>>> {
        // As for the sessions: every change leaves the map consistent.
        self.failures.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_file_is_checked() {
        let hash = hash_password("correct horse").unwrap();
        let users = Users::parse(&format!(
            "[[user]]\nname = \"alice\"\nrole = \"operator\"\npassword_hash = \"{hash}\"\n\
             [[user]]\nname = \"bob\"\nrole = \"viewer\"\n"
        ))
        .unwrap();
        let alice = users.verify("alice", "correct horse").unwrap();
        assert_eq!(alice.role, Role::Operator);
        assert!(users.verify("alice", "wrong").is_none());
        // Bob has no password: only the proxy can sign him in.
        assert!(users.verify("bob", "").is_none());
        assert_eq!(users.proxied("bob").unwrap().role, Role::Viewer);
        assert!(users.verify("nobody", "correct horse").is_none());
        for (bad, why) in [
            ("[[user]]\nname = \"a b\"\nrole = \"viewer\"\n", "invalid user name"),
            ("[[user]]\nname = \"a\"\nrole = \"admin\"\n", "neither viewer nor operator"),
            ("[[user]]\nname = \"a\"\nrole = \"viewer\"\npassword_hash = \"plain\"\n", "not a PHC string"),
            ("[[user]]\nname = \"a\"\nrole = \"viewer\"\n[[user]]\nname = \"a\"\nrole = \"viewer\"\n", "listed twice"),
            ("[[user]]\nname = \"a\"\nrole = \"viewer\"\npassword = \"x\"\n", "unknown field"),
        ] {
            let e = Users::parse(bad).err().unwrap();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn the_dummy_hash_parses() {
        // An unknown name must cost one real verification.
        assert!(PasswordHash::new(DUMMY_HASH).is_ok());
    }

    #[test]
    fn failed_logins_are_limited_per_address_and_name() {
        let l = LoginLimiter::default();
        for _ in 0..MAX_FAILED_LOGINS {
            assert!(l.blocked("10.0.0.1", "alice").is_none());
            l.failed("10.0.0.1", "alice");
        }
        assert!(l.blocked("10.0.0.1", "bob").is_some(), "same address");
        assert!(l.blocked("10.0.0.2", "alice").is_some(), "same name");
        assert!(l.blocked("10.0.0.2", "bob").is_none());
    }

    #[test]
    fn sessions_open_and_close() {
        let s = Sessions::default();
        let id = s.open(
            User {
                name: "alice".into(),
                role: Role::Viewer,
            },
            false,
        );
        assert_eq!(s.get(&id).unwrap().user.name, "alice");
        assert!(s.get("nope").is_none());
        s.close(&id);
        assert!(s.get(&id).is_none());
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
    }
}
