//! A Full snapshot in constant time: guest RAM kept in a file mapped shared
//! (guest_memory::in_file, `--ram-dir`) becomes the snapshot's memory file as it is. At the
//! create, with the guest and its devices paused, every RAM region is mapped again
//! privately over the file (the guest goes on copy-on-write over it, its later writes
//! its own), then the file is linked into the memory file's directory: nothing is copied,
//! whatever the guest's size. Clones that load the snapshot map the same file privately
//! (memory.rs), so the pages nobody writes are held once, in the file.
//!
//! The file is given once. Later snapshots of the same guest write a file as today
//! (memory.rs): the guest's memory is the given file and its own private pages. So does a
//! snapshot whose memory file is on another filesystem than the RAM's (a link cannot
//! cross it), a guest with hotpluggable memory (which is not in the file), on huge pages
//! or over a page-fault handler (which have no such file).

use crate::guest_memory::GuestMemoryMmap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use vm_memory::GuestMemoryBackend;

/// Guest RAM's own file, until a snapshot takes it.
pub struct RamFile {
    file: File,
    state: AtomicU8,
}

const SHARED: u8 = 0;
/// Linked as a snapshot's memory file, or left unusable by a failed attempt: the guest's
/// memory is no longer (all) in it.
const GIVEN: u8 = 1;

/// Why a snapshot could not take the RAM file: said once in the log, and the memory file
/// is written instead.
#[derive(Debug, thiserror::Error)]
pub enum NotTaken {
    #[error("the RAM file was given to an earlier snapshot")]
    Given,
    #[error("the guest has hotpluggable memory, which is not in the RAM file")]
    Hotplug,
    #[error("the memory file's directory is on another filesystem than --ram-dir")]
    OtherFilesystem,
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl RamFile {
    pub fn new(file: File) -> RamFile {
        RamFile { file, state: AtomicU8::new(SHARED) }
    }

    /// Whether guest RAM is still (all) in the file.
    pub fn shared(&self) -> bool {
        self.state.load(Ordering::Acquire) == SHARED
    }

    /// Makes the file the memory file at `path` (which must not exist: a staged name,
    /// snapshot/staged.rs), the guest's RAM going on privately over it. The guest and
    /// every device must be paused. On failure guest RAM is as it was, shared over the
    /// file, unless mapping it back failed too: then the file is never given.
    pub fn give(&self, memory: &GuestMemoryMmap, path: &Path) -> Result<(), NotTaken> {
        if !self.shared() {
            return Err(NotTaken::Given);
        }
        if memory.iter().any(|r| !r.is_ram()) {
            return Err(NotTaken::Hotplug);
        }
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if std::fs::metadata(dir)?.dev() != self.file.metadata()?.dev() {
            return Err(NotTaken::OtherFilesystem);
        }
        // Private first: once linked, the file must hold what it holds now for good.
        let mut done = Vec::new();
        for region in memory.iter() {
            if let Err(e) = region.remap_private() {
                self.undo(&done);
                return Err(e.into());
            }
            done.push(region);
        }
        if let Err(e) = link(&self.file, path) {
            self.undo(&done);
            return Err(e.into());
        }
        self.state.store(GIVEN, Ordering::Release);
        Ok(())
    }

    /// Maps `regions` shared again; if that fails for any, the guest's memory is partly
    /// private from now on and the file is never given.
    fn undo(&self, regions: &[&crate::guest_memory::GuestRegion]) {
        for region in regions {
            if let Err(e) = region.remap_shared() {
                tracing::warn!("guest RAM stays private over its file ({e}): later snapshots copy it");
                self.state.store(GIVEN, Ordering::Release);
            }
        }
    }
}

/// Links the unlinked file `file` at `path`: by its descriptor (AT_EMPTY_PATH, which
/// needs CAP_DAC_READ_SEARCH), else through /proc/self/fd (which a jail may not have).
fn link(file: &File, path: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let to = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let empty = c"";
    // SAFETY: a descriptor `file` owns and two NUL-terminated strings; no memory is kept.
    let by_fd =
        unsafe { libc::linkat(file.as_raw_fd(), empty.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::AT_EMPTY_PATH) };
    if by_fd == 0 {
        return Ok(());
    }
    let first = std::io::Error::last_os_error();
    let proc = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())).map_err(std::io::Error::other)?;
    // SAFETY: two NUL-terminated strings; no memory is kept.
    let by_proc =
        unsafe { libc::linkat(libc::AT_FDCWD, proc.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::AT_SYMLINK_FOLLOW) };
    match by_proc {
        0 => Ok(()),
        _ => Err(std::io::Error::other(format!(
            "cannot link the RAM file at {}: {first}; through /proc: {}",
            path.display(),
            std::io::Error::last_os_error()
        ))),
    }
}
