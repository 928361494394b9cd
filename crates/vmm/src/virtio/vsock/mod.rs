//! virtio-vsock (device type 19) with Firecracker's host side: a Unix socket at
//! `uds_path` where a host process writes `CONNECT <port>\n` to reach the guest's port
//! (answered `OK <local port>\n`), and `<uds_path>_<port>` sockets the VMM connects to when
//! the guest connects to the host (CID 2) on that port. Three queues (rx, tx, event) on
//! one device thread (muxer.rs) woken by their ioeventfds and by the sockets.

mod attach;
mod conn;
mod muxer;
pub mod packet;

pub use attach::{attach, VsockHandle, KIND};

use super::thread::{DeviceThread, QueuePosition};
use super::{ActivateError, Activation, ActiveQueue, VirtioDevice};
use super::{VIRTIO_F_EVENT_IDX, VIRTIO_F_VERSION_1};
use crate::seccomp::ThreadKind;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

const QUEUE_SIZE: u16 = 256;

/// `PUT /vsock`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VsockConfig {
    pub guest_cid: u64,
    pub uds_path: PathBuf,
    /// Its configuration's id (Firecracker's `vsock_id`), which a snapshot knows it by.
    pub id: Option<String>,
}

/// Counters the report and the lab read while the device runs.
#[derive(Default)]
pub struct VsockStats {
    pub rx_packets: AtomicU64,
    pub tx_packets: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub tx_bytes: AtomicU64,
    /// Packets from the guest refused (bad header, unknown connection, beyond credit).
    pub bad_packets: AtomicU64,
    pub resets: AtomicU64,
    /// RSTs not sent: the guest left too many waiting (muxer/control.rs).
    pub resets_dropped: AtomicU64,
    pub kicks: AtomicU64,
    pub irqs: AtomicU64,
    pub connections: AtomicU64,
    /// What polling found and cost (crate::poll).
    pub poll: crate::poll::PollStats,
}

impl AsRef<crate::poll::PollStats> for VsockStats {
    fn as_ref(&self) -> &crate::poll::PollStats {
        &self.poll
    }
}

pub struct VirtioVsock {
    config: VsockConfig,
    poll: crate::poll::PollMode,
    listener: Arc<UnixListener>,
    pub stats: Arc<VsockStats>,
    thread: DeviceThread<muxer::Muxer>,
}

#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    #[error("guest CID {0} does not fit the 32 bits Firecracker's API gives it")]
    Cid(u64),
    #[error("cannot listen on {0}")]
    Listen(PathBuf, #[source] std::io::Error),
    #[error("cannot start its thread")]
    Thread(#[source] std::io::Error),
}

impl VirtioVsock {
    /// Binds `uds_path` (which must not exist, as Firecracker requires) and starts the
    /// device thread, idle until the driver activates the device.
    pub fn new(config: VsockConfig, poll: crate::poll::PollMode) -> Result<Self, VsockError> {
        // Any 32-bit CID, as Firecracker (whose VsockDeviceConfig checks none): the Go SDK
        // sends 0 for a device configured without one (firecracker-containerd's), and
        // the host side never routes by the guest's CID.
        if config.guest_cid > u64::from(u32::MAX) {
            return Err(VsockError::Cid(config.guest_cid));
        }
        let listener =
            UnixListener::bind(&config.uds_path).map_err(|e| VsockError::Listen(config.uds_path.clone(), e))?;
        listener.set_nonblocking(true).map_err(|e| VsockError::Listen(config.uds_path.clone(), e))?;
        let thread = DeviceThread::spawn("virtio-vsock", ThreadKind::Vsock).map_err(VsockError::Thread)?;
        Ok(VirtioVsock { config, poll, listener: Arc::new(listener), stats: Arc::default(), thread })
    }

    pub fn uds_path(&self) -> &Path {
        &self.config.uds_path
    }
}

/// One pass over what the guest queued (its packets acted on, the replies put in its
/// receive buffers), without a thread: for the fuzz target. Returns the packets refused.
pub fn process_once(config: &VsockConfig, listener: UnixListener, queues: [ActiveQueue; 3], a: Activation) -> u64 {
    let stats = Arc::new(VsockStats::default());
    let mut muxer = muxer::Muxer::new(config, Arc::new(listener), stats.clone(), queues, a);
    muxer.process_once();
    stats.bad_packets.load(std::sync::atomic::Ordering::Relaxed)
}

impl Drop for VirtioVsock {
    fn drop(&mut self) {
        self.thread.stop();
        let _ = std::fs::remove_file(&self.config.uds_path);
    }
}

impl VirtioDevice for VirtioVsock {
    fn device_type(&self) -> u16 {
        19
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | VIRTIO_F_EVENT_IDX
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE; 3]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let cid = self.config.guest_cid.to_le_bytes();
        for (i, b) in data.iter_mut().enumerate() {
            *b = usize::try_from(offset).ok().and_then(|o| cid.get(o + i)).copied().unwrap_or(0);
        }
    }

    fn activate(&mut self, queues: Vec<ActiveQueue>, a: Activation) -> Result<(), ActivateError> {
        self.thread.stop();
        let have = queues.len();
        let Ok(queues) = <[ActiveQueue; 3]>::try_from(queues) else {
            return Err(ActivateError::QueueCount { want: 3, have });
        };
        let mut muxer = muxer::Muxer::new(&self.config, self.listener.clone(), self.stats.clone(), queues, a);
        muxer.poll = self.poll;
        self.thread.start(muxer)
    }

    fn reset(&mut self) {
        // The connections close with the muxer; the host sockets see EOF.
        self.thread.stop();
    }

    fn pause(&mut self) -> Option<Vec<QueuePosition>> {
        // Packets are taken and answered in one pass; streams keep their bytes in their
        // sockets until the muxer resumes (a snapshot's copy of the guest resets them).
        self.thread.pause()
    }

    fn resume(&mut self) -> Result<(), ActivateError> {
        self.thread.resume()
    }
}
