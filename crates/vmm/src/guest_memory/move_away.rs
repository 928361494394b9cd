//! A mapping's pages moved out of the way in constant time. Unmapping a range (munmap, or
//! a MAP_FIXED mapping over it) tears down every page's entry: linear in the pages, a
//! quarter of a second for 3 GiB written in 4 KiB pages, which a snapshot's pause must not
//! pay ([`GuestRegion::remap_private`](super::GuestRegion::remap_private)). mremap moves the
//! page tables instead, a whole table (2 MiB of pages) per entry where both ends sit at
//! the same offset within 2 MiB; the pages are unmapped later, off the pause, when the
//! [`MovedAway`] is dropped.

use std::io;

/// What the kernel moves whole: a page table's reach.
const TABLE: usize = 2 << 20;

/// Pages moved out of guest memory's range into a mapping of their own that nothing else
/// refers to; unmapped when dropped (which takes time linear in them).
#[derive(Debug)]
pub struct MovedAway {
    at: usize,
    len: usize,
}

/// Moves the pages of the mapping at `host` (`len` bytes, one mapping) to a new address.
/// The mapping at `host` stays, with no pages (MREMAP_DONTUNMAP: the range is never free,
/// so no other thread's mmap can land in it): an access there faults them in again as the
/// mapping says. Refused by kernels before 5.13 for a file mapping.
pub fn move_away(host: *mut u8, len: usize) -> io::Result<MovedAway> {
    let reserve = len.checked_add(TABLE).ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    // SAFETY: a new mapping where the kernel chooses: nothing existing is touched.
    let r = unsafe { libc::mmap(std::ptr::null_mut(), reserve, libc::PROT_NONE, flags, -1, 0) };
    if r == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let r = r as usize;
    // The same offset within a table as `host`, inside the reservation.
    let to = r + ((host as usize).wrapping_sub(r) & (TABLE - 1));
    // SAFETY: the parts of the reservation just made outside [to, to + len): ours, unused.
    unsafe {
        if to > r {
            libc::munmap(r as *mut libc::c_void, to - r);
        }
        if r + reserve > to + len {
            libc::munmap((to + len) as *mut libc::c_void, r + reserve - (to + len));
        }
    }
    let flags = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP;
    // SAFETY: moves the pages of the caller's mapping at `host` over our reservation at
    // `to`; the mapping at `host` stays (DONTUNMAP), so every pointer into it stays valid.
    let moved = unsafe { libc::mremap(host.cast(), len, len, flags, to as *mut libc::c_void) };
    if moved == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        // SAFETY: the rest of our reservation.
        unsafe { libc::munmap(to as *mut libc::c_void, len) };
        return Err(e);
    }
    Ok(MovedAway { at: to, len })
}

impl MovedAway {
    /// Moves the pages back over the mapping at `host` (which must be the one they came
    /// from, with nothing written since): as they were, in constant time.
    pub fn put_back(self, host: *mut u8) -> io::Result<()> {
        let flags = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED;
        // SAFETY: our mapping moved over the caller's at `host`, the same length, which it
        // replaces (unmapping a range with no pages written: the moved-away ones were its).
        let at = unsafe {
            libc::mremap(self.at as *mut libc::c_void, self.len, self.len, flags, host.cast::<libc::c_void>())
        };
        if at == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        std::mem::forget(self);
        Ok(())
    }
}

/// How much is unmapped at a time: an munmap holds the process's mmap lock while it tears
/// pages down, and a thread that maps memory meanwhile (an allocation) waits, and the vCPUs'
/// page faults queue behind it; in pieces, each wait is a few milliseconds.
const PIECE: usize = 64 << 20;

impl Drop for MovedAway {
    fn drop(&mut self) {
        let mut done = 0;
        while done < self.len {
            let piece = PIECE.min(self.len - done);
            // SAFETY: a part of our own mapping, which nothing refers to.
            unsafe { libc::munmap((self.at + done) as *mut libc::c_void, piece) };
            done += piece;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_moved_away_leave_the_mapping_in_place_and_come_back_whole() {
        // More than a piece, to be unmapped in two.
        let len = PIECE + (8 << 20);
        let dir = std::env::temp_dir();
        let file = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_TMPFILE).open(&dir).unwrap();
        file.set_len(len as u64).unwrap();
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a new shared mapping of our file.
        let host = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        assert_ne!(host, libc::MAP_FAILED);
        let host = host.cast::<u8>();
        // SAFETY: within our mapping.
        let byte = |at: usize| unsafe { host.add(at).read_volatile() };
        // SAFETY: within our mapping.
        let set = |at: usize, v: u8| unsafe { host.add(at).write_volatile(v) };
        for at in (0..len).step_by(1 << 20).chain([4096, len - 4096]) {
            set(at, 7);
        }
        let moved = move_away(host, len).unwrap();
        assert_eq!(moved.at & (TABLE - 1), host as usize & (TABLE - 1), "same offset within a table");
        // The mapping left in place is the file's, shared: its pages fault in again.
        assert_eq!(byte(4096), 7);
        set(8192, 9);
        // SAFETY: the moved pages' mapping, ours.
        assert_eq!(unsafe { (moved.at as *const u8).add(8192).read_volatile() }, 9, "the same file pages");
        moved.put_back(host).unwrap();
        assert_eq!((byte(0), byte(8192), byte(len - 4096)), (7, 9, 7));
        // Unmapped in two pieces (whether they are gone is not checked here: another test's
        // thread may map the freed range at once).
        drop(move_away(host, len).unwrap());
        assert_eq!(byte(len - 4096), 7, "the moved pages unmapped, the file's are there");
        // SAFETY: our mapping, no longer used.
        unsafe { libc::munmap(host.cast(), len) };
    }
}
