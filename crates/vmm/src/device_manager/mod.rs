//! The device manager: the one owner of the buses, the PCI root, every allocator (PCI
//! slots, BAR windows, ports, IOAPIC pins, memory slots; GSIs through the router), the
//! ioeventfd registry, and the list of every device with its name, kind, resources and
//! handle. It knows no device type by name: each device's own module attaches it through
//! the generic calls here (`attach_pio`, `attach_mmio`, `attach_pci`, `attach_virtio`),
//! names its kind and hands over what its users reach it by and its part of a snapshot
//! (device.rs); snapshots, hot-swap and the API reach devices through
//! [`DeviceManager::devices`], [`DeviceManager::find`] and [`DeviceManager::virtio_of`].

pub mod allocators;
mod device;
mod hotplug;
mod persist;
#[cfg(test)]
mod state_tests;
#[cfg(test)]
mod tests;
mod virtio;

pub use device::{BarRequest, Device, DeviceHandle, DeviceKind, DeviceName, PciPlacement, Resource, Saves};
pub use hotplug::{HotplugError, Unplug};
pub use persist::{DeviceRecord, DeviceTree};

use crate::memslots::{Memslots, NoMemslots};
pub use allocators::{AllocError, Allocators};
pub use virtio::{TransportKind, VirtioTransport};

use crate::bus::{BusDevice, BusError, BusSet, DeviceId, MmioAddress, PioAddress, SharedBuses};
use crate::guest_memory::GuestMemoryMmap;
use crate::ioeventfd::{IoeventfdLimits, IoeventfdRegistry, IoeventfdSink};
use crate::irq::{GsiRouter, IrqError, IrqLevel, IrqSink};
use crate::kvm::MemslotSink;
use crate::layout::{self, MemoryMap};
use crate::pci::cf8::{Cf8Device, CF8_LEN, CF8_PORT};
use crate::pci::ecam::{EcamPages, EcamShadow, ECAM_SIZE, SHADOW_MAX_SLOTS};
use crate::pci::ecam_device::EcamDevice;
use crate::pci::{EcamMode, PciError, PciFunction, PciRoot};
use crate::virtio::mmio::RegisterMode;
use std::sync::Arc;

/// The host bridge and the config access mechanisms: the PCI root's own.
pub const PCI_HOST_BRIDGE: DeviceKind = DeviceKind("pci-host-bridge");
pub const PCI_CONFIG_ACCESS: DeviceKind = DeviceKind("pci-config-access");

/// Attaches one device as a machine is built, made by the device's own module from its
/// configuration (`virtio::net::attach`) or by a lab (its devices at fixed places).
pub type Attach = Box<dyn FnOnce(&mut DeviceManager) -> Result<(), DeviceError>>;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("cannot place device {name}")]
    Bus {
        name: String,
        #[source]
        source: BusError,
    },
    #[error("cannot set up device {name}")]
    Setup {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} failed for device {name}")]
    Ioctl {
        name: &'static str,
        what: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error(transparent)]
    Alloc(#[from] AllocError),
    #[error(transparent)]
    Memslots(#[from] NoMemslots),
    #[error(transparent)]
    Irq(#[from] IrqError),
    #[error(transparent)]
    Ioeventfd(#[from] crate::ioeventfd::IoeventfdError),
    #[error(transparent)]
    Pci(#[from] PciError),
    /// What a device's own module refused (its tap, disk or file), in its words.
    #[error(transparent)]
    Backend(Box<dyn std::error::Error + Send + Sync>),
    /// What a device's own module refused, whose words do not name the device.
    #[error("cannot set up {name}")]
    Device {
        name: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The API named a device the machine does not have (`what`: "drive").
    #[error("the machine has no {what} {id}")]
    NoSuch { what: &'static str, id: String },
}

impl DeviceError {
    /// What a device's module refused, its cause kept.
    pub fn backend(e: impl std::error::Error + Send + Sync + 'static) -> DeviceError {
        DeviceError::Backend(Box::new(e))
    }
}

/// What the device manager asks of the VM: GSI routes and irqfds, line levels, ioeventfds
/// and read-only memory slots. KVM's `VmFd` in a machine; the fake KVM in unit tests.
pub trait VmDevices: IrqSink + IrqLevel + IoeventfdSink + MemslotSink {}

impl<T: IrqSink + IrqLevel + IoeventfdSink + MemslotSink> VmDevices for T {}

/// Where the device manager starts from.
pub struct DeviceManagerConfig {
    pub ioeventfd_limits: IoeventfdLimits,
    pub ecam: EcamMode,
    /// How virtio-mmio register windows are served (mapped only where the host allows).
    pub mmio_registers: RegisterMode,
    /// Whether 0xCF8/0xCFC config access exists (see `MachineConfig`).
    pub pci_config_io: bool,
    /// The transport virtio devices are attached over.
    pub transport: TransportKind,
    /// The ECAM window's pages, made before the VM (see EcamPages).
    pub ecam_pages: EcamPages,
    /// Guest memory's KVM memory slot numbering, for the memory devices map in.
    pub memslots: Arc<Memslots>,
}

pub struct DeviceManager {
    vm: Arc<dyn VmDevices>,
    memory: GuestMemoryMmap,
    buses: Arc<SharedBuses>,
    pci: Arc<PciRoot>,
    allocators: Allocators,
    gsi_router: Arc<GsiRouter>,
    ioeventfds: Arc<IoeventfdRegistry>,
    /// What each bus entry is called in the exit profile, by [`DeviceId`].
    bus_names: Vec<String>,
    devices: Vec<Device>,
    transport: TransportKind,
    mmio_registers: RegisterMode,
    memslots: Arc<Memslots>,
    /// What the vCPUs consult when KVM_RUN fails with EFAULT (device memory that lost its
    /// host pages).
    fault_repairs: Arc<crate::kvm::FaultRepairs>,
    /// Where a snapshot had each device, by [`DeviceName::id`]: a restored machine's
    /// devices are placed there, whatever order they are attached in.
    plan: std::collections::BTreeMap<String, Vec<Resource>>,
}

impl DeviceManager {
    /// The buses, the PCI root with its host bridge and config access, and the allocators
    /// (`allocators` already gave guest RAM its memory slots).
    pub fn new(
        vm: Arc<dyn VmDevices>,
        memory: GuestMemoryMmap,
        map: &MemoryMap,
        allocators: Allocators,
        config: DeviceManagerConfig,
    ) -> Result<Self, DeviceError> {
        let buses = Arc::new(SharedBuses::new(BusSet::default()));
        let ioeventfds = Arc::new(IoeventfdRegistry::new(vm.clone(), config.ioeventfd_limits));
        let gsi_router = Arc::new(GsiRouter::new(vm.clone()));
        let slots = config.memslots.take(SHADOW_MAX_SLOTS)?;
        let shadow = EcamShadow::on(config.ecam_pages, vm.clone(), layout::ECAM_GPA, slots);
        let pci = PciRoot::new(buses.clone(), ioeventfds.clone(), shadow, config.ecam, map.pci_windows())?;
        let pci = Arc::new(pci);
        let mut dm = DeviceManager {
            vm,
            memory,
            buses,
            pci: pci.clone(),
            allocators,
            gsi_router,
            ioeventfds,
            bus_names: Vec::new(),
            devices: Vec::new(),
            transport: config.transport,
            mmio_registers: config.mmio_registers,
            memslots: config.memslots,
            fault_repairs: Arc::default(),
            plan: Default::default(),
        };
        if config.pci_config_io {
            let cf8 = Arc::new(Cf8Device::new(&pci));
            dm.attach_pio("pci-cf8", PCI_CONFIG_ACCESS, CF8_PORT, CF8_LEN, cf8, DeviceHandle::bus())?;
        }
        let ecam = Arc::new(EcamDevice::new(&pci));
        dm.attach_mmio("pci-ecam", PCI_CONFIG_ACCESS, layout::ECAM_GPA, ECAM_SIZE, ecam, DeviceHandle::bus())?;
        pci.add(0, 0, crate::pci::host_bridge())?;
        dm.push("host-bridge".into(), PCI_HOST_BRIDGE, vec![Resource::PciSlot(0)], DeviceHandle::bus());
        Ok(dm)
    }

    /// Devices attached from here on are placed where `tree` (a snapshot's) had the device
    /// of the same id, rather than where the allocators would put them.
    pub fn plan_restore(&mut self, tree: &DeviceTree) {
        self.plan = tree.devices.iter().map(|(id, r)| (id.clone(), r.placement.clone())).collect();
    }

    /// Where the snapshot being restored had device `id` (nothing if none): a device that
    /// takes a place of a kind of its own (device memory) takes it there.
    pub fn planned(&self, id: &str) -> &[Resource] {
        self.plan.get(id).map_or(&[], Vec::as_slice)
    }

    /// The transport virtio devices are attached over.
    pub fn transport(&self) -> TransportKind {
        self.transport
    }

    /// Every attached device, in the order attached.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// The device a snapshot calls `id`, to record what its module adds (a place of its
    /// own, what a snapshot does with it).
    pub fn device_mut(&mut self, id: &str) -> Option<&mut Device> {
        self.devices.iter_mut().find(|d| d.id == id)
    }

    /// The VM the devices' interrupts, ioeventfds and memory slots are asked of.
    pub fn vm(&self) -> &Arc<dyn VmDevices> {
        &self.vm
    }

    /// Guest memory, which devices read and write.
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.memory
    }

    /// KVM memory slot numbers, for a device that maps memory of its own.
    pub fn memslots(&self) -> &Arc<Memslots> {
        &self.memslots
    }

    /// What the exit profile calls each bus entry, by [`DeviceId`].
    pub fn bus_names(&self) -> &[String] {
        &self.bus_names
    }

    /// What the vCPUs consult when guest memory faults in KVM (pmem files that shrank).
    pub fn fault_repairs(&self) -> &Arc<crate::kvm::FaultRepairs> {
        &self.fault_repairs
    }

    pub fn buses(&self) -> &Arc<SharedBuses> {
        &self.buses
    }

    pub fn pci(&self) -> &Arc<PciRoot> {
        &self.pci
    }

    pub fn ioeventfds(&self) -> &Arc<IoeventfdRegistry> {
        &self.ioeventfds
    }

    pub fn gsi_router(&self) -> &Arc<GsiRouter> {
        &self.gsi_router
    }

    pub fn allocators(&mut self) -> &mut Allocators {
        &mut self.allocators
    }

    /// A device on the port I/O bus; its ports are taken from the I/O window where they
    /// fall in it.
    pub fn attach_pio(
        &mut self,
        name: impl Into<DeviceName>,
        kind: DeviceKind,
        port: u16,
        len: u64,
        device: Arc<dyn BusDevice>,
        handle: DeviceHandle,
    ) -> Result<DeviceId, DeviceError> {
        let name = name.into();
        self.allocators.reserve_ports(port, len)?;
        tracing::debug!("{}: ports {port:#x}..{:#x}", name.label, u64::from(port) + len);
        let id = self.insert(&name.label, |b, id| b.pio.insert(PioAddress(port), len, id, device))?;
        self.push(name, kind, vec![Resource::Ports { base: port, len }], handle);
        Ok(id)
    }

    /// A device on the MMIO bus.
    pub fn attach_mmio(
        &mut self,
        name: impl Into<DeviceName>,
        kind: DeviceKind,
        addr: u64,
        len: u64,
        device: Arc<dyn BusDevice>,
        handle: DeviceHandle,
    ) -> Result<DeviceId, DeviceError> {
        let name = name.into();
        let id = self.place_mmio(&name.label, addr, len, device)?;
        self.push(name, kind, vec![Resource::Mmio { base: addr, len }], handle);
        Ok(id)
    }

    /// A bus entry on the MMIO bus for a device that is recorded otherwise (a device's
    /// second window): named `label` in the exit profile.
    pub fn place_mmio(
        &mut self,
        label: &str,
        addr: u64,
        len: u64,
        device: Arc<dyn BusDevice>,
    ) -> Result<DeviceId, DeviceError> {
        tracing::debug!("{label}: MMIO {addr:#x}..{:#x}", addr + len);
        self.insert(label, |b, id| b.mmio.insert(MmioAddress(addr), len, id, device))
    }

    /// A PCI function: a slot (`slot`, or where a restored snapshot had it, or the lowest
    /// free), its BARs placed likewise, then `build` makes the function for that placement.
    pub fn attach_pci(
        &mut self,
        name: impl Into<DeviceName>,
        kind: DeviceKind,
        slot: Option<u8>,
        bars: &[BarRequest],
        build: impl FnOnce(&PciPlacement) -> Result<(PciFunction, DeviceHandle), DeviceError>,
    ) -> Result<PciPlacement, DeviceError> {
        let name = name.into();
        let planned = self.planned(&name.id).to_vec();
        let planned_slot = planned.iter().find_map(|r| match r {
            Resource::PciSlot(s) => Some(*s),
            _ => None,
        });
        let slot = match slot.or(planned_slot) {
            Some(n) => self.allocators.reserve_slot(n).map(|()| n)?,
            None => self.allocators.slot()?,
        };
        let mut placement = PciPlacement { slot, bars: Vec::new() };
        let mut resources = vec![Resource::PciSlot(slot)];
        for (index, bar) in bars.iter().enumerate() {
            let planned_bar = planned.iter().find_map(|r| match r {
                Resource::Bar { index: i, base } if usize::from(*i) == index => Some(*base),
                _ => None,
            });
            let base = match bar.at.or(planned_bar) {
                Some(at) => self.allocators.reserve_bar(bar.spec, at).map(|()| at)?,
                None => self.allocators.bar(bar.spec)?,
            };
            let name = &name.label;
            let label = if bar.label.is_empty() { name.to_string() } else { format!("{name}-{}", bar.label) };
            placement.bars.push((self.name_bus_entry(&label), base));
            resources.push(Resource::Bar { index: index as u8, base });
        }
        let (function, handle) = build(&placement)?;
        self.pci.add(slot, 0, function)?;
        tracing::debug!(
            "{}: PCI 00:{slot:02x}.0, BARs {:#x?}",
            name.label,
            placement.bars.iter().map(|b| b.1).collect::<Vec<_>>()
        );
        self.push(name, kind, resources, handle);
        Ok(placement)
    }

    /// A device on no bus, which the guest finds in its ACPI tables only (VMGenID): its
    /// places in guest memory and its line, as its module took them.
    pub fn record(&mut self, name: DeviceName, kind: DeviceKind, resources: Vec<Resource>, handle: DeviceHandle) {
        tracing::debug!("{}: {resources:x?}", name.label);
        self.push(name, kind, resources, handle);
    }

    /// Names a bus entry for the exit profile and returns its id.
    fn name_bus_entry(&mut self, name: &str) -> DeviceId {
        self.bus_names.push(name.to_string());
        DeviceId(self.bus_names.len() - 1)
    }

    /// Names the entry and places it with `insert` on the current bus layout.
    fn insert(
        &mut self,
        name: &str,
        insert: impl FnOnce(&mut BusSet, DeviceId) -> Result<(), BusError>,
    ) -> Result<DeviceId, DeviceError> {
        let id = self.name_bus_entry(name);
        self.buses.update(|b| insert(b, id)).map_err(|source| DeviceError::Bus { name: name.into(), source })?;
        Ok(id)
    }

    fn push(&mut self, name: DeviceName, kind: DeviceKind, resources: Vec<Resource>, handle: DeviceHandle) {
        self.devices.push(Device { name: name.label, id: name.id, kind, resources, handle });
    }

    /// What its users reach the devices reached by a `T` by, in the order attached.
    pub fn all<T: 'static>(&self) -> impl Iterator<Item = &T> {
        self.devices.iter().filter_map(|d| d.handle.users::<T>())
    }

    /// The first device reached by a `T` (COM1's `Arc<Serial>`).
    pub fn find<T: 'static>(&self) -> Option<&T> {
        self.all().next()
    }

    /// The virtio devices reached by a `T` (a `NetHandle`), in the order attached, with
    /// their transports.
    pub fn virtio_of<T: 'static>(&self) -> impl Iterator<Item = (&T, &VirtioTransport)> {
        self.devices.iter().filter_map(|d| Some((d.handle.users::<T>()?, d.handle.transport()?)))
    }

    /// Every virtio device, in the order attached: its name, where it is (a PCI slot, or
    /// an MMIO window and line) and its transport.
    pub fn virtio_devices(&self) -> impl Iterator<Item = (&str, &[Resource], &VirtioTransport)> {
        self.devices.iter().filter_map(|d| Some((d.name.as_str(), d.resources.as_slice(), d.handle.transport()?)))
    }

    /// The first device a snapshot of this machine cannot hold, and why.
    pub fn unsaved(&self) -> Option<(&str, &'static str)> {
        self.devices.iter().find_map(|d| match d.handle.saves() {
            Saves::Refused(why) => Some((d.name.as_str(), *why)),
            _ => None,
        })
    }

    /// Each virtio-mmio device's window and interrupt line, in the order attached: what the
    /// guest is told on its command line and in the DSDT.
    pub fn mmio_windows(&self) -> Vec<(u64, u64, u32)> {
        let windows = self.virtio_devices().filter_map(|(_, resources, transport)| {
            let VirtioTransport::Mmio(_) = transport else { return None };
            let window = resources.iter().find_map(|r| match r {
                Resource::Mmio { base, len } => Some((*base, *len)),
                _ => None,
            })?;
            let line = resources.iter().find_map(|r| match r {
                Resource::Irq(gsi) => Some(*gsi),
                _ => None,
            })?;
            Some((window.0, window.1, line))
        });
        windows.collect()
    }

    /// Starts the virtio devices a snapshot restored, where their queues stood, and lets
    /// every restored device do what it does then (VMGenID notifies its new generation):
    /// once the vCPUs' interrupt state is back, so no interrupt is lost.
    pub fn start_restored(&self) {
        for (_, _, transport) in self.virtio_devices() {
            transport.core().start_restored();
        }
        for device in &self.devices {
            if let Saves::State(part) = device.handle.saves() {
                if let Err(e) = part.start_restored(&device.id) {
                    tracing::error!("{}: after the restore: {e}", device.name);
                }
            }
        }
    }
}
