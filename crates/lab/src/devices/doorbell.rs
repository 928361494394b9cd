//! The doorbell: a device that only counts rings, reachable through a port-I/O register
//! and an MMIO register, so the cost of each way of delivering a guest write shows alone.
//!
//! Registers (same layout in both windows): offset 0, ring (any write adds one);
//! offset 8, the ring count (an 8-byte MMIO read, or two 4-byte port reads at 8 and 12).
//! A ring can also arrive through an eventfd signalled by KVM (an ioeventfd), through
//! KVM's coalesced ring, or from a host thread; `count` includes them all.

use exitless_vmm::bus::{BusDevice, DeviceId};
use exitless_vmm::pci::config::{COMMAND, COMMAND_IO, COMMAND_MEMORY};
use exitless_vmm::pci::{BarKind, BarSpec, ConfigSpace, PciFunction, PciIds};
use exitless_vmm::poll::{PollMode, PollStats, PollWindow, SharedPollMode};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

/// Bytes each register window spans.
pub const DOORBELL_PIO_LEN: u64 = 16;
pub const DOORBELL_MMIO_LEN: u64 = 0x1000;
pub const RING: u64 = 0;
pub const COUNT: u64 = 8;

#[derive(Default)]
pub struct Doorbell {
    rings: AtomicU64,
    /// Eventfds KVM signals for this doorbell; read on `count` so it is exact.
    eventfds: Mutex<Vec<Arc<EventFd>>>,
}

impl Doorbell {
    pub fn ring(&self, n: u64) {
        self.rings.fetch_add(n, Ordering::Relaxed);
    }

    /// Every ring so far, including those still waiting in an eventfd.
    pub fn count(&self) -> u64 {
        for fd in exitless_vmm::sync::lock(&self.eventfds).iter() {
            drain(fd, self);
        }
        self.rings.load(Ordering::Acquire)
    }

    pub fn reset(&self) {
        self.count();
        self.rings.store(0, Ordering::Release);
    }

    /// Adds an eventfd that KVM signals on a ring (see [`EventfdWorker`]).
    pub fn attach(&self, fd: Arc<EventFd>) {
        exitless_vmm::sync::lock(&self.eventfds).push(fd);
    }

    pub fn detach(&self, fd: &Arc<EventFd>) {
        drain(fd, self);
        exitless_vmm::sync::lock(&self.eventfds).retain(|f| !Arc::ptr_eq(f, fd));
    }
}

/// The doorbell as PCI function: BAR0 its MMIO registers, BAR1 its port-I/O registers,
/// at the addresses the VMM assigns, decode already enabled (as firmware would leave it).
/// BAR0: the MMIO ring register and count.
pub const MMIO_BAR: BarSpec = BarSpec { kind: BarKind::Memory32, size: DOORBELL_MMIO_LEN };
/// BAR1: the port-I/O ring register and count.
pub const PIO_BAR: BarSpec = BarSpec { kind: BarKind::Io, size: DOORBELL_PIO_LEN };

pub fn pci_function(bell: Arc<Doorbell>, mmio: (DeviceId, u64), pio: (DeviceId, u64)) -> PciFunction {
    let mut config = ConfigSpace::new(PciIds::exitless(0x0d00, [0xff, 0x00, 0x00]));
    config.set_bar(0, MMIO_BAR, mmio.1);
    config.set_bar(1, PIO_BAR, pio.1);
    let _ = config.add_capability(0x09, &[8, b'd', b'o', b'o', b'r', b'b', b'l']); // vendor-specific: length, tag
    config.write(COMMAND, &(COMMAND_IO | COMMAND_MEMORY).to_le_bytes());
    PciFunction::new("doorbell", config).with_bar(0, mmio.0, bell.clone()).with_bar(1, pio.0, bell)
}

/// Adds what an eventfd holds (the number of rings since the last read) to the count;
/// true if it held any. The count read by the vCPU may race the device thread to the
/// value: either adds it once.
fn drain(fd: &EventFd, doorbell: &Doorbell) -> bool {
    fd.read().map(|n| doorbell.ring(n)).is_ok()
}

impl BusDevice for Doorbell {
    fn read(&self, offset: u64, data: &mut [u8]) {
        let count = self.count().to_le_bytes();
        match offset.checked_sub(COUNT) {
            Some(at) if at as usize + data.len() <= count.len() => {
                data.copy_from_slice(&count[at as usize..][..data.len()])
            }
            _ => data.fill(0),
        }
    }

    fn write(&self, offset: u64, _data: &[u8]) {
        if offset == RING {
            self.ring(1);
        }
    }
}

/// The device thread of the ioeventfd wiring: waits on the doorbell's eventfds and adds
/// what each read returns (one read may carry many rings). After work it polls the
/// eventfds for a while before it sleeps again (crate::poll), so a ring that comes soon
/// wakes no one. The eventfds are level-triggered in epoll: a ring that lands between the
/// last poll and the sleep makes epoll return at once, so none is lost.
pub struct EventfdWorker {
    epoll: Arc<Epoll>,
    stop: Arc<AtomicBool>,
    wake: EventFd,
    /// The watched eventfds (the thread's own duplicates, so a poll never reads a closed
    /// descriptor), by the descriptor number the caller knows them by.
    sources: Arc<Mutex<Vec<(i32, EventFd)>>>,
    pub poll_mode: Arc<SharedPollMode>,
    pub poll_stats: Arc<PollStats>,
    thread: Option<JoinHandle<()>>,
}

/// Reads every source once; true if any had rings.
fn drain_all(sources: &Mutex<Vec<(i32, EventFd)>>, doorbell: &Doorbell) -> bool {
    exitless_vmm::sync::lock(sources).iter().fold(false, |found, (_, fd)| drain(fd, doorbell) | found)
}

impl EventfdWorker {
    pub fn spawn(doorbell: Arc<Doorbell>, mode: PollMode) -> std::io::Result<Self> {
        let epoll = Arc::new(Epoll::new()?);
        let wake = EventFd::new(libc::EFD_NONBLOCK)?;
        epoll.ctl(ControlOperation::Add, wake.as_raw_fd(), EpollEvent::new(EventSet::IN, u64::MAX))?;
        let stop = Arc::new(AtomicBool::new(false));
        let sources: Arc<Mutex<Vec<(i32, EventFd)>>> = Arc::default();
        let (poll_mode, poll_stats) = (Arc::new(SharedPollMode::new(mode)), Arc::new(PollStats::default()));
        let (epoll2, stop2, sources2) = (epoll.clone(), stop.clone(), sources.clone());
        let (mode2, stats2) = (poll_mode.clone(), poll_stats.clone());
        let thread = std::thread::Builder::new().name("doorbell".into()).spawn(move || {
            if !exitless_vmm::seccomp::confine_or_log(exitless_vmm::seccomp::ThreadKind::Device) {
                return;
            }
            let mut events = vec![EpollEvent::default(); 16];
            let mut window = PollWindow::default();
            while !stop2.load(Ordering::Acquire) {
                window.sleeping(&stats2);
                let Ok(n) = epoll2.wait(-1, &mut events) else { continue };
                if events[..n].iter().any(|e| e.data() != u64::MAX) {
                    window.woke(mode2.get(), &stats2);
                }
                drain_all(&sources2, &doorbell);
                while !stop2.load(Ordering::Relaxed)
                    && window.poll(mode2.get(), &stats2, || drain_all(&sources2, &doorbell))
                {}
            }
        })?;
        Ok(EventfdWorker { epoll, stop, wake, sources, poll_mode, poll_stats, thread: Some(thread) })
    }

    pub fn watch(&self, fd: &EventFd) -> std::io::Result<()> {
        let own = fd.try_clone()?;
        exitless_vmm::sync::lock(&self.sources).push((fd.as_raw_fd(), own));
        self.epoll.ctl(ControlOperation::Add, fd.as_raw_fd(), EpollEvent::new(EventSet::IN, fd.as_raw_fd() as u64))
    }

    pub fn unwatch(&self, fd: &EventFd) -> std::io::Result<()> {
        exitless_vmm::sync::lock(&self.sources).retain(|(raw, _)| *raw != fd.as_raw_fd());
        self.epoll.ctl(ControlOperation::Delete, fd.as_raw_fd(), EpollEvent::default())
    }

    /// CPU time the device thread has used (its pthread CPU clock).
    pub fn cpu_time(&self) -> Option<std::time::Duration> {
        use std::os::unix::thread::JoinHandleExt;
        // SAFETY: the worker's thread runs until the worker is dropped (it joins it).
        unsafe { exitless_vmm::poll::thread_cpu_time(self.thread.as_ref()?.as_pthread_t() as _) }
    }
}

impl Drop for EventfdWorker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.wake.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_from_every_source_add_up() {
        let bell = Arc::new(Doorbell::default());
        bell.write(RING, &[1]);
        bell.write(RING, &[0, 0, 0, 0]);
        bell.write(4, &[1]); // not the ring register
        let fd = Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
        bell.attach(fd.clone());
        fd.write(5).unwrap();
        assert_eq!(bell.count(), 7);
        let mut lo = [0u8; 4];
        bell.read(COUNT, &mut lo);
        assert_eq!(u32::from_le_bytes(lo), 7);
        let mut wide = [0xffu8; 8];
        bell.read(12, &mut wide); // runs past the register: zeros, no panic
        assert_eq!(wide, [0; 8]);
        bell.reset();
        assert_eq!(bell.count(), 0);
    }

    #[test]
    fn the_worker_counts_eventfd_signals() {
        let bell = Arc::new(Doorbell::default());
        let worker = EventfdWorker::spawn(bell.clone(), PollMode::Off).unwrap();
        let fd = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        worker.watch(&fd).unwrap();
        fd.write(3).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while bell.count() != 3 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(bell.count(), 3);
        worker.unwatch(&fd).unwrap();
        drop(worker);
    }

    /// Rings `n` times from another thread at random moments around the poll window (spins
    /// of 0-150 us, now and then a sleep), so that many rings land while the worker is
    /// switching between polling and sleeping.
    fn ring_at_awkward_moments(fd: &EventFd, n: u64) {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i % 97 == 0 {
                // Well past any poll window, even when the worker waits for a core: it sleeps.
                std::thread::sleep(std::time::Duration::from_micros(2_000 + x % 3_000));
            } else {
                let until = std::time::Instant::now() + std::time::Duration::from_nanos(x % 150_000);
                while std::time::Instant::now() < until {
                    std::hint::spin_loop();
                }
            }
            fd.write(1).unwrap();
        }
    }

    fn wait_for(bell: &Doorbell, n: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while bell.rings.load(Ordering::Relaxed) != n && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn no_ring_is_lost_between_polling_and_sleeping_and_an_idle_worker_sleeps() {
        for mode in [PollMode::Adaptive, PollMode::Fixed(std::time::Duration::from_micros(50)), PollMode::Off] {
            let bell = Arc::new(Doorbell::default());
            let worker = EventfdWorker::spawn(bell.clone(), mode).unwrap();
            let fd = EventFd::new(libc::EFD_NONBLOCK).unwrap();
            worker.watch(&fd).unwrap();
            let n = 3000;
            ring_at_awkward_moments(&fd, n);
            // Counted by the worker alone (not `count`, which would read the eventfd itself).
            wait_for(&bell, n);
            assert_eq!(bell.rings.load(Ordering::Relaxed), n, "{mode:?}");
            // Past the last ring's window the worker sleeps again (a loaded host may hold
            // it up; then it took many rings in one read).
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while worker.poll_stats.counts().sleeps < 2 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let c = worker.poll_stats.counts();
            assert!(c.sleeps > 1 && c.wakeups > 0, "{mode:?}: {c:?}");
            if mode == PollMode::Off {
                assert_eq!((c.polls_found_work, c.idle_poll_us), (0, 0), "{c:?}");
            }
            // Idle: within the bound the thread is asleep and uses no CPU.
            std::thread::sleep(std::time::Duration::from_millis(50));
            let before = worker.cpu_time().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(300));
            let used = worker.cpu_time().unwrap() - before;
            assert!(used < std::time::Duration::from_millis(3), "{mode:?}: {used:?} of CPU while idle");
            worker.unwatch(&fd).unwrap();
        }
    }

    #[test]
    fn a_ring_during_the_poll_window_is_found_without_a_wakeup() {
        let bell = Arc::new(Doorbell::default());
        // A window no preemption outlasts: the second ring lands in it however late.
        let worker = EventfdWorker::spawn(bell.clone(), PollMode::Fixed(std::time::Duration::from_secs(60))).unwrap();
        let fd = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        worker.watch(&fd).unwrap();
        fd.write(1).unwrap(); // wakes it; it then polls for 60 s
        wait_for(&bell, 1);
        std::thread::sleep(std::time::Duration::from_millis(20));
        fd.write(1).unwrap(); // lands in the window
        wait_for(&bell, 2);
        // The poller counts what it found just after handling it: on a loaded host the
        // second ring can be visible before its count is.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while worker.poll_stats.counts().polls_found_work == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let c = worker.poll_stats.counts();
        assert_eq!((bell.rings.load(Ordering::Relaxed), c.polls_found_work, c.wakeups), (2, 1, 1), "{c:?}");
        // The worker polls on, and looks at its stop flag only between windows: a last
        // ring ends this one, so that dropping it does not wait out the minute.
        worker.poll_mode.set(PollMode::Off);
        fd.write(1).unwrap();
        wait_for(&bell, 3);
    }
}
