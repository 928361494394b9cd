//! Guest RAM to a file and back. A full snapshot writes every RAM region in order, one
//! after the other, leaving holes for pages that are all zeros (never written by the
//! guest: the file stays as sparse as the guest's use of memory). A restore maps the file
//! privately: pages come in on first touch and the guest's writes never reach the file.

use super::SnapshotError;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap};

const PAGE: usize = 4096;

/// Writes every region of `memory` to `file` (truncated first); its length is the sum of
/// the regions' sizes. Returns the bytes actually written (all but the zero pages).
pub fn write_full(memory: &GuestMemoryMmap, file: &mut File) -> std::io::Result<u64> {
    file.set_len(0)?;
    let total: u64 = memory.iter().map(|r| r.len()).sum();
    file.set_len(total)?;
    let (mut at, mut written) = (0u64, 0u64);
    for region in memory.iter() {
        let slice = region
            .get_slice(vm_memory::MemoryRegionAddress(0), region.len() as usize)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        // SAFETY: the region is mapped for as long as `memory` lives, and the guest is
        // paused: nothing writes it while it is copied.
        let bytes = unsafe { std::slice::from_raw_parts(slice.ptr_guard().as_ptr(), slice.len()) };
        for (i, page) in bytes.chunks(PAGE).enumerate() {
            if page.iter().all(|&b| b == 0) {
                continue;
            }
            file.write_all_at(page, at + (i * PAGE) as u64)?;
            written += page.len() as u64;
        }
        at += region.len();
    }
    file.seek(SeekFrom::End(0))?;
    file.flush()?;
    Ok(written)
}

/// The file's length, which must equal the RAM it is to back.
pub fn check_length(file: &File, ram: u64) -> Result<(), String> {
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    if len != ram {
        return Err(format!("the memory file holds {len} bytes; the microVM has {ram} bytes of RAM"));
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
        let region = MmapRegionBuilder::new(size)
            .with_file_offset(offset)
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
            .build()
            .map_err(|e| fail(e.to_string()))?;
        mapped.push(GuestRegionMmap::new(region, start).ok_or_else(|| fail("a region overflows".into()))?);
        at += size as u64;
    }
    GuestMemoryMmap::from_regions(mapped).map_err(|e| fail(e.to_string()))
}
