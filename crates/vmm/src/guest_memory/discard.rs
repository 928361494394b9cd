//! Giving guest pages back to the host: the one routine the balloon (inflate, free page
//! reporting and hinting) and virtio-mem (unplug) both use. A discarded page leaves the
//! VMM's resident memory at once and reads zeros on the next touch, whatever the memory
//! is made of:
//! - anonymous memory: MADV_DONTNEED. Under a userfaultfd (the Uffd snapshot backend) the
//!   handler hears of it as a REMOVE event and lets the kernel fill the range with zeros
//!   from then on (snapshot/uffd_handler.rs);
//! - a snapshot's file mapped privately: MADV_DONTNEED would bring the file's page back
//!   (the snapshot's bytes, not zeros), so a fresh anonymous mapping goes over the range,
//!   as Firecracker does;
//! - RAM shared with a vhost-user backend (a memfd mapped shared): MADV_REMOVE frees the
//!   file's page, so the backend's mapping reads zeros too;
//! - guest RAM kept in a file mapped shared (`--ram-dir`): MADV_REMOVE punches the
//!   pages out of the file (MADV_DONTNEED would keep them there, resident);
//! - unplugged hotpluggable memory: a fresh mapping too, read-only or PROT_NONE, and
//!   where a vhost-user backend maps the region, its memfd's pages punched out (plugs.rs).

use super::GuestMemoryMmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

/// Why a range was not discarded.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DiscardError {
    #[error("{0:#x}+{1:#x} is not inside the guest's memory")]
    OutsideRam(u64, u64),
    #[error("cannot discard {0:#x}+{1:#x}: errno {2}")]
    Failed(u64, u64, i32),
}

/// How a range's pages are dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fresh {
    /// MADV_DONTNEED.
    Advise,
    /// MADV_REMOVE: a shared file's pages punched out of the file.
    Remove,
    /// A new anonymous mapping over the range, of this protection.
    Replace(Prot),
}

/// A mapping's protection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub(super) enum Prot {
    None = libc::PROT_NONE,
    /// Reads see the zero page: nothing becomes resident.
    Read = libc::PROT_READ,
    ReadWrite = libc::PROT_READ | libc::PROT_WRITE,
}

/// Drops the pages of `host..host + len` as `how` says.
///
/// # Safety
/// The range must be page-aligned and lie inside one of guest memory's mappings, and hold
/// nothing the VMM relies on (the guest gave it up).
pub(super) unsafe fn drop_pages(host: *mut u8, len: usize, how: Fresh) -> std::io::Result<()> {
    let ok = match how {
        // SAFETY: the caller's range; MADV_DONTNEED drops its contents, the mapping stays.
        Fresh::Advise => unsafe { libc::madvise(host.cast(), len, libc::MADV_DONTNEED) == 0 },
        // SAFETY: as above; the pages leave the file the range maps (shared, the guest's own).
        Fresh::Remove => unsafe { libc::madvise(host.cast(), len, libc::MADV_REMOVE) == 0 },
        Fresh::Replace(prot) => {
            let flags = libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
            // SAFETY: MAP_FIXED over the caller's range of a mapping guest memory owns (and
            // will unmap whole, this part included); nothing else lives there.
            unsafe { libc::mmap(host.cast(), len, prot as i32, flags, -1, 0) != libc::MAP_FAILED }
        }
    };
    match ok {
        true => Ok(()),
        false => Err(std::io::Error::last_os_error()),
    }
}

/// Discards `[addr, addr + len)` of guest memory, which must lie wholly inside it (across
/// regions if need be) and be the guest's (never an unplugged block); nothing is
/// discarded if any of it is not. `addr` and `len` must be whole pages.
pub fn discard(mem: &GuestMemoryMmap, addr: u64, len: u64) -> Result<(), DiscardError> {
    let outside = || DiscardError::OutsideRam(addr, len);
    let end = addr.checked_add(len).ok_or_else(outside)?;
    let whole = addr.is_multiple_of(4096) && len.is_multiple_of(4096);
    if len == 0 || !whole || !mem.check_range(GuestAddress(addr), len as usize) {
        return Err(outside());
    }
    for region in mem.iter() {
        let (start, stop) = (region.start_addr().0, region.start_addr().0 + region.len());
        let (from, to) = (addr.max(start), end.min(stop));
        if from >= to {
            continue;
        }
        // The slice pins hotpluggable memory: no unplug protects it under the discard.
        let slice = region.get_slice(MemoryRegionAddress(from - start), (to - from) as usize).map_err(|_| outside())?;
        let how = match (region.private_file(), region.shared_file()) {
            (true, _) => Fresh::Replace(Prot::ReadWrite),
            (false, true) => Fresh::Remove,
            (false, false) => Fresh::Advise,
        };
        // SAFETY: the slice is this region's mapping for exactly `to - from` bytes, whole
        // pages, owned by `mem`; the guest gave the pages up.
        let dropped = unsafe { drop_pages(slice.ptr_guard_mut().as_ptr(), (to - from) as usize, how) };
        if let Err(e) = dropped {
            let errno = e.raw_os_error().unwrap_or(0);
            if matches!(how, Fresh::Replace(_)) {
                // Out of mappings (vm.max_map_count): zeros by hand, so that the page never
                // reads back the snapshot's bytes, though it stays resident.
                let zeros = [0u8; 4096];
                for at in (0..slice.len()).step_by(zeros.len()) {
                    slice.write_slice(&zeros, at).map_err(|_| DiscardError::Failed(from, to - from, errno))?;
                }
            }
            return Err(DiscardError::Failed(from, to - from, errno));
        }
    }
    Ok(())
}
