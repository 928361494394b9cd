//! Attaching a virtio device, whatever its type, over PCI (the transport, MSI-X vectors,
//! BAR0 and the notify ioeventfds) or over MMIO (a 4 KiB window, an interrupt line, the
//! notify ioeventfds); the transport's part of a snapshot. Each device type's module
//! builds its device and calls [`DeviceManager::attach_virtio`].

use super::{BarRequest, DeviceError, DeviceHandle, DeviceKind, DeviceManager, DeviceName, Resource};
use crate::pci::msix::Msix;
use crate::persist::{Pausable, Persist, PersistError};
use crate::virtio::mmio::page::RegisterPage;
use crate::virtio::mmio::{RegisterMode, VirtioMmio};
use crate::virtio::pci::{TransportState, VirtioPci};
use crate::virtio::transport::Core;
use crate::virtio::{self, VirtioDevice};
use std::sync::Arc;

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

impl DeviceManager {
    /// Plugs a virtio device in over the machine's transport; `users` is what the API and
    /// the labs reach it by ([`DeviceManager::virtio_of`]); its transport, with the device's
    /// own state, is its part of a snapshot.
    pub fn attach_virtio(
        &mut self,
        name: impl Into<DeviceName>,
        kind: DeviceKind,
        device: Box<dyn VirtioDevice>,
        users: impl std::any::Any + Send + Sync,
    ) -> Result<VirtioTransport, DeviceError> {
        let handle = |transport| DeviceHandle::virtio(transport, users);
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
}
