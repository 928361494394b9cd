//! virtio-fs (virtio 1.2 section 5.11): a host directory in the guest, served by a
//! vhost-user backend (virtiofsd) over the frontend in `virtio::vhost_user`. The VMM holds
//! the configuration (the tag the guest mounts by, the number of request queues); the
//! backend serves the FUSE requests on the queues directly, the VMM never sees them.
//! No DAX window (the shared memory region the spec makes optional): every read and
//! write goes through the queues.

use crate::device_manager::{Attach, DeviceError, DeviceKind, DeviceManager, DeviceName, Saves};
use crate::virtio::vhost_user::{Backend, BackendError, Health, Spec, VhostUserDevice};
use crate::virtio::{VIRTIO_F_EVENT_IDX, VIRTIO_F_INDIRECT_DESC, VIRTIO_F_VERSION_1};
use std::path::PathBuf;
use std::sync::Arc;

pub const KIND: DeviceKind = DeviceKind("virtio-fs");
/// virtio's device type for a file system device.
pub const TYPE_FS: u16 = 26;
/// The longest tag (the configuration's `tag[36]`, NUL-padded).
pub const TAG_MAX: usize = 36;
/// The largest queue virtiofsd takes, and the spec's largest split queue.
pub const QUEUE_SIZE_MAX: u16 = 32768;
/// Cloud Hypervisor's defaults for `--fs`.
pub const DEFAULT_QUEUE_SIZE: u16 = 1024;
pub const DEFAULT_REQUEST_QUEUES: u16 = 1;
/// What a snapshot of a machine with virtio-fs is refused with.
pub const NOT_SAVED: &str =
    "virtio-fs: the backend's state (virtiofsd's open files and inodes) is not saved: a restored guest's mounts would be broken";

/// A virtio-fs device on `config`, attached as the machine is built.
pub fn attach(config: FsConfig) -> Attach {
    Box::new(move |dm| dm.attach_fs(&config))
}

/// `PUT /fs/{fs_id}` (Cloud Hypervisor's `--fs` names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsConfig {
    pub id: String,
    pub tag: String,
    pub socket: PathBuf,
    pub num_request_queues: u16,
    pub queue_size: u16,
}

impl FsConfig {
    /// Why the configuration cannot make a device, if it cannot.
    pub fn validate(&self) -> Result<(), String> {
        let tag = self.tag.as_bytes();
        match () {
            _ if tag.is_empty() => Err("virtio-fs: the tag must not be empty".into()),
            _ if tag.len() > TAG_MAX => Err(format!("virtio-fs: the tag is {} bytes, at most {TAG_MAX}", tag.len())),
            _ if tag.contains(&0) => Err("virtio-fs: the tag must not hold a NUL byte".into()),
            _ if self.socket.as_os_str().is_empty() => Err("virtio-fs: the socket path must not be empty".into()),
            _ if self.num_request_queues == 0 => Err("virtio-fs: num_request_queues must be at least 1".into()),
            // The queue count goes in a byte of vhost-user's vring index.
            _ if self.num_request_queues > 254 => Err("virtio-fs: num_request_queues must be at most 254".into()),
            _ if !self.queue_size.is_power_of_two() || self.queue_size > QUEUE_SIZE_MAX => Err(format!(
                "virtio-fs: queue_size {} must be a power of two from 1 to {QUEUE_SIZE_MAX}",
                self.queue_size
            )),
            _ => Ok(()),
        }
    }

    /// The configuration space: the tag, NUL-padded, then num_request_queues (le32).
    fn config_space(&self) -> Vec<u8> {
        let mut config = vec![0u8; TAG_MAX + 4];
        config[..self.tag.len()].copy_from_slice(self.tag.as_bytes());
        config[TAG_MAX..].copy_from_slice(&u32::from(self.num_request_queues).to_le_bytes());
        config
    }
}

/// A virtio-fs device, for the API and metrics.
pub struct FsHandle {
    pub id: String,
    pub tag: String,
    pub socket: PathBuf,
    /// Its backend failed, and why.
    pub health: Arc<Health>,
}

impl DeviceManager {
    /// A virtio-fs device: its backend's socket connected and its handshake done here. A
    /// socket that cannot be connected refuses the start (a configuration error); a
    /// backend that fails its handshake leaves the device failed and the guest running.
    pub fn attach_fs(&mut self, config: &FsConfig) -> Result<(), DeviceError> {
        config.validate().map_err(|e| DeviceError::backend(std::io::Error::other(e)))?;
        let label = format!("virtio-fs{}", self.virtio_of::<FsHandle>().count());
        let key = DeviceName::keyed(KIND, Some(&config.id), label.clone());
        // The backend maps guest memory: it must be shared (the machine's `shared_memory`).
        crate::virtio::vhost_user::backend::memory_table(self.memory()).map_err(|e| {
            DeviceError::backend(std::io::Error::other(format!("{label}: {e}; guest memory must be shared")))
        })?;
        let queues = 1 + usize::from(config.num_request_queues);
        let backend = match Backend::connect(&config.socket, queues) {
            Err(e @ BackendError::Connect { .. }) => return Err(DeviceError::backend(e)),
            other => other,
        };
        let spec = Spec {
            label: label.clone(),
            device_type: TYPE_FS,
            config: config.config_space(),
            queue_sizes: vec![config.queue_size; queues],
            features: VIRTIO_F_VERSION_1 | VIRTIO_F_INDIRECT_DESC | VIRTIO_F_EVENT_IDX,
            // virtiofsd's open files and FUSE session die with it: never reconnected.
            reconnect: None,
        };
        let setup = |source| DeviceError::Setup { name: label.clone(), source };
        let device = VhostUserDevice::new(spec, backend).map_err(setup)?;
        let handle = FsHandle {
            id: config.id.clone(),
            tag: config.tag.clone(),
            socket: config.socket.clone(),
            health: device.health(),
        };
        tracing::info!("{label}: tag {:?} on {}", config.tag, config.socket.display());
        let id = key.id.clone();
        self.attach_virtio(key, KIND, Box::new(device), handle)?;
        if let Some(device) = self.device_mut(&id) {
            device.handle.set_saves(Saves::Refused(NOT_SAVED));
        }
        Ok(())
    }

    /// The virtio-fs device its configuration calls `id`.
    pub fn fs(&self, id: &str) -> Result<&FsHandle, DeviceError> {
        self.virtio_of::<FsHandle>()
            .map(|(f, _)| f)
            .find(|f| f.id == id)
            .ok_or_else(|| DeviceError::NoSuch { what: "fs device", id: id.into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> FsConfig {
        FsConfig {
            id: "fs0".into(),
            tag: "share".into(),
            socket: "/tmp/fs.sock".into(),
            num_request_queues: 1,
            queue_size: 1024,
        }
    }

    #[test]
    fn the_configuration_space_is_the_tag_then_the_request_queues() {
        let space = FsConfig { num_request_queues: 3, ..config() }.config_space();
        assert_eq!(space.len(), 40);
        assert_eq!(&space[..5], b"share");
        assert!(space[5..36].iter().all(|&b| b == 0));
        assert_eq!(&space[36..], &3u32.to_le_bytes());
    }

    #[test]
    fn bad_configurations_are_refused_with_their_reason() {
        assert_eq!(config().validate(), Ok(()));
        let refused = |c: FsConfig| c.validate().unwrap_err();
        assert!(refused(FsConfig { tag: String::new(), ..config() }).contains("tag must not be empty"));
        assert!(refused(FsConfig { tag: "x".repeat(37), ..config() }).contains("at most 36"));
        assert!(refused(FsConfig { tag: "a\0b".into(), ..config() }).contains("NUL"));
        assert!(refused(FsConfig { num_request_queues: 0, ..config() }).contains("at least 1"));
        assert!(refused(FsConfig { queue_size: 1000, ..config() }).contains("power of two"));
        assert!(refused(FsConfig { queue_size: 0, ..config() }).contains("power of two"));
        assert!(refused(FsConfig { socket: PathBuf::new(), ..config() }).contains("socket"));
    }
}
