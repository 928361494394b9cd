//! vhost-user-blk as Firecracker v1.16.1 takes it (`PUT /drives` with `socket`,
//! src/vmm/src/devices/virtio/block/vhost_user/): one queue of 256, the guest offered
//! what the backend offers of VERSION_1, EVENT_IDX, RO and (with cache_type Writeback)
//! FLUSH; the configuration space (60 bytes) read from the backend with GET_CONFIG where
//! it speaks the CONFIG protocol feature, else empty, as Firecracker's; read again on
//! `PATCH /drives/{id}` (the capacity changed), with a configuration interrupt. The
//! backend serves the queue itself (virtio::vhost_user); the VMM never sees a request.
//!
//! Beyond Firecracker (whose snapshot of such a drive aborts the VMM on MMIO and leaves
//! the drive out on PCI): a snapshot stops the backend's vring (GET_VRING_BASE) and saves
//! the queue where it stopped; a load connects to the socket again, shakes hands, and
//! hands the backend the restored memory and the vring at that base.
//!
//! Beyond Firecracker too: a backend that hangs up (killed, crashed) is reconnected on the
//! same socket once it listens again (vhost_user::reconnect), the drive failed meanwhile.

use crate::device_manager::{Attach, DeviceError, DeviceManager, DeviceName};
use crate::sync::lock;
use crate::virtio::blk::KIND;
use crate::virtio::vhost_user::metrics::store_since;
use crate::virtio::vhost_user::{
    Backend, BackendError, ConfigReader, Health, Reconnect, Spec, VhostUserDevice, VhostUserMetrics,
};
use crate::virtio::{VIRTIO_F_EVENT_IDX, VIRTIO_F_VERSION_1};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use vhost::vhost_user::message::VhostUserProtocolFeatures;

/// virtio's device type for a block device.
const TYPE_BLOCK: u16 = 2;
/// Firecracker's queue (one, of 256 entries) and configuration space size.
pub const QUEUE_SIZE: u16 = 256;
pub const CONFIG_SPACE_SIZE: u32 = 60;
/// virtio-blk's read-only and flush features.
pub const VIRTIO_BLK_F_RO: u64 = 1 << 5;
pub const VIRTIO_BLK_F_FLUSH: u64 = 1 << 9;

/// A vhost-user-blk drive's configuration (Firecracker's `VhostUserBlockConfig`: the
/// drive's id, its socket, and whether flushes are offered).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VublkConfig {
    pub id: String,
    pub socket: PathBuf,
    /// cache_type Writeback: FLUSH offered (if the backend offers it).
    pub writeback: bool,
}

impl VublkConfig {
    /// What the guest may be offered, before the backend's own offer is taken out.
    fn features(&self) -> u64 {
        let flush = if self.writeback { VIRTIO_BLK_F_FLUSH } else { 0 };
        VIRTIO_F_VERSION_1 | VIRTIO_F_EVENT_IDX | VIRTIO_BLK_F_RO | flush
    }
}

/// A backend connected and past its handshake, with its configuration space: made when
/// the drive is configured (as Firecracker connects on `PUT /drives`), attached at start.
pub struct Connection {
    backend: Backend,
    config: Vec<u8>,
    init_us: u64,
}

impl Connection {
    /// Whether the backend offers the drive read-only (VIRTIO_BLK_F_RO).
    pub fn read_only(&self) -> bool {
        self.backend.features & VIRTIO_BLK_F_RO != 0
    }
}

/// Connects to `config`'s socket, shakes hands and reads the configuration space.
pub fn connect(config: &VublkConfig) -> Result<Connection, BackendError> {
    let since = Instant::now();
    let backend = Backend::connect_with(&config.socket, 1, VhostUserProtocolFeatures::CONFIG)?;
    let config = match backend.acked_protocol.contains(VhostUserProtocolFeatures::CONFIG) {
        true => backend.config().read(CONFIG_SPACE_SIZE)?,
        false => Vec::new(),
    };
    let init_us = since.elapsed().as_micros().try_into().unwrap_or(u64::MAX);
    Ok(Connection { backend, config, init_us })
}

/// A connection made early, taken by the attach (or made there if there is none: a
/// snapshot's load connects again).
pub type Pending = Arc<Mutex<Option<Connection>>>;

/// The backends connected for the configured vhost-user drives, by drive id, until the
/// machine is built.
#[derive(Default)]
pub struct Connections {
    by_id: std::collections::HashMap<String, (Pending, bool)>,
}

impl Connections {
    /// Drive `id` is no longer a vhost-user drive (or is configured again): its backend let go.
    pub fn forget(&mut self, id: &str) {
        self.by_id.remove(id);
    }

    /// Keeps drive `id`'s connection for the start.
    pub fn keep(&mut self, id: &str, connection: Connection) {
        let read_only = connection.read_only();
        self.by_id.insert(id.to_string(), (Arc::new(Mutex::new(Some(connection))), read_only));
    }

    /// Whether drive `id`'s backend offers it read-only.
    pub fn read_only(&self, id: &str) -> bool {
        self.by_id.get(id).is_some_and(|(_, ro)| *ro)
    }

    /// Drive `id`'s connection, for its attach (empty if none was kept).
    pub fn pending(&self, id: &str) -> Pending {
        self.by_id.get(id).map(|(p, _)| p.clone()).unwrap_or_default()
    }
}

/// A vhost-user-blk drive on `config`, attached as the machine is built.
pub fn attach(config: VublkConfig, pending: Pending) -> Attach {
    Box::new(move |dm| dm.attach_vublk(&config, lock(&pending).take()))
}

/// A vhost-user-blk drive, for the API and metrics.
pub struct VublkHandle {
    pub id: String,
    pub socket: PathBuf,
    /// Its backend failed, and why.
    pub health: Arc<Health>,
    /// Firecracker's `vhost_user_block_<id>` counters.
    pub metrics: Arc<VhostUserMetrics>,
    config: Arc<Mutex<Vec<u8>>>,
    reader: Arc<Mutex<Option<ConfigReader>>>,
    config_protocol: bool,
}

impl DeviceManager {
    /// A vhost-user-blk drive over `connection` (made now if None). A socket that cannot
    /// be connected refuses the start (or the load); a backend that fails its handshake
    /// leaves the drive failed and the guest running.
    pub fn attach_vublk(&mut self, config: &VublkConfig, connection: Option<Connection>) -> Result<(), DeviceError> {
        let label = format!("vhost-user-blk{}", self.virtio_of::<VublkHandle>().count());
        // The backend maps guest memory: it must be shared (the machine's `shared_memory`).
        crate::virtio::vhost_user::backend::memory_table(self.memory()).map_err(|e| {
            DeviceError::backend(std::io::Error::other(format!("{label}: {e}; guest memory must be shared")))
        })?;
        let connection = match connection.map(Ok).unwrap_or_else(|| connect(config)) {
            Err(e @ BackendError::Connect { .. }) => return Err(DeviceError::backend(e)),
            other => other,
        };
        let (space, init_us) = match &connection {
            Ok(c) => (c.config.clone(), c.init_us),
            Err(_) => (Vec::new(), 0),
        };
        let config_protocol =
            connection.as_ref().is_ok_and(|c| c.backend.acked_protocol.contains(VhostUserProtocolFeatures::CONFIG));
        let spec = Spec {
            label: label.clone(),
            device_type: TYPE_BLOCK,
            config: space,
            queue_sizes: vec![QUEUE_SIZE],
            features: config.features(),
            reconnect: Some(Reconnect { socket: config.socket.clone(), protocol: VhostUserProtocolFeatures::CONFIG }),
        };
        let setup = |source| DeviceError::Setup { name: label.clone(), source };
        let device = VhostUserDevice::new(spec, connection.map(|c| c.backend)).map_err(setup)?;
        let metrics = device.metrics();
        metrics.init_time_us.store(init_us, std::sync::atomic::Ordering::Relaxed);
        let handle = VublkHandle {
            id: config.id.clone(),
            socket: config.socket.clone(),
            health: device.health(),
            metrics,
            config: device.config_slot(),
            reader: device.reader_slot(),
            config_protocol,
        };
        tracing::info!("{label}: drive {} on the vhost-user socket {}", config.id, config.socket.display());
        let name = DeviceName::keyed(KIND, Some(&config.id), label);
        self.attach_virtio(name, KIND, Box::new(device), handle).map(drop)
    }

    /// The vhost-user-blk drive its configuration calls `id`.
    pub fn vublk(&self, id: &str) -> Result<&VublkHandle, DeviceError> {
        self.virtio_of::<VublkHandle>()
            .map(|(d, _)| d)
            .find(|d| d.id == id)
            .ok_or_else(|| DeviceError::NoSuch { what: "vhost-user drive", id: id.into() })
    }

    /// The vhost-user-blk drives, in the order attached.
    pub fn vublks(&self) -> impl Iterator<Item = &VublkHandle> {
        self.virtio_of::<VublkHandle>().map(|(d, _)| d)
    }

    /// `PATCH /drives/{id}` of a vhost-user drive (Firecracker's `update_vhost_user_block_config`):
    /// the configuration space read from the backend again, the guest told by a
    /// configuration interrupt.
    pub fn update_vublk_config(&self, id: &str) -> Result<(), String> {
        let since = Instant::now();
        let (drive, transport) = self
            .virtio_of::<VublkHandle>()
            .find(|(d, _)| d.id == id)
            .ok_or_else(|| format!("no vhost-user drive {id}"))?;
        if let Some(why) = drive.health.failure() {
            return Err(format!("its backend failed: {why}"));
        }
        let reader = lock(&drive.reader).clone().filter(|_| drive.config_protocol);
        let reader = reader.ok_or("the backend does not speak vhost-user's CONFIG protocol feature")?;
        let space = reader.read(CONFIG_SPACE_SIZE).map_err(|e| e.to_string())?;
        *lock(&drive.config) = space;
        transport.core().config_changed();
        store_since(&drive.metrics.config_change_time_us, since);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_is_offered_only_with_writeback() {
        let config = VublkConfig { id: "d".into(), socket: "/s".into(), writeback: false };
        assert_eq!(config.features() & VIRTIO_BLK_F_FLUSH, 0);
        assert_ne!(config.features() & VIRTIO_BLK_F_RO, 0);
        let writeback = VublkConfig { writeback: true, ..config };
        assert_ne!(writeback.features() & VIRTIO_BLK_F_FLUSH, 0);
        assert_eq!(writeback.features() & crate::virtio::VIRTIO_F_INDIRECT_DESC, 0, "Firecracker offers none");
    }
}
