//! What the NIC counts: atomics the device thread bumps and the lab reads while it runs.

use crate::net::mmds::MmdsCounters;
use crate::poll::{PollCounts, PollStats};
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters the lab reads while the device runs.
#[derive(Default)]
pub struct NetStats {
    pub tx_frames: AtomicU64,
    pub tx_bytes: AtomicU64,
    pub tx_copied: AtomicU64,
    pub tx_dropped: AtomicU64,
    pub rx_frames: AtomicU64,
    pub rx_dropped: AtomicU64,
    pub bad_chains: AtomicU64,
    /// Sent frames whose virtio-net header the tap must not see (header.rs), dropped.
    pub bad_headers: AtomicU64,
    /// TSC cycles the copy path spent gathering chains into the VMM buffer: what zero-copy saves.
    pub tx_copy_cycles: AtomicU64,
    /// Guest notifications (kicks), as summed from the queues' eventfds.
    pub kicks: AtomicU64,
    /// Interrupts the device asked for.
    pub irqs: AtomicU64,
    /// Times a frame had to wait for the rate limiter's tokens, each way.
    pub rx_throttled: AtomicU64,
    pub tx_throttled: AtomicU64,
    /// The device thread's pthread id, for reading its CPU clock (0 until it starts).
    pub thread: AtomicU64,
    /// What polling after work found and cost (crate::poll).
    pub poll: PollStats,
    /// MMDS's frames and requests, on a NIC that has it.
    pub mmds: MmdsStats,
}

impl AsRef<PollStats> for NetStats {
    fn as_ref(&self) -> &PollStats {
        &self.poll
    }
}

/// [`MmdsCounters`] as atomics: the device thread stores them after each MMDS frame.
#[derive(Default)]
pub struct MmdsStats([AtomicU64; 4]);

impl MmdsStats {
    pub fn store(&self, c: MmdsCounters) {
        for (cell, v) in self.0.iter().zip([c.frames_in, c.frames_out, c.requests, c.dropped]) {
            cell.store(v, Ordering::Relaxed);
        }
    }

    pub fn load(&self) -> MmdsCounters {
        let [frames_in, frames_out, requests, dropped] = self.0.each_ref().map(|c| c.load(Ordering::Relaxed));
        MmdsCounters { frames_in, frames_out, requests, dropped }
    }
}

impl NetStats {
    /// The device thread's CPU time so far; None before it started.
    pub fn thread_cpu(&self) -> Option<std::time::Duration> {
        match self.thread.load(Ordering::Acquire) {
            0 => None,
            // SAFETY: a non-zero id is a device thread that has not ended: the device clears
            // it (Drop for VirtioNet) before its thread is joined.
            thread => unsafe { crate::poll::thread_cpu_time(thread as libc::pthread_t) },
        }
    }
}

/// The counters of [`NetStats`] at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetCounters {
    pub tx_frames: u64,
    pub tx_bytes: u64,
    pub tx_copied: u64,
    pub tx_dropped: u64,
    pub tx_copy_cycles: u64,
    pub rx_frames: u64,
    pub rx_dropped: u64,
    pub bad_chains: u64,
    pub bad_headers: u64,
    pub kicks: u64,
    pub irqs: u64,
    pub rx_throttled: u64,
    pub tx_throttled: u64,
    pub poll: PollCounts,
    pub mmds: MmdsCounters,
}

impl NetStats {
    pub fn snapshot(&self) -> NetCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NetCounters {
            tx_frames: get(&self.tx_frames),
            tx_bytes: get(&self.tx_bytes),
            tx_copied: get(&self.tx_copied),
            tx_dropped: get(&self.tx_dropped),
            tx_copy_cycles: get(&self.tx_copy_cycles),
            rx_frames: get(&self.rx_frames),
            rx_dropped: get(&self.rx_dropped),
            bad_chains: get(&self.bad_chains),
            bad_headers: get(&self.bad_headers),
            kicks: get(&self.kicks),
            irqs: get(&self.irqs),
            rx_throttled: get(&self.rx_throttled),
            tx_throttled: get(&self.tx_throttled),
            poll: self.poll.counts(),
            mmds: self.mmds.load(),
        }
    }
}
