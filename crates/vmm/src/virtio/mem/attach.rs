//! The virtio-mem device over hotpluggable memory (already part of guest memory, placed by
//! the machine, with the record of its plugged blocks that translation reads): attached
//! like every virtio device, then reached by the API for its requested size and status.

use super::{Geometry, MemError, MemShared, MemStatus, VirtioMem};
use crate::device_manager::{DeviceError, DeviceKind, DeviceManager};
use crate::virtio::STATUS_DRIVER_OK;
use std::sync::Arc;

pub const KIND: DeviceKind = DeviceKind("virtio-mem");

/// The virtio-mem device, for the API and the report.
pub struct MemHandle {
    pub shared: Arc<MemShared>,
}

impl DeviceManager {
    /// A virtio-mem device over `geometry`, guest memory's hotpluggable region; one KVM
    /// memory slot number per slot, taken now, used as the driver plugs.
    pub fn attach_virtio_mem(&mut self, geometry: Geometry) -> Result<(), DeviceError> {
        let setup = |source| DeviceError::Setup { name: "virtio-mem".into(), source };
        if crate::virtio::mem::plugs_of(self.memory(), &geometry).is_none() {
            let why = format!("no hotpluggable region at {:#x}+{:#x}", geometry.start, geometry.size);
            return Err(setup(std::io::Error::other(why)));
        }
        let memslots = self.memslots().take(geometry.slots() as u32)?;
        let device = VirtioMem::new(geometry, memslots, self.vm().clone(), self.memory().clone()).map_err(setup)?;
        tracing::info!(
            "virtio-mem: {} MiB of hotpluggable memory at {:#x} ({} MiB blocks, {} MiB slots)",
            geometry.size >> 20,
            geometry.start,
            geometry.block_size >> 20,
            geometry.slot_size >> 20
        );
        let handle = MemHandle { shared: device.shared.clone() };
        // Saved with its transport (persist.rs); the plugged blocks' bytes are the memory
        // file's.
        self.attach_virtio("virtio-mem", KIND, Box::new(device), handle)?;
        Ok(())
    }

    /// The status `GET /hotplug/memory` reports.
    pub fn hotplug_memory(&self) -> Result<MemStatus, MemError> {
        let (mem, _) = self.virtio_of::<MemHandle>().next().ok_or(MemError::NoDevice)?;
        Ok(mem.shared.status())
    }

    /// A new requested size: the driver is told by a configuration change and plugs or
    /// unplugs toward it. Refused before the driver runs, as Firecracker does.
    pub fn set_hotplug_memory(&self, requested_size_mib: u64) -> Result<(), MemError> {
        let (mem, transport) = self.virtio_of::<MemHandle>().next().ok_or(MemError::NoDevice)?;
        if transport.core().status() & STATUS_DRIVER_OK == 0 {
            return Err(MemError::NotActive);
        }
        let bytes = requested_size_mib.checked_mul(1 << 20).ok_or(MemError::InvalidSize(u64::MAX))?;
        mem.shared.request(bytes)?;
        transport.core().config_changed();
        Ok(())
    }
}
