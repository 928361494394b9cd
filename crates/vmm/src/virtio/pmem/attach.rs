//! virtio-pmem devices: each file mapped into device memory past the 64-bit PCI window
//! (a region from the allocators, a memory slot of its own), then attached like every
//! virtio device.

use super::{PmemMapping, PmemStats, PmemWindow, VirtioPmem, ALIGNMENT};
use crate::device_manager::{Attach, DeviceError, DeviceKind, DeviceManager, DeviceName, Resource};
use crate::rate_limiter::{LimiterSlot, Limits};
use std::path::PathBuf;
use std::sync::Arc;

pub const KIND: DeviceKind = DeviceKind("virtio-pmem");

/// A pmem device on `config`, attached as the machine is built.
pub fn attach(config: PmemConfig) -> Attach {
    Box::new(move |dm| dm.attach_pmem(&config))
}

/// `PUT /pmem/{id}`.
#[derive(Clone, Debug)]
pub struct PmemConfig {
    pub id: String,
    pub path: PathBuf,
    pub read_only: bool,
    pub limits: Limits,
}

/// A virtio-pmem device, for the API and the report.
pub struct PmemHandle {
    pub id: String,
    /// Where the guest finds it, and how long it is there.
    pub start: u64,
    pub len: u64,
    pub stats: Arc<PmemStats>,
    pub limits: Arc<LimiterSlot>,
}

impl DeviceManager {
    /// A virtio-pmem device on `config.path`: mapped shared (read-only if asked, and then
    /// read-only to the guest too: a KVM_MEM_READONLY slot) where the guest finds it.
    pub fn attach_pmem(&mut self, config: &PmemConfig) -> Result<(), DeviceError> {
        let label = format!("virtio-pmem{}", self.virtio_of::<PmemHandle>().count());
        let key = DeviceName::keyed(KIND, Some(&config.id), label);
        let name = key.label.clone();
        let mapping = PmemMapping::open(&config.path, config.read_only).map_err(DeviceError::backend)?;
        // Where a restored snapshot had it, else the lowest free.
        let planned = self.planned(&key.id).iter().find_map(|r| match r {
            Resource::Memory { base, .. } => Some(*base),
            _ => None,
        });
        let start = self.allocators().device_memory(mapping.len(), ALIGNMENT, planned)?;
        let slot = self.memslots().take(1)?.start;
        self.vm()
            .set_slot(slot, start, mapping.len(), mapping.host_address(), config.read_only)
            .map_err(|source| DeviceError::Setup { name: name.clone(), source })?;
        let (len, host) = (mapping.len(), mapping.host_address());
        let mapping = Arc::new(mapping);
        let repair: Arc<dyn crate::kvm::FaultRepair> = mapping.clone();
        self.fault_repairs().register(repair.clone());
        // Behind the slot on the bus: what KVM cannot serve from it comes here.
        let window = Arc::new(PmemWindow::new(mapping.clone(), config.read_only));
        self.place_mmio(&format!("{name}-memory"), start, len, window)?;
        let device = VirtioPmem::new(mapping, start, config.limits)
            .map_err(|source| DeviceError::Setup { name: name.clone(), source })?;
        let handle = PmemHandle {
            id: config.id.clone(),
            start,
            len,
            stats: device.stats.clone(),
            limits: device.limiter_slot(),
        };
        tracing::info!(
            "{name}: {} at {start:#x} ({len} bytes{})",
            config.path.display(),
            if config.read_only { ", read-only" } else { "" }
        );
        let id = key.id.clone();
        self.attach_virtio(key, KIND, Box::new(device), handle)?;
        // The device memory is where the device is too (a snapshot records it).
        // Unplugged from a running guest: its slot and window go before its mapping does.
        let (vm, buses, repairs) = (self.vm().clone(), self.buses().clone(), self.fault_repairs().clone());
        let read_only = config.read_only;
        let undo = Box::new(move || {
            if let Err(e) = vm.set_slot(slot, start, 0, host, read_only) {
                tracing::error!("{name}: its memory slot stays: {e}");
            }
            let _ = buses.update(|b| b.mmio.remove(crate::bus::MmioAddress(start)).map(drop));
            repairs.unregister(&repair);
        });
        if let Some(device) = self.device_mut(&id) {
            device.resources.push(Resource::Memory { base: start, len });
            device.handle.on_unplug(undo);
        }
        Ok(())
    }

    /// The pmem device its configuration calls `id`.
    pub fn pmem(&self, id: &str) -> Result<&PmemHandle, DeviceError> {
        self.virtio_of::<PmemHandle>()
            .map(|(p, _)| p)
            .find(|p| p.id == id)
            .ok_or_else(|| DeviceError::NoSuch { what: "pmem device", id: id.into() })
    }
}
