//! virtio-net over a tap: queue 0 receives, queue 1 transmits, on one device thread
//! that waits (epoll) on both queues' kick eventfds, the tap and a stop eventfd.
//!
//! TX either gathers a chain into a VMM buffer and writes that (`copy`), or hands the
//! kernel iovecs that point straight into guest memory (`zerocopy`); chains under 256
//! bytes are copied either way. A chain is put on the used ring only once the kernel has
//! taken it; when the tap is full the chain stays on the avail ring and the thread waits
//! for the tap to drain (EPOLLOUT), never spinning. With EVENT_IDX the thread keeps
//! notifications off while it drains a queue and asks for one interrupt per batch.

use super::chain::{self, ChainError, Segment};
use super::thread::DeviceThread;
use super::{ActivateError, Activation, ActiveQueue, Interrupt, VirtioDevice};
use super::{VIRTIO_F_EVENT_IDX, VIRTIO_F_INDIRECT_DESC, VIRTIO_F_VERSION_1};
use crate::net::tap::{Tap, VNET_HDR_LEN};
use crate::poll::{PollCounts, PollMode, PollStats, PollWindow};
use crate::rate_limiter::{LimiterSlot, Limits, Throttle};
use crate::seccomp::ThreadKind;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

pub const VIRTIO_NET_F_MAC: u64 = 1 << 5;
pub const VIRTIO_NET_F_STATUS: u64 = 1 << 16;
/// The device advises the guest of an MTU (config field `mtu`).
pub const VIRTIO_NET_F_MTU: u64 = 1 << 3;
const QUEUE_SIZE: u16 = 256;
const RX: usize = 0;
const TX: usize = 1;
/// Chains shorter than this are copied on both TX paths (the cost of pinning a small
/// buffer outweighs a copy).
pub const COPY_BELOW: usize = 256;
/// The largest frame, virtio-net header included.
pub const MAX_FRAME: usize = VNET_HDR_LEN + 65535;
/// The most buffers one zero-copy write takes; longer chains are copied.
const MAX_IOVECS: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxMode {
    Copy,
    Zerocopy,
}

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
    pub kicks: u64,
    pub irqs: u64,
    pub rx_throttled: u64,
    pub tx_throttled: u64,
    pub poll: PollCounts,
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
            kicks: get(&self.kicks),
            irqs: get(&self.irqs),
            rx_throttled: get(&self.rx_throttled),
            tx_throttled: get(&self.tx_throttled),
            poll: self.poll.counts(),
        }
    }
}

pub struct VirtioNet {
    tap: Arc<Tap>,
    mac: [u8; 6],
    mtu: Option<u16>,
    /// Rate limits on received and sent frames, changeable while it runs.
    limits: [Arc<LimiterSlot>; 2],
    tx_mode: TxMode,
    poll: PollMode,
    pub stats: Arc<NetStats>,
    thread: DeviceThread<()>,
}

impl VirtioNet {
    /// A NIC on `tap`; its thread starts now, idle until the driver activates it.
    pub fn new(tap: Tap, mac: [u8; 6], tx_mode: TxMode, poll: PollMode) -> std::io::Result<Self> {
        Ok(VirtioNet {
            tap: Arc::new(tap),
            mac,
            mtu: None,
            limits: Default::default(),
            tx_mode,
            poll,
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
        VIRTIO_F_VERSION_1 | VIRTIO_F_EVENT_IDX | VIRTIO_F_INDIRECT_DESC | VIRTIO_NET_F_MAC | VIRTIO_NET_F_STATUS | mtu
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
        let mut worker = Worker::new(self.tap.clone(), self.tx_mode, self.stats.clone(), queues, activation)?;
        worker.poll = self.poll;
        worker.throttles = self.limits.clone().map(Throttle::new);
        self.thread.start(Box::new(move |stop| worker.run(stop)))
    }

    fn reset(&mut self) {
        // Outstanding chains are dropped with the queues: the driver re-posts after reset.
        self.thread.stop();
    }
}

const TOKEN_RX_KICK: u64 = 0;
const TOKEN_TX_KICK: u64 = 1;
const TOKEN_TAP: u64 = 2;
const TOKEN_STOP: u64 = 3;

struct Worker {
    queues: Vec<Queue>,
    kicks: Vec<Arc<EventFd>>,
    mem: GuestMemoryMmap,
    interrupt: Arc<Interrupt>,
    activation_status: Arc<super::DeviceStatus>,
    io: FrameIo,
    /// A received frame waiting in `io.buf` for an RX buffer, and its length.
    rx_staged: Option<usize>,
    broken: bool,
    poll: PollMode,
    /// False while the thread polls: the queues' notifications stay off (crate::poll).
    kicks_wanted: bool,
    /// The tap refused a frame; TX waits for its EPOLLOUT.
    tx_blocked: bool,
    /// The RX and TX rate limits (crate::rate_limiter).
    throttles: [Throttle; 2],
}

/// The tap and the scratch space frames pass through (apart from the queues, so a chain
/// that borrows guest memory can be handed to it).
struct FrameIo {
    tap: Arc<Tap>,
    tx_mode: TxMode,
    stats: Arc<NetStats>,
    segs: Vec<Segment>,
    buf: Vec<u8>,
}

impl Worker {
    fn new(
        tap: Arc<Tap>,
        tx_mode: TxMode,
        stats: Arc<NetStats>,
        queues: Vec<ActiveQueue>,
        a: Activation,
    ) -> Result<Self, ActivateError> {
        if queues.len() != 2 {
            return Err(ActivateError::QueueCount { want: 2, have: queues.len() });
        }
        let (queues, kicks) = queues.into_iter().map(|q| (q.queue, q.kick)).unzip();
        let io =
            FrameIo { tap, tx_mode, stats, segs: Vec::with_capacity(QUEUE_SIZE as usize), buf: vec![0; MAX_FRAME] };
        Ok(Worker {
            queues,
            kicks,
            mem: a.mem,
            interrupt: a.interrupt,
            activation_status: a.status,
            io,
            rx_staged: None,
            broken: false,
            poll: PollMode::Off,
            kicks_wanted: true,
            tx_blocked: false,
            throttles: Default::default(),
        })
    }

    fn run(&mut self, stop: &EventFd) {
        // SAFETY: pthread_self has no preconditions.
        self.io.stats.thread.store(unsafe { libc::pthread_self() } as u64, Ordering::Release);
        let epoll = match self.epoll(stop) {
            Ok(e) => e,
            Err(e) => return tracing::error!("virtio-net: cannot start its thread: {e}"),
        };
        let mut events = [EpollEvent::default(); 8];
        // Buffers may have been posted before the kicks were watched.
        self.process_tx();
        self.process_rx();
        let (stats, mut window) = (self.io.stats.clone(), PollWindow::default());
        loop {
            if !self.kicks_wanted {
                // Done polling: the driver must kick again, and a last look finds what it
                // queued while told not to.
                self.kicks_wanted = true;
                self.process_tx();
                self.process_rx();
            }
            window.sleeping(&stats.poll);
            let timeout = Throttle::sooner(self.throttles[RX].timeout_ms(), self.throttles[TX].timeout_ms());
            let n = match epoll.wait(timeout, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return tracing::error!("virtio-net: epoll failed: {e}"),
            };
            // A queue that waited for its rate limiter's tokens goes on.
            if self.throttles[TX].expired() {
                self.process_tx();
            }
            if self.throttles[RX].expired() {
                self.process_rx();
            }
            window.woke(self.poll, &stats.poll);
            self.kicks_wanted = !window.will_poll(self.poll);
            if !self.handle(&events[..n]) {
                return;
            }
            // Keep looking for a while before sleeping: kicks land on eventfds no one
            // waits on (cheap for KVM), frames are read as they come. The kick eventfds
            // and the tap stay in epoll, so what arrives after the last look wakes it.
            let (mode, look) = (self.poll, || self.poll_once(&epoll, &mut events));
            if !window.poll_while_working(mode, &stats.poll, stop, look) {
                return;
            }
        }
    }

    /// Does what epoll reported; false once the device is stopped.
    fn handle(&mut self, events: &[EpollEvent]) -> bool {
        for event in events {
            match event.data() {
                TOKEN_STOP => return false,
                TOKEN_TX_KICK => {
                    self.count_kicks(TX);
                    self.process_tx();
                }
                TOKEN_RX_KICK => {
                    self.count_kicks(RX);
                    self.process_rx();
                }
                _ => {
                    if event.event_set().contains(EventSet::OUT) {
                        self.tx_blocked = false;
                        self.process_tx();
                    }
                    if event.event_set().contains(EventSet::IN) {
                        self.process_rx();
                    }
                }
            }
        }
        true
    }

    /// One look at every source, in one system call: epoll without waiting (kicks, the
    /// tap's edges), then the rings the driver does not kick for while we poll. True if
    /// any had work (done here), or the device was stopped.
    fn poll_once(&mut self, epoll: &Epoll, events: &mut [EpollEvent]) -> bool {
        let before = self.io.stats.snapshot();
        let n = epoll.wait(0, events).unwrap_or(0);
        let stopped = !self.handle(&events[..n]);
        self.process_tx();
        if self.rx_staged.is_some() {
            self.process_rx();
        }
        let after = self.io.stats.snapshot();
        stopped
            || n > 0
            || (after.tx_frames, after.tx_dropped, after.rx_frames, after.rx_dropped, after.bad_chains)
                != (before.tx_frames, before.tx_dropped, before.rx_frames, before.rx_dropped, before.bad_chains)
    }

    fn epoll(&self, stop: &EventFd) -> std::io::Result<Epoll> {
        let epoll = Epoll::new()?;
        epoll.ctl(ControlOperation::Add, stop.as_raw_fd(), EpollEvent::new(EventSet::IN, TOKEN_STOP))?;
        epoll.ctl(ControlOperation::Add, self.kicks[RX].as_raw_fd(), EpollEvent::new(EventSet::IN, TOKEN_RX_KICK))?;
        epoll.ctl(ControlOperation::Add, self.kicks[TX].as_raw_fd(), EpollEvent::new(EventSet::IN, TOKEN_TX_KICK))?;
        let tap_events = EventSet::IN | EventSet::OUT | EventSet::EDGE_TRIGGERED;
        epoll.ctl(ControlOperation::Add, self.io.tap.as_raw_fd(), EpollEvent::new(tap_events, TOKEN_TAP))?;
        Ok(epoll)
    }

    fn count_kicks(&self, queue: usize) {
        if let Ok(n) = self.kicks[queue].read() {
            self.io.stats.kicks.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// A queue the driver broke (its rings left guest memory): stop and ask for a reset.
    fn fail(&mut self, what: &str) {
        if !self.broken {
            tracing::warn!("virtio-net: {what}; the device needs a reset");
            self.broken = true;
            self.activation_status.needs_reset(&self.interrupt);
        }
    }

    fn interrupt_if_needed(&mut self, queue: usize) {
        let irqs = &self.io.stats.irqs;
        if let Err(e) = super::interrupt_if_needed(&mut self.queues[queue], &self.mem, &self.interrupt, queue, irqs) {
            self.fail(e);
        }
    }

    fn process_tx(&mut self) {
        // Blocked: the tap's EPOLLOUT says when it takes frames again; trying before that
        // would gather (on the copy path, copy) a chain only to have it refused.
        if self.broken || self.tx_blocked || !self.queues[TX].ready() {
            return;
        }
        let mut used_any = false;
        loop {
            if self.queues[TX].disable_notification(&self.mem).is_err() {
                return self.fail("cannot write the TX queue's avail_event");
            }
            while let Some(chain) = self.queues[TX].pop_descriptor_chain(&self.mem) {
                let head = chain.head_index();
                let frame_len =
                    || chain.clone().map(|d| u64::from(d.len())).sum::<u64>().saturating_sub(VNET_HDR_LEN as u64);
                if !self.throttles[TX].admit(1, frame_len, &self.io.stats.tx_throttled) {
                    // Back on the avail ring until its tokens are back.
                    self.queues[TX].go_to_previous_position();
                    if used_any {
                        self.interrupt_if_needed(TX);
                    }
                    return;
                }
                match self.io.send(&self.mem, chain) {
                    Ok(()) => {}
                    Err(SendError::Full) => {
                        // The kernel did not take it: back on the avail ring, wait for EPOLLOUT.
                        self.queues[TX].go_to_previous_position();
                        self.tx_blocked = true;
                        if used_any {
                            self.interrupt_if_needed(TX);
                        }
                        return;
                    }
                    Err(SendError::Dropped) => {}
                }
                if self.queues[TX].add_used(&self.mem, head, 0).is_err() {
                    return self.fail("cannot write the TX used ring");
                }
                used_any = true;
            }
            match super::rearm_notifications(&mut self.queues[TX], &self.mem, self.kicks_wanted) {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => return self.fail(&format!("TX queue: {e}")),
            }
        }
        if used_any {
            self.interrupt_if_needed(TX);
        }
    }

    fn process_rx(&mut self) {
        if self.broken || !self.queues[RX].ready() {
            return;
        }
        let mut used_any = false;
        loop {
            let len = match self.rx_staged.take() {
                Some(len) => len,
                None => match self.io.tap.read_frame(&mut self.io.buf) {
                    Ok(len) if len > VNET_HDR_LEN => len,
                    Ok(_) => continue,
                    Err(_) => break, // WouldBlock: the tap is drained (edge-triggered)
                },
            };
            let frame_len = || (len - VNET_HDR_LEN) as u64;
            if !self.throttles[RX].admit(1, frame_len, &self.io.stats.rx_throttled) {
                // Kept until its tokens are back; the tap holds the frames after it.
                self.rx_staged = Some(len);
                break;
            }
            // num_buffers = 1: the tap leaves that field of the header to us.
            self.io.buf[10..12].copy_from_slice(&1u16.to_le_bytes());
            let Some(chain) = self.queues[RX].pop_descriptor_chain(&self.mem) else {
                self.rx_staged = Some(len);
                match super::rearm_notifications(&mut self.queues[RX], &self.mem, self.kicks_wanted) {
                    Ok(true) => continue,
                    Ok(false) => break, // wait for the driver's kick, or the next look
                    Err(e) => return self.fail(&format!("RX queue: {e}")),
                }
            };
            let head = chain.head_index();
            let io = &mut self.io;
            let written = match chain::segments(chain, &self.mem, true, usize::MAX, &mut io.segs) {
                Ok(room) if room >= len => chain::scatter(&self.mem, &io.segs, &io.buf[..len]),
                Ok(_) => {
                    io.stats.rx_dropped.fetch_add(1, Ordering::Relaxed);
                    0
                }
                Err(e) => {
                    io.bad_chain("RX", e);
                    0
                }
            };
            if written > 0 {
                io.stats.rx_frames.fetch_add(1, Ordering::Relaxed);
            }
            if self.queues[RX].add_used(&self.mem, head, written as u32).is_err() {
                return self.fail("cannot write the RX used ring");
            }
            used_any = true;
        }
        if used_any {
            self.interrupt_if_needed(RX);
        }
    }
}

/// One pass of the device thread's work, without the thread: the TX queue, then the RX
/// queue (the fuzz target's entry into the queue processing).
#[doc(hidden)]
pub fn process_once(tap: Tap, tx_mode: TxMode, queues: Vec<ActiveQueue>, a: Activation) -> NetCounters {
    let stats = Arc::new(NetStats::default());
    if let Ok(mut worker) = Worker::new(Arc::new(tap), tx_mode, stats.clone(), queues, a) {
        worker.process_tx();
        worker.process_rx();
    }
    stats.snapshot()
}

impl FrameIo {
    fn bad_chain(&self, queue: &str, e: ChainError) {
        if self.stats.bad_chains.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!("virtio-net: dropped a {queue} chain: {e} (further ones are only counted)");
        }
    }

    fn send(
        &mut self,
        mem: &GuestMemoryMmap,
        chain: virtio_queue::DescriptorChain<&GuestMemoryMmap>,
    ) -> Result<(), SendError> {
        let len = match chain::segments(chain, mem, false, MAX_FRAME, &mut self.segs) {
            Ok(len) if len > VNET_HDR_LEN => len,
            Ok(_) => {
                self.stats.tx_dropped.fetch_add(1, Ordering::Relaxed);
                return Err(SendError::Dropped);
            }
            Err(e) => {
                self.bad_chain("TX", e);
                self.stats.tx_dropped.fetch_add(1, Ordering::Relaxed);
                return Err(SendError::Dropped);
            }
        };
        let copy = self.tx_mode == TxMode::Copy || len < COPY_BELOW || self.segs.len() > MAX_IOVECS;
        let written = if copy {
            let start = crate::stats::cycles();
            let n = chain::gather(mem, &self.segs, &mut self.buf[..len]);
            self.stats.tx_copy_cycles.fetch_add(crate::stats::cycles() - start, Ordering::Relaxed);
            self.tap.write_frame(&[std::io::IoSlice::new(&self.buf[..n])])
        } else {
            let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_IOVECS];
            match chain::host_iovecs(mem, &self.segs, &mut iov) {
                Some(n) => {
                    // SAFETY: the iovecs point into slices of `mem`, which stays borrowed (so
                    // mapped) for this whole call; the kernel only reads them during writev.
                    let r = unsafe { libc::writev(self.tap.as_raw_fd(), iov.as_ptr(), n as i32) };
                    if r < 0 {
                        Err(std::io::Error::last_os_error())
                    } else {
                        Ok(r as usize)
                    }
                }
                None => Err(std::io::Error::other("a TX buffer left guest memory")),
            }
        };
        match written {
            Ok(_) => {
                self.stats.tx_frames.fetch_add(1, Ordering::Relaxed);
                self.stats.tx_bytes.fetch_add((len - VNET_HDR_LEN) as u64, Ordering::Relaxed);
                if copy {
                    self.stats.tx_copied.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Err(SendError::Full),
            Err(e) => {
                if self.stats.tx_dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!("virtio-net: the tap refused a frame: {e} (further ones are only counted)");
                }
                Err(SendError::Dropped)
            }
        }
    }
}

enum SendError {
    /// The tap's queue is full: try the same chain again later.
    Full,
    /// The chain was bad or the kernel refused it: it goes back used, unsent.
    Dropped,
}
