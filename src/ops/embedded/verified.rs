//! The cluster's folders and files, made and opened so that nothing is
//! written into a folder before it is verified and no symbolic link is ever
//! followed. A folder is verified through an open descriptor (`fstat` on the
//! descriptor, not on the name), and everything inside it is then reached
//! through that descriptor (`mkdirat`, `openat`, `unlinkat`), so swapping a
//! name for a symlink after the check changes nothing.

use std::ffi::{CStr, OsStr};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::{Dir as NixDir, Type};
use nix::errno::Errno;
use nix::fcntl::{openat, renameat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstat, fstatat, mkdirat, FileStat, Mode, SFlag};
use nix::unistd::{fchown, unlinkat, Gid, Uid, UnlinkatFlags};

use super::EmbeddedError;

/// Who an existing folder or file may belong to, and who a folder is
/// handed to once verified.
#[derive(Debug, Clone)]
pub(super) struct Access {
    /// Owners an existing folder is accepted from: the user who starts the
    /// cluster, and as root also the server's user (`postgres`), to whom
    /// root hands the folders (only root or that user can make a folder
    /// owned by that user).
    pub owners: Vec<Uid>,
    /// As root, the server's user and group: `postgres` must traverse the
    /// folders, and nobody else may.
    pub hand_to: Option<(Uid, Gid)>,
}

/// A verified folder: the path for messages and child processes, and the
/// descriptor everything inside it is reached through.
#[derive(Debug)]
pub(super) struct Dir {
    pub path: PathBuf,
    fd: OwnedFd,
}

fn io(path: &Path, e: impl Into<std::io::Error>) -> EmbeddedError {
    EmbeddedError::Io {
        path: path.to_owned(),
        source: e.into(),
    }
}

fn refused(path: &Path, reason: impl Into<String>) -> EmbeddedError {
    EmbeddedError::Refused {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// Takes ownership of a descriptor `openat` just returned.
fn own(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was returned by a successful `openat` a moment ago and
    // nothing else holds it, so this is its only owner and closes it once.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

/// What the name is, for a refusal: never followed.
fn describe(at: Option<RawFd>, name: &Path) -> &'static str {
    match fstatat(at, name, AtFlags::AT_SYMLINK_NOFOLLOW).map(|st| kind(&st)) {
        Ok(SFlag::S_IFLNK) => "it is a symbolic link",
        Ok(SFlag::S_IFDIR) => "it is a folder",
        Ok(_) => "it is not a folder",
        Err(_) => "it cannot be examined",
    }
}

fn owner_names(owners: &[Uid]) -> String {
    owners
        .iter()
        .map(|u| match nix::unistd::User::from_uid(*u) {
            Ok(Some(user)) => user.name,
            _ => format!("uid {u}"),
        })
        .collect::<Vec<_>>()
        .join(" or ")
}

/// Makes the folder `name` (inside `parent`, or an absolute path when
/// `parent` is `None`) with mode 0700 if it is missing, then verifies what
/// is there through a descriptor opened without following a symlink: a
/// real folder, owned by one of `access.owners`, writable by nobody else.
/// Only then is it handed to the server's user and set to exactly 0700.
/// A folder someone else made first, a symlink or a file is refused and
/// left exactly as it was.
pub(super) fn ensure_dir(
    parent: Option<&Dir>,
    name: &Path,
    access: &Access,
) -> Result<Dir, EmbeddedError> {
    let path = match parent {
        Some(p) => p.path.join(name),
        None => name.to_owned(),
    };
    let at = parent.map(|p| p.fd.as_raw_fd());
    // mkdir never follows a symlink in its last component: on a planted
    // name it fails with EEXIST and writes nothing.
    match mkdirat(at, name, Mode::S_IRWXU) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(io(&path, e)),
    }
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = match openat(at, name, flags, Mode::empty()) {
        Ok(fd) => own(fd),
        Err(Errno::ELOOP | Errno::ENOTDIR) => return Err(refused(&path, describe(at, name))),
        Err(e) => return Err(io(&path, e)),
    };
    let st = fstat(fd.as_raw_fd()).map_err(|e| io(&path, e))?;
    if kind(&st) != SFlag::S_IFDIR {
        return Err(refused(&path, "it is not a folder"));
    }
    let uid = Uid::from_raw(st.st_uid);
    if !access.owners.contains(&uid) {
        return Err(refused(
            &path,
            format!(
                "it belongs to {}, not to {}",
                owner_names(&[uid]),
                owner_names(&access.owners)
            ),
        ));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(refused(
            &path,
            format!(
                "it is writable by other users (mode {:o})",
                st.st_mode & 0o7777
            ),
        ));
    }
    if let Some((u, g)) = access.hand_to {
        if st.st_uid != u.as_raw() || st.st_gid != g.as_raw() {
            fchown(fd.as_raw_fd(), Some(u), Some(g)).map_err(|e| io(&path, e))?;
        }
    }
    // Exactly 0700: an earlier version's 0755, or a umask that left the
    // owner without search permission, is put right through the descriptor.
    if st.st_mode & 0o7777 != 0o700 {
        fchmod(fd.as_raw_fd(), Mode::S_IRWXU).map_err(|e| io(&path, e))?;
    }
    Ok(Dir { path, fd })
}

/// How a file in a verified folder is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Open {
    /// Read only; a missing file is `None`.
    Read,
    /// Read and write, created 0600 if missing (the lock file).
    Create,
    /// Appended to, created 0600 if missing (the server log).
    Append,
}

impl Dir {
    /// Opens the file `name` in this folder without following a symlink
    /// (O_NOFOLLOW, and O_NONBLOCK so a planted FIFO cannot block us), and
    /// accepts it only if it is a regular file with a single link, owned by
    /// one of `owners`. A file the caller creates is 0600; one it merely
    /// reads must be unreadable by others (it holds the secret).
    pub fn open(
        &self,
        name: &str,
        how: Open,
        owners: &[Uid],
    ) -> Result<Option<File>, EmbeddedError> {
        let path = self.path.join(name);
        let common = OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
        let flags = match how {
            Open::Read => OFlag::O_RDONLY,
            Open::Create => OFlag::O_RDWR | OFlag::O_CREAT,
            Open::Append => OFlag::O_WRONLY | OFlag::O_APPEND | OFlag::O_CREAT,
        } | common;
        let fd = match openat(
            Some(self.fd.as_raw_fd()),
            name,
            flags,
            Mode::S_IRUSR | Mode::S_IWUSR,
        ) {
            Ok(fd) => own(fd),
            Err(Errno::ENOENT) if how == Open::Read => return Ok(None),
            Err(Errno::ELOOP) => return Err(refused(&path, "it is a symbolic link")),
            Err(e) => return Err(io(&path, e)),
        };
        let st = fstat(fd.as_raw_fd()).map_err(|e| io(&path, e))?;
        if kind(&st) != SFlag::S_IFREG || st.st_nlink != 1 {
            return Err(refused(&path, "it is not a plain file"));
        }
        if !owners.contains(&Uid::from_raw(st.st_uid)) {
            return Err(refused(
                &path,
                format!(
                    "it belongs to {}, not to {}",
                    owner_names(&[Uid::from_raw(st.st_uid)]),
                    owner_names(owners)
                ),
            ));
        }
        if how == Open::Read {
            if st.st_mode & 0o077 != 0 {
                return Err(refused(
                    &path,
                    format!(
                        "other users may have read it (mode {:o})",
                        st.st_mode & 0o7777
                    ),
                ));
            }
        } else if st.st_mode & 0o7777 != 0o600 {
            fchmod(fd.as_raw_fd(), Mode::S_IRUSR | Mode::S_IWUSR).map_err(|e| io(&path, e))?;
        }
        Ok(Some(File::from(fd)))
    }

    /// Reads the whole file `name` (see [`Dir::open`] with [`Open::Read`]).
    pub fn read(&self, name: &str, owners: &[Uid]) -> Result<Option<String>, EmbeddedError> {
        let Some(mut f) = self.open(name, Open::Read, owners)? else {
            return Ok(None);
        };
        let mut text = String::new();
        f.read_to_string(&mut text)
            .map_err(|e| io(&self.path.join(name), e))?;
        Ok(Some(text))
    }

    /// Writes `name` whole, mode 0600, owned by `owner` (or by us): into a
    /// fresh file made with O_EXCL beside it, then renamed over it, so a
    /// reader sees the old content or the new, never part of it.
    pub fn write(
        &self,
        name: &str,
        contents: &[u8],
        owner: Option<(Uid, Gid)>,
    ) -> Result<(), EmbeddedError> {
        let tmp = format!("{name}.new");
        let path = self.path.join(&tmp);
        self.remove(&tmp)?;
        let fd = openat(
            Some(self.fd.as_raw_fd()),
            tmp.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )
        .map_err(|e| io(&path, e))?;
        let mut f = File::from(own(fd));
        if let Some((u, g)) = owner {
            fchown(f.as_raw_fd(), Some(u), Some(g)).map_err(|e| io(&path, e))?;
        }
        f.write_all(contents).map_err(|e| io(&path, e))?;
        f.sync_all().map_err(|e| io(&path, e))?;
        renameat(
            Some(self.fd.as_raw_fd()),
            tmp.as_str(),
            Some(self.fd.as_raw_fd()),
            name,
        )
        .map_err(|e| io(&self.path.join(name), e))
    }

    /// Removes the file `name` if it is there (a symlink is removed, never
    /// followed).
    pub fn remove(&self, name: &str) -> Result<(), EmbeddedError> {
        match unlinkat(Some(self.fd.as_raw_fd()), name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(io(&self.path.join(name), e)),
        }
    }

    /// Removes the tree `name` (a data folder) if it is there, through
    /// descriptors: a symlink inside is removed, never followed.
    pub fn remove_tree(&self, name: &str) -> Result<(), EmbeddedError> {
        remove_tree_at(self.fd.as_raw_fd(), OsStr::new(name), &self.path.join(name))
    }
}

fn remove_tree_at(parent: RawFd, name: &OsStr, path: &Path) -> Result<(), EmbeddedError> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match NixDir::openat(Some(parent), name, flags, Mode::empty()) {
        Ok(mut dir) => {
            let fd = dir.as_raw_fd();
            let mut entries: Vec<(Vec<u8>, Option<Type>)> = Vec::new();
            for entry in dir.iter() {
                let entry = entry.map_err(|e| io(path, e))?;
                let n: &CStr = entry.file_name();
                if n.to_bytes() != b"." && n.to_bytes() != b".." {
                    entries.push((n.to_bytes().to_vec(), entry.file_type()));
                }
            }
            for (n, t) in entries {
                let n = OsStr::from_bytes(&n);
                let child = path.join(n);
                match t {
                    Some(Type::Directory) => remove_tree_at(fd, n, &child)?,
                    // Unknown types (some file systems) are tried as a file
                    // first; a folder then answers EISDIR.
                    _ => match unlinkat(Some(fd), n, UnlinkatFlags::NoRemoveDir) {
                        Ok(()) | Err(Errno::ENOENT) => {}
                        Err(Errno::EISDIR) => remove_tree_at(fd, n, &child)?,
                        Err(e) => return Err(io(&child, e)),
                    },
                }
            }
            match unlinkat(Some(parent), name, UnlinkatFlags::RemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => Ok(()),
                Err(e) => Err(io(path, e)),
            }
        }
        Err(Errno::ENOENT) => Ok(()),
        // A symlink or a file where the folder was: the name goes, its
        // target stays untouched.
        Err(Errno::ELOOP | Errno::ENOTDIR) => {
            match unlinkat(Some(parent), name, UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => Ok(()),
                Err(e) => Err(io(path, e)),
            }
        }
        Err(e) => Err(io(path, e)),
    }
}
