//! One vhost-user backend's session, on the rust-vmm `vhost` crate's frontend: the
//! handshake at attach (owner, features, protocol features, queue count), and per
//! activation the memory table and each vring (size, addresses, base, call, kick, enable);
//! a reset stops the vrings. Every reply is awaited at most [`REPLY_TIMEOUT`] (deadline.rs):
//! a backend that never answers is a backend that failed, not a VMM thread stuck for good.

use super::deadline::Deadline;
use crate::guest_memory::GuestMemoryMmap;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserHeaderFlag, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

/// The longest wait for one reply (or for the backend to take one request).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// The protocol features exitless uses where the backend offers them: several queues,
/// a reply to every request (so a refusal is seen where it happens), and the memory table
/// of up to the backend's own number of regions.
const WANTED_PROTOCOL: VhostUserProtocolFeatures =
    VhostUserProtocolFeatures::MQ.union(VhostUserProtocolFeatures::REPLY_ACK);

/// What went wrong with a backend, in words that name the step.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("cannot connect to the vhost-user socket {path}: {source}")]
    Connect { path: String, source: std::io::Error },
    #[error("the vhost-user backend failed at {step}: {source}")]
    Protocol { step: &'static str, source: vhost::Error },
    #[error("the vhost-user backend lacks {0}")]
    Lacks(String),
    #[error("guest memory at {0:#x} is not shared with the backend (not a file mapping)")]
    NotShared(u64),
    #[error("queue {0}'s rings are not inside guest memory")]
    Rings(usize),
    #[error(
        "queue {0}: the dead backend's rings do not tell which requests it had in hand (it offers \
         no INFLIGHT_SHMFD), so none is replayed"
    )]
    Unreplayable(usize),
    #[error("the vhost-user backend did not answer {0} within {REPLY_TIMEOUT:?}")]
    NoReply(&'static str),
    #[error("the vhost-user backend's configuration space is {got} bytes, {want} asked for")]
    ConfigSize { got: usize, want: usize },
}

/// Runs `request` (the step `name`) under `deadline`: its error, or no reply in time.
fn ask<T>(
    deadline: &Deadline,
    name: &'static str,
    request: impl FnOnce() -> Result<T, vhost::Error>,
) -> Result<T, BackendError> {
    match deadline.run(request) {
        Ok(done) => done.map_err(|source| BackendError::Protocol { step: name, source }),
        Err(()) => Err(BackendError::NoReply(name)),
    }
}

/// A connected backend, past its handshake.
pub struct Backend {
    frontend: Frontend,
    deadline: Arc<Deadline>,
    /// The virtio features the backend offers (its vhost-user bit taken out).
    pub features: u64,
    /// Whether the backend speaks protocol features (then vrings start disabled and are
    /// enabled by the frontend).
    protocol: bool,
    /// The protocol features both sides speak.
    pub acked_protocol: VhostUserProtocolFeatures,
    queues: usize,
}

impl Backend {
    /// Connects to `path` and shakes hands for `queues` queues.
    pub fn connect(path: &Path, queues: usize) -> Result<Backend, BackendError> {
        Backend::connect_with(path, queues, VhostUserProtocolFeatures::empty())
    }

    /// Connects to `path` and shakes hands for `queues` queues, asking for the protocol
    /// features `more` too (vhost-user-blk's CONFIG) where the backend offers them.
    pub fn connect_with(path: &Path, queues: usize, more: VhostUserProtocolFeatures) -> Result<Backend, BackendError> {
        let connect = |source| BackendError::Connect { path: path.display().to_string(), source };
        let stream = UnixStream::connect(path).map_err(connect)?;
        Backend::handshake(stream, queues, more)
    }

    /// The handshake over a connected `stream`.
    pub fn handshake(
        stream: UnixStream,
        queues: usize,
        more: VhostUserProtocolFeatures,
    ) -> Result<Backend, BackendError> {
        let watch = |source| BackendError::Connect { path: "(connected)".into(), source };
        let deadline = Deadline::new(stream.try_clone().map_err(watch)?.into(), REPLY_TIMEOUT).map_err(watch)?;
        Backend::handshake_on(stream, Arc::new(deadline), queues, more)
    }

    /// Connects to `path` again (the backend was restarted) and shakes hands as at first,
    /// under the same deadline's watch; the old connection is let go. On the device's
    /// thread: no thread is made.
    pub fn reconnect(&mut self, path: &Path, more: VhostUserProtocolFeatures) -> Result<(), BackendError> {
        let connect = |source| BackendError::Connect { path: path.display().to_string(), source };
        // The old connection ends first: a backend serving one connection at a time
        // (qemu-storage-daemon) takes the next only once the last is gone.
        // SAFETY: shutting down the socket this session owns; its later requests fail.
        unsafe { libc::shutdown(self.frontend.as_raw_fd(), libc::SHUT_RDWR) };
        let stream = UnixStream::connect(path).map_err(connect)?;
        let watched = stream.try_clone().map_err(connect)?;
        self.deadline.rewatch(watched.try_clone().map_err(connect)?.into());
        match Backend::handshake_on(stream, self.deadline.clone(), self.queues, more) {
            Ok(backend) => {
                *self = backend;
                Ok(())
            }
            Err(e) => {
                // The deadline's copy would keep a broken backend's connection open.
                let _ = watched.shutdown(std::net::Shutdown::Both);
                Err(e)
            }
        }
    }

    fn handshake_on(
        stream: UnixStream,
        deadline: Arc<Deadline>,
        queues: usize,
        more: VhostUserProtocolFeatures,
    ) -> Result<Backend, BackendError> {
        let mut frontend = Frontend::from_stream(stream, queues as u64);
        ask(&deadline, "SET_OWNER", || frontend.set_owner())?;
        let offered = ask(&deadline, "GET_FEATURES", || frontend.get_features())?;
        let protocol_bit = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        let protocol = offered & protocol_bit != 0;
        let mut acked_protocol = VhostUserProtocolFeatures::empty();
        if protocol {
            let theirs = ask(&deadline, "GET_PROTOCOL_FEATURES", || frontend.get_protocol_features())?;
            let acked = theirs & (WANTED_PROTOCOL | more);
            acked_protocol = acked;
            ask(&deadline, "SET_PROTOCOL_FEATURES", || frontend.set_protocol_features(acked))?;
            if acked.contains(VhostUserProtocolFeatures::REPLY_ACK) {
                frontend.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
            }
            if acked.contains(VhostUserProtocolFeatures::MQ) {
                let most = ask(&deadline, "GET_QUEUE_NUM", || frontend.get_queue_num())?;
                if (most as usize) < queues {
                    return Err(BackendError::Lacks(format!("queues: it serves {most}, the device needs {queues}")));
                }
            }
        }
        if offered & super::super::VIRTIO_F_VERSION_1 == 0 {
            return Err(BackendError::Lacks("VIRTIO_F_VERSION_1".into()));
        }
        Ok(Backend { frontend, deadline, features: offered & !protocol_bit, protocol, acked_protocol, queues })
    }

    /// The backend's configuration space, `size` bytes from offset 0 (GET_CONFIG; the
    /// protocol's CONFIG feature must have been agreed).
    pub fn config(&self) -> ConfigReader {
        ConfigReader { frontend: self.frontend.clone(), deadline: self.deadline.clone() }
    }

    /// The socket, for watching it close.
    pub fn socket_fd(&self) -> std::os::fd::RawFd {
        self.frontend.as_raw_fd()
    }

    /// The driver's `features` (and the vhost-user bit where the backend speaks protocol
    /// features), then guest memory's table.
    pub fn set_features_and_memory(&mut self, features: u64, mem: &GuestMemoryMmap) -> Result<(), BackendError> {
        let bit = if self.protocol { VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() } else { 0 };
        let (frontend, deadline) = (&mut self.frontend, &self.deadline);
        ask(deadline, "SET_FEATURES", || frontend.set_features(features | bit))?;
        let regions = memory_table(mem)?;
        ask(deadline, "SET_MEM_TABLE", || frontend.set_mem_table(&regions))?;
        Ok(())
    }

    /// Starts vring `index` on `queue`: the backend is kicked through `kick` (the guest's
    /// ioeventfd) and calls through `call` (an irqfd, or the VMM's relay).
    pub fn start_vring(
        &mut self,
        index: usize,
        queue: &Queue,
        mem: &GuestMemoryMmap,
        kick: &EventFd,
        call: &EventFd,
    ) -> Result<(), BackendError> {
        // The backend maps the rings by the VMM's own addresses for them.
        let host = |gpa: u64| {
            mem.get_host_address(GuestAddress(gpa)).map(|p| p as u64).map_err(|_| BackendError::Rings(index))
        };
        let config = VringConfigData {
            queue_max_size: queue.max_size(),
            queue_size: queue.size(),
            flags: 0,
            desc_table_addr: host(queue.desc_table())?,
            used_ring_addr: host(queue.used_ring())?,
            avail_ring_addr: host(queue.avail_ring())?,
            log_addr: None,
        };
        let (frontend, deadline) = (&mut self.frontend, &self.deadline);
        ask(deadline, "SET_VRING_NUM", || frontend.set_vring_num(index, queue.size()))?;
        ask(deadline, "SET_VRING_ADDR", || frontend.set_vring_addr(index, &config))?;
        ask(deadline, "SET_VRING_BASE", || frontend.set_vring_base(index, queue.next_avail()))?;
        ask(deadline, "SET_VRING_CALL", || frontend.set_vring_call(index, call))?;
        ask(deadline, "SET_VRING_KICK", || frontend.set_vring_kick(index, kick))?;
        if self.protocol {
            ask(deadline, "SET_VRING_ENABLE", || frontend.set_vring_enable(index, true))?;
        }
        Ok(())
    }

    /// Stops every vring (the driver reset the device): disabled, then its base asked
    /// for, which stops it (vhost-user's GET_VRING_BASE).
    /// Each stopped vring's base: the next avail entry the backend would have taken.
    pub fn stop_vrings(&mut self, started: usize) -> Result<Vec<u16>, BackendError> {
        let (frontend, deadline) = (&mut self.frontend, &self.deadline);
        let mut bases = Vec::new();
        for index in 0..started.min(self.queues) {
            if self.protocol {
                ask(deadline, "SET_VRING_ENABLE", || frontend.set_vring_enable(index, false))?;
            }
            let base = ask(deadline, "GET_VRING_BASE", || frontend.get_vring_base(index))?;
            // The split ring's index is 16 bits; a backend's larger number is malformed.
            bases.push(u16::try_from(base).map_err(|_| BackendError::Lacks(format!("a vring base: it sent {base}")))?);
        }
        Ok(bases)
    }
}

/// Reads a backend's configuration space from any thread (the device's, or the API's for
/// a configuration change), one request at a time with the session's.
#[derive(Clone)]
pub struct ConfigReader {
    frontend: Frontend,
    deadline: Arc<Deadline>,
}

impl ConfigReader {
    /// `size` bytes of the backend's configuration space from offset 0.
    pub fn read(&self, size: u32) -> Result<Vec<u8>, BackendError> {
        let mut frontend = self.frontend.clone();
        let buffer = vec![0u8; size as usize];
        let (_, space) = ask(&self.deadline, "GET_CONFIG", || {
            frontend.get_config(0, size, VhostUserConfigFlags::WRITABLE, &buffer)
        })?;
        if space.len() != size as usize {
            return Err(BackendError::ConfigSize { got: space.len(), want: size as usize });
        }
        Ok(space)
    }
}

/// Guest memory as the backend maps it: each region's file, offset, guest and VMM
/// addresses. A region that is not a file mapping (anonymous RAM) cannot be shared:
/// refused. The hotpluggable region (a memfd where memory is shared) is there whole,
/// plugged or not, as Cloud Hypervisor's table holds virtio-mem's: the guest hands the
/// backend buffers only in blocks it plugged, and an unplug punches the memfd's pages out
/// (guest_memory/plugs.rs), so no table change follows a plug or an unplug.
pub fn memory_table(mem: &GuestMemoryMmap) -> Result<Vec<VhostUserMemoryRegionInfo>, BackendError> {
    mem.iter()
        .map(|region| {
            let start = region.start_addr().0;
            let file = region.file_offset().ok_or(BackendError::NotShared(start))?;
            // The mapping's start, whether or not its first block is plugged.
            let host = region.host_range().start;
            Ok(VhostUserMemoryRegionInfo {
                guest_phys_addr: start,
                memory_size: region.len(),
                userspace_addr: host,
                mmap_offset: file.start(),
                mmap_handle: file.file().as_raw_fd(),
            })
        })
        .collect()
}
