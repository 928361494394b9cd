//! virtio 1.x (modern): the devices, and the two transports beneath them (PCI, as
//! exitless's own guests find devices; MMIO, as Firecracker's do), which share
//! `transport`'s status machine and activation.

pub mod balloon;
pub mod blk;
pub mod chain;
pub mod event_loop;
pub mod fs;
pub mod mem;
pub mod mmio;
pub mod net;
pub mod pci;
pub mod pmem;
pub mod rng;
pub mod thread;
pub mod transport;
pub mod vhost_user;
pub mod vsock;
pub mod vublk;

pub use thread::QueuePosition;

use crate::guest_memory::GuestMemoryMmap;
use crate::pci::msix::Msix;
use crate::persist::{Saved, StateFault};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use virtio_queue::Queue;
use vmm_sys_util::eventfd::EventFd;

pub const VIRTIO_F_INDIRECT_DESC: u64 = 1 << 28;
pub const VIRTIO_F_EVENT_IDX: u64 = 1 << 29;
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;

pub const STATUS_ACKNOWLEDGE: u8 = 1;
pub const STATUS_DRIVER: u8 = 2;
pub const STATUS_DRIVER_OK: u8 = 4;
pub const STATUS_FEATURES_OK: u8 = 8;
pub const STATUS_NEEDS_RESET: u8 = 0x40;
pub const STATUS_FAILED: u8 = 0x80;

/// The ISR's bits: a used buffer, a configuration change (virtio 1.2 4.1.4.5, 4.2.2).
pub const ISR_QUEUE: u8 = 1;
pub const ISR_CONFIG: u8 = 2;

/// "No MSI-X vector" in queue_msix_vector and msix_config.
pub const NO_VECTOR: u16 = 0xffff;

/// What a device type supplies; the transport does the rest.
pub trait VirtioDevice: Send {
    /// virtio device type (1 for net); the PCI device ID is 0x1040 plus this.
    fn device_type(&self) -> u16;
    fn features(&self) -> u64;
    fn queue_max_sizes(&self) -> Vec<u16>;
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// The driver writes its configuration at `offset`; false if that is not the driver's
    /// to write (most devices: none of it is).
    fn write_config(&mut self, _offset: u64, _data: &[u8]) -> bool {
        false
    }
    /// Starts the device on the driver's queues (DRIVER_OK).
    fn activate(&mut self, queues: Vec<ActiveQueue>, activation: Activation) -> Result<(), ActivateError>;
    /// Stops the device and forgets its queues (the driver wrote status 0).
    fn reset(&mut self);
    /// Stops the device for a snapshot with nothing in flight (every chain it took is on
    /// the used ring), keeping it to resume; each queue's position, or None if it does not
    /// run.
    fn pause(&mut self) -> Option<Vec<QueuePosition>>;
    /// Goes on after [`VirtioDevice::pause`] where it stopped.
    fn resume(&mut self) -> Result<(), ActivateError>;
    /// What the device holds beyond its queues' positions, for a snapshot taken paused
    /// (None: nothing): a typed, versioned state ([`crate::persist::DeviceState`]).
    fn save_state(&self) -> Result<Option<Saved>, StateFault> {
        Ok(None)
    }
    /// Puts a snapshot's [`VirtioDevice::save_state`] back before the restored activation
    /// (None: the snapshot saved none), read with [`Saved::decode`]; refused, naming the
    /// field, if it does not fit this device. A device that keeps state refuses None.
    fn restore_state(&mut self, state: Option<&Saved>) -> Result<(), StateFault> {
        match state {
            None => Ok(()),
            Some(_) => Err(StateFault::Unexpected),
        }
    }
}

/// Copies `config[offset..]` into `data` (zeros past its end), as every device's
/// `read_config` does.
pub fn copy_config(config: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Ok(start) = usize::try_from(offset) else { return };
    if let Some(rest) = config.get(start..) {
        let n = rest.len().min(data.len());
        data[..n].copy_from_slice(&rest[..n]);
    }
}

/// Why a device could not start on what the driver set up.
#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    #[error("queue {index} is not valid")]
    Queue { index: usize, source: virtio_queue::Error },
    #[error("queue {0}'s rings are not inside guest memory")]
    RingsOutsideMemory(usize),
    #[error("the device needs {want} queues, the driver set up {have}")]
    QueueCount { want: usize, have: usize },
    #[error("cannot start the device thread")]
    Thread(#[source] std::io::Error),
    /// A vhost-user device's backend failed (its device is marked failed).
    #[error("its backend failed: {0}")]
    Backend(String),
}

/// A queue as the driver set it up, with the eventfd its notifications arrive on.
pub struct ActiveQueue {
    pub queue: Queue,
    pub kick: Arc<EventFd>,
}

/// What an activated device needs besides its queues.
pub struct Activation {
    pub mem: GuestMemoryMmap,
    pub features: u64,
    pub interrupt: Arc<Interrupt>,
    pub status: Arc<DeviceStatus>,
    /// The device goes on from a snapshot taken in another VMM (its queues where they
    /// were; what lived only in that VMM, like vsock's connections, is gone).
    pub restored: bool,
}

/// The device status byte, shared so a device thread can raise NEEDS_RESET.
#[derive(Default)]
pub struct DeviceStatus(AtomicU8);

impl DeviceStatus {
    pub fn get(&self) -> u8 {
        self.0.load(Ordering::Acquire)
    }

    pub fn set(&self, v: u8) {
        self.0.store(v, Ordering::Release)
    }

    /// Sets `bits` atomically; returns the status after.
    pub fn raise(&self, bits: u8) -> u8 {
        self.0.fetch_or(bits, Ordering::AcqRel) | bits
    }

    /// A device thread gives up on what the driver set up: NEEDS_RESET, and a config
    /// interrupt so the driver notices.
    pub fn needs_reset(&self, interrupt: &Interrupt) {
        self.raise(STATUS_NEEDS_RESET);
        interrupt.signal_config();
    }

    /// A device thread found what the driver set up broken (`what`): said once and
    /// NEEDS_RESET raised once; `broken` remembers it, and the thread stops serving.
    pub fn break_once(&self, broken: &mut bool, device: &str, what: &str, interrupt: &Interrupt) {
        if !std::mem::replace(broken, true) {
            tracing::warn!("{device}: {what}; the device needs a reset");
            self.needs_reset(interrupt);
        }
    }
}

/// Whether the driver's avail index is at most a queue's worth ahead of the device.
/// virtio-queue refuses to pop past a bogus one, while `enable_notification` keeps
/// reporting "more": a device thread that did not check would spin on it forever.
pub fn avail_index_valid(queue: &Queue, mem: &GuestMemoryMmap) -> bool {
    use virtio_queue::QueueT;
    queue
        .avail_idx(mem, Ordering::Acquire)
        .is_ok_and(|idx| (idx - std::num::Wrapping(queue.next_avail())).0 <= queue.size())
}

/// A device thread has emptied `queue`. While it polls, the driver's notifications stay
/// off: its next look finds new buffers, and a kick would only signal an eventfd no one
/// waits on. Otherwise they are turned back on, and `Ok(true)` says buffers arrived in
/// between: look again, or they would wait for a kick the driver was told not to send.
pub fn rearm_notifications(queue: &mut Queue, mem: &GuestMemoryMmap, kicks_wanted: bool) -> Result<bool, &'static str> {
    use virtio_queue::QueueT;
    if !kicks_wanted {
        return Ok(false);
    }
    match queue.enable_notification(mem) {
        Ok(true) if avail_index_valid(queue, mem) => Ok(true),
        Ok(true) => Err("its avail index is not valid"),
        Ok(false) => Ok(false),
        Err(_) => Err("cannot write its avail_event"),
    }
}

/// After a device used chains of queue `index`: its interrupt, if the driver asked for
/// one (EVENT_IDX), counted in `irqs`. An unreadable used_event index is the driver's
/// fault, for the caller to report.
pub fn interrupt_if_needed(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    interrupt: &Interrupt,
    index: usize,
    irqs: &AtomicU64,
) -> Result<(), &'static str> {
    use virtio_queue::QueueT;
    match queue.needs_notification(mem) {
        Ok(true) => {
            irqs.fetch_add(1, Ordering::Relaxed);
            interrupt.signal_queue(index);
            Ok(())
        }
        Ok(false) => Ok(()),
        Err(_) => Err("cannot read the used_event index"),
    }
}

/// Interrupts from a device: the ISR bits (MMIO's InterruptStatus, PCI's ISR), set
/// before the interrupt is sent so a driver that reads them on it sees them, and the way
/// the interrupt is delivered.
pub struct Interrupt {
    pub isr: AtomicU8,
    /// Interrupts requested by the device (delivered or left pending by a mask).
    pub signalled: AtomicU64,
    pub delivery: Delivery,
}

pub enum Delivery {
    /// PCI: the queue's or the configuration's MSI-X vector.
    Msix { msix: Arc<Mutex<Msix>>, queue_vectors: Vec<u16>, config_vector: u16 },
    /// MMIO: the device's one line, an irqfd on its GSI (edge: one interrupt per write),
    /// and the register page that shows InterruptStatus without an exit, if mapped.
    Line { irqfd: Arc<EventFd>, mirror: Option<(Arc<dyn InterruptMirror>, Arc<DeviceStatus>)> },
}

/// Where a transport shows InterruptStatus (and the device status) to the driver without
/// an exit: virtio-mmio's read-only register page.
pub trait InterruptMirror: Send + Sync {
    /// `bits` were set in the ISR: shown before the interrupt goes out, so the driver's read
    /// on it sees why, with the device status (a device thread may have just raised
    /// NEEDS_RESET).
    fn raise(&self, bits: u8, status: u8);
    /// The device's configuration is now `config` (from offset 0).
    fn show_config(&self, config: &[u8]);
}

impl Interrupt {
    pub fn signal_queue(&self, queue: usize) {
        self.signal(Some(queue), ISR_QUEUE);
    }

    pub fn signal_config(&self) {
        self.signal(None, ISR_CONFIG);
    }

    /// A device thread changed its configuration to `config`: shown where the driver
    /// reads it without an exit, then the configuration interrupt. (Changes the VMM makes
    /// go through the transport, `Core::config_changed`, which also bumps the generation;
    /// a device thread must not take the transport's lock, held while it is stopped.)
    pub fn config_changed(&self, config: &[u8]) {
        self.show_config(config);
        self.signal_config();
    }

    /// A device thread's configuration is now `config`, a change the driver is not told
    /// of (virtio-mem's plugged_size, which its driver counts itself): shown where the
    /// driver reads it without an exit.
    pub fn show_config(&self, config: &[u8]) {
        if let Delivery::Line { mirror: Some((mirror, _)), .. } = &self.delivery {
            mirror.show_config(config);
        }
    }

    /// Queue `queue`'s interrupt, or the configuration's, for ISR bit `bit`.
    fn signal(&self, queue: Option<usize>, bit: u8) {
        self.isr.fetch_or(bit, Ordering::AcqRel);
        self.signalled.fetch_add(1, Ordering::Relaxed);
        match &self.delivery {
            Delivery::Msix { msix, queue_vectors, config_vector } => {
                let vector = match queue {
                    Some(q) => queue_vectors.get(q).copied().unwrap_or(NO_VECTOR),
                    None => *config_vector,
                };
                if vector != NO_VECTOR {
                    crate::sync::lock(msix).trigger(vector);
                }
            }
            Delivery::Line { irqfd, mirror } => {
                if let Some((mirror, status)) = mirror {
                    mirror.raise(bit, status.get());
                }
                if let Err(e) = irqfd.write(1) {
                    tracing::warn!("virtio: cannot raise the device's interrupt line: {e}");
                }
            }
        }
    }
}
