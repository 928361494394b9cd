//! Paths walked one open directory at a time and never through a symlink. The jail's root
//! and everything in it belong to the jailed user, who may have put a link (or a FIFO) in
//! place of any name in it; a path string handed to chown, chmod or mknod would follow
//! such a link out of the jail as root. So every step here acts on a descriptor checked
//! first, or on a name relative to one, with the flags that keep the kernel from following.

use crate::error::JailError;
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

/// An open directory, and the path it was reached by (for messages only: nothing is looked
/// up through it again).
#[derive(Clone)]
pub struct Dir {
    fd: Rc<OwnedFd>,
    path: PathBuf,
}

fn cname(name: &OsStr) -> Result<CString, JailError> {
    CString::new(name.as_encoded_bytes())
        .map_err(|_| JailError::Step(format!("{}: a name with a NUL byte", name.to_string_lossy())))
}

/// A descriptor from a raw open's result (errno kept on failure).
fn owned(fd: libc::c_int) -> std::io::Result<OwnedFd> {
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just returned, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstat(fd: RawFd) -> std::io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into the struct we own.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

fn is(st: &libc::stat, kind: libc::mode_t) -> bool {
    st.st_mode & libc::S_IFMT == kind
}

/// The error for a name that is not a regular file (ErrorKind::InvalidInput).
fn not_regular() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file: refused")
}

/// `fd` (opened O_PATH, so no FIFO or device was opened) checked to be a regular file,
/// then opened for real with `flags` through /proc/self/fd: the same inode, not whatever
/// has the name by now.
fn reopen_regular(fd: OwnedFd, flags: libc::c_int) -> std::io::Result<File> {
    if !is(&fstat(fd.as_raw_fd())?, libc::S_IFREG) {
        return Err(not_regular());
    }
    let proc = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL in a number");
    // SAFETY: open with a NUL-terminated path we own.
    Ok(File::from(owned(unsafe { libc::open(proc.as_ptr(), flags | libc::O_CLOEXEC) })?))
}

/// The regular file at `path`, open with `flags`; its last component is followed only if
/// `follow` (the caller trusts the path up to it). A FIFO or device there is refused
/// (ErrorKind::InvalidInput) without being opened.
pub fn open_regular_path(path: &Path, follow: bool, flags: libc::c_int) -> std::io::Result<File> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
    let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
    // SAFETY: open with a NUL-terminated path we own.
    let fd = owned(unsafe { libc::open(c.as_ptr(), libc::O_PATH | nofollow | libc::O_CLOEXEC) })?;
    reopen_regular(fd, flags)
}

/// A kernel file (/proc, a cgroup's) read whole, up to `cap` bytes: its size is not known
/// before reading (stat says 0), so the cap bounds what is kept.
pub fn read_kernel_file(path: &Path, cap: u64) -> std::io::Result<String> {
    // O_NONBLOCK: a FIFO in its place would not keep the open waiting.
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    if !is(&fstat(file.as_raw_fd())?, libc::S_IFREG) {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut text = String::new();
    file.take(cap + 1).read_to_string(&mut text)?;
    if text.len() as u64 > cap {
        return Err(std::io::Error::other(format!("longer than {cap} bytes")));
    }
    Ok(text)
}

impl Dir {
    /// The absolute `path`, each of its directories opened without following a symlink.
    pub fn walk(path: &Path) -> Result<Dir, JailError> {
        // SAFETY: open with a NUL-terminated literal.
        let fd = owned(unsafe { libc::open(c"/".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) })
            .map_err(|e| JailError::io("Failed to open /", e))?;
        let mut dir = Dir { fd: Rc::new(fd), path: PathBuf::from("/") };
        for c in path.components() {
            match c {
                Component::RootDir => {}
                Component::Normal(name) => dir = dir.open_dir(name)?,
                _ => return Err(JailError::Step(format!("{}: not a plain absolute path", path.display()))),
            }
        }
        Ok(dir)
    }

    pub fn path_of(&self, name: impl AsRef<OsStr>) -> PathBuf {
        self.path.join(name.as_ref())
    }

    fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Why `name` could not be opened as a directory: a link or a non-directory is refused
    /// by name, anything else is the OS error.
    fn refusal(&self, name: &CStr, shown: &Path, e: std::io::Error) -> JailError {
        // SAFETY: an all-zero stat is a valid value of this plain C struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstatat on our directory and a NUL-terminated name, into a struct we own.
        let found = unsafe { libc::fstatat(self.raw(), name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } == 0;
        match () {
            _ if found && is(&st, libc::S_IFLNK) => {
                JailError::Step(format!("{} is a symlink: refused (the jailer follows no link)", shown.display()))
            }
            _ if found && !is(&st, libc::S_IFDIR) => {
                JailError::Step(format!("{} is not a directory: refused", shown.display()))
            }
            _ => JailError::io(format!("Failed to open {}", shown.display()), e),
        }
    }

    /// The directory `name` in this one; a symlink or anything else not a directory is
    /// refused. (A mount on it is crossed, as any lookup does.)
    pub fn open_dir(&self, name: impl AsRef<OsStr>) -> Result<Dir, JailError> {
        let (name, shown) = (cname(name.as_ref())?, self.path_of(name));
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: openat on our directory and a NUL-terminated name.
        match owned(unsafe { libc::openat(self.raw(), name.as_ptr(), flags) }) {
            Ok(fd) => Ok(Dir { fd: Rc::new(fd), path: shown }),
            Err(e) => Err(self.refusal(&name, &shown, e)),
        }
    }

    /// The directory `name` in this one, made with `mode` (less the umask) if missing;
    /// one made is recorded in `undo`.
    pub fn make_dir(
        &self,
        name: impl AsRef<OsStr>,
        mode: libc::mode_t,
        undo: &mut crate::undo::Undo,
    ) -> Result<Dir, JailError> {
        let c = cname(name.as_ref())?;
        // SAFETY: mkdirat on our directory and a NUL-terminated name.
        if unsafe { libc::mkdirat(self.raw(), c.as_ptr(), mode) } == 0 {
            undo.made(self, c, true);
        } else {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(JailError::io(format!("Failed to create directory {}", self.path_of(name).display()), e));
            }
        }
        self.open_dir(name)
    }

    /// This directory's mode and owner, set on the descriptor (never on a path).
    pub fn set_mode_owner(&self, mode: libc::mode_t, uid: u32, gid: u32) -> Result<(), JailError> {
        // SAFETY: fchmod on a descriptor we own.
        if unsafe { libc::fchmod(self.raw(), mode) } != 0 {
            return Err(JailError::os(format!("Failed to change permissions on {}", self.path.display())));
        }
        // SAFETY: fchown on a descriptor we own.
        if unsafe { libc::fchown(self.raw(), uid, gid) } != 0 {
            return Err(JailError::os(format!("Failed to change owner for {}", self.path.display())));
        }
        Ok(())
    }

    /// A character device node `name` (0600 less the umask); an existing name, a link
    /// included, is an error (EEXIST), never followed.
    pub fn mknod(&self, name: &CStr, major: u32, minor: u32) -> std::io::Result<()> {
        let dev = libc::makedev(major, minor);
        // SAFETY: mknodat on our directory and a NUL-terminated name.
        if unsafe { libc::mknodat(self.raw(), name.as_ptr(), libc::S_IFCHR | 0o600, dev) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// The node `name` just made given to `uid`:`gid`, once checked to be still that device
    /// with one link (the directory is the jailed user's: it could have put a link, or a
    /// hard link to a host file, in its place).
    pub fn own_node(&self, name: &CStr, major: u32, minor: u32, uid: u32, gid: u32) -> Result<(), JailError> {
        let shown = self.path_of(OsStr::from_bytes(name.to_bytes()));
        let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: openat on our directory and a NUL-terminated name.
        let fd = owned(unsafe { libc::openat(self.raw(), name.as_ptr(), flags) })
            .map_err(|e| JailError::io(format!("Failed to open {}", shown.display()), e))?;
        let st = fstat(fd.as_raw_fd())
            .map_err(|e| JailError::io(format!("Cannot get metadata for {}", shown.display()), e))?;
        if !is(&st, libc::S_IFCHR) || st.st_rdev != libc::makedev(major, minor) || st.st_nlink != 1 {
            return Err(JailError::Step(format!("{} was replaced after it was made: refused", shown.display())));
        }
        // SAFETY: fchownat on a descriptor we own with an empty name (AT_EMPTY_PATH: the
        // descriptor's own file).
        if unsafe { libc::fchownat(fd.as_raw_fd(), c"".as_ptr(), uid, gid, libc::AT_EMPTY_PATH) } != 0 {
            return Err(JailError::os(format!("Failed to change owner for {}", shown.display())));
        }
        Ok(())
    }

    /// A new file `name` (O_EXCL: an existing name, a link included, is EEXIST), open with
    /// `flags`, made with `mode` less the umask.
    pub fn create_file(&self, name: &CStr, flags: libc::c_int, mode: libc::mode_t) -> std::io::Result<File> {
        let flags = flags | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: openat on our directory and a NUL-terminated name; mode is passed as the
        // variadic argument open(2) takes with O_CREAT.
        let fd = owned(unsafe { libc::openat(self.raw(), name.as_ptr(), flags, libc::c_uint::from(mode)) })?;
        Ok(File::from(fd))
    }

    /// The existing regular file `name`, open with `flags`; a link, a FIFO, a device or a
    /// directory is refused (ErrorKind::InvalidInput) without being opened.
    pub fn open_regular(&self, name: &CStr, flags: libc::c_int) -> std::io::Result<File> {
        let opath = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: openat on our directory and a NUL-terminated name.
        let fd = owned(unsafe { libc::openat(self.raw(), name.as_ptr(), opath) })?;
        reopen_regular(fd, flags)
    }

    /// Removes `name` from this directory (a directory if `dir`).
    pub fn remove(&self, name: &CStr, dir: bool) -> std::io::Result<()> {
        let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
        // SAFETY: unlinkat on our directory and a NUL-terminated name.
        if unsafe { libc::unlinkat(self.raw(), name.as_ptr(), flags) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// This directory's descriptor, for fchdir and a bind mount through /proc/self/fd.
    pub fn fd(&self) -> RawFd {
        self.raw()
    }
}
