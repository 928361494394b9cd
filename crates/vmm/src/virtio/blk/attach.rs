//! Attaching a virtio-blk device on its backing file, and what the API, the labs and the
//! report reach it by: its statistics, its backing file (swapped on a running guest) and
//! its rate limits, by the id its configuration gave it.

use super::{BlkStats, DiskSlot, DriveConfig, VirtioBlk};
use crate::device_manager::{Attach, DeviceError, DeviceKind, DeviceManager, DeviceName, VirtioTransport};
use crate::poll::PollMode;
use crate::rate_limiter::{LimiterSlot, Limits};
use std::sync::Arc;

pub const KIND: DeviceKind = DeviceKind("virtio-blk");

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

/// A drive on `config`, attached as the machine is built, its device thread polling as
/// `poll` says.
pub fn attach(config: DriveConfig, poll: PollMode) -> Attach {
    Box::new(move |dm| dm.attach_blk(&config, poll))
}

impl DeviceManager {
    /// A virtio-blk device on `drive`'s backing file.
    pub fn attach_blk(&mut self, drive: &DriveConfig, poll: PollMode) -> Result<(), DeviceError> {
        let device = VirtioBlk::new(drive, poll).map_err(DeviceError::backend)?;
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
        let name = DeviceName::keyed(KIND, drive.config_id.as_deref(), name);
        self.attach_virtio(name, KIND, Box::new(device), handle).map(drop)
    }

    /// The virtio-blk devices, in the order attached.
    pub fn drives(&self) -> impl Iterator<Item = &DriveHandle> {
        self.all::<DriveHandle>()
    }

    /// The drive its configuration calls `id`.
    pub fn drive(&self, id: &str) -> Result<&DriveHandle, DeviceError> {
        self.drive_and_transport(id).map(|(d, _)| d)
    }

    fn drive_and_transport(&self, id: &str) -> Result<(&DriveHandle, &VirtioTransport), DeviceError> {
        let missing = || DeviceError::NoSuch { what: "drive", id: id.into() };
        self.virtio_of::<DriveHandle>().find(|(d, _)| d.id == id).ok_or_else(missing)
    }

    /// Gives drive `id` a new backing file on a running guest: its capacity re-read, the
    /// guest told by a configuration-change interrupt (Firecracker's PATCH /drives).
    pub fn update_drive(&self, id: &str, path: &std::path::Path) -> Result<(), DeviceError> {
        let (drive, transport) = self.drive_and_transport(id)?;
        let disk = drive.disk.swap(path).map_err(DeviceError::backend)?;
        tracing::info!("{}: swapped to {} ({} bytes)", drive.name, path.display(), disk.capacity);
        transport.core().config_changed();
        Ok(())
    }

    /// New rate limits for drive `id` (Firecracker's PATCH /drives rate_limiter).
    pub fn set_drive_limits(&self, id: &str, limits: Limits) -> Result<(), DeviceError> {
        self.drive(id)?.limits.set(limits);
        Ok(())
    }
}
