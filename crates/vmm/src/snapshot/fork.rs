//! A Full snapshot in constant time: guest RAM kept in a file mapped shared
//! (guest_memory::in_file, `--ram-dir`) becomes the snapshot's memory file as it is. At the
//! create, with the guest and its devices paused, every RAM region is mapped again
//! privately over the file (the guest goes on copy-on-write over it, its later writes
//! its own), then the file is linked into the memory file's directory: nothing is copied,
//! whatever the guest's size. Clones that load the snapshot map the same file privately
//! (memory.rs), so the pages nobody writes are held once, in the file.
//!
//! The pause does not grow with the guest: the shared mapping's pages are moved away
//! whole (mremap moves page tables, guest_memory/move_away.rs) rather than unmapped in
//! place, which tears down every page's entry (a quarter of a second at 4 GiB), and are
//! unmapped once the guest runs again ([`RamFile::release`]), on a thread started with the
//! file: the API thread that takes the snapshot may not start one (its seccomp filter).
//! What still grows is KVM's MMU notifier walking the range at the two calls (it must drop
//! its mappings of the shared pages): about 0.3 ms per GiB each on the nested test host.
//!
//! The file is given once. Later snapshots of the same guest write a file as today
//! (memory.rs): the guest's memory is the given file and its own private pages. So does a
//! snapshot whose memory file is on another filesystem than the RAM's (a link cannot
//! cross it), a guest with hotpluggable memory (which is not in the file), on huge pages
//! or over a page-fault handler (which have no such file).

use crate::guest_memory::{GuestMemoryMmap, GuestRegion, MovedAway};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Mutex;
use vm_memory::GuestMemoryBackend;

/// Guest RAM's own file, until a snapshot takes it.
pub struct RamFile {
    file: File,
    state: AtomicU8,
    /// The shared mapping's pages, moved out of the guest's range by a snapshot and
    /// unmapped once the guest runs again.
    moved: Mutex<Vec<MovedAway>>,
    /// The thread that unmaps them; None if it could not be started (then they are
    /// unmapped by the caller of [`RamFile::release`]).
    unmapper: Option<Sender<Vec<MovedAway>>>,
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
        RamFile { file, state: AtomicU8::new(SHARED), moved: Mutex::new(Vec::new()), unmapper: start_unmapper() }
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
            match region.remap_private() {
                Ok(moved) => done.push((region, moved)),
                Err(e) => {
                    self.undo(done);
                    return Err(e.into());
                }
            }
        }
        if let Err(e) = link(&self.file, path) {
            self.undo(done);
            return Err(e.into());
        }
        self.state.store(GIVEN, Ordering::Release);
        crate::sync::lock(&self.moved).extend(done.into_iter().filter_map(|(_, moved)| moved));
        Ok(())
    }

    /// Unmaps, on a thread of its own, what a snapshot moved out of the guest's range: to
    /// be called once the guest runs again, which the unmapping then overlaps.
    pub fn release(&self) {
        let moved = std::mem::take(&mut *crate::sync::lock(&self.moved));
        if moved.is_empty() {
            return;
        }
        // Unmapped here if the thread is gone (the send gives them back).
        if let Some(Err(e)) = self.unmapper.as_ref().map(|u| u.send(moved)) {
            drop(e.0);
        }
    }

    /// Maps `regions` shared again; if that fails for any, the guest's memory is partly
    /// private from now on and the file is never given.
    fn undo(&self, regions: Vec<(&GuestRegion, Option<MovedAway>)>) {
        for (region, moved) in regions {
            if let Err(e) = region.remap_shared(moved) {
                tracing::warn!("guest RAM stays private over its file ({e}): later snapshots copy it");
                self.state.store(GIVEN, Ordering::Release);
            }
        }
    }
}

/// The thread that unmaps what snapshots moved out of guest RAM, as they come; it ends
/// with the RAM file (the channel closes).
fn start_unmapper() -> Option<Sender<Vec<MovedAway>>> {
    let (send, moved) = channel::<Vec<MovedAway>>();
    let started = std::thread::Builder::new().name("ram-unmap".into()).spawn(move || {
        // It reaches no guest input: unconfined, only a weaker guard is lost.
        crate::seccomp::confine_or_log(crate::seccomp::ThreadKind::Helper);
        while let Ok(pages) = moved.recv() {
            drop(pages);
        }
    });
    match started {
        Ok(_) => Some(send),
        Err(e) => {
            tracing::warn!("no thread to unmap guest RAM's old pages after a snapshot ({e}): the resume does");
            None
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

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress};

    /// The file is given as the guest left it, the guest's later writes stay its own, and
    /// the old pages are held (moved away, not unmapped in the pause) until the release.
    #[test]
    fn a_given_file_keeps_the_snapshot_and_the_old_pages_wait_for_the_release() {
        let dir = std::env::temp_dir().join(format!("exitless-ramfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ranges = [(GuestAddress(0), 4 << 20), (GuestAddress(16 << 20), 4 << 20)];
        let (memory, file) = crate::guest_memory::in_file(&ranges, &dir).unwrap();
        let ram = RamFile::new(file);
        memory.write_slice(b"before", GuestAddress(4096)).unwrap();
        memory.write_slice(b"second", GuestAddress((16 << 20) + 8192)).unwrap();
        let path = dir.join("mem");
        ram.give(&memory, &path).unwrap();
        assert!(!ram.shared());
        assert_eq!(crate::sync::lock(&ram.moved).len(), 2, "each region's pages moved away, held until the release");
        memory.write_slice(b"after!", GuestAddress(4096)).unwrap();
        let mut back = [0u8; 6];
        memory.read_slice(&mut back, GuestAddress((16 << 20) + 8192)).unwrap();
        assert_eq!(&back, b"second", "the guest reads what it wrote before");
        ram.release();
        assert!(crate::sync::lock(&ram.moved).is_empty());
        let given = std::fs::read(&path).unwrap();
        assert_eq!(given.len(), 8 << 20);
        assert_eq!(&given[4096..4102], b"before", "a write after the snapshot reached the file");
        assert_eq!(&given[(4 << 20) + 8192..(4 << 20) + 8198], b"second");
        memory.read_slice(&mut back, GuestAddress(4096)).unwrap();
        assert_eq!(&back, b"after!");
        assert!(matches!(ram.give(&memory, &dir.join("again")), Err(NotTaken::Given)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A link that fails after the remap (a file is in the way) puts the old pages back:
    /// the guest's RAM is the file's again, shared, and can be given later.
    #[test]
    fn a_failed_link_leaves_ram_shared_over_its_file() {
        let dir = std::env::temp_dir().join(format!("exitless-ramfile-undo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (memory, file) = crate::guest_memory::in_file(&[(GuestAddress(0), 4 << 20)], &dir).unwrap();
        let ram = RamFile::new(file);
        memory.write_slice(b"before", GuestAddress(4096)).unwrap();
        let taken = dir.join("taken");
        std::fs::write(&taken, b"someone's").unwrap();
        assert!(matches!(ram.give(&memory, &taken), Err(NotTaken::Io(_))));
        assert!(ram.shared(), "a failed give left RAM private");
        assert!(crate::sync::lock(&ram.moved).is_empty(), "the moved pages were not put back");
        assert_eq!(std::fs::read(&taken).unwrap(), b"someone's");
        memory.write_slice(b"after!", GuestAddress(4096)).unwrap();
        let path = dir.join("mem");
        ram.give(&memory, &path).unwrap();
        assert_eq!(&std::fs::read(&path).unwrap()[4096..4102], b"after!", "RAM was not shared over the file again");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
