//! What every virtio transport does the same way, whichever registers carry it (PCI's
//! common configuration, MMIO's register page): the device behind it, the features the
//! driver negotiated, each queue's registers, the status machine (virtio 1.2 2.1), and
//! activation on DRIVER_OK. A transport owns one [`Core`]: a [`Transport`] behind its lock
//! and the [`Link`] beside it, the parts device threads and interrupt paths reach without
//! the lock.

use super::{ActivateError, Activation, ActiveQueue, DeviceStatus, Interrupt, InterruptMirror, QueuePosition};
use super::{VirtioDevice, NO_VECTOR};
use super::{STATUS_DRIVER_OK, STATUS_FEATURES_OK, STATUS_NEEDS_RESET, VIRTIO_F_EVENT_IDX, VIRTIO_F_VERSION_1};
use crate::guest_memory::GuestMemoryMmap;
use crate::pci::msix::Msix;
use std::sync::atomic::{AtomicU64, AtomicU8};
use std::sync::{Arc, Mutex};
use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::EventFd;

/// What the driver wrote for one queue.
#[derive(Clone, Copy, Default)]
pub struct QueueRegs {
    pub max: u16,
    pub size: u16,
    pub enabled: bool,
    pub desc: u64,
    pub driver: u64,
    pub device: u64,
    /// PCI's MSI-X vector for the queue (NO_VECTOR on MMIO).
    pub vector: u16,
}

impl QueueRegs {
    fn reset(max: u16) -> Self {
        QueueRegs { max, size: max, vector: NO_VECTOR, ..Default::default() }
    }
}

/// How the device's interrupts reach the guest.
#[derive(Clone)]
pub enum Lines {
    /// PCI: an MSI-X vector per queue and one for configuration changes.
    Msix(Arc<Mutex<Msix>>),
    /// MMIO: one interrupt line, the irqfd of its GSI.
    Line(Arc<EventFd>),
}

/// Where the transport's registers are shown to the driver without an exit (virtio-mmio's
/// read-only register page): refreshed, with the transport locked, after anything the
/// driver, the API or a restore changed, before the vCPU resumes or an interrupt goes out.
pub trait Mirror: InterruptMirror {
    fn refresh(&self, t: &Transport, link: &Link);
}

/// The transport's parts that live outside its lock.
pub struct Link {
    pub status: Arc<DeviceStatus>,
    /// The registers' read-only mirror, if the transport has one.
    pub mirror: Option<Arc<dyn Mirror>>,
    /// The interrupt of the running device (None before DRIVER_OK and after a reset).
    pub interrupt: Mutex<Option<Arc<Interrupt>>>,
    /// Each queue's notification eventfd (an ioeventfd where the guest kicks).
    pub kicks: Vec<Arc<EventFd>>,
    pub lines: Lines,
}

impl Link {
    pub fn new(queues: usize, lines: Lines, mirror: Option<Arc<dyn Mirror>>) -> std::io::Result<Self> {
        let kicks = (0..queues).map(|_| EventFd::new(libc::EFD_NONBLOCK).map(Arc::new)).collect::<Result<_, _>>()?;
        Ok(Link { status: Arc::default(), mirror, interrupt: Mutex::new(None), kicks, lines })
    }

    /// Shows `t` on the mirror, if any (`t` is this link's transport, locked).
    pub fn refresh(&self, t: &Transport) {
        if let Some(mirror) = &self.mirror {
            mirror.refresh(t, self);
        }
    }

    /// Interrupts the device has asked for since activation.
    pub fn interrupts_signalled(&self) -> u64 {
        crate::sync::lock(&self.interrupt)
            .as_ref()
            .map_or(0, |i| i.signalled.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// A transport's shared half, and what the device manager, snapshots and the API ask of
/// any transport.
pub struct Core {
    state: Mutex<Transport>,
    pub link: Link,
}

impl Core {
    pub fn new(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        lines: Lines,
        mirror: Option<Arc<dyn Mirror>>,
    ) -> std::io::Result<Core> {
        let state = Transport::new(device, mem);
        let link = Link::new(state.queues.len(), lines, mirror)?;
        link.refresh(&state);
        Ok(Core { state: Mutex::new(state), link })
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, Transport> {
        crate::sync::lock(&self.state)
    }

    pub fn status(&self) -> u8 {
        self.link.status.get()
    }

    /// The device's configuration changed under the driver (a drive's new backing file):
    /// a new config generation, and the configuration interrupt if the driver runs it.
    pub fn config_changed(&self) {
        self.lock().config_changed(&self.link);
    }

    /// Interrupts the device has asked for since activation.
    pub fn interrupts_signalled(&self) -> u64 {
        self.link.interrupts_signalled()
    }

    /// Stops the device's work (nothing in flight once this returns), for a snapshot.
    pub fn pause(&self) {
        let mut t = self.lock();
        if t.paused.is_none() {
            t.paused = Some(if t.active { t.device.pause() } else { None });
        }
    }

    /// Reads the transport: a device that runs must be paused first.
    pub fn save(&self) -> Result<TransportState, crate::persist::PersistError> {
        self.lock().save(&self.link)
    }

    /// After [`Core::pause`]: the device goes on where it stopped.
    pub fn resume(&self) -> Result<(), ActivateError> {
        let mut t = self.lock();
        match t.paused.take() {
            Some(_) => t.device.resume(),
            None => Ok(()),
        }
    }

    /// Puts a snapshot's state on this transport (with `vectors` MSI-X vectors), built from
    /// the same configuration and never run; [`Core::start_restored`] starts the device.
    pub fn restore(&self, s: &TransportState, vectors: usize) -> Result<(), crate::persist::StateFault> {
        let mut t = self.lock();
        let restored = t.restore(&self.link, s, vectors);
        self.link.refresh(&t);
        restored
    }

    /// Starts a restored device where its queues stood (nothing if it did not run).
    pub fn start_restored(&self) {
        let mut t = self.lock();
        t.start_restored(&self.link);
        self.link.refresh(&t);
    }
}

pub struct Transport {
    pub device: Box<dyn VirtioDevice>,
    pub mem: GuestMemoryMmap,
    pub device_feature_select: u32,
    pub driver_feature_select: u32,
    pub driver_features: u64,
    /// PCI's MSI-X vector for configuration changes (NO_VECTOR on MMIO).
    pub config_vector: u16,
    pub queue_select: u16,
    pub queues: Vec<QueueRegs>,
    pub active: bool,
    warned: bool,
    /// Bumped on every change of the device's configuration the driver did not make.
    pub config_generation: u8,
    /// A snapshot's queue positions and ISR, until the restored device starts.
    pub restored: Option<(Vec<QueuePosition>, u8)>,
    /// Paused for a snapshot, and where its queues stopped (None if it ran nothing).
    pub paused: Option<Option<Vec<QueuePosition>>>,
}

impl Transport {
    pub fn new(device: Box<dyn VirtioDevice>, mem: GuestMemoryMmap) -> Self {
        let queues = device.queue_max_sizes().into_iter().map(QueueRegs::reset).collect();
        Transport {
            device,
            mem,
            device_feature_select: 0,
            driver_feature_select: 0,
            driver_features: 0,
            config_vector: NO_VECTOR,
            queue_select: 0,
            queues,
            active: false,
            warned: false,
            config_generation: 0,
            restored: None,
            paused: None,
        }
    }

    /// The 32 feature bits the device offers at `device_feature_select`.
    pub fn device_features_word(&self) -> u32 {
        feature_word(self.device_feature_select, self.device.features())
    }

    /// The 32 feature bits the driver accepted at `driver_feature_select`.
    pub fn driver_features_word(&self) -> u32 {
        feature_word(self.driver_feature_select, self.driver_features)
    }

    /// The driver's 32 feature bits at `driver_feature_select`: fixed once FEATURES_OK is
    /// set; bits never offered are dropped.
    pub fn set_driver_features_word(&mut self, link: &Link, v: u32) {
        if self.driver_feature_select >= 2 || link.status.get() & STATUS_FEATURES_OK != 0 {
            return;
        }
        let shift = 32 * self.driver_feature_select;
        let word = (self.driver_features & !(0xffff_ffffu64 << shift)) | (u64::from(v) << shift);
        self.driver_features = word & self.device.features();
    }

    /// The selected queue's registers, if the driver may write them now (they are frozen
    /// once the device runs); a write that may not is reported once and dropped.
    pub fn writable_queue(&mut self, register: &str) -> Option<&mut QueueRegs> {
        let select = usize::from(self.queue_select);
        if self.active || select >= self.queues.len() {
            self.warn_once(format_args!("{register} written for queue {select} while not allowed"));
            return None;
        }
        self.queues.get_mut(select)
    }

    /// The selected queue's registers (a queue that does not exist reads as zeros).
    pub fn selected_queue(&self) -> QueueRegs {
        self.queues.get(usize::from(self.queue_select)).copied().unwrap_or_default()
    }

    /// QueueSize / QueueNum: a power of two up to the queue's maximum.
    pub fn set_queue_size(&mut self, v: u64) {
        let select = self.queue_select;
        let Some(q) = self.writable_queue("queue size") else { return };
        if v == 0 || v > u64::from(q.max) || !v.is_power_of_two() {
            return self.warn_once(format_args!("queue size {v} out of range for queue {select}"));
        }
        q.size = v as u16;
    }

    pub fn warn_once(&mut self, what: std::fmt::Arguments) {
        if !self.warned {
            self.warned = true;
            tracing::warn!("virtio: {what} (ignored; further driver errors are not reported)");
        }
    }

    /// A status write: 0 resets; otherwise the driver may only add bits (virtio 1.2
    /// 2.1.2), and the update is one atomic step so a NEEDS_RESET the device thread raises
    /// meanwhile is never lost.
    pub fn set_status(&mut self, link: &Link, v: u8) {
        if v == 0 {
            return self.reset(link);
        }
        let old = link.status.get();
        let driver_bits = old & !STATUS_NEEDS_RESET;
        if v & driver_bits != driver_bits {
            return self.warn_once(format_args!("driver cleared status bits ({old:#x} -> {v:#x})"));
        }
        let mut add = v & !old & !STATUS_NEEDS_RESET;
        if add & STATUS_FEATURES_OK != 0 && self.driver_features & VIRTIO_F_VERSION_1 == 0 {
            // A modern device needs VERSION_1: FEATURES_OK does not stick.
            let accepted = self.driver_features;
            self.warn_once(format_args!("driver accepted features {accepted:#x} without VERSION_1"));
            add &= !STATUS_FEATURES_OK;
        }
        let new = link.status.raise(add);
        tracing::debug!("virtio type {}: status {old:#x} -> {new:#x}", self.device.device_type());
        if new & STATUS_DRIVER_OK != 0 && new & STATUS_FEATURES_OK != 0 && !self.active {
            if let Err(e) = self.activate(link, None) {
                self.cannot_start(link, "start the device", e);
            }
        }
    }

    /// The device could not start on what the driver (or a snapshot) set up: NEEDS_RESET,
    /// and the configuration interrupt where the driver set one up, so that it notices.
    pub fn cannot_start(&self, link: &Link, what: &str, e: ActivateError) {
        tracing::warn!("virtio type {}: cannot {what}: {e}; it needs a reset", self.device.device_type());
        link.status.raise(STATUS_NEEDS_RESET);
        if let Some(i) = crate::sync::lock(&link.interrupt).as_ref() {
            i.signal_config();
        }
    }

    /// DRIVER_OK: builds the queues from what the driver wrote, checks them, and starts
    /// the device (synchronously, on this vCPU's exit); `at` says where each queue stands
    /// when the device goes on from a snapshot.
    pub fn activate(&mut self, link: &Link, at: Option<&[QueuePosition]>) -> Result<(), ActivateError> {
        let sizes: Vec<u16> = self.queues.iter().filter(|q| q.enabled).map(|q| q.size).collect();
        tracing::debug!(
            "virtio type {}: DRIVER_OK, features {:#x}, queue sizes {sizes:?}",
            self.device.device_type(),
            self.driver_features
        );
        let event_idx = self.driver_features & VIRTIO_F_EVENT_IDX != 0;
        let interrupt = Arc::new(Interrupt {
            isr: AtomicU8::new(0),
            signalled: AtomicU64::new(0),
            delivery: match &link.lines {
                Lines::Msix(msix) => super::Delivery::Msix {
                    msix: msix.clone(),
                    queue_vectors: self.queues.iter().map(|q| q.vector).collect(),
                    config_vector: self.config_vector,
                },
                Lines::Line(irqfd) => super::Delivery::Line {
                    irqfd: irqfd.clone(),
                    mirror: link.mirror.clone().map(|m| (m as Arc<dyn InterruptMirror>, link.status.clone())),
                },
            },
        });
        *crate::sync::lock(&link.interrupt) = Some(interrupt.clone());
        let mut active = Vec::new();
        for (i, regs) in self.queues.iter().enumerate() {
            let queue_error = |source| ActivateError::Queue { index: i, source };
            let mut queue = Queue::new(regs.max).map_err(queue_error)?;
            queue.try_set_size(regs.size).map_err(queue_error)?;
            queue.set_desc_table_address(Some(regs.desc as u32), Some((regs.desc >> 32) as u32));
            queue.set_avail_ring_address(Some(regs.driver as u32), Some((regs.driver >> 32) as u32));
            queue.set_used_ring_address(Some(regs.device as u32), Some((regs.device >> 32) as u32));
            queue.set_event_idx(event_idx);
            queue.set_ready(regs.enabled);
            if let Some(p) = at.and_then(|at| at.get(i)) {
                queue.set_next_avail(p.next_avail);
                queue.set_next_used(p.next_used);
            }
            if regs.enabled && !queue.is_valid(&self.mem) {
                return Err(ActivateError::RingsOutsideMemory(i));
            }
            active.push(ActiveQueue { queue, kick: link.kicks[i].clone() });
        }
        let (mem, features, status) = (self.mem.clone(), self.driver_features, link.status.clone());
        let activation = Activation { mem, features, interrupt, status, restored: at.is_some() };
        self.device.activate(active, activation)?;
        self.active = true;
        Ok(())
    }

    pub fn reset(&mut self, link: &Link) {
        tracing::debug!("virtio type {}: reset by the driver", self.device.device_type());
        self.device.reset();
        self.active = false;
        self.driver_features = 0;
        self.config_vector = NO_VECTOR;
        self.queue_select = 0;
        for q in &mut self.queues {
            *q = QueueRegs::reset(q.max);
        }
        link.status.set(0);
        *crate::sync::lock(&link.interrupt) = None;
    }

    /// The device's configuration changed under the driver (a drive's new backing file):
    /// a new config_generation, and the configuration-change interrupt if the driver runs it.
    pub fn config_changed(&mut self, link: &Link) {
        self.config_generation = self.config_generation.wrapping_add(1);
        link.refresh(self);
        if let Some(i) = crate::sync::lock(&link.interrupt).as_ref() {
            i.signal_config();
        }
    }

    /// Starts a restored device where its queues stood (nothing if it did not run). A
    /// device that cannot start asks the driver for a reset, as at DRIVER_OK.
    pub fn start_restored(&mut self, link: &Link) {
        let Some((positions, isr)) = self.restored.take() else { return };
        match self.activate(link, Some(&positions)) {
            Ok(()) => {
                if let Some(i) = crate::sync::lock(&link.interrupt).as_ref() {
                    i.isr.store(isr, std::sync::atomic::Ordering::Release);
                    if let Some(mirror) = &link.mirror {
                        mirror.raise(isr, link.status.get());
                    }
                }
            }
            Err(e) => self.cannot_start(link, "go on from the snapshot", e),
        }
    }
}

fn feature_word(select: u32, features: u64) -> u32 {
    if select < 2 {
        (features >> (32 * select)) as u32
    } else {
        0
    }
}

mod state;
pub use state::{QueueState, TransportState};
