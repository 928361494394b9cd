//! Stand-ins for KVM in unit tests: they record what would have been asked of it.

use crate::guest_memory::GuestMemoryMmap;
use crate::ioeventfd::{IoeventfdKey, IoeventfdSink};
use crate::irq::GsiRouter;
use crate::irq::{IrqError, IrqLevel, IrqSink, MsiMessage, Route};
use crate::kvm::MemslotSink;
use crate::pci::msix::Msix;
use crate::virtio::mmio::page::RegisterPage;
use crate::virtio::mmio::{RegisterMode, VirtioMmio};
use crate::virtio::pci::VirtioPci;
use crate::virtio::{ActivateError, Activation, ActiveQueue, VirtioDevice, VIRTIO_F_EVENT_IDX, VIRTIO_F_VERSION_1};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use virtio_queue::QueueT;
use vm_memory::{Address, Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

/// True where /dev/kvm works; otherwise says loudly that the calling test is skipped, or
/// fails it when `EXITLESS_REQUIRE_KVM=1` (CI, whose machines have KVM, sets it: a green
/// run must not be one that skipped the VMM).
pub fn kvm_or_skip(test: &str) -> bool {
    if crate::kvm::available() {
        return true;
    }
    skip_or_fail(test, "/dev/kvm is not available on this machine")
}

/// Says loudly that `test` did not run, or fails it where skipping is not allowed.
pub fn skip_or_fail(test: &str, why: &str) -> bool {
    assert!(
        std::env::var("EXITLESS_REQUIRE_KVM").as_deref() != Ok("1"),
        "{test}: {why}, and EXITLESS_REQUIRE_KVM=1 forbids skipping"
    );
    eprintln!("SKIPPED {test}: {why}; this test did not run");
    false
}

impl FakeKvm {
    /// The MSI routes of the last routing table.
    pub fn msi_routes(&self) -> Vec<(u32, MsiMessage)> {
        let routes = self.routes.lock().unwrap();
        routes.iter().filter_map(|&(g, r)| if let Route::Msi(m) = r { Some((g, m)) } else { None }).collect()
    }
}

#[derive(Default)]
pub struct FakeKvm {
    /// Every KVM_IOEVENTFD call: key and whether it assigned.
    pub ioeventfds: Mutex<Vec<(IoeventfdKey, bool)>>,
    /// Live read-only slots: (slot, gpa, size).
    pub slots: Mutex<Vec<(u32, u64, u64)>>,
    /// The last GSI routing table set.
    pub routes: Mutex<Vec<(u32, Route)>>,
    /// How many routing tables were set.
    pub route_updates: AtomicU64,
    /// GSIs with an irqfd.
    pub irqfds: Mutex<Vec<u32>>,
    /// Every legacy line change: (GSI, level).
    pub lines: Mutex<Vec<(u32, bool)>>,
}

impl IrqSink for FakeKvm {
    fn set_routes(&self, routes: &[(u32, Route)]) -> Result<(), IrqError> {
        *self.routes.lock().unwrap() = routes.to_vec();
        self.route_updates.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn register_irqfd(&self, _fd: &EventFd, gsi: u32) -> Result<(), IrqError> {
        self.irqfds.lock().unwrap().push(gsi);
        Ok(())
    }
}

impl IrqLevel for FakeKvm {
    fn set_level(&self, irq: u32, level: bool) {
        self.lines.lock().unwrap().push((irq, level));
    }
}

impl IoeventfdSink for FakeKvm {
    fn ioeventfd(&self, key: &IoeventfdKey, _: &EventFd, assign: bool) -> Result<(), i32> {
        self.ioeventfds.lock().unwrap().push((*key, assign));
        Ok(())
    }
}

impl MemslotSink for FakeKvm {
    fn set_slot(&self, slot: u32, gpa: u64, size: u64, _host: u64, _read_only: bool) -> std::io::Result<()> {
        let mut slots = self.slots.lock().unwrap();
        slots.retain(|s| s.0 != slot);
        if size > 0 {
            slots.push((slot, gpa, size));
        }
        Ok(())
    }
}

/// A virtio device that only counts the transport's activations and keeps the queues'
/// positions it was started with (a restore's must be the snapshot's).
#[derive(Default)]
pub struct RecordingDevice {
    pub activations: Arc<AtomicU64>,
    pub started_at: Arc<Mutex<Vec<crate::virtio::QueuePosition>>>,
}

impl VirtioDevice for RecordingDevice {
    fn device_type(&self) -> u16 {
        1
    }
    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | VIRTIO_F_EVENT_IDX
    }
    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![256, 256]
    }
    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0xab);
    }
    fn activate(&mut self, queues: Vec<ActiveQueue>, _activation: Activation) -> Result<(), ActivateError> {
        self.activations.fetch_add(1, Ordering::Relaxed);
        *self.started_at.lock().unwrap() = queues.iter().map(|q| crate::virtio::QueuePosition::of(&q.queue)).collect();
        Ok(())
    }
    fn reset(&mut self) {}
    fn pause(&mut self) -> Option<Vec<crate::virtio::QueuePosition>> {
        (self.activations.load(Ordering::Relaxed) > 0).then(|| self.started_at.lock().unwrap().clone())
    }
    fn resume(&mut self) -> Result<(), ActivateError> {
        Ok(())
    }
}

/// A virtio-pci transport (3 MSI-X vectors, routed nowhere) over `mem` around a
/// [`RecordingDevice`], and that device's activation count.
pub fn virtio_transport(mem: GuestMemoryMmap) -> (Arc<VirtioPci>, Arc<AtomicU64>) {
    let router = Arc::new(GsiRouter::new(Arc::new(FakeKvm::default())));
    let device = RecordingDevice::default();
    let activations = device.activations.clone();
    let msix = Msix::new(router, 3).expect("a fake router takes any route");
    let transport = VirtioPci::new(Box::new(device), mem, msix).expect("eventfds for the kicks");
    (Arc::new(transport), activations)
}

/// A virtio-mmio transport over `mem` around a [`RecordingDevice`], its registers served
/// as `mode` says (a mapped page in a stand-in slot), that device's activation count, and
/// the eventfd its interrupt line writes.
pub fn virtio_mmio_transport(
    mem: GuestMemoryMmap,
    mode: RegisterMode,
) -> (Arc<VirtioMmio>, Arc<AtomicU64>, Arc<EventFd>) {
    let device = RecordingDevice::default();
    let activations = device.activations.clone();
    let irqfd = Arc::new(EventFd::new(libc::EFD_NONBLOCK).expect("an eventfd for the line"));
    let page = (mode == RegisterMode::Mapped)
        .then(|| RegisterPage::map(Arc::new(FakeKvm::default()), 0, 0xd000_0000).expect("a page"));
    let transport = VirtioMmio::new(Box::new(device), mem, irqfd.clone(), page).expect("eventfds for the kicks");
    (Arc::new(transport), activations, irqfd)
}

/// A bus device with a 4 KiB scratch register file: what PCI tests and the config-space
/// fuzz target put behind BARs.
#[derive(Default)]
pub struct ScratchDevice {
    bytes: Mutex<Vec<u8>>,
}

impl crate::bus::BusDevice for ScratchDevice {
    fn read(&self, offset: u64, data: &mut [u8]) {
        let bytes = crate::sync::lock(&self.bytes);
        for (i, b) in data.iter_mut().enumerate() {
            *b = usize::try_from(offset).ok().and_then(|o| bytes.get(o + i)).copied().unwrap_or(0);
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        let mut bytes = crate::sync::lock(&self.bytes);
        let Ok(start) = usize::try_from(offset) else { return };
        let end = start.saturating_add(data.len()).min(0x1000);
        if start < end {
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            bytes[start..end].copy_from_slice(&data[..end - start]);
        }
    }
}

/// A PCI function with a 4 KiB memory BAR0 at `bar0` and a 16-port I/O BAR1 at `bar1`
/// (bus ids 0 and 1), both decoded; `side_effects` marks its config reads as having them.
pub fn two_bar_function(side_effects: bool, bar0: u64, bar1: u64) -> crate::pci::PciFunction {
    use crate::bus::DeviceId;
    use crate::pci::config::{COMMAND, COMMAND_IO, COMMAND_MEMORY};
    use crate::pci::{BarKind, BarSpec, ConfigSpace, PciFunction, PciIds};
    let ids =
        PciIds { vendor: 0xe1e5, device: 0xd00, class: [0xff, 0, 0], revision: 1, subsystem_vendor: 0, subsystem: 0 };
    let mut config = ConfigSpace::new(ids);
    config.set_bar(0, BarSpec { kind: BarKind::Memory32, size: 0x1000 }, bar0);
    config.set_bar(1, BarSpec { kind: BarKind::Io, size: 16 }, bar1);
    let command = (COMMAND_IO | COMMAND_MEMORY).to_le_bytes();
    config.write(COMMAND, &command);
    let device = Arc::new(ScratchDevice::default());
    let mut f =
        PciFunction::new("scratch", config).with_bar(0, DeviceId(0), device.clone()).with_bar(1, DeviceId(1), device);
    f.read_side_effects = side_effects;
    f
}

/// The size of a [`DriverQueue`].
const QSIZE: u16 = 16;

/// A driver's view of one split queue of 16 entries, its rings at 64 KiB + 8 KiB per `index`,
/// for devices driven without a transport.
pub struct DriverQueue {
    base: u64,
    next_desc: u16,
    avail: u16,
}

impl DriverQueue {
    pub fn new(index: usize) -> DriverQueue {
        DriverQueue { base: 0x10000 + 0x2000 * index as u64, next_desc: 0, avail: 0 }
    }

    pub fn device_queue(&self) -> virtio_queue::Queue {
        let mut q = virtio_queue::Queue::new(QSIZE).unwrap();
        q.set_size(QSIZE);
        q.set_desc_table_address(Some(self.base as u32), Some(0));
        q.set_avail_ring_address(Some((self.base + 0x800) as u32), Some(0));
        q.set_used_ring_address(Some((self.base + 0x1000) as u32), Some(0));
        q.set_ready(true);
        q
    }

    /// Posts a chain of (addr, len, device-writable) buffers; returns its head.
    pub fn post(&mut self, mem: &GuestMemoryMmap, bufs: &[(u64, u32, bool)]) -> u16 {
        let head = self.next_desc;
        for (i, &(addr, len, writable)) in bufs.iter().enumerate() {
            let at = GuestAddress(self.base + 16 * u64::from(self.next_desc));
            write_descriptor(mem, at, (addr, len, writable), i + 1 == bufs.len(), self.next_desc + 1);
            self.next_desc += 1;
        }
        self.publish(mem, head)
    }

    /// Posts one descriptor pointing at an indirect table, written at `table`, of the
    /// (addr, len, device-writable) buffers chained in order; returns its head.
    pub fn post_indirect(&mut self, mem: &GuestMemoryMmap, table: u64, bufs: &[(u64, u32, bool)]) -> u16 {
        for (i, &(addr, len, writable)) in bufs.iter().enumerate() {
            let at = GuestAddress(table + 16 * i as u64);
            write_descriptor(mem, at, (addr, len, writable), i + 1 == bufs.len(), i as u16 + 1);
        }
        let head = self.next_desc;
        let at = GuestAddress(self.base + 16 * u64::from(head));
        mem.write_obj(table, at).unwrap();
        mem.write_obj(16 * bufs.len() as u32, at.unchecked_add(8)).unwrap();
        mem.write_obj(4u16, at.unchecked_add(12)).unwrap(); // VIRTQ_DESC_F_INDIRECT
        mem.write_obj(0u16, at.unchecked_add(14)).unwrap();
        self.next_desc += 1;
        self.publish(mem, head)
    }

    /// Puts the chain at `head` on the available ring; returns `head`.
    fn publish(&mut self, mem: &GuestMemoryMmap, head: u16) -> u16 {
        let slot = GuestAddress(self.base + 0x800 + 4 + 2 * u64::from(self.avail % QSIZE));
        mem.write_obj(head, slot).unwrap();
        self.avail += 1;
        mem.write_obj(self.avail, GuestAddress(self.base + 0x800 + 2)).unwrap();
        head
    }

    pub fn used(&self, mem: &GuestMemoryMmap) -> u16 {
        mem.read_obj(GuestAddress(self.base + 0x1000 + 2)).unwrap()
    }
}

/// One split-ring descriptor at `at`: a buffer, chained to `next` unless it is the `last`.
fn write_descriptor(
    mem: &GuestMemoryMmap,
    at: GuestAddress,
    (addr, len, writable): (u64, u32, bool),
    last: bool,
    next: u16,
) {
    let flags = (if last { 0u16 } else { 1 }) | (if writable { 2 } else { 0 });
    mem.write_obj(addr, at).unwrap();
    mem.write_obj(len, at.unchecked_add(8)).unwrap();
    mem.write_obj(flags, at.unchecked_add(12)).unwrap();
    mem.write_obj(next, at.unchecked_add(14)).unwrap();
}

/// A device's activation on `mem`: an interrupt line nobody listens to.
pub fn activation(mem: &GuestMemoryMmap) -> Activation {
    let interrupt = crate::virtio::Interrupt {
        isr: Default::default(),
        signalled: Default::default(),
        delivery: crate::virtio::Delivery::Line {
            irqfd: Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()),
            mirror: None,
        },
    };
    Activation {
        mem: mem.clone(),
        features: 0,
        interrupt: Arc::new(interrupt),
        status: Arc::default(),
        restored: false,
    }
}
