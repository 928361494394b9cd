//! virtio-net over a tap: queue 0 receives, queue 1 transmits, on one device thread
//! that waits (epoll) on both queues' kick eventfds, the tap and a stop eventfd.
//!
//! TX either gathers a chain into a VMM buffer and writes that (`copy`), or hands the
//! kernel iovecs that point straight into guest memory (`zerocopy`); chains under 2048
//! bytes are copied either way. A chain is put on the used ring only once the kernel has
//! taken it; when the tap is full the chain stays on the avail ring and the thread waits
//! for the tap to drain (EPOLLOUT), never spinning. With EVENT_IDX the thread keeps
//! notifications off while it drains a queue and asks for one interrupt per batch.
//!
//! Offloads (features.rs) pass through the tap's virtio-net header: a guest's partial
//! checksums and 64 KiB TSO frames go to the tap as they are (header.rs checks them
//! first), and the tap hands the guest what it negotiated. RX (rx.rs) reads straight into
//! the guest's buffers, several per frame with MRG_RXBUF.

mod attach;
pub mod features;
mod frame_io;
pub mod header;
mod rx;
mod stats;
mod worker;

pub use attach::{attach, NetConfig, NetHandle, KIND};
pub use stats::{MmdsStats, NetCounters, NetStats};

use super::thread::{DeviceThread, QueuePosition};
use super::{ActivateError, Activation, ActiveQueue, VirtioDevice};
use super::{VIRTIO_F_EVENT_IDX, VIRTIO_F_INDIRECT_DESC, VIRTIO_F_VERSION_1};
use crate::net::mmds::{MmdsStack, SharedMmds};
use crate::net::tap::{Tap, VNET_HDR_LEN};
use crate::poll::PollMode;
use crate::rate_limiter::{LimiterSlot, Limits, Throttle};
use crate::seccomp::ThreadKind;
use frame_io::FrameIo;
use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use worker::Worker;

use features::{VIRTIO_NET_F_MAC, VIRTIO_NET_F_MRG_RXBUF, VIRTIO_NET_F_MTU, VIRTIO_NET_F_STATUS};
pub(super) const QUEUE_SIZE: u16 = 256;
pub(super) const RX: usize = 0;
pub(super) const TX: usize = 1;
/// Chains shorter than this are copied on both TX paths: below it pinning a buffer costs
/// what a copy does. From `bench net --frames tso` (docs/benchmarks.md): zero-copy's Gb/s
/// per VMM CPU-second was 0.98x copy's at 1K, 1.0x at 2K and 1.04-1.47x from 4K to 64K.
pub const COPY_BELOW: usize = 2048;
/// The largest frame, virtio-net header included.
pub const MAX_FRAME: usize = VNET_HDR_LEN + 65535;
/// The most buffers one zero-copy write takes; longer chains are copied.
pub(super) const MAX_IOVECS: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxMode {
    Copy,
    Zerocopy,
}

pub struct VirtioNet {
    tap: Arc<Tap>,
    mac: [u8; 6],
    mtu: Option<u16>,
    /// Rate limits on received and sent frames, changeable while it runs.
    limits: [Arc<LimiterSlot>; 2],
    tx_mode: TxMode,
    poll: PollMode,
    /// MMDS answered on this NIC, at this address.
    mmds: Option<(SharedMmds, Ipv4Addr)>,
    /// The checksum and segmentation offloads offered (features.rs); none when turned off.
    offloads: u64,
    pub stats: Arc<NetStats>,
    thread: DeviceThread<Worker>,
}

impl VirtioNet {
    /// A NIC on `tap`, offering the offloads the tap can carry; its thread starts now,
    /// idle until the driver activates it.
    pub fn new(tap: Tap, mac: [u8; 6], tx_mode: TxMode, poll: PollMode) -> std::io::Result<Self> {
        let offloads = features::offered(tap.supported_offloads());
        Ok(VirtioNet {
            offloads,
            tap: Arc::new(tap),
            mac,
            mtu: None,
            limits: Default::default(),
            tx_mode,
            poll,
            mmds: None,
            stats: Arc::default(),
            thread: DeviceThread::spawn("virtio-net", ThreadKind::Device)?,
        })
    }

    /// Rate limits on received (`rx`) and sent (`tx`) frames.
    pub fn with_limits(mut self, rx: Limits, tx: Limits) -> Self {
        self.limits = [Arc::new(LimiterSlot::new(rx)), Arc::new(LimiterSlot::new(tx))];
        self
    }

    /// Where the RX and TX limits are changed from (the machine's NIC handle keeps them).
    pub fn limiter_slots(&self) -> [Arc<LimiterSlot>; 2] {
        self.limits.clone()
    }

    /// Answers MMDS at `ip` on this NIC: frames to it never reach the tap.
    pub fn with_mmds(mut self, mmds: SharedMmds, ip: Ipv4Addr) -> Self {
        self.mmds = Some((mmds, ip));
        self
    }

    /// Offers no checksum or segmentation offloads (`offloads=off`, for comparison).
    pub fn without_offloads(mut self) -> Self {
        self.offloads = 0;
        self
    }

    /// Advises the guest of `mtu` (VIRTIO_NET_F_MTU), as Firecracker's `mtu` does.
    pub fn with_mtu(mut self, mtu: Option<u16>) -> Self {
        self.mtu = mtu;
        self
    }
}

impl Drop for VirtioNet {
    fn drop(&mut self) {
        // Before the fields drop (and the thread is joined): readers stop naming it.
        self.stats.thread.store(0, Ordering::Release);
    }
}

impl VirtioDevice for VirtioNet {
    fn device_type(&self) -> u16 {
        1
    }

    fn features(&self) -> u64 {
        let mtu = if self.mtu.is_some() { VIRTIO_NET_F_MTU } else { 0 };
        let base = VIRTIO_F_VERSION_1 | VIRTIO_F_EVENT_IDX | VIRTIO_F_INDIRECT_DESC | VIRTIO_NET_F_MRG_RXBUF;
        base | VIRTIO_NET_F_MAC | VIRTIO_NET_F_STATUS | mtu | self.offloads
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE, QUEUE_SIZE]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // mac, status (link up), max_virtqueue_pairs, mtu
        let mut config = [0u8; 12];
        config[..6].copy_from_slice(&self.mac);
        config[6] = 1;
        config[8] = 1;
        config[10..12].copy_from_slice(&self.mtu.unwrap_or(0).to_le_bytes());
        for (i, b) in data.iter_mut().enumerate() {
            *b = config.get(offset as usize + i).copied().unwrap_or(0);
        }
    }

    fn activate(&mut self, queues: Vec<ActiveQueue>, activation: Activation) -> Result<(), ActivateError> {
        self.thread.stop();
        // A fresh MMDS stack: TCP connections do not outlive the driver that made them.
        let mmds = self.mmds.as_ref().map(|(store, ip)| MmdsStack::new(store.clone(), *ip));
        // The tap hands us what the guest takes: checksums left partial, frames unsegmented.
        if let Err(e) = self.tap.set_offloads(features::tun_offloads(activation.features)) {
            tracing::warn!("virtio-net: the tap refused the receive offloads the guest negotiated: {e}");
        }
        let io = FrameIo::new(self.tap.clone(), self.tx_mode, self.stats.clone(), mmds, activation.features);
        let mut worker = Worker::new(io, queues, activation)?;
        worker.poll = self.poll;
        worker.throttles = self.limits.clone().map(Throttle::new);
        self.thread.start(worker)
    }

    fn reset(&mut self) {
        // Outstanding chains are dropped with the queues: the driver re-posts after reset.
        self.thread.stop();
    }

    fn pause(&mut self) -> Option<Vec<QueuePosition>> {
        // Nothing is in flight between passes: a sent chain is used once the tap took it,
        // RX rewinds the buffers a frame did not fill.
        self.thread.pause()
    }

    fn resume(&mut self) -> Result<(), ActivateError> {
        self.thread.resume()
    }
}

/// One pass of the device thread's work, without the thread: the TX queue, then the RX
/// queue (the fuzz target's entry into the queue processing).
#[doc(hidden)]
pub fn process_once(tap: Tap, tx_mode: TxMode, queues: Vec<ActiveQueue>, a: Activation) -> NetCounters {
    let stats = Arc::new(NetStats::default());
    let io = FrameIo::new(Arc::new(tap), tx_mode, stats.clone(), None, a.features);
    if let Ok(mut worker) = Worker::new(io, queues, a) {
        worker.process_tx();
        worker.process_rx();
    }
    stats.snapshot()
}
