//! virtio-pmem (type 27), as Firecracker's `/pmem/{id}`: a file mapped shared into the
//! guest's physical address space past the 64-bit PCI window (its own KVM memory slot,
//! read-only if the file is), 2 MiB aligned and rounded up to 2 MiB (anonymous memory
//! past the file's end), so the guest reads it straight from the host's page cache (DAX)
//! and guests mapping the same file share that cache. The one queue takes flush
//! requests, answered after msync(2) of the file (one per pass, as Firecracker).

mod attach;

pub use attach::{attach, PmemConfig, PmemHandle, KIND};

use super::chain::{self, Segment};
use super::event_loop;
use super::thread::{DeviceThread, QueuePosition};
use super::{ActivateError, Activation, ActiveQueue, Interrupt, VirtioDevice, VIRTIO_F_VERSION_1};
use crate::guest_memory::GuestMemoryMmap;
use crate::rate_limiter::{LimiterSlot, Limits, Throttle};
use crate::seccomp::ThreadKind;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

/// The guest sees the file in whole 2 MiB pages, at a 2 MiB boundary (virtio 1.2 5.19).
pub const ALIGNMENT: u64 = 2 << 20;
const QUEUE_SIZE: u16 = 256;
const REQ_TYPE_FLUSH: u32 = 0;
const SUCCESS: i32 = 0;
const FAILURE: i32 = -1;

/// Why a pmem file could not be given to the guest.
#[derive(Debug, thiserror::Error)]
pub enum PmemError {
    #[error("cannot open {0}")]
    Open(String, #[source] std::io::Error),
    #[error("{0} is empty: a pmem device needs a file of at least one byte")]
    Empty(String),
    #[error("{0} is {1}: a pmem device needs a regular file")]
    NotAFile(String, &'static str),
    #[error("cannot map {0}")]
    Map(String, #[source] std::io::Error),
}

/// The file's mapping: `len` bytes (the file's length rounded up to 2 MiB), the file
/// shared over its own length, anonymous memory after it. Unmapped when dropped, which
/// is after the VM (the device manager, which holds it, goes with the machine).
pub struct PmemMapping {
    host: *mut libc::c_void,
    len: u64,
    /// How much of the mapping is the file's (less once the file shrank and the rest was
    /// mapped anonymous, [`PmemMapping::repair`]).
    file_len: AtomicU64,
    file: std::fs::File,
    name: String,
    prot: libc::c_int,
    /// Times the file was found shorter than its mapping.
    pub shrank: AtomicU64,
}

// SAFETY: the mapping is plain memory owned by this value; it is only read through
// `host` by KVM and by msync, neither of which needs one thread.
unsafe impl Send for PmemMapping {}
// SAFETY: as above: no interior state besides the memory the guest owns.
unsafe impl Sync for PmemMapping {}

impl PmemMapping {
    pub fn open(path: &std::path::Path, read_only: bool) -> Result<PmemMapping, PmemError> {
        let name = path.display().to_string();
        // A regular file, checked on the descriptor mapped (a read-only open of a FIFO
        // would wait for a writer; a device's length says nothing of its mapping).
        let (file, file_len) = crate::files::open_regular(path, !read_only).map_err(|e| match e {
            crate::files::FileError::NotRegular { kind, .. } => PmemError::NotAFile(name.clone(), kind),
            crate::files::FileError::Open { source, .. } => PmemError::Open(name.clone(), source),
            e => PmemError::Open(name.clone(), std::io::Error::other(e)),
        })?;
        if file_len == 0 {
            return Err(PmemError::Empty(name));
        }
        let len = file_len.next_multiple_of(ALIGNMENT);
        let prot = if read_only { libc::PROT_READ } else { libc::PROT_READ | libc::PROT_WRITE };
        let failed = |name: &str| PmemError::Map(name.to_string(), std::io::Error::last_os_error());
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        // SAFETY: a fresh anonymous mapping of `len` bytes; checked below.
        let host = unsafe { libc::mmap(std::ptr::null_mut(), len as usize, prot, anon, -1, 0) };
        if host == libc::MAP_FAILED {
            return Err(failed(&name));
        }
        let file_len = AtomicU64::new(file_len);
        let mapping = PmemMapping { host, len, file_len, file, name, prot, shrank: AtomicU64::new(0) };
        let shared = libc::MAP_SHARED | libc::MAP_NORESERVE | libc::MAP_FIXED;
        let fd = mapping.file.as_raw_fd();
        let file_len = mapping.file_len.load(Ordering::Relaxed) as usize;
        // SAFETY: the file over the start of our own mapping (MAP_FIXED replaces only
        // pages this value owns).
        let at = unsafe { libc::mmap(host, file_len, prot, shared, fd, 0) };
        if at == libc::MAP_FAILED {
            return Err(failed(&mapping.name));
        }
        Ok(mapping)
    }

    /// Where it is in the VMM.
    pub fn host_address(&self) -> u64 {
        self.host as u64
    }

    /// What the guest sees: the file's length rounded up to 2 MiB.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// msync(MS_SYNC) of the file's part: what a guest's flush asks for.
    fn sync(&self) -> bool {
        let len = self.file_len.load(Ordering::Acquire) as usize;
        // SAFETY: the file's part of this value's own mapping.
        unsafe { libc::msync(self.host, len, libc::MS_SYNC) == 0 }
    }

    /// The file shrank under the guest (someone truncated it): the pages it lost would fail
    /// every guest access in KVM, so they are mapped anonymous instead (they read as zeros
    /// and take writes that reach no file), counted and logged once. True if it did so.
    pub fn repair(&self) -> bool {
        let Ok(now) = self.file.metadata().map(|m| m.len()) else { return false };
        let mapped = self.file_len.load(Ordering::Acquire);
        let keep = now.next_multiple_of(4096).min(mapped);
        if keep >= mapped {
            return false;
        }
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED;
        // SAFETY: [keep, mapped) lies inside this value's own mapping; MAP_FIXED replaces
        // only those pages (KVM drops what it mapped of them through its MMU notifier).
        let at =
            unsafe { libc::mmap(self.host.byte_add(keep as usize), (mapped - keep) as usize, self.prot, anon, -1, 0) };
        if at == libc::MAP_FAILED {
            return false;
        }
        self.file_len.store(keep, Ordering::Release);
        if self.shrank.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(
                "virtio-pmem: {} shrank to {now} bytes under the running guest; the {} bytes it lost read as zeros now (said once)",
                self.name,
                mapped - keep
            );
        }
        true
    }
}

impl PmemMapping {
    /// Whether `[offset, offset + len)` is inside the mapping and backed now: the file's
    /// part as long as the file still holds it, or the anonymous part after it.
    fn backed(&self, offset: u64, len: usize) -> bool {
        let Some(end) = offset.checked_add(len as u64).filter(|&end| end <= self.len) else { return false };
        let file_len = self.file_len.load(Ordering::Acquire);
        let file_now = self.file.metadata().map_or(0, |m| m.len()).next_multiple_of(4096);
        offset >= file_len || end <= file_now
    }
}

/// The file's guest range on the MMIO bus, behind its memory slot: reached only when KVM
/// cannot serve an access from the slot, that is a guest write to a read-only device, or
/// (on a host whose KVM turns a failed page lookup into an MMIO exit, as this nested one
/// does) a page the file lost under the guest. Lost pages are mended first
/// ([`PmemMapping::repair`]), so the next access stays in the guest; this one is served
/// from the mapping.
pub struct PmemWindow {
    mapping: Arc<PmemMapping>,
    read_only: bool,
    /// Guest writes a read-only device dropped.
    pub dropped_writes: AtomicU64,
}

impl PmemWindow {
    pub fn new(mapping: Arc<PmemMapping>, read_only: bool) -> PmemWindow {
        PmemWindow { mapping, read_only, dropped_writes: AtomicU64::new(0) }
    }
}

impl crate::bus::BusDevice for PmemWindow {
    fn read(&self, offset: u64, data: &mut [u8]) {
        self.mapping.repair();
        data.fill(0);
        if self.mapping.backed(offset, data.len()) {
            // SAFETY: `backed` checked the range lies in the mapping, with pages behind it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.mapping.host.cast::<u8>().add(offset as usize),
                    data.as_mut_ptr(),
                    data.len(),
                )
            };
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        if self.read_only {
            if self.dropped_writes.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!(
                    "virtio-pmem: the guest writes to its read-only {} (dropped; said once)",
                    self.mapping.name
                );
            }
            return;
        }
        self.mapping.repair();
        if self.mapping.backed(offset, data.len()) {
            // SAFETY: as in `read`; the mapping is writable (the device is not read-only).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    data.as_ptr(),
                    self.mapping.host.cast::<u8>().add(offset as usize),
                    data.len(),
                )
            };
        }
    }
}

impl crate::kvm::FaultRepair for PmemMapping {
    fn repair(&self) -> bool {
        PmemMapping::repair(self)
    }
}

impl Drop for PmemMapping {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `open`.
        unsafe { libc::munmap(self.host, self.len as usize) };
    }
}

/// Firecracker's `pmem` metrics, and what the driver did wrong.
#[derive(Default)]
pub struct PmemStats {
    pub flushes: AtomicU64,
    pub flush_fails: AtomicU64,
    pub bad_requests: AtomicU64,
    pub kicks: AtomicU64,
    pub irqs: AtomicU64,
    pub throttled: AtomicU64,
}

pub struct VirtioPmem {
    /// Where the guest finds the file and how long it is (the config space).
    start: u64,
    mapping: Arc<PmemMapping>,
    limits: Arc<LimiterSlot>,
    pub stats: Arc<PmemStats>,
    thread: DeviceThread<Worker>,
}

impl VirtioPmem {
    /// The device for `mapping`, which the guest finds at `start`; its thread starts now.
    pub fn new(mapping: Arc<PmemMapping>, start: u64, limits: Limits) -> std::io::Result<Self> {
        let thread = DeviceThread::spawn("virtio-pmem", ThreadKind::Pmem)?;
        let limits = Arc::new(LimiterSlot::new(limits));
        Ok(VirtioPmem { start, mapping, limits, stats: Arc::default(), thread })
    }

    pub fn limiter_slot(&self) -> Arc<LimiterSlot> {
        self.limits.clone()
    }
}

impl VirtioDevice for VirtioPmem {
    fn device_type(&self) -> u16 {
        27
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE]
    }

    /// start (le64), size (le64).
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let mut config = [0u8; 16];
        config[..8].copy_from_slice(&self.start.to_le_bytes());
        config[8..].copy_from_slice(&self.mapping.len().to_le_bytes());
        super::copy_config(&config, offset, data);
    }

    fn activate(&mut self, queues: Vec<ActiveQueue>, a: Activation) -> Result<(), ActivateError> {
        self.thread.stop();
        let have = queues.len();
        let Ok([q]) = <[ActiveQueue; 1]>::try_from(queues) else {
            return Err(ActivateError::QueueCount { want: 1, have });
        };
        let worker = Worker::new(q, a, self.mapping.clone(), Throttle::new(self.limits.clone()), self.stats.clone());
        self.thread.start(worker)
    }

    fn reset(&mut self) {
        self.thread.stop();
    }

    fn pause(&mut self) -> Option<Vec<QueuePosition>> {
        // A flush is answered in the pass that takes it: none is in flight.
        self.thread.pause()
    }

    fn resume(&mut self) -> Result<(), ActivateError> {
        self.thread.resume()
    }
}

/// One pass over the queue (the fuzz target): returns the requests refused.
pub fn process_once(mapping: Arc<PmemMapping>, queue: ActiveQueue, a: Activation) -> u64 {
    let stats = Arc::new(PmemStats::default());
    let throttle = Throttle::new(Arc::new(LimiterSlot::new(Limits::default())));
    Worker::new(queue, a, mapping, throttle, stats.clone()).process();
    stats.bad_requests.load(Ordering::Relaxed)
}

struct Worker {
    queue: Queue,
    kick: Arc<EventFd>,
    mem: GuestMemoryMmap,
    interrupt: Arc<Interrupt>,
    status: Arc<super::DeviceStatus>,
    mapping: Arc<PmemMapping>,
    throttle: Throttle,
    stats: Arc<PmemStats>,
    segs: Vec<Segment>,
    broken: bool,
    warned: bool,
}

impl Worker {
    fn new(
        q: ActiveQueue,
        a: Activation,
        mapping: Arc<PmemMapping>,
        throttle: Throttle,
        stats: Arc<PmemStats>,
    ) -> Self {
        Worker {
            queue: q.queue,
            kick: q.kick,
            mem: a.mem,
            interrupt: a.interrupt,
            status: a.status,
            mapping,
            throttle,
            stats,
            segs: Vec::with_capacity(4),
            broken: false,
            warned: false,
        }
    }

    fn fail(&mut self, what: &str) {
        self.status.break_once(&mut self.broken, "virtio-pmem", what, &self.interrupt);
    }

    /// Answers every flush the driver posted (as its limits allow): one msync per pass.
    fn process(&mut self) {
        if self.broken || !self.queue.ready() {
            return;
        }
        let mut synced: Option<i32> = None;
        let mut used_any = false;
        loop {
            if self.queue.disable_notification(&self.mem).is_err() {
                return self.fail("cannot write its avail_event");
            }
            while let Some(chain) = self.queue.pop_descriptor_chain(&self.mem) {
                let head = chain.head_index();
                // Firecracker's charge: one op and the file's length in bytes per request.
                let file_len = self.mapping.file_len.load(Ordering::Relaxed);
                if !self.throttle.admit(1, || file_len, &self.stats.throttled) {
                    self.queue.go_to_previous_position();
                    return self.finish(used_any);
                }
                let walked = chain::walk(chain, &self.mem, 64, &mut self.segs);
                let written = match walked.ok().and_then(|_| self.flush_request()) {
                    Some(status_at) => {
                        let status = *synced.get_or_insert_with(|| self.flush());
                        match self.mem.write_obj(status, GuestAddress(status_at)) {
                            Ok(()) => 4,
                            Err(_) => 0,
                        }
                    }
                    None => {
                        self.stats.bad_requests.fetch_add(1, Ordering::Relaxed);
                        if !std::mem::replace(&mut self.warned, true) {
                            tracing::warn!(
                                "virtio-pmem: a request that is not a flush with its status (refused; said once)"
                            );
                        }
                        0
                    }
                };
                if self.queue.add_used(&self.mem, head, written).is_err() {
                    return self.fail("cannot write its used ring");
                }
                used_any = true;
            }
            match super::rearm_notifications(&mut self.queue, &self.mem, true) {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => return self.fail(e),
            }
        }
        self.finish(used_any);
    }

    /// The walked chain as virtio 1.2 5.19.6 has it: a 4-byte request the driver wrote
    /// (FLUSH), then a 4-byte status for the device; the status's address.
    fn flush_request(&self) -> Option<u64> {
        let [request, status] = self.segs.as_slice() else { return None };
        let kind: u32 = self.mem.read_obj(GuestAddress(request.addr)).ok()?;
        let shaped = !request.writable && request.len == 4 && status.writable && status.len == 4;
        (shaped && kind == REQ_TYPE_FLUSH).then_some(status.addr)
    }

    fn flush(&self) -> i32 {
        self.stats.flushes.fetch_add(1, Ordering::Relaxed);
        if self.mapping.sync() {
            return SUCCESS;
        }
        self.stats.flush_fails.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("virtio-pmem: msync failed: {}", std::io::Error::last_os_error());
        FAILURE
    }

    fn finish(&mut self, used_any: bool) {
        if !used_any {
            return;
        }
        if let Err(e) = super::interrupt_if_needed(&mut self.queue, &self.mem, &self.interrupt, 0, &self.stats.irqs) {
            self.fail(e);
        }
    }
}

impl event_loop::LimitedQueue for Worker {
    const NAME: &'static str = "virtio-pmem";

    fn kick(&self) -> &EventFd {
        &self.kick
    }

    fn kicks(&self) -> &AtomicU64 {
        &self.stats.kicks
    }

    fn throttle(&mut self) -> &mut Throttle {
        &mut self.throttle
    }

    fn process(&mut self) {
        Worker::process(self)
    }

    fn queue(&self) -> &Queue {
        &self.queue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_mapped_in_whole_2m_pages_and_an_empty_one_refused() {
        let dir = std::env::temp_dir().join(format!("exitless-pmem-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("img");
        std::fs::write(&file, b"pmem!").unwrap();
        let m = PmemMapping::open(&file, true).unwrap();
        assert_eq!(m.len(), ALIGNMENT);
        // SAFETY: the mapping's first bytes are the file's, mapped readable.
        let first = unsafe { std::slice::from_raw_parts(m.host_address() as *const u8, 5) };
        assert_eq!(first, b"pmem!");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(PmemMapping::open(&file, true), Err(PmemError::Empty(_))));
        assert!(matches!(PmemMapping::open(&dir.join("none"), true), Err(PmemError::Open(..))));
        let device = VirtioPmem::new(Arc::new(m), 0x40_0000_0000, Limits::default()).unwrap();
        let mut config = [0u8; 16];
        device.read_config(0, &mut config);
        assert_eq!(u64::from_le_bytes(config[..8].try_into().unwrap()), 0x40_0000_0000);
        assert_eq!(u64::from_le_bytes(config[8..].try_into().unwrap()), ALIGNMENT);
        assert_eq!(device.device_type(), 27);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_truncated_under_the_guest_is_mended_once_and_reads_zeros() {
        let dir = std::env::temp_dir().join(format!("exitless-pmem-shrink-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("img");
        std::fs::write(&file, vec![0x5au8; 3 << 20]).unwrap();
        let m = PmemMapping::open(&file, false).unwrap();
        assert_eq!(m.len(), 4 << 20);
        assert!(!m.repair(), "nothing to mend while the file is whole");
        std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len((1 << 20) + 100).unwrap();
        assert!(m.repair());
        assert!(!m.repair(), "mended once");
        assert_eq!(m.shrank.load(Ordering::Relaxed), 1);
        // SAFETY: the whole mapping is readable: the file's first 1 MiB + 100 bytes (its
        // page), anonymous after it; without the repair this read would be a SIGBUS.
        let bytes = unsafe { std::slice::from_raw_parts(m.host_address() as *const u8, 4 << 20) };
        assert_eq!((bytes[0], bytes[(1 << 20) + 99]), (0x5a, 0x5a));
        assert_eq!((bytes[(1 << 20) + 8192], bytes[(3 << 20) - 1]), (0, 0), "lost pages read as zeros");
        assert!(m.sync(), "flushes go on over what is left of the file");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_window_behind_the_slot_mends_serves_and_drops_read_only_writes() {
        use crate::bus::BusDevice;
        let dir = std::env::temp_dir().join(format!("exitless-pmem-window-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("img");
        std::fs::write(&file, vec![0x77u8; 2 << 20]).unwrap();
        let window = PmemWindow::new(Arc::new(PmemMapping::open(&file, false).unwrap()), false);
        std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(4096).unwrap();
        let mut data = [0xffu8; 8];
        window.read(8192, &mut data);
        assert_eq!(data, [0; 8], "a lost page, mended, reads zeros");
        window.read(0, &mut data);
        assert_eq!(data, [0x77; 8], "what the file still holds");
        window.write(8192, &[1, 2]);
        window.read(8192, &mut data);
        assert_eq!(data[..2], [1, 2]);
        window.read((2 << 20) - 4, &mut data);
        assert_eq!(data, [0; 8], "past the end: nothing");
        let read_only = PmemWindow::new(Arc::new(PmemMapping::open(&file, true).unwrap()), true);
        read_only.write(0, &[9]);
        read_only.read(0, &mut data);
        assert_eq!((data[0], read_only.dropped_writes.load(Ordering::Relaxed)), (0x77, 1));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
