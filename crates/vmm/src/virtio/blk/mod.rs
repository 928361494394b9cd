//! virtio-blk on a file: one request queue served by a device thread that waits (epoll)
//! on the queue's kick eventfd and on the I/O engine's completions. Requests go to the
//! file straight from guest memory, many in flight at once (io_uring); each is put on the
//! used ring, and the guest interrupted (EVENT_IDX permitting), when its I/O completes.

mod attach;
pub mod disk;
pub mod engine;
pub mod request;
pub mod slot;
mod worker;

use super::thread::{DeviceThread, QueuePosition};
use super::{ActivateError, Activation, ActiveQueue, VirtioDevice};
use super::{VIRTIO_F_EVENT_IDX, VIRTIO_F_INDIRECT_DESC, VIRTIO_F_VERSION_1};
use crate::poll::{PollCounts, PollMode, PollStats};
use crate::rate_limiter::LimiterSlot;
use crate::seccomp::ThreadKind;
pub use attach::{attach, DriveHandle, KIND};
pub use disk::{Disk, DiskError, DriveConfig};
use engine::Engine;
use request::SECTOR_SIZE;
pub use slot::DiskSlot;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

pub const VIRTIO_BLK_F_SEG_MAX: u64 = 1 << 2;
pub const VIRTIO_BLK_F_RO: u64 = 1 << 5;
pub const VIRTIO_BLK_F_BLK_SIZE: u64 = 1 << 6;
pub const VIRTIO_BLK_F_FLUSH: u64 = 1 << 9;
pub const VIRTIO_BLK_F_DISCARD: u64 = 1 << 13;
pub const VIRTIO_BLK_F_WRITE_ZEROES: u64 = 1 << 14;

pub const QUEUE_SIZE: u16 = 256;
/// The most data buffers one request may have (the chain also holds header and status).
pub const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;
/// The largest discard or write-zeroes range, in sectors (1 GiB).
const MAX_DISCARD_SECTORS: u32 = 1 << 21;

/// Counters the lab and the exit profile read while the device runs.
#[derive(Default)]
pub struct BlkStats {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub flushes: AtomicU64,
    pub discards: AtomicU64,
    /// Requests answered IOERR or UNSUPP: malformed, out of range, refused or failed.
    pub errors: AtomicU64,
    /// Chains that were not a well-formed request at all.
    pub bad_requests: AtomicU64,
    /// Guest notifications (kicks), as summed from the queue's eventfd.
    pub kicks: AtomicU64,
    /// Interrupts the device asked for.
    pub irqs: AtomicU64,
    /// Times a request had to wait for the rate limiter's tokens.
    pub throttled: AtomicU64,
    /// The device thread's pthread id, for reading its CPU clock (0 until it starts).
    pub thread: AtomicU64,
    /// The I/O engine's name ("io_uring" or "thread pool").
    pub engine: &'static str,
    /// What polling after work found and cost (crate::poll).
    pub poll: PollStats,
}

impl AsRef<PollStats> for BlkStats {
    fn as_ref(&self) -> &PollStats {
        &self.poll
    }
}

/// The counters of [`BlkStats`] at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlkCounters {
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub flushes: u64,
    pub discards: u64,
    pub errors: u64,
    pub bad_requests: u64,
    pub kicks: u64,
    pub irqs: u64,
    pub throttled: u64,
    pub engine: &'static str,
    pub poll: PollCounts,
}

impl BlkStats {
    fn count_done(&self, kind: request::Kind, bytes: u64) {
        let (count, moved) = match kind {
            request::Kind::In => (&self.reads, Some(&self.read_bytes)),
            request::Kind::Out => (&self.writes, Some(&self.write_bytes)),
            _ => (&self.flushes, None),
        };
        count.fetch_add(1, Ordering::Relaxed);
        if let Some(moved) = moved {
            moved.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    pub fn snapshot(&self) -> BlkCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        BlkCounters {
            reads: get(&self.reads),
            writes: get(&self.writes),
            read_bytes: get(&self.read_bytes),
            write_bytes: get(&self.write_bytes),
            flushes: get(&self.flushes),
            discards: get(&self.discards),
            errors: get(&self.errors),
            bad_requests: get(&self.bad_requests),
            kicks: get(&self.kicks),
            irqs: get(&self.irqs),
            throttled: get(&self.throttled),
            engine: self.engine,
            poll: self.poll.counts(),
        }
    }
}

pub struct VirtioBlk {
    disk: Arc<DiskSlot>,
    /// The drive's rate limits, changeable while it runs.
    limits: Arc<LimiterSlot>,
    /// The I/O engine and request slots, kept across resets (made once, before any
    /// seccomp filter); lent to the device thread while the device runs.
    kept: Option<worker::Kept>,
    pub stats: Arc<BlkStats>,
    /// Lent the engine and slots while the device runs.
    thread: DeviceThread<worker::Worker>,
    poll: PollMode,
    /// Tells the thread a snapshot stops it (its requests in flight are answered).
    pausing: Arc<AtomicBool>,
}

impl VirtioBlk {
    pub fn new(config: &DriveConfig, poll: PollMode) -> Result<Self, DiskError> {
        let disk = Arc::new(DiskSlot::open(config)?);
        let kept = Self::fresh(config.thread_pool);
        let stats = Arc::new(BlkStats { engine: kept.engine.name(), ..Default::default() });
        let limits = Arc::new(LimiterSlot::new(config.limits));
        let thread = DeviceThread::spawn("virtio-blk", ThreadKind::Block).map_err(DiskError::Thread)?;
        Ok(VirtioBlk { disk, limits, kept: Some(kept), stats, thread, poll, pausing: Arc::default() })
    }

    fn fresh(thread_pool: bool) -> worker::Kept {
        let engine = match thread_pool {
            true => Engine::pool(engine::POOL_THREADS),
            false => Engine::new(u32::from(QUEUE_SIZE)),
        };
        worker::Kept { engine, slots: worker::Slots::new() }
    }

    /// The backing file now.
    pub fn disk(&self) -> Arc<Disk> {
        self.disk.current()
    }

    /// Where the rate limits are changed from (the machine's drive handle keeps it).
    pub fn limiter_slot(&self) -> Arc<LimiterSlot> {
        self.limits.clone()
    }

    /// Where the backing file is swapped from (the machine's drive handle keeps it).
    pub fn disk_slot(&self) -> Arc<DiskSlot> {
        self.disk.clone()
    }

    /// "io_uring" or "thread pool".
    pub fn engine_name(&self) -> &'static str {
        self.kept.as_ref().map_or("none", |k| k.engine.name())
    }

    /// Stops the device thread's job once its requests in flight have completed, and
    /// takes the engine back.
    fn stop(&mut self) {
        if let Some(worker) = self.thread.stop() {
            self.kept = Some(worker.into_kept());
        }
    }
}

impl VirtioDevice for VirtioBlk {
    fn device_type(&self) -> u16 {
        2
    }

    fn features(&self) -> u64 {
        let disk = self.disk.current();
        let mut f = VIRTIO_F_VERSION_1
            | VIRTIO_F_EVENT_IDX
            | VIRTIO_F_INDIRECT_DESC
            | VIRTIO_BLK_F_SEG_MAX
            | VIRTIO_BLK_F_BLK_SIZE
            | VIRTIO_BLK_F_FLUSH;
        if disk.readonly {
            f |= VIRTIO_BLK_F_RO;
        }
        if disk.can_discard {
            f |= VIRTIO_BLK_F_DISCARD | VIRTIO_BLK_F_WRITE_ZEROES;
        }
        f
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // struct virtio_blk_config, up to write_zeroes_may_unmap.
        let disk = self.disk.current();
        let mut c = [0u8; 60];
        c[0..8].copy_from_slice(&(disk.capacity / SECTOR_SIZE).to_le_bytes());
        c[12..16].copy_from_slice(&SEG_MAX.to_le_bytes());
        c[20..24].copy_from_slice(&(SECTOR_SIZE as u32).to_le_bytes());
        c[34..36].copy_from_slice(&1u16.to_le_bytes()); // num_queues
        if disk.can_discard {
            c[36..40].copy_from_slice(&MAX_DISCARD_SECTORS.to_le_bytes());
            c[40..44].copy_from_slice(&1u32.to_le_bytes()); // max_discard_seg
            c[44..48].copy_from_slice(&1u32.to_le_bytes()); // discard_sector_alignment
            c[48..52].copy_from_slice(&MAX_DISCARD_SECTORS.to_le_bytes());
            c[52..56].copy_from_slice(&1u32.to_le_bytes()); // max_write_zeroes_seg
            c[56] = 1; // write_zeroes_may_unmap
        }
        for (i, b) in data.iter_mut().enumerate() {
            *b = c.get(offset as usize + i).copied().unwrap_or(0);
        }
    }

    fn activate(&mut self, mut queues: Vec<ActiveQueue>, activation: Activation) -> Result<(), ActivateError> {
        self.stop();
        if queues.len() != 1 {
            return Err(ActivateError::QueueCount { want: 1, have: queues.len() });
        }
        let queue = queues.remove(0);
        // Made before any filter (an io_uring ring cannot be set up on a vCPU thread); lost
        // only if the thread died, and then the device cannot run again.
        let lost = || ActivateError::Thread(std::io::Error::other("virtio-blk's engine was lost with its thread"));
        let worker::Kept { engine, slots } = self.kept.take().ok_or_else(lost)?;
        let parts = worker::Parts {
            queue,
            activation,
            disk: self.disk.clone(),
            limits: self.limits.clone(),
            stats: self.stats.clone(),
            engine,
            slots,
            poll: self.poll,
            pausing: self.pausing.clone(),
        };
        self.thread.start(worker::Worker::new(parts))
    }

    fn reset(&mut self) {
        self.stop();
    }

    fn pause(&mut self) -> Option<Vec<QueuePosition>> {
        self.pausing.store(true, Ordering::Release);
        let positions = self.thread.pause();
        self.pausing.store(false, Ordering::Release);
        positions
    }

    fn resume(&mut self) -> Result<(), ActivateError> {
        self.thread.resume()
    }
}
