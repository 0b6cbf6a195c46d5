//! What a command job's program can reach of the processes above it.
//!
//! Every batchonce process, the worker and the supervisor included, makes
//! itself non-dumpable first thing ([`make_non_dumpable`], called by
//! [`crate::runtime::supervisor::run_if_invoked`]). The kernel then lets no
//! process without `CAP_SYS_PTRACE` read its `/proc/<pid>/environ`, `mem`
//! or `fd`, nor ptrace it, even one of the same user: a program that runs
//! as the worker's user cannot read the worker's database URL or tokens.
//! `execve` makes the program dumpable again, which is fine: it holds only
//! what it was given.
//!
//! `run_as_user` (and `run_as_group`) run the program as another account.
//! The worker resolves it before anything starts ([`resolve`]: the user
//! exists, it is neither root nor the worker's own, and the worker holds
//! `CAP_SETUID`, `CAP_SETGID` and `CAP_KILL`, which root has), so a refusal
//! is a clear, fatal error and the program never runs as the worker's user
//! instead. The supervisor receives the numeric ids ([`Switch`], one
//! argument) and switches in the program's process between fork and exec
//! ([`Switch::apply`]): supplementary groups, group, user, in that order,
//! each checked, then every capability dropped and the result verified.
//! The supervisor itself keeps the worker's identity, so it can still kill
//! the program's group, and the program cannot signal or read it. A program
//! that keeps the worker's user loses the worker's inheritable and ambient
//! capabilities ([`clear_inherited_capabilities`]), which are there for
//! `run_as_user`.

use std::ffi::CString;
use std::path::PathBuf;

use nix::unistd::{Gid, Group, Uid, User};

/// Makes this process non-dumpable (`PR_SET_DUMPABLE = 0`), see the module
/// documentation.
pub fn make_non_dumpable() -> nix::Result<()> {
    nix::sys::prctl::set_dumpable(false)
}

/// Clears this process's inheritable and ambient capabilities, between
/// fork and exec of a program that keeps the worker's user: a worker that
/// holds capabilities for `run_as_user` (systemd's `AmbientCapabilities=`)
/// must not pass them on to every program it runs, through the ambient set
/// or a file's inheritable capabilities. A kernel without ambient
/// capabilities (before 4.3) has none to clear.
pub fn clear_inherited_capabilities() -> std::io::Result<()> {
    let caps = capabilities()?;
    if caps.inheritable != 0 {
        let half = |c: Caps, high: bool| {
            let pick = |m: u64| if high { (m >> 32) as u32 } else { m as u32 };
            CapData {
                effective: pick(c.effective),
                permitted: pick(c.permitted),
                inheritable: 0,
            }
        };
        set_capabilities([half(caps, false), half(caps, true)])?;
    }
    // SAFETY: a plain prctl with integer arguments; a raw system call, so
    // it is safe between fork and exec.
    let r = unsafe {
        nix::libc::prctl(
            nix::libc::PR_CAP_AMBIENT,
            nix::libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    match nix::Error::result(r) {
        Ok(_) | Err(nix::Error::EINVAL) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The account a program runs as, resolved by the worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub home: PathBuf,
    pub switch: Switch,
}

impl Account {
    /// `HOME`, `USER` and `LOGNAME` of the account, for the program.
    pub fn env(&self) -> [(String, String); 3] {
        [
            ("HOME".into(), self.home.to_string_lossy().into_owned()),
            ("USER".into(), self.name.clone()),
            ("LOGNAME".into(), self.name.clone()),
        ]
    }
}

/// The numeric identity the supervisor gives the program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switch {
    pub uid: Uid,
    pub gid: Gid,
    /// Supplementary groups, the primary one included.
    pub groups: Vec<Gid>,
}

/// Why a program cannot run as the account its job names. Each is fatal:
/// another attempt on this worker would meet the same.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccountError {
    #[error("run_as_user = {0:?}: no such user on this host; the program was not started")]
    NoSuchUser(String),
    #[error("run_as_group = {0:?}: no such group on this host; the program was not started")]
    NoSuchGroup(String),
    #[error("run_as_user = {user:?}: cannot look the account up: {error}")]
    Lookup { user: String, error: String },
    #[error(
        "run_as_user = {0:?} names root: a program never runs as root through run_as_user; \
         the program was not started"
    )]
    Root(String),
    #[error(
        "run_as_user = {user:?} names the worker's own user (uid {uid}), whose secrets the \
         program must not reach; name another user. The program was not started"
    )]
    WorkersOwn { user: String, uid: u32 },
    #[error(
        "run_as_user = {user:?} needs a worker that runs as root or holds CAP_SETUID, CAP_SETGID \
         and CAP_KILL; this worker (uid {uid}) lacks {missing}, so the program was not started \
         (it never runs as the worker's user instead)"
    )]
    NotPrivileged {
        user: String,
        uid: u32,
        missing: String,
    },
}

/// Capabilities the worker needs to run a program as another user:
/// switching groups and user, and killing the program's group afterwards.
const NEEDED: [(u64, &str); 3] = [(5, "CAP_KILL"), (6, "CAP_SETGID"), (7, "CAP_SETUID")];

/// Resolves `user` (and `group`, which replaces the user's primary group)
/// and checks that this process may switch to it. Blocking: it asks the
/// system's user database.
pub fn resolve(user: &str, group: Option<&str>) -> Result<Account, AccountError> {
    let lookup = |e: nix::Error| AccountError::Lookup {
        user: user.to_owned(),
        error: e.to_string(),
    };
    let u = User::from_name(user)
        .map_err(lookup)?
        .ok_or_else(|| AccountError::NoSuchUser(user.to_owned()))?;
    if u.uid.is_root() {
        return Err(AccountError::Root(user.to_owned()));
    }
    let me = Uid::current();
    if u.uid == me || u.uid == Uid::effective() {
        return Err(AccountError::WorkersOwn {
            user: user.to_owned(),
            uid: u.uid.as_raw(),
        });
    }
    let gid = match group {
        Some(g) => {
            Group::from_name(g)
                .map_err(lookup)?
                .ok_or_else(|| AccountError::NoSuchGroup(g.to_owned()))?
                .gid
        }
        None => u.gid,
    };
    let effective = capabilities().map_err(lookup)?.effective;
    let missing: Vec<&str> = NEEDED
        .iter()
        .filter(|(bit, _)| effective & (1 << bit) == 0)
        .map(|(_, name)| *name)
        .collect();
    if !missing.is_empty() {
        return Err(AccountError::NotPrivileged {
            user: user.to_owned(),
            uid: me.as_raw(),
            missing: missing.join(", "),
        });
    }
    // A valid user name holds no NUL byte; the configuration checked it.
    let cname = CString::new(user).map_err(|_| lookup(nix::Error::EINVAL))?;
    let groups = nix::unistd::getgrouplist(&cname, gid).map_err(lookup)?;
    Ok(Account {
        name: u.name,
        home: u.dir,
        switch: Switch {
            uid: u.uid,
            gid,
            groups,
        },
    })
}

impl Switch {
    /// The supervisor's argument: `UID:GID:G1,G2,…`.
    pub fn arg(&self) -> String {
        let groups: Vec<String> = self.groups.iter().map(|g| g.to_string()).collect();
        format!("{}:{}:{}", self.uid, self.gid, groups.join(","))
    }

    pub fn parse(s: &str) -> Option<Self> {
        let mut parts = s.split(':');
        let uid = Uid::from_raw(parts.next()?.parse().ok()?);
        let gid = Gid::from_raw(parts.next()?.parse().ok()?);
        let groups = match parts.next()? {
            "" => Vec::new(),
            list => list
                .split(',')
                .map(|g| g.parse().ok().map(Gid::from_raw))
                .collect::<Option<_>>()?,
        };
        if parts.next().is_some() || uid.is_root() {
            return None;
        }
        Some(Self { uid, gid, groups })
    }

    /// Runs in the program's process between fork and exec, so it calls
    /// only system calls: supplementary groups, group and user, in that
    /// order (each needs the privilege the next one drops), then every
    /// capability dropped, and the result read back. Any failure fails the
    /// spawn: the program never runs with the supervisor's identity.
    pub fn apply(&self) -> std::io::Result<()> {
        nix::unistd::setgroups(&self.groups)?;
        nix::unistd::setgid(self.gid)?;
        nix::unistd::setuid(self.uid)?;
        // From root to another user the kernel clears the capabilities
        // itself; a worker that is not root but holds CAP_SETUID keeps
        // them across setuid unless they are dropped here. Lowering the
        // permitted and inheritable sets lowers the ambient set too.
        set_capabilities([CapData::default(); 2])?;
        let uids = nix::unistd::getresuid()?;
        let gids = nix::unistd::getresgid()?;
        let caps = capabilities()?;
        let switched = [uids.real, uids.effective, uids.saved]
            .iter()
            .all(|u| *u == self.uid)
            && [gids.real, gids.effective, gids.saved]
                .iter()
                .all(|g| *g == self.gid)
            && caps.effective == 0
            && caps.permitted == 0
            && caps.inheritable == 0;
        if switched {
            Ok(())
        } else {
            Err(std::io::Error::from_raw_os_error(nix::libc::EPERM))
        }
    }
}

/// `struct __user_cap_header_struct` of `<linux/capability.h>`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

/// `struct __user_cap_data_struct`: one 32-bit half of each set.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit sets, as two `CapData`.
const CAP_VERSION_3: u32 = 0x2008_0522;

/// This thread's capability sets, as 64-bit masks.
#[derive(Debug, Clone, Copy)]
struct Caps {
    effective: u64,
    permitted: u64,
    inheritable: u64,
}

fn capabilities() -> nix::Result<Caps> {
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two `CapData` for version 3, which `data`
    // holds; both structs have the kernel's layout. A raw system call, so
    // it is safe between fork and exec.
    let r = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_capget,
            &mut header as *mut CapHeader,
            data.as_mut_ptr(),
        )
    };
    nix::Error::result(r)?;
    let join = |low: u32, high: u32| u64::from(low) | u64::from(high) << 32;
    Ok(Caps {
        effective: join(data[0].effective, data[1].effective),
        permitted: join(data[0].permitted, data[1].permitted),
        inheritable: join(data[0].inheritable, data[1].inheritable),
    })
}

fn set_capabilities(data: [CapData; 2]) -> nix::Result<()> {
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    // SAFETY: capset reads two `CapData` for version 3; both structs have
    // the kernel's layout. A raw system call, safe between fork and exec.
    let r = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        )
    };
    nix::Error::result(r).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_argument_round_trips() {
        let s = Switch {
            uid: Uid::from_raw(65534),
            gid: Gid::from_raw(65534),
            groups: vec![Gid::from_raw(65534), Gid::from_raw(27)],
        };
        assert_eq!(s.arg(), "65534:65534:65534,27");
        assert_eq!(Switch::parse(&s.arg()), Some(s));
        let none = Switch::parse("1000:1000:").unwrap();
        assert!(none.groups.is_empty());
        for bad in ["", "1000", "1000:x:", "0:0:0", "1:1:1:1", "1:1:a"] {
            assert_eq!(Switch::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn an_unknown_or_own_user_is_refused() {
        assert_eq!(
            resolve("no-such-user-bo42", None),
            Err(AccountError::NoSuchUser("no-such-user-bo42".into()))
        );
        let me = User::from_uid(Uid::current()).unwrap().unwrap();
        let e = resolve(&me.name, None).unwrap_err();
        assert!(
            matches!(e, AccountError::Root(_) | AccountError::WorkersOwn { .. }),
            "{e}"
        );
    }
}
