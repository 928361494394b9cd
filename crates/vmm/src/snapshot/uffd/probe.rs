//! Whether the page-fault handler answers. Firecracker freezes for good on a handler that
//! never does (dead, or copying pages of the wrong size, which the kernel refuses): the
//! load's own first access to guest memory (a device's restore, VMGenID's new id) would
//! hang the API thread. Here the load reads the first byte of guest memory from a thread
//! of its own and waits while the handler makes progress (pages of guest memory becoming
//! resident: a handler copying all of memory at once before it wakes anyone is slow, not
//! stuck); after a while without any, the load is refused: the ranges are unregistered,
//! which wakes the waiting read (the kernel fills the page with zeros), and the caller
//! drops the memory.

use super::{UffdioRange, UFFDIO_UNREGISTER};
use crate::guest_memory::GuestMemoryMmap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

/// How long the handler may leave the first page unfilled without filling any other.
pub(super) const HANDLER_IDLE_AT_MOST: Duration = Duration::from_secs(10);

pub(super) fn first_page_served(
    memory: &GuestMemoryMmap,
    uffd: &OwnedFd,
    page_size: usize,
    idle_at_most: Duration,
) -> Result<(), String> {
    let Some(first) = memory.iter().next() else { return Ok(()) };
    let host = memory.get_host_address(first.start_addr()).map_err(|e| e.to_string())? as usize;
    let (done, wait) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        // SAFETY: the first byte of a mapping `memory` owns, which outlives this thread
        // (joined below on every path); a volatile read only faults the page in.
        let _ = unsafe { std::ptr::read_volatile(host as *const u8) };
        let _ = done.send(());
    });
    let step = (idle_at_most / 4).min(Duration::from_secs(1));
    let (mut resident, mut moved) = (resident_pages(memory), Instant::now());
    loop {
        if wait.recv_timeout(step).is_ok() {
            let _ = reader.join();
            return Ok(());
        }
        let now = resident_pages(memory);
        if now > resident {
            (resident, moved) = (now, Instant::now());
        } else if moved.elapsed() >= idle_at_most {
            break;
        }
    }
    for region in memory.iter() {
        let start = memory.get_host_address(region.start_addr()).map_err(|e| e.to_string())? as u64;
        let mut range = UffdioRange { start, len: region.len() };
        // SAFETY: UFFDIO_UNREGISTER with a struct of the kernel's layout, on a range this
        // process registered.
        unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_UNREGISTER as _, &mut range) };
    }
    let _ = reader.join();
    Err(format!(
        "it did not fill the first page of guest memory, nor any other, within {} s (not running, or not serving {} KiB pages)",
        idle_at_most.as_secs_f64(),
        page_size >> 10
    ))
}

/// The 4 KiB pages of guest memory resident in this process (mincore), summed.
fn resident_pages(memory: &GuestMemoryMmap) -> usize {
    let mut total = 0;
    for region in memory.iter() {
        let Ok(host) = memory.get_host_address(region.start_addr()) else { continue };
        let mut vec = vec![0u8; (region.len() as usize).div_ceil(4096)];
        // SAFETY: the region's whole mapping (page-aligned), owned by `memory`; mincore only
        // reads its page tables and writes one byte per page into `vec`, which has room.
        if unsafe { libc::mincore(host.cast(), region.len() as usize, vec.as_mut_ptr()) } == 0 {
            total += vec.iter().filter(|&&b| b & 1 != 0).count();
        }
    }
    total
}
