//! What a password guesser can make the console do: the sign-in limit per
//! client address and per user name, and the bound on argon2 verifications
//! running at once.
//!
//! - A try is counted when it starts, before its password is verified, so
//!   that tries sent in parallel are limited by the count as much as tries
//!   sent one after another. A try that signs in is taken back off the
//!   count; so is one that never reached a verification.
//! - At most [`MAX_VERIFICATIONS`] argon2 verifications run at once, each
//!   in working memory (about 19 MiB) allocated once and reused; a try
//!   waits at most [`VERIFY_WAIT`] for its turn and is then refused with
//!   429, counted as nothing.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argon2::Block;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Sign-in tries allowed per client address and per user name in
/// [`LOGIN_WINDOW`] (those that signed in do not count).
pub const MAX_FAILED_LOGINS: usize = 5;
pub const LOGIN_WINDOW: Duration = Duration::from_secs(5 * 60);
/// Argon2 verifications running at once, at most.
pub const MAX_VERIFICATIONS: usize = 4;
/// How long a try waits for a verification to end before it is refused.
pub const VERIFY_WAIT: Duration = Duration::from_secs(5);

/// Counts sign-in tries per client address and per user name.
#[derive(Default)]
pub struct LoginLimiter {
    tries: Mutex<HashMap<String, VecDeque<Instant>>>,
}

/// A try counted by [`LoginLimiter::begin`]: what [`LoginLimiter::refund`]
/// takes back.
#[derive(Debug)]
pub struct Try {
    at: Instant,
    keys: [String; 2],
}

impl LoginLimiter {
    /// Counts a try from `addr` for `name`, or `Err(wait)` when either has
    /// used up its tries: checked and counted under one lock, so no two
    /// tries can both take the last one.
    pub fn begin(&self, addr: &str, name: &str) -> Result<Try, Duration> {
        let now = Instant::now();
        let keys = [format!("addr:{addr}"), format!("user:{name}")];
        let mut map = self.lock();
        // Bounded: keys whose tries are all older than the window go.
        if map.len() > 100_000 {
            map.retain(|_, q| {
                q.back()
                    .is_some_and(|t| now.duration_since(*t) < LOGIN_WINDOW)
            });
        }
        let mut wait: Option<Duration> = None;
        for k in &keys {
            if let Some(q) = map.get_mut(k) {
                while q
                    .front()
                    .is_some_and(|t| now.duration_since(*t) >= LOGIN_WINDOW)
                {
                    q.pop_front();
                }
                if q.len() >= MAX_FAILED_LOGINS {
                    let until = q[q.len() - MAX_FAILED_LOGINS] + LOGIN_WINDOW;
                    let w = until.saturating_duration_since(now);
                    wait = Some(wait.map_or(w, |x| x.max(w)));
                }
            }
        }
        if let Some(w) = wait {
            return Err(w);
        }
        for k in &keys {
            map.entry(k.clone()).or_default().push_back(now);
        }
        Ok(Try { at: now, keys })
    }

    /// Takes a try back off the count: it signed in, or never reached a
    /// verification.
    pub fn refund(&self, t: Try) {
        let mut map = self.lock();
        for k in &t.keys {
            if let Some(q) = map.get_mut(k) {
                if let Some(i) = q.iter().rposition(|x| *x == t.at) {
                    q.remove(i);
                }
                if q.is_empty() {
                    map.remove(k);
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, VecDeque<Instant>>> {
        // A panic while holding the lock leaves a map that is still
        // consistent (every change is a push or a removal), so a poisoned
        // lock is taken over rather than failing every later sign-in.
        self.tries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The bound on argon2 verifications at once, and their counts (read by
/// the tests through `Users::verifications`).
pub struct VerifyGate {
    permits: Arc<Semaphore>,
    stats: Arc<VerifyStats>,
    memories: Memories,
}

/// How many verifications ran, and the most that ran at once.
#[derive(Debug, Default)]
pub struct VerifyStats {
    pub total: AtomicUsize,
    pub running: AtomicUsize,
    pub peak: AtomicUsize,
}

/// argon2's working memory, one per turn: allocated once and reused, so
/// the console's memory for verifications stays at [`MAX_VERIFICATIONS`]
/// times a hash's memory however many threads run them.
type Memories = Arc<Mutex<Vec<Vec<Block>>>>;

/// One verification's turn: held until the verification ends.
pub struct Turn {
    _permit: OwnedSemaphorePermit,
    stats: Arc<VerifyStats>,
    memories: Memories,
}

impl Turn {
    /// Runs `verify` with working memory of its own, counted.
    pub fn run<T>(self, verify: impl FnOnce(&mut Vec<Block>) -> T) -> T {
        let mut memory = lock(&self.memories).pop().unwrap_or_default();
        self.stats.total.fetch_add(1, Ordering::SeqCst);
        let now = self.stats.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.stats.peak.fetch_max(now, Ordering::SeqCst);
        let out = verify(&mut memory);
        self.stats.running.fetch_sub(1, Ordering::SeqCst);
        lock(&self.memories).push(memory);
        out
    }
}

fn lock(m: &Memories) -> std::sync::MutexGuard<'_, Vec<Vec<Block>>> {
    // A push or a pop leaves the list consistent: a poisoned lock is
    // taken over.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl VerifyGate {
    pub fn new(stats: Arc<VerifyStats>) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(MAX_VERIFICATIONS)),
            stats,
            memories: Memories::default(),
        }
    }

    /// A turn within [`VERIFY_WAIT`], or `None`: too many verifications
    /// are running.
    pub async fn turn(&self) -> Option<Turn> {
        let permit = tokio::time::timeout(VERIFY_WAIT, self.permits.clone().acquire_owned())
            .await
            .ok()?
            // The semaphore is never closed.
            .ok()?;
        Some(Turn {
            _permit: permit,
            stats: self.stats.clone(),
            memories: self.memories.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tries_are_limited_per_address_and_name_as_they_start() {
        let l = LoginLimiter::default();
        let mut tries = Vec::new();
        for _ in 0..MAX_FAILED_LOGINS {
            tries.push(l.begin("10.0.0.1", "alice").unwrap());
        }
        // None has ended yet: the count is already spent.
        assert!(l.begin("10.0.0.1", "bob").is_err(), "same address");
        assert!(l.begin("10.0.0.2", "alice").is_err(), "same name");
        // A try taken back frees its place, once.
        l.refund(tries.pop().unwrap());
        let t = l.begin("10.0.0.1", "carol").unwrap();
        assert!(l.begin("10.0.0.1", "dave").is_err());
        l.refund(t);
        assert!(l.begin("10.0.0.1", "dave").is_ok());
        assert!(l.begin("10.0.0.3", "erin").is_ok());
    }
}
