//! Who may use the console: the users file (name, role, argon2 password
//! hash), the demo's one-time login, the optional trusted reverse-proxy
//! header, sessions and CSRF tokens. Nothing here touches the database;
//! the sign-in limits are `limits.rs`'s.
//!
//! - A session is a random 256-bit id in an `HttpOnly`, `SameSite=Strict`
//!   cookie (`Secure` unless the console listens on loopback, or as told),
//!   kept in this process's memory: a restart logs everyone out, and
//!   replicas need sticky sessions. Each session has its own CSRF token,
//!   which every form carries and every POST must return.
//! - The login form is protected by a double-submit token (a cookie and a
//!   form field that must match), so another site cannot log a browser in
//!   as someone else.
//! - An unknown name costs the same argon2 verification as a known one.
//! - A one-time account (the demo's) signs in once; then it is spent.
//! - The proxy header is believed only with the shared secret in
//!   `X-Batchonce-Proxy-Secret`, and only for names the users file lists
//!   (which gives their role).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argon2::password_hash::{self, PasswordHash, PasswordHasher, SaltString};
use argon2::{Algorithm, Argon2, Block, Params, Version};
use rand::RngCore;
use subtle::ConstantTimeEq;

/// Where the sign-in limit was before it had a module of its own.
pub use super::limits::{LOGIN_WINDOW, MAX_FAILED_LOGINS};

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
    /// Set for a one-time account: whether it has signed in already.
    spent: Option<AtomicBool>,
}

/// The operator's users: name → role and password hash.
pub struct Users {
    accounts: HashMap<String, Account>,
    stats: Arc<super::limits::VerifyStats>,
}

/// Why a sign-in was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No such user, no password, or the wrong one.
    Wrong,
    /// The right password of a one-time account that already signed in.
    Spent,
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
                spent: None,
            };
            if accounts.insert(u.name.clone(), account).is_some() {
                return Err(format!("user {} is listed twice", u.name));
            }
        }
        Ok(Self::of(accounts))
    }

    fn of(accounts: HashMap<String, Account>) -> Self {
        Self {
            accounts,
            stats: Arc::default(),
        }
    }

    /// Users made in memory.
    pub fn from_hashes(list: &[(&str, Role, String)]) -> Self {
        Self::in_memory(list, false)
    }

    /// Users made in memory who each sign in once (the demo's login,
    /// whose password is printed on a terminal).
    pub fn one_time(list: &[(&str, Role, String)]) -> Self {
        Self::in_memory(list, true)
    }

    fn in_memory(list: &[(&str, Role, String)], once: bool) -> Self {
        let accounts = list
            .iter()
            .map(|(n, role, hash)| {
                (
                    (*n).to_owned(),
                    Account {
                        role: *role,
                        hash: Some(hash.clone()),
                        spent: once.then(|| AtomicBool::new(false)),
                    },
                )
            })
            .collect();
        Self::of(accounts)
    }

    /// How many argon2 verifications the console has run, and the most at
    /// once: what a password guesser costs it.
    #[cfg(feature = "testing")]
    pub fn verifications(&self) -> Arc<super::limits::VerifyStats> {
        self.stats.clone()
    }

    pub(crate) fn stats(&self) -> Arc<super::limits::VerifyStats> {
        self.stats.clone()
    }

    pub fn is_empty(&self) -> bool {
        self.accounts.is_empty()
    }

    /// The user, if `password` is theirs. Always runs one argon2
    /// verification, so an unknown name answers as slowly as a known one.
    /// A one-time account's right password signs in once: the first
    /// caller takes it, even among callers at the same moment.
    pub fn verify(&self, name: &str, password: &str) -> Result<User, Refusal> {
        self.verify_in(&mut Vec::new(), name, password)
    }

    /// [`Users::verify`] with argon2's working memory in `memory` (grown
    /// as the hash needs, kept for the next verification).
    pub fn verify_in(
        &self,
        memory: &mut Vec<Block>,
        name: &str,
        password: &str,
    ) -> Result<User, Refusal> {
        let account = self.accounts.get(name);
        let hash = account
            .and_then(|a| a.hash.as_deref())
            .unwrap_or(DUMMY_HASH);
        let parsed = PasswordHash::new(hash).map_err(|_| Refusal::Wrong)?;
        let ok = verify_hash(memory, &parsed, password.as_bytes());
        match account {
            Some(a) if ok && a.hash.is_some() => {
                if let Some(spent) = &a.spent {
                    if spent.swap(true, Ordering::SeqCst) {
                        return Err(Refusal::Spent);
                    }
                }
                Ok(User {
                    name: name.to_owned(),
                    role: a.role,
                })
            }
            _ => Err(Refusal::Wrong),
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

/// Whether `password` is the one of `parsed`, as
/// `Argon2::verify_password` says, but in `memory` rather than in memory
/// allocated for each verification: the allocator keeps what a
/// verification freed in the arena of the thread that ran it, so a
/// verification in fresh memory on each of many threads left the process
/// hundreds of MiB larger for good.
fn verify_hash(memory: &mut Vec<Block>, parsed: &PasswordHash<'_>, password: &[u8]) -> bool {
    let (Some(salt), Some(expected)) = (parsed.salt, parsed.hash) else {
        return false;
    };
    let Ok(algorithm) = Algorithm::try_from(parsed.algorithm) else {
        return false;
    };
    let Ok(version) = parsed
        .version
        .map_or(Ok(Version::default()), Version::try_from)
    else {
        return false;
    };
    let Ok(params) = Params::try_from(parsed) else {
        return false;
    };
    let mut salt_buf = [0u8; 64];
    let Ok(salt) = salt.decode_b64(&mut salt_buf) else {
        return false;
    };
    if memory.len() < params.block_count() {
        memory.resize(params.block_count(), Block::default());
    }
    let mut out = vec![0u8; expected.len()];
    Argon2::new(algorithm, version, params)
        .hash_password_into_with_memory(password, salt, &mut out, &mut memory[..])
        .is_ok()
        // `Output`'s comparison takes the same time wherever they differ.
        && password_hash::Output::new(&out).is_ok_and(|o| o == expected)
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
        assert_eq!(users.verify("alice", "wrong").err(), Some(Refusal::Wrong));
        // Bob has no password: only the proxy can sign him in.
        assert!(users.verify("bob", "").is_err());
        assert_eq!(users.proxied("bob").unwrap().role, Role::Viewer);
        assert!(users.verify("nobody", "correct horse").is_err());
        // Users of a file sign in as often as they like; a one-time
        // account once.
        assert!(users.verify("alice", "correct horse").is_ok());
        let once = Users::one_time(&[("demo", Role::Operator, hash.clone())]);
        assert!(once.verify("demo", "correct horse").is_ok());
        assert_eq!(
            once.verify("demo", "correct horse").err(),
            Some(Refusal::Spent)
        );
        assert_eq!(once.verify("demo", "wrong").err(), Some(Refusal::Wrong));
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
    fn verification_in_kept_memory_agrees_with_the_crate() {
        use argon2::password_hash::PasswordVerifier;
        let hash = hash_password("correct horse").unwrap();
        let parsed = PasswordHash::new(&hash).unwrap();
        let mut memory = Vec::new();
        for pw in ["correct horse", "correct hors", "", "correct horse!"] {
            assert_eq!(
                verify_hash(&mut memory, &parsed, pw.as_bytes()),
                Argon2::default()
                    .verify_password(pw.as_bytes(), &parsed)
                    .is_ok(),
                "{pw}"
            );
        }
        // Other parameters, in the same memory.
        let small = Argon2::new(
            Algorithm::Argon2id,
            Version::V0x13,
            Params::new(8, 1, 1, None).unwrap(),
        );
        let salt = SaltString::encode_b64(b"sixteen byte slt").unwrap();
        let h = small.hash_password(b"pw", &salt).unwrap().to_string();
        let parsed = PasswordHash::new(&h).unwrap();
        assert!(verify_hash(&mut memory, &parsed, b"pw"));
        assert!(!verify_hash(&mut memory, &parsed, b"px"));
    }

    #[test]
    fn the_dummy_hash_parses() {
        // An unknown name must cost one real verification: every part
        // that `verify_hash` reads before hashing is good.
        let parsed = PasswordHash::new(DUMMY_HASH).unwrap();
        assert!(Params::try_from(&parsed).is_ok());
        assert!(Algorithm::try_from(parsed.algorithm).is_ok());
        assert!(parsed.hash.is_some());
        assert!(parsed.salt.unwrap().decode_b64(&mut [0u8; 64]).is_ok());
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
