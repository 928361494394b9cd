//! Attaching the virtio-vsock device with Firecracker's Unix-socket host side, and what
//! the API, the labs and the report reach it by.

use super::{VirtioVsock, VsockConfig, VsockStats};
use crate::device_manager::{Attach, DeviceError, DeviceKind, DeviceManager, DeviceName};
use crate::poll::PollMode;
use std::sync::Arc;

pub const KIND: DeviceKind = DeviceKind("virtio-vsock");

/// The virtio-vsock device, for the API, the lab and the report.
pub struct VsockHandle {
    pub stats: Arc<VsockStats>,
    pub uds_path: std::path::PathBuf,
}

/// The vsock device on `config`, attached as the machine is built, its device thread
/// polling as `poll` says.
pub fn attach(config: VsockConfig, poll: PollMode) -> Attach {
    Box::new(move |dm| dm.attach_vsock(&config, poll))
}

impl DeviceManager {
    /// A virtio-vsock device with Firecracker's Unix-socket host side (`PUT /vsock`).
    pub fn attach_vsock(&mut self, config: &VsockConfig, poll: PollMode) -> Result<(), DeviceError> {
        let device = VirtioVsock::new(config.clone(), poll)
            .map_err(|e| DeviceError::Device { name: "virtio-vsock", source: Box::new(e) })?;
        let (stats, uds_path) = (device.stats.clone(), device.uds_path().to_path_buf());
        let handle = VsockHandle { stats, uds_path };
        let name = DeviceName::keyed(KIND, config.id.as_deref(), "virtio-vsock".into());
        self.attach_virtio(name, KIND, Box::new(device), handle).map(drop)
    }

    /// The vsock device, if there is one.
    pub fn vsock(&self) -> Option<&VsockHandle> {
        self.find()
    }
}
