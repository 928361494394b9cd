//! Guest RAM to a file and back. A full snapshot writes every RAM region in order, one
//! after the other, then the hotpluggable region's plugged blocks at their place in it,
//! leaving holes for pages that are all zeros (never written by the guest: the file stays
//! as sparse as the guest's use of memory) and for unplugged blocks. A restore maps the
//! file privately: pages come in on first touch and the guest's writes never reach it.

use super::SnapshotError;
use crate::guest_memory::{self, GuestMemoryMmap, GuestRegion};
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

const PAGE: usize = 4096;

/// The RAM regions, in order.
fn ram(memory: &GuestMemoryMmap) -> impl Iterator<Item = &GuestRegion> {
    memory.iter().filter(|r| r.is_ram())
}

/// The memory file's length: every region one after the other, in address order (RAM,
/// then the hotpluggable region whole, as Firecracker v1.16.1's file covers it).
pub fn file_len(memory: &GuestMemoryMmap) -> u64 {
    memory.iter().map(|r| r.len()).sum()
}

/// The bytes of `region` the file holds (region offsets): RAM whole; of hotpluggable
/// memory the plugged blocks only (the rest are holes, and never read: unplugged blocks
/// are PROT_NONE or not the guest's).
fn saved(region: &GuestRegion) -> Vec<std::ops::Range<u64>> {
    match region.plugs() {
        None => std::iter::once(0..region.len()).collect(),
        Some(plugs) => plugs.plugged_runs(),
    }
}

/// The host bytes of `run` of `region`.
fn bytes_of<'a>(region: &'a GuestRegion, run: &std::ops::Range<u64>) -> std::io::Result<&'a [u8]> {
    let len = (run.end - run.start) as usize;
    let slice = region
        .get_slice(vm_memory::MemoryRegionAddress(run.start), len)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    // SAFETY: RAM or plugged blocks (readable), mapped for as long as `region` lives; the
    // guest and the devices (virtio-mem's thread too) are paused: nothing writes them,
    // plugs or unplugs them while they are copied.
    Ok(unsafe { std::slice::from_raw_parts(slice.ptr_guard().as_ptr(), slice.len()) })
}

/// Writes every region of `memory` to `file` (truncated first; [`file_len`] long).
/// Returns the bytes actually written (all but the zero pages and unplugged blocks).
pub fn write_full(memory: &GuestMemoryMmap, file: &mut File) -> std::io::Result<u64> {
    file.set_len(0)?;
    file.set_len(file_len(memory))?;
    let (mut at, mut written) = (0u64, 0u64);
    for region in memory.iter() {
        for run in saved(region) {
            for (i, page) in bytes_of(region, &run)?.chunks(PAGE).enumerate() {
                if page.iter().all(|&b| b == 0) {
                    continue;
                }
                file.write_all_at(page, at + run.start + (i * PAGE) as u64)?;
                written += page.len() as u64;
            }
        }
        at += region.len();
    }
    file.seek(SeekFrom::End(0))?;
    file.flush()?;
    Ok(written)
}

/// Which pages a Diff holds.
#[derive(Clone, Copy, Debug)]
pub enum DiffPages<'a> {
    /// Those KVM logged as written in each region's memslot (in the memory's order).
    Logged(&'a [u32]),
    /// Without dirty tracking, every page resident in the VMM (mincore), as Firecracker
    /// falls back to: more than the guest wrote since the base (pages it only read), but
    /// nothing it wrote, unless the host swapped that page out.
    Resident,
}

/// Writes the pages `which` names at their offsets in `file`, which gets [`file_len`]
/// (a logged region's log is cleared by reading it), and every page of the plugged
/// blocks (KVM logs none of hotpluggable memory). Returns the bytes written.
pub fn write_dirty(
    vm: &kvm_ioctls::VmFd,
    memory: &GuestMemoryMmap,
    which: DiffPages,
    file: &mut File,
) -> std::io::Result<u64> {
    file.set_len(0)?;
    file.set_len(file_len(memory))?;
    let (mut at, mut written) = (0u64, 0u64);
    for (index, region) in ram(memory).enumerate() {
        let bytes = bytes_of(region, &(0..region.len()))?;
        let bitmap = match which {
            DiffPages::Logged(slots) => {
                let slot =
                    *slots.get(index).ok_or_else(|| std::io::Error::other("a RAM region without its memslot"))?;
                vm.get_dirty_log(slot, bytes.len())
                    .map_err(|e| std::io::Error::other(format!("KVM_GET_DIRTY_LOG: {e}")))?
            }
            DiffPages::Resident => resident(bytes)?,
        };
        for (word_index, &word) in bitmap.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let page = word_index * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let Some(data) = bytes.get(page * PAGE..(page + 1) * PAGE) else { continue };
                // Zeros too: a page written back to zeros must cover the older one.
                file.write_all_at(data, at + (page * PAGE) as u64)?;
                written += PAGE as u64;
            }
        }
        at += region.len();
    }
    // Hotpluggable memory lies above RAM: its plugged blocks whole, zeros too (a block
    // written back to zeros must cover the older one).
    for region in memory.iter().filter(|r| !r.is_ram()) {
        for run in saved(region) {
            file.write_all_at(bytes_of(region, &run)?, at + run.start)?;
            written += run.end - run.start;
        }
        at += region.len();
    }
    file.flush()?;
    Ok(written)
}

/// A bitmap (as KVM's dirty log: bit i of word i / 64) of the pages of `bytes` resident
/// in this process.
fn resident(bytes: &[u8]) -> std::io::Result<Vec<u64>> {
    let pages = bytes.len().div_ceil(PAGE);
    let mut vec = vec![0u8; pages];
    // SAFETY: `bytes` is a page-aligned mapping (a guest RAM region) of `bytes.len()`
    // bytes; mincore only reads its page tables and writes one byte per page into `vec`,
    // which has room for every page.
    if unsafe { libc::mincore(bytes.as_ptr() as *mut libc::c_void, bytes.len(), vec.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::other(format!("mincore: {}", std::io::Error::last_os_error())));
    }
    let mut bitmap = vec![0u64; pages.div_ceil(64)];
    for (page, _) in vec.iter().enumerate().filter(|(_, &b)| b & 1 != 0) {
        bitmap[page / 64] |= 1 << (page % 64);
    }
    Ok(bitmap)
}

/// Reads (and so clears) the dirty log: the next Diff holds what is written from now.
pub fn clear_dirty_log(vm: &kvm_ioctls::VmFd, memory: &GuestMemoryMmap, slots: &[u32]) -> std::io::Result<()> {
    for (region, &slot) in ram(memory).zip(slots) {
        vm.get_dirty_log(slot, region.len() as usize)
            .map_err(|e| std::io::Error::other(format!("KVM_GET_DIRTY_LOG: {e}")))?;
    }
    Ok(())
}

/// Lays the data of `diff` (a Diff snapshot's memory file: data where pages were written,
/// holes elsewhere) over `base`, as Firecracker's rebase-snap does. Returns the bytes laid.
pub fn rebase(base: &File, diff: &File) -> std::io::Result<u64> {
    use std::os::fd::AsRawFd;
    let (base_len, diff_len) = (base.metadata()?.len(), diff.metadata()?.len());
    if base_len != diff_len {
        return Err(std::io::Error::other(format!("the base holds {base_len} bytes and the diff {diff_len}")));
    }
    let mut buf = vec![0u8; 1 << 20];
    let (mut at, mut laid) = (0i64, 0u64);
    loop {
        // SAFETY: lseek on a file this function borrows; the result is checked.
        let data = unsafe { libc::lseek(diff.as_raw_fd(), at, libc::SEEK_DATA) };
        if data < 0 {
            break; // ENXIO: no data past `at`
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(diff.as_raw_fd(), data, libc::SEEK_HOLE) };
        let end = if hole < 0 { diff_len as i64 } else { hole };
        let mut pos = data as u64;
        while pos < end as u64 {
            let n = buf.len().min((end as u64 - pos) as usize);
            diff.read_exact_at(&mut buf[..n], pos)?;
            base.write_all_at(&buf[..n], pos)?;
            (pos, laid) = (pos + n as u64, laid + n as u64);
        }
        at = end;
    }
    Ok(laid)
}

/// The file (its descriptor, as mapped) is a regular file whose length equals the RAM it
/// is to back and the hotpluggable memory after it (`hotplug` bytes): a device's or a
/// FIFO's length of 0 says nothing of what mapping it gives.
pub fn check_length(file: &File, ram: u64, hotplug: u64) -> Result<(), String> {
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.file_type().is_file() {
        return Err(format!("the memory file is {}, not a regular file", crate::files::kind(&meta)));
    }
    let len = meta.len();
    if len != ram + hotplug {
        let also = match hotplug {
            0 => String::new(),
            n => format!(" and {n} bytes of hotpluggable memory"),
        };
        return Err(format!("the memory file holds {len} bytes; the microVM has {ram} bytes of RAM{also}"));
    }
    Ok(())
}

/// Guest RAM backed by `file` (the regions one after the other), mapped privately: pages
/// come in on first touch, and what the guest writes stays in this process.
pub fn map_private(file: &File, regions: &[(GuestAddress, usize)]) -> Result<GuestMemoryMmap, SnapshotError> {
    let fail = |e: String| SnapshotError::Refused(format!("cannot map the memory file: {e}"));
    let mut at = 0u64;
    let mut mapped = Vec::with_capacity(regions.len());
    for &(start, size) in regions {
        let offset = FileOffset::new(file.try_clone().map_err(|e| fail(e.to_string()))?, at);
        let (prot, flags) = (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_NORESERVE);
        let region = guest_memory::map(start, size, prot, flags, Some(offset)).map_err(|e| fail(e.to_string()))?;
        mapped.push(GuestRegion::ram(region));
        at += size as u64;
    }
    guest_memory::from_regions(mapped).map_err(|e| fail(e.to_string()))
}

/// Copies the RAM regions' bytes from `file` (laid out as [`map_private`] maps it) into
/// `memory`, already mapped: only the file's data, so the pages of its holes (never
/// written by the guest) stay untouched until the guest touches them.
pub fn copy_into(file: &File, memory: &GuestMemoryMmap) -> Result<(), SnapshotError> {
    let fail = |e: String| SnapshotError::Refused(format!("cannot copy the memory file into guest memory: {e}"));
    let mut at = 0u64;
    for region in ram(memory) {
        let all = bytes_of(region, &(0..region.len())).map_err(|e| fail(e.to_string()))?;
        // SAFETY: the region's whole mapping, readable and writable, owned by `memory` and
        // not yet seen by any vCPU or device (the machine is being built): nothing else
        // reads or writes it while the file is read into it.
        let dst = unsafe { std::slice::from_raw_parts_mut(all.as_ptr() as *mut u8, all.len()) };
        for run in data_runs(file, at, at + region.len()).map_err(|e| fail(e.to_string()))? {
            let (from, to) = ((run.start - at) as usize, (run.end - at) as usize);
            file.read_exact_at(&mut dst[from..to], run.start)
                .map_err(|e| fail(format!("at offset {}: {e}", run.start)))?;
        }
        at += region.len();
    }
    Ok(())
}

/// Copies the hotpluggable region's bytes from `file` (after RAM, as [`write_full`] lays
/// them) into the memfd the region maps shared (guest_memory::with_shared_hotplug), file
/// to file: the mapping is PROT_NONE until virtio-mem's restore opens the plugged blocks,
/// and punches the rest out of the memfd again.
pub fn copy_hotplug_into(file: &File, memory: &GuestMemoryMmap) -> Result<(), SnapshotError> {
    let fail = |e: String| SnapshotError::Refused(format!("cannot copy the memory file into hotpluggable memory: {e}"));
    let at: u64 = ram(memory).map(|r| r.len()).sum();
    let Some(region) = memory.iter().find(|r| !r.is_ram()) else { return Ok(()) };
    let target = region.file_offset().ok_or_else(|| fail("the region is not a file mapping".into()))?;
    let mut buf = vec![0u8; 1 << 20];
    for run in data_runs(file, at, at + region.len()).map_err(|e| fail(e.to_string()))? {
        let mut pos = run.start;
        while pos < run.end {
            let n = buf.len().min((run.end - pos) as usize);
            file.read_exact_at(&mut buf[..n], pos).map_err(|e| fail(format!("at offset {pos}: {e}")))?;
            target.file().write_all_at(&buf[..n], target.start() + (pos - at)).map_err(|e| fail(e.to_string()))?;
            pos += n as u64;
        }
    }
    Ok(())
}

/// The runs of `start..end` of `file` that hold data (SEEK_DATA, SEEK_HOLE): all of it
/// where the file system cannot tell.
fn data_runs(file: &File, start: u64, end: u64) -> std::io::Result<Vec<std::ops::Range<u64>>> {
    use std::os::fd::AsRawFd;
    let mut runs = Vec::new();
    let mut at = start;
    while at < end {
        // SAFETY: lseek on a file this function borrows; the result is checked.
        let data = unsafe { libc::lseek(file.as_raw_fd(), at as i64, libc::SEEK_DATA) };
        if data < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::ENXIO) => break, // no data past `at`
                _ => return Ok(std::iter::once(start..end).collect()),
            }
        }
        let data = data as u64;
        if data >= end {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(file.as_raw_fd(), data as i64, libc::SEEK_HOLE) };
        let stop = if hole < 0 { end } else { (hole as u64).min(end) };
        runs.push(data..stop);
        at = stop;
    }
    Ok(runs)
}
