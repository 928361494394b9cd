//! Guest RAM kept in a file of its own (`--ram-dir`): an unlinked file (O_TMPFILE) in the
//! directory given, the RAM regions one after the other in it as a memory file lays them,
//! mapped shared. What the guest writes is the file's, so a Full snapshot on the same
//! filesystem can take the file as it is (a link, no copy) and the guest go on privately
//! over it ([`GuestRegion::remap_private`], crate::snapshot::fork).

use super::move_away::{move_away, MovedAway};
use super::{map, GuestMemoryMmap, GuestRegion, MemoryError};
use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryRegion};

/// Guest RAM of the regions `ranges` in a new unlinked file in `dir`, mapped shared;
/// the file is returned (to link it at a snapshot). Refused if `dir`'s filesystem has
/// less room than the RAM: a guest's touch beyond it would fault the vCPU.
pub fn in_file(ranges: &[(GuestAddress, usize)], dir: &Path) -> Result<(GuestMemoryMmap, File), MemoryError> {
    let total: usize = ranges.iter().map(|&(_, size)| size).sum();
    let failed = |reason: String| MemoryError::Map { start: 0, size: total, reason };
    let room = free_bytes(dir).map_err(|e| failed(format!("{}: {e}", dir.display())))?;
    if room < total as u64 {
        return Err(failed(format!("{} has {} MiB free, less than the guest's RAM", dir.display(), room >> 20)));
    }
    // 0666 less the umask, as a memory file the API creates: the file is named only if a
    // snapshot links it, and is then that snapshot's.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o666)
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|e| failed(format!("cannot make a file in {}: {e}", dir.display())))?;
    file.set_len(total as u64).map_err(|e| failed(e.to_string()))?;
    let (mut at, mut regions) = (0u64, Vec::with_capacity(ranges.len()));
    for &(start, size) in ranges {
        let offset = FileOffset::new(file.try_clone().map_err(|e| failed(e.to_string()))?, at);
        let region = map(start, size, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, Some(offset))?;
        regions.push(GuestRegion::ram(region));
        at += size as u64;
    }
    Ok((super::from_regions(regions)?, file))
}

fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: statvfs is plain data, for which all zeros is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs the call fills.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

impl GuestRegion {
    /// The region, a shared mapping of its file, mapped again privately over the same
    /// file and offset at the same address: the file keeps what it holds now, the
    /// region's later writes go to pages of its own. The memory slot over the range stays
    /// (same address); KVM's mappings of the old pages are dropped by its MMU notifier.
    /// The guest and every device must be paused: a write during the call could land in
    /// either. The old pages are moved away first (move_away.rs) and returned, to be
    /// dropped once the guest runs again: unmapping them here would cost time linear in
    /// them. None if the kernel could not move them (they were unmapped here).
    pub fn remap_private(&self) -> std::io::Result<Option<MovedAway>> {
        let (host, len) = (self.inner.as_ptr(), self.len() as usize);
        let moved = match move_away(host, len) {
            Ok(moved) => Some(moved),
            Err(e) => {
                tracing::debug!("guest RAM's pages cannot be moved away ({e}): unmapped in the pause");
                None
            }
        };
        // Over the mapping left in place, with no pages if they moved: cheap then. On a
        // failure the region is still the file's, shared (what it held is in the file).
        if let Err(e) = self.remap(libc::MAP_PRIVATE | libc::MAP_NORESERVE) {
            if let Some(moved) = moved {
                let _ = moved.put_back(host);
            }
            return Err(e);
        }
        self.remapped.store(true, Ordering::Release);
        Ok(moved)
    }

    /// Undoes [`GuestRegion::remap_private`] (a snapshot that could not take the file),
    /// while nothing has been written since: the pages it moved away back in place, else
    /// the file mapped shared again.
    pub fn remap_shared(&self, moved: Option<MovedAway>) -> std::io::Result<()> {
        let back = moved.map(|m| m.put_back(self.inner.as_ptr()));
        if !matches!(back, Some(Ok(()))) {
            self.remap(libc::MAP_SHARED)?;
        }
        self.remapped.store(false, Ordering::Release);
        Ok(())
    }

    fn remap(&self, flags: i32) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let file = self.inner.file_offset().filter(|_| self.inner.flags() & libc::MAP_SHARED != 0);
        let file = file.ok_or_else(|| std::io::Error::other("the region is not a shared file mapping"))?;
        let (host, len) = (self.inner.as_ptr(), self.len() as usize);
        let offset = libc::off_t::try_from(file.start()).map_err(std::io::Error::other)?;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: MAP_FIXED over exactly this region's own mapping (which the region unmaps
        // whole when dropped), with the same file, offset, length and protection: every
        // pointer into it stays valid and reads what it read.
        let at =
            unsafe { libc::mmap(host.cast(), len, prot, flags | libc::MAP_FIXED, file.file().as_raw_fd(), offset) };
        if at == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // Transparent huge pages where the host offers them, as for the first mapping
        // (machine/ram.rs); only advice.
        // SAFETY: the same range, just mapped.
        unsafe { libc::madvise(host.cast(), len, libc::MADV_HUGEPAGE) };
        Ok(())
    }
}
