//! The floor: the lab process itself doing a workload on the same file, through the same
//! engine (io_uring, O_DIRECT where aligned) and with the same verification as the guest.

use super::pattern;
use super::{RunResult, Workload};
use crate::stats::cpu_time;
use exitless_vmm::virtio::blk::engine::{Completion, Engine, Op};
use exitless_vmm::virtio::blk::Disk;
use std::time::{Duration, Instant};

/// Buffers, one block per slot, in an anonymous mapping with transparent huge pages, as
/// guest memory is (pinning a huge page for O_DIRECT costs less than pinning 4K ones):
/// the floor gets the same memory the guest path does.
struct Buffers {
    mem: vm_memory::MmapRegion,
    block: usize,
}

impl Buffers {
    fn new(slots: usize, block: usize) -> Self {
        let len = (slots * block).next_multiple_of(2 << 20);
        let mem = vm_memory::MmapRegion::new(len).expect("mmap of the host path's buffers");
        // SAFETY: advice on a mapping this struct owns; failure only loses the advice.
        unsafe { libc::madvise(mem.as_ptr().cast(), len, libc::MADV_HUGEPAGE) };
        Buffers { mem, block }
    }

    fn slot(&mut self, i: usize) -> &mut [u8] {
        assert!((i + 1) * self.block <= self.mem.size());
        // SAFETY: in bounds (checked above) of a mapping owned by self and borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.mem.as_ptr().add(i * self.block), self.block) }
    }
}

/// The slots' buffers and iovecs, and where the next block is.
struct Io {
    workload: Workload,
    stamp: u64,
    bufs: Buffers,
    iov: Vec<libc::iovec>,
    lba: Vec<u64>,
    rng: u64,
    cursor: u64,
    blocks: u64,
}

impl Io {
    /// Starts slot `i` on the next block.
    fn issue(&mut self, i: usize, engine: &mut Engine, disk: &Disk) -> bool {
        let w = self.workload;
        let block = if w.random() { xorshift(&mut self.rng) % self.blocks } else { self.cursor % self.blocks };
        self.cursor += 1;
        self.lba[i] = block * (w.block() / pattern::SECTOR) as u64;
        let buf = self.bufs.slot(i);
        if w.write() {
            pattern::fill(buf, self.lba[i], self.stamp);
        }
        self.iov[i] = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: w.block() };
        let offset = self.lba[i] * pattern::SECTOR as u64;
        let op = if w.write() { Op::Write { offset } } else { Op::Read { offset } };
        let fd = disk.fd_for(offset, &self.iov[i..=i]);
        // SAFETY: iov[i] and its buffer stay untouched until slot i's completion is reaped.
        unsafe { engine.push(i as u64, fd, op, &self.iov[i], 1) }
    }
}

/// Runs `workload` at queue depth `qd` for `seconds` on `disk`, writing under `stamp`.
pub fn run(disk: &Disk, workload: Workload, qd: usize, seconds: f64, stamp: u64, seed: u64) -> RunResult {
    let bs = workload.block();
    let empty = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };
    let mut io = Io {
        workload,
        stamp,
        bufs: Buffers::new(qd, bs),
        iov: vec![empty; qd],
        lba: vec![0; qd],
        rng: seed | 1,
        cursor: 0,
        blocks: disk.capacity / bs as u64,
    };
    let mut engine = Engine::new(qd as u32);
    let mut r = RunResult::default();
    let (t0, cpu0) = (Instant::now(), cpu_time(libc::RUSAGE_SELF));
    let deadline = t0 + Duration::from_secs_f64(seconds);
    let mut inflight = 0;
    for i in 0..qd {
        inflight += usize::from(io.issue(i, &mut engine, disk));
    }
    engine.submit();
    let mut done: Vec<Completion> = Vec::with_capacity(qd);
    while inflight > 0 {
        engine.wait();
        engine.reap(&mut done);
        let more = Instant::now() < deadline;
        for c in done.drain(..) {
            let i = c.tag as usize;
            inflight -= 1;
            r.requests += 1;
            if c.result != bs as i64 {
                r.failed += 1;
            } else if !workload.write() {
                r.bad_sectors += pattern::bad_sectors(io.bufs.slot(i), io.lba[i]);
            }
            if more {
                inflight += usize::from(io.issue(i, &mut engine, disk));
            }
        }
        engine.submit();
    }
    r.seconds = t0.elapsed().as_secs_f64();
    r.bytes = r.requests * bs as u64;
    r.vmm_cpu = (cpu_time(libc::RUSAGE_SELF) - cpu0).as_secs_f64();
    r
}

/// xorshift64*, as the guest's rand64.
pub fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    s.wrapping_mul(0x2545_f491_4f6c_dd1d)
}
