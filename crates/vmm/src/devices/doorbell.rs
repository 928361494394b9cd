//! The doorbell: a device that only counts rings, reachable through a port-I/O register
//! and an MMIO register, so the cost of each way of delivering a guest write shows alone.
//!
//! Registers (same layout in both windows): offset 0, ring (any write adds one);
//! offset 8, the ring count (an 8-byte MMIO read, or two 4-byte port reads at 8 and 12).
//! A ring can also arrive through an eventfd signalled by KVM (an ioeventfd), through
//! KVM's coalesced ring, or from a host thread; `count` includes them all.

use crate::bus::{BusDevice, DeviceId};
use crate::pci::config::{COMMAND, COMMAND_IO, COMMAND_MEMORY};
use crate::pci::{BarKind, BarSpec, ConfigSpace, PciFunction, PciIds};
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
        for fd in self.eventfds.lock().unwrap_or_else(|e| e.into_inner()).iter() {
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
        self.eventfds.lock().unwrap_or_else(|e| e.into_inner()).push(fd);
    }

    pub fn detach(&self, fd: &Arc<EventFd>) {
        drain(fd, self);
        self.eventfds.lock().unwrap_or_else(|e| e.into_inner()).retain(|f| !Arc::ptr_eq(f, fd));
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

/// Adds what an eventfd holds (the number of rings since the last read) to the count.
fn drain(fd: &EventFd, doorbell: &Doorbell) {
    if let Ok(n) = fd.read() {
        doorbell.ring(n);
    }
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
/// what each read returns (one read may carry many rings).
pub struct EventfdWorker {
    epoll: Arc<Epoll>,
    stop: Arc<AtomicBool>,
    wake: EventFd,
    thread: Option<JoinHandle<()>>,
}

impl EventfdWorker {
    pub fn spawn(doorbell: Arc<Doorbell>) -> std::io::Result<Self> {
        let epoll = Arc::new(Epoll::new()?);
        let wake = EventFd::new(libc::EFD_NONBLOCK)?;
        epoll.ctl(ControlOperation::Add, wake.as_raw_fd(), EpollEvent::new(EventSet::IN, u64::MAX))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (epoll2, stop2) = (epoll.clone(), stop.clone());
        let thread = std::thread::Builder::new().name("doorbell".into()).spawn(move || {
            if !crate::seccomp::confine_or_log(crate::seccomp::ThreadKind::Device) {
                return;
            }
            let mut events = vec![EpollEvent::default(); 16];
            while !stop2.load(Ordering::Acquire) {
                let Ok(n) = epoll2.wait(-1, &mut events) else { continue };
                for event in &events[..n] {
                    if event.data() != u64::MAX {
                        // The count read by the vCPU may race us to the value; either adds it once.
                        let mut value = 0u64;
                        // SAFETY: reading 8 bytes from an eventfd into a u64 we own.
                        let r = unsafe { libc::read(event.data() as i32, (&mut value as *mut u64).cast(), 8) };
                        if r == 8 {
                            doorbell.ring(value);
                        }
                    }
                }
            }
        })?;
        Ok(EventfdWorker { epoll, stop, wake, thread: Some(thread) })
    }

    pub fn watch(&self, fd: &EventFd) -> std::io::Result<()> {
        self.epoll.ctl(ControlOperation::Add, fd.as_raw_fd(), EpollEvent::new(EventSet::IN, fd.as_raw_fd() as u64))
    }

    pub fn unwatch(&self, fd: &EventFd) -> std::io::Result<()> {
        self.epoll.ctl(ControlOperation::Delete, fd.as_raw_fd(), EpollEvent::default())
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
        let worker = EventfdWorker::spawn(bell.clone()).unwrap();
        let fd = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        worker.watch(&fd).unwrap();
        fd.write(3).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while bell.count() != 3 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(bell.count(), 3);
        worker.unwatch(&fd).unwrap();
        drop(worker);
    }
}
