//! virtio-rng (entropy device, type 4): one queue of device-writable buffers, filled
//! with bytes from the host's getrandom(2) straight into guest memory, on a device thread
//! woken by the queue's ioeventfd. Firecracker's `PUT /entropy` rate limiter holds back
//! requests (one operation and its length in bytes each) until their tokens are back.

use super::chain::{self, Segment};
use super::event_loop;
use super::thread::{DeviceThread, QueuePosition};
use super::{ActivateError, Activation, ActiveQueue, Interrupt, VirtioDevice};
use super::{VIRTIO_F_EVENT_IDX, VIRTIO_F_VERSION_1};
use crate::device_manager::{Attach, DeviceError, DeviceKind, DeviceManager};
use crate::guest_memory::GuestMemoryMmap;
use crate::rate_limiter::{LimiterSlot, Limits, Throttle};
use crate::seccomp::ThreadKind;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vmm_sys_util::eventfd::EventFd;

const QUEUE_SIZE: u16 = 256;
/// The most one request is given (Firecracker fills at most 64 KiB per buffer too): a
/// guest asking for more gets this much, as the spec allows.
pub const MAX_REQUEST: usize = 64 << 10;

pub const KIND: DeviceKind = DeviceKind("virtio-rng");
const MAX_SEGMENTS: usize = 16;

/// What the report and the API read while the device runs.
#[derive(Default)]
pub struct RngStats {
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
    /// Chains refused: outside guest memory, not device-writable, or unterminated.
    pub bad_chains: AtomicU64,
    pub kicks: AtomicU64,
    pub irqs: AtomicU64,
    /// Times a request waited for the rate limiter's tokens.
    pub throttled: AtomicU64,
}

pub struct VirtioRng {
    limits: Arc<LimiterSlot>,
    pub stats: Arc<RngStats>,
    thread: DeviceThread<Worker>,
}

impl VirtioRng {
    /// An entropy device; its thread starts now, idle until the driver activates it.
    pub fn new(limits: Limits) -> std::io::Result<Self> {
        Ok(VirtioRng {
            limits: Arc::new(LimiterSlot::new(limits)),
            stats: Arc::default(),
            thread: DeviceThread::spawn("virtio-rng", ThreadKind::Entropy)?,
        })
    }

    /// Where the limits are changed from (PATCH /entropy has no such call in Firecracker,
    /// but the slot keeps the device like the others).
    pub fn limiter_slot(&self) -> Arc<LimiterSlot> {
        self.limits.clone()
    }
}

impl VirtioDevice for VirtioRng {
    fn device_type(&self) -> u16 {
        4
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | VIRTIO_F_EVENT_IDX
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE]
    }

    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        // virtio-rng has no configuration space.
        data.fill(0);
    }

    fn activate(&mut self, queues: Vec<ActiveQueue>, a: Activation) -> Result<(), ActivateError> {
        self.thread.stop();
        let Ok([q]) = <[ActiveQueue; 1]>::try_from(queues) else {
            return Err(ActivateError::QueueCount { want: 1, have: 0 });
        };
        let worker = Worker {
            queue: q.queue,
            kick: q.kick,
            mem: a.mem,
            interrupt: a.interrupt,
            status: a.status,
            stats: self.stats.clone(),
            throttle: Throttle::new(self.limits.clone()),
            segs: Vec::with_capacity(MAX_SEGMENTS),
            broken: false,
        };
        self.thread.start(worker)
    }

    fn reset(&mut self) {
        self.thread.stop();
    }

    fn pause(&mut self) -> Option<Vec<QueuePosition>> {
        // A request is filled and used in one pass: none is in flight.
        self.thread.pause()
    }

    fn resume(&mut self) -> Result<(), ActivateError> {
        self.thread.resume()
    }
}

struct Worker {
    queue: Queue,
    kick: Arc<EventFd>,
    mem: GuestMemoryMmap,
    interrupt: Arc<Interrupt>,
    status: Arc<super::DeviceStatus>,
    stats: Arc<RngStats>,
    throttle: Throttle,
    segs: Vec<Segment>,
    broken: bool,
}

impl event_loop::LimitedQueue for Worker {
    const NAME: &'static str = "virtio-rng";

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

impl Worker {
    /// A queue the driver broke (its rings left guest memory): stop and ask for a reset.
    fn fail(&mut self, what: &str) {
        self.status.break_once(&mut self.broken, "virtio-rng", what, &self.interrupt);
    }

    /// Fills every buffer the driver posted (as its limits allow), then rearms the kick.
    fn process(&mut self) {
        if self.broken || !self.queue.ready() {
            return;
        }
        let mut used_any = false;
        loop {
            if self.queue.disable_notification(&self.mem).is_err() {
                return self.fail("cannot write its avail_event");
            }
            while let Some(chain) = self.queue.pop_descriptor_chain(&self.mem) {
                let head = chain.head_index();
                let want = || chain.clone().map(|d| u64::from(d.len())).sum::<u64>().min(MAX_REQUEST as u64);
                if !self.throttle.admit(1, want, &self.stats.throttled) {
                    // Back on the avail ring until its tokens are back.
                    self.queue.go_to_previous_position();
                    return self.finish(used_any);
                }
                let written = match chain::segments(chain, &self.mem, true, usize::MAX, &mut self.segs) {
                    Ok(_) => self.fill(),
                    Err(e) => {
                        self.stats.bad_chains.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!("virtio-rng: {e}");
                        0
                    }
                };
                if self.queue.add_used(&self.mem, head, written).is_err() {
                    return self.fail("cannot write its used ring");
                }
                self.stats.requests.fetch_add(1, Ordering::Relaxed);
                self.stats.bytes.fetch_add(u64::from(written), Ordering::Relaxed);
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

    fn finish(&mut self, used_any: bool) {
        if !used_any {
            return;
        }
        if let Err(e) = super::interrupt_if_needed(&mut self.queue, &self.mem, &self.interrupt, 0, &self.stats.irqs) {
            self.fail(e);
        }
    }

    /// getrandom(2) into the chain's buffers in guest memory, at most [`MAX_REQUEST`]
    /// bytes; returns how many were written.
    fn fill(&mut self) -> u32 {
        let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_SEGMENTS];
        let count = self.segs.len().min(MAX_SEGMENTS);
        let Some(n) = chain::host_iovecs(&self.mem, &self.segs[..count], &mut iov) else { return 0 };
        let mut written = 0usize;
        for v in &iov[..n] {
            let len = v.iov_len.min(MAX_REQUEST - written);
            if len == 0 {
                break;
            }
            // SAFETY: the iovec points into guest memory, checked by host_iovecs to hold
            // `iov_len` bytes, and `mem` (which keeps the mapping) lives through the call.
            let got = unsafe { libc::getrandom(v.iov_base, len, 0) };
            if got <= 0 {
                break;
            }
            written += got as usize;
            if (got as usize) < len {
                break;
            }
        }
        u32::try_from(written).unwrap_or(0)
    }
}

/// The virtio-rng device, for the API and the report.
pub struct EntropyHandle {
    pub stats: Arc<RngStats>,
    pub limits: Arc<LimiterSlot>,
}

/// An entropy device held to `limits`, attached as the machine is built.
pub fn attach(limits: Limits) -> Attach {
    Box::new(move |dm| dm.attach_rng(limits))
}

impl DeviceManager {
    /// A virtio-rng device (Firecracker's `PUT /entropy`), held to `limits`.
    pub fn attach_rng(&mut self, limits: Limits) -> Result<(), DeviceError> {
        let setup = |source| DeviceError::Setup { name: "virtio-rng".into(), source };
        let device = VirtioRng::new(limits).map_err(setup)?;
        let (stats, limits) = (device.stats.clone(), device.limiter_slot());
        let handle = EntropyHandle { stats, limits };
        self.attach_virtio("virtio-rng", KIND, Box::new(device), handle).map(drop)
    }

    /// The entropy device, if there is one.
    pub fn entropy(&self) -> Option<&EntropyHandle> {
        self.find()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_queue_no_config_and_the_entropy_type() {
        let rng = VirtioRng::new(Limits::default()).unwrap();
        assert_eq!(rng.device_type(), 4);
        assert_eq!(rng.queue_max_sizes(), [QUEUE_SIZE]);
        let mut config = [0xffu8; 8];
        rng.read_config(0, &mut config);
        assert_eq!(config, [0; 8]);
        assert_ne!(rng.features() & VIRTIO_F_VERSION_1, 0);
    }

    /// Issue 53, item 3: a buffer in hotpluggable memory the guest never plugged is a bad
    /// chain: used with nothing written, counted, and the next buffer is served.
    #[test]
    fn a_buffer_in_unplugged_memory_is_refused_counted_and_the_device_goes_on() {
        use crate::testing::{activation, DriverQueue};
        use vm_memory::{Bytes, GuestAddress};
        const HP: u64 = 16 << 20;
        let ram = crate::guest_memory::anonymous(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let mem = crate::guest_memory::with_hotplug(&ram, GuestAddress(HP), 2 << 20, 64 << 10, 1 << 20).unwrap();
        let mut q = DriverQueue::new(0);
        q.post(&mem, &[(HP, 4096, true)]);
        q.post(&mem, &[(0x30000, 64, true), (HP + (1 << 20), 64, true)]);
        q.post(&mem, &[(0x30000, 64, true)]);
        let a = activation(&mem);
        let stats = Arc::new(RngStats::default());
        let mut worker = Worker {
            queue: q.device_queue(),
            kick: Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()),
            mem: mem.clone(),
            interrupt: a.interrupt,
            status: a.status,
            stats: stats.clone(),
            throttle: Throttle::new(Arc::new(LimiterSlot::new(Limits::default()))),
            segs: Vec::new(),
            broken: false,
        };
        worker.process();
        assert_eq!(q.used(&mem), 3, "every chain used");
        // The used ring's lengths (DriverQueue 0's used ring is at 0x11000).
        let len = |i: u64| mem.read_obj::<u32>(GuestAddress(0x11000 + 4 + 8 * i + 4)).unwrap();
        assert_eq!([len(0), len(1), len(2)], [0, 0, 64]);
        assert_eq!(stats.bad_chains.load(Ordering::Relaxed), 2);
        assert!(!worker.broken, "the device goes on");
    }
}
