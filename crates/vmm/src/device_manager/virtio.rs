//! Attaching virtio devices over PCI (the transport, MSI-X vectors, BAR0 and the notify
//! ioeventfds) or over MMIO (a 4 KiB window, an interrupt line, the notify ioeventfds),
//! and the handles the API, snapshots and the labs use.

use super::{BarRequest, DeviceError, DeviceHandle, DeviceKind, DeviceManager, DeviceName, Resource, VirtioHandle};
use crate::net::mmds::SharedMmds;
use crate::net::Tap;
use crate::pci::msix::Msix;
use crate::persist::{Pausable, Persist, PersistError};
use crate::poll::PollMode;
use crate::rate_limiter::{LimiterSlot, Limits};
use crate::virtio::blk::{BlkStats, DiskSlot, DriveConfig, VirtioBlk};
use crate::virtio::mmio::page::RegisterPage;
use crate::virtio::mmio::{RegisterMode, VirtioMmio};
use crate::virtio::net::{NetStats, TxMode, VirtioNet};
use crate::virtio::pci::{TransportState, VirtioPci};
use crate::virtio::rng::{RngStats, VirtioRng};
use crate::virtio::transport::Core;
use crate::virtio::vsock::{VirtioVsock, VsockConfig, VsockStats};
use crate::virtio::{self, VirtioDevice};
use std::net::Ipv4Addr;
use std::sync::Arc;

/// `--net tap=NAME[,mac=..]` and `--net-tx`.
#[derive(Clone, Debug)]
pub struct NetConfig {
    pub tap: String,
    pub mac: [u8; 6],
    pub tx: TxMode,
    /// An MTU advised to the guest (VIRTIO_NET_F_MTU), if any.
    pub mtu: Option<u16>,
    /// Rate limits on received and sent frames.
    pub rx_limits: Limits,
    pub tx_limits: Limits,
    /// MMDS answered on this NIC: the store and its address.
    pub mmds: Option<(SharedMmds, Ipv4Addr)>,
    /// Checksum and segmentation offloads offered (as far as the tap carries them).
    pub offloads: bool,
    /// The id its configuration knows it by (Firecracker's `iface_id`), by which it is
    /// found again (PATCH /network-interfaces/{id}); the device manager's name when not given.
    pub config_id: Option<String>,
}

impl NetConfig {
    /// A NIC on `tap` with `mac`: zero-copy TX, offloads offered, no MTU advice, no
    /// limits, no MMDS (the struct update syntax changes what a caller needs).
    pub fn on_tap(tap: impl Into<String>, mac: [u8; 6]) -> NetConfig {
        NetConfig {
            tap: tap.into(),
            mac,
            tx: TxMode::Zerocopy,
            mtu: None,
            rx_limits: Limits::default(),
            tx_limits: Limits::default(),
            mmds: None,
            offloads: true,
            config_id: None,
        }
    }
}

/// Which transport the virtio devices are attached over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportKind {
    /// virtio-pci: exitless's own guests, Firecracker's with `--enable-pci`.
    #[default]
    Pci,
    /// virtio-mmio: Firecracker's default, for guests that boot with `pci=off`.
    Mmio,
}

/// A virtio device's transport.
#[derive(Clone)]
pub enum VirtioTransport {
    Pci(Arc<VirtioPci>),
    Mmio(Arc<VirtioMmio>),
}

impl VirtioTransport {
    /// What both transports share: status, configuration changes, interrupts counted,
    /// pause and resume, starting a restored device.
    pub fn core(&self) -> &Core {
        match self {
            VirtioTransport::Pci(t) => t.core(),
            VirtioTransport::Mmio(t) => t.core(),
        }
    }
}

/// The transport's registers, queues and (PCI) MSI-X table; the device behind it is
/// paused first ([`Pausable`]) so the queue positions saved are where it stopped.
impl Persist<'_> for VirtioTransport {
    type State = TransportState;
    type SaveArgs = ();
    type RestoreArgs = ();

    fn save(&self, (): ()) -> Result<TransportState, PersistError> {
        match self {
            VirtioTransport::Pci(t) => t.save(),
            VirtioTransport::Mmio(t) => t.core().save(),
        }
    }

    fn restore(&self, (): (), s: &TransportState) -> Result<(), PersistError> {
        Ok(match self {
            VirtioTransport::Pci(t) => t.restore(s),
            VirtioTransport::Mmio(t) => t.restore(s),
        }?)
    }
}

impl Pausable for VirtioTransport {
    fn pause(&self) -> Result<(), PersistError> {
        self.core().pause();
        Ok(())
    }

    fn resume(&self) -> Result<(), PersistError> {
        self.core().resume().map_err(|e| PersistError::Refused(e.to_string()))
    }
}

/// A virtio-blk device, for the API, the lab and the report.
pub struct DriveHandle {
    pub name: String,
    /// The id it is found by (DriveConfig::config_id, else `name`).
    pub id: String,
    pub stats: Arc<BlkStats>,
    /// The backing file, swapped by [`DeviceManager::update_drive`].
    pub disk: Arc<DiskSlot>,
    /// The rate limits, changed by [`DeviceManager::set_drive_limits`].
    pub limits: Arc<LimiterSlot>,
}

/// A virtio-net device, for the API, the lab and the report.
pub struct NetHandle {
    /// The id it is found by (NetConfig::config_id, else its device name).
    pub id: String,
    pub stats: Arc<NetStats>,
    pub tap_name: String,
    /// The RX and TX rate limits, changed by [`DeviceManager::set_net_limits`].
    pub limits: [Arc<LimiterSlot>; 2],
}

/// The virtio-rng device, for the API and the report.
pub struct EntropyHandle {
    pub stats: Arc<RngStats>,
    pub limits: Arc<LimiterSlot>,
}

/// The virtio-vsock device, for the API, the lab and the report.
pub struct VsockHandle {
    pub stats: Arc<VsockStats>,
    pub uds_path: std::path::PathBuf,
}

impl DeviceManager {
    /// Plugs a virtio device in over the machine's transport; `users` is what the API and
    /// the labs reach it by ([`DeviceManager::virtio_of`]).
    pub fn attach_virtio(
        &mut self,
        name: impl Into<DeviceName>,
        kind: DeviceKind,
        device: Box<dyn VirtioDevice>,
        users: impl std::any::Any + Send + Sync,
    ) -> Result<VirtioTransport, DeviceError> {
        let handle = |transport| DeviceHandle::Virtio(VirtioHandle { transport, device: Box::new(users) });
        match self.transport {
            TransportKind::Pci => self.attach_virtio_pci(name.into(), kind, device, handle),
            TransportKind::Mmio => self.attach_virtio_mmio(name.into(), kind, device, handle),
        }
    }

    /// Over PCI: a free slot, BAR0 from the 32-bit window, one MSI-X vector per queue plus
    /// one for config changes, every queue's notify address an ioeventfd wherever the
    /// guest puts BAR0.
    fn attach_virtio_pci(
        &mut self,
        name: DeviceName,
        kind: DeviceKind,
        device: Box<dyn VirtioDevice>,
        handle: impl FnOnce(VirtioTransport) -> DeviceHandle,
    ) -> Result<VirtioTransport, DeviceError> {
        let vectors = device.queue_max_sizes().len() + 1;
        let msix = Msix::new(self.gsi_router.clone(), vectors)?;
        let label = name.label.clone();
        let setup = |source| DeviceError::Setup { name: label.clone(), source };
        let transport = Arc::new(VirtioPci::new(device, self.memory.clone(), msix).map_err(setup)?);
        let bars = [BarRequest { label: "", spec: virtio::pci::BAR0, at: None }];
        let pci = transport.clone();
        self.attach_pci(name, kind, None, &bars, |p| {
            let function = pci.pci_function(&label, p.bars[0].0, p.bars[0].1).map_err(setup)?;
            Ok((function, handle(VirtioTransport::Pci(pci))))
        })?;
        Ok(VirtioTransport::Pci(transport))
    }

    /// Over MMIO, as Firecracker places them: the next 4 KiB window after the boot timer's
    /// page, the next free interrupt line (an irqfd on its GSI), and one ioeventfd per
    /// queue on QueueNotify; when mapped, the window's read-only page in a memory slot of
    /// its own, and the ioeventfd on InterruptACK.
    fn attach_virtio_mmio(
        &mut self,
        name: DeviceName,
        kind: DeviceKind,
        device: Box<dyn VirtioDevice>,
        handle: impl FnOnce(VirtioTransport) -> DeviceHandle,
    ) -> Result<VirtioTransport, DeviceError> {
        let setup = |source| DeviceError::Setup { name: name.label.clone(), source };
        // Where a restored snapshot had it, else the next free.
        let planned = self.planned(&name.id);
        let planned_gsi = planned.iter().find_map(|r| if let Resource::Irq(g) = r { Some(*g) } else { None });
        let planned_base =
            planned.iter().find_map(|r| if let Resource::Mmio { base, .. } = r { Some(*base) } else { None });
        // The line first: lines run out (17 of them) long before the window does, and a
        // device refused for want of one must leave no window taken behind it.
        let gsi = match planned_gsi {
            Some(gsi) => self.allocators.reserve_mmio_irq(gsi).map(|()| gsi)?,
            None => self.allocators.mmio_irq()?,
        };
        let base = match planned_base {
            Some(base) => {
                let spec = crate::pci::BarSpec { kind: crate::pci::BarKind::Memory32, size: virtio::mmio::WINDOW };
                self.allocators.reserve_bar(spec, base).map(|()| base)?
            }
            None => self.allocators.mmio_device_window(virtio::mmio::WINDOW)?,
        };
        let irqfd = Arc::new(vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK).map_err(setup)?);
        self.vm.register_irqfd(&irqfd, gsi)?;
        let page = match self.mmio_registers {
            RegisterMode::Mapped => {
                let slot = self.memslots.take(1)?.start;
                Some(RegisterPage::map(self.vm.clone(), slot, base).map_err(setup)?)
            }
            RegisterMode::Trapped => None,
        };
        let transport = Arc::new(VirtioMmio::new(device, self.memory.clone(), irqfd, page).map_err(setup)?);
        for (key, fd) in transport.notify_ioeventfds().map_err(setup)? {
            let at = crate::ioeventfd::IoeventfdKey { addr: base + key.addr, ..key };
            self.ioeventfds.register(at, &fd)?;
        }
        let made = VirtioTransport::Mmio(transport.clone());
        let label = name.label.clone();
        self.attach_mmio(name, kind, base, virtio::mmio::WINDOW, transport, handle(made.clone()))?;
        if let Some(device) = self.devices.last_mut() {
            device.resources.push(Resource::Irq(gsi));
        }
        tracing::debug!("{label}: virtio-mmio at {base:#x}, GSI {gsi}");
        Ok(made)
    }

    /// A virtio-net device on tap `net.tap`.
    pub fn attach_net(&mut self, net: &NetConfig, poll: PollMode) -> Result<(), DeviceError> {
        let tap = Tap::open(&net.tap)?;
        let tap_name = tap.name().to_string();
        let setup = |source| DeviceError::Setup { name: "virtio-net".into(), source };
        let device = VirtioNet::new(tap, net.mac, net.tx, poll).map_err(setup)?;
        let mut device = device.with_mtu(net.mtu).with_limits(net.rx_limits, net.tx_limits);
        if !net.offloads {
            device = device.without_offloads();
        }
        if let Some((store, ip)) = &net.mmds {
            device = device.with_mmds(store.clone(), *ip);
        }
        let (stats, limits) = (device.stats.clone(), device.limiter_slots());
        let label = match self.nets().count() {
            0 => "virtio-net".to_string(),
            n => format!("virtio-net{n}"),
        };
        let name = DeviceName::keyed("virtio-net", net.config_id.as_deref(), label);
        let id = net.config_id.clone().unwrap_or_else(|| name.label.clone());
        let handle = NetHandle { id, stats, tap_name, limits };
        self.attach_virtio(name, DeviceKind::VirtioNet, Box::new(device), handle).map(drop)
    }

    /// A virtio-blk device on `drive`'s backing file.
    pub fn attach_blk(&mut self, drive: &DriveConfig, poll: PollMode) -> Result<(), DeviceError> {
        let device = VirtioBlk::new(drive, poll)?;
        let disk = device.disk();
        let name = format!("virtio-blk{}", self.drives().count());
        tracing::info!(
            "{name}: {} ({} bytes{}{}, {} engine)",
            drive.path.display(),
            disk.capacity,
            if disk.readonly { ", read-only" } else { "" },
            if disk.is_direct() { ", O_DIRECT" } else { "" },
            device.engine_name()
        );
        let (stats, disk, limits) = (device.stats.clone(), device.disk_slot(), device.limiter_slot());
        let (drive_name, id) = (name.clone(), drive.config_id.clone().unwrap_or_else(|| name.clone()));
        let handle = DriveHandle { name: drive_name, id, stats, disk, limits };
        let name = DeviceName::keyed("virtio-blk", drive.config_id.as_deref(), name);
        self.attach_virtio(name, DeviceKind::VirtioBlock, Box::new(device), handle).map(drop)
    }

    /// A virtio-rng device (Firecracker's `PUT /entropy`), held to `limits`.
    pub fn attach_rng(&mut self, limits: Limits) -> Result<(), DeviceError> {
        let setup = |source| DeviceError::Setup { name: "virtio-rng".into(), source };
        let device = VirtioRng::new(limits).map_err(setup)?;
        let (stats, limits) = (device.stats.clone(), device.limiter_slot());
        let handle = EntropyHandle { stats, limits };
        self.attach_virtio("virtio-rng", DeviceKind::VirtioRng, Box::new(device), handle).map(drop)
    }

    /// A virtio-vsock device with Firecracker's Unix-socket host side (`PUT /vsock`).
    pub fn attach_vsock(&mut self, config: &VsockConfig, poll: PollMode) -> Result<(), DeviceError> {
        let device = VirtioVsock::new(config.clone(), poll)?;
        let (stats, uds_path) = (device.stats.clone(), device.uds_path().to_path_buf());
        let handle = VsockHandle { stats, uds_path };
        let name = DeviceName::keyed("virtio-vsock", config.id.as_deref(), "virtio-vsock".into());
        self.attach_virtio(name, DeviceKind::VirtioVsock, Box::new(device), handle).map(drop)
    }

    /// The drive its configuration calls `id`.
    pub fn drive(&self, id: &str) -> Result<&DriveHandle, DeviceError> {
        self.drive_and_transport(id).map(|(d, _)| d)
    }

    fn drive_and_transport(&self, id: &str) -> Result<(&DriveHandle, &VirtioTransport), DeviceError> {
        self.virtio_of::<DriveHandle>().find(|(d, _)| d.id == id).ok_or_else(|| DeviceError::NoDrive(id.into()))
    }

    /// The NIC its configuration calls `id`.
    pub fn nic(&self, id: &str) -> Result<&NetHandle, DeviceError> {
        self.nets().find(|n| n.id == id).ok_or_else(|| DeviceError::NoNic(id.into()))
    }

    /// Gives drive `id` a new backing file on a running guest: its capacity re-read, the
    /// guest told by a configuration-change interrupt (Firecracker's PATCH /drives).
    pub fn update_drive(&self, id: &str, path: &std::path::Path) -> Result<(), DeviceError> {
        let (drive, transport) = self.drive_and_transport(id)?;
        let disk = drive.disk.swap(path)?;
        tracing::info!("{}: swapped to {} ({} bytes)", drive.name, path.display(), disk.capacity);
        transport.core().config_changed();
        Ok(())
    }

    /// New rate limits for drive `id` (Firecracker's PATCH /drives rate_limiter).
    pub fn set_drive_limits(&self, id: &str, limits: Limits) -> Result<(), DeviceError> {
        self.drive(id)?.limits.set(limits);
        Ok(())
    }

    /// New rate limits for NIC `id`, each way that is given (PATCH /network-interfaces).
    pub fn set_net_limits(&self, id: &str, rx: Option<Limits>, tx: Option<Limits>) -> Result<(), DeviceError> {
        let nic = self.nic(id)?;
        for (slot, limits) in nic.limits.iter().zip([rx, tx]) {
            if let Some(limits) = limits {
                slot.set(limits);
            }
        }
        Ok(())
    }
}
