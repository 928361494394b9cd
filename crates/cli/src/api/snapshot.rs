//! Firecracker's snapshot endpoints: `PUT /snapshot/create` on a paused microVM (its
//! state file and memory file), `PUT /snapshot/load` on a VMM nothing was configured in
//! (the configuration comes from the state file; the guest resumes or stays paused).

use super::model::{MemBackend, MemBackendType, SnapshotCreate, SnapshotLoad, SnapshotType, VmConfig};
use super::vm::{Fault, State, Vm};
use exitless_vmm::snapshot::staged::Staged;
use exitless_vmm::snapshot::{MemoryBackend, Restore, SnapshotFile};
use exitless_vmm::Machine;

impl Vm {
    /// `PUT /snapshot/create`.
    pub fn create_snapshot(&mut self, c: SnapshotCreate) -> Result<(), Fault> {
        let State::Running { machine, .. } = &self.state else {
            return Err(Fault("Cannot create a snapshot: the microVM is not running.".into()));
        };
        if !machine.control().is_paused() {
            return Err(Fault(
                "The microVM must be paused to be snapshotted: PATCH /vm {\"state\": \"Paused\"} first.".into(),
            ));
        }
        // Without track_dirty_pages a Diff holds every resident page, as in Firecracker.
        let diff = c.snapshot_type == Some(SnapshotType::Diff);
        // KVM's dirty log sees the guest's writes only, not a vhost-user backend's.
        if diff && self.config.machine_config.track_dirty_pages && self.shared_memory() {
            return Err(Fault(
                "Cannot create a Diff snapshot of dirty pages: a vhost-user backend writes guest memory where KVM's \
                 dirty log does not see it; take a Full snapshot."
                    .into(),
            ));
        }
        // Both files are written at staged names beside their paths and renamed over them
        // once whole: a failed create leaves the previous snapshot as it was, and clones
        // that map its memory file keep it (snapshot/staged.rs). Anything there but a
        // regular file (a FIFO, a device) is refused untouched.
        let memory =
            Staged::new(c.mem_file_path.as_ref()).map_err(|e| Fault(format!("Cannot create the memory file: {e}.")))?;
        let state_file = Staged::new(c.snapshot_path.as_ref())
            .map_err(|e| Fault(format!("Cannot create the snapshot file: {e}.")))?;
        let (state, written) =
            machine.snapshot(&memory, diff).map_err(|e| Fault(format!("Cannot create a snapshot: {e}.")))?;
        let config = serde_json::to_value(&self.config)?;
        SnapshotFile::new(state, config).write(state_file.temp()).map_err(|e| Fault(format!("{e}.")))?;
        // The memory first: a state file names the memory it goes with only by being
        // beside it, and from here on both are whole.
        let commit = |f: Staged, what| {
            let path = f.path().display().to_string();
            f.commit().map_err(|e| Fault(format!("Cannot write the {what} {path}: {e}.")))
        };
        commit(memory, "memory file")?;
        commit(state_file, "snapshot file")?;
        tracing::info!("snapshot created: {} bytes of memory written", written);
        Ok(())
    }

    /// `PUT /snapshot/load`: the machine to run, and whether it stays paused.
    pub fn load_snapshot(&mut self, l: SnapshotLoad) -> Result<(Machine, bool), Fault> {
        self.pre_boot()?;
        // Logging and metrics may be set up first, as Firecracker allows (the Go SDK does).
        let (logger, metrics) = (self.config.logger.clone(), self.config.metrics.clone());
        let unconfigured = VmConfig { logger: logger.clone(), metrics: metrics.clone(), ..VmConfig::default() };
        if self.config != unconfigured {
            return Err(Fault("Loading a snapshot is only allowed before anything is configured.".into()));
        }
        let backend = match (&l.mem_backend, &l.mem_file_path) {
            (Some(b), None) => b.clone(),
            (None, Some(path)) => MemBackend { backend_type: MemBackendType::File, backend_path: path.clone() },
            (Some(_), Some(_)) => return Err(Fault("Give mem_backend or mem_file_path, not both.".into())),
            (None, None) => return Err(Fault("The memory file is missing: give mem_backend.".into())),
        };
        let file = SnapshotFile::read(l.snapshot_path.as_ref()).map_err(|e| Fault(format!("{e}.")))?;
        let config: VmConfig = serde_json::from_value(file.config)
            .map_err(|e| Fault(format!("{}: its configuration is not Firecracker's: {e}.", l.snapshot_path)))?;
        if let Some(e) = config.too_many() {
            return Err(Fault(format!("{}: its configuration lists {e}.", l.snapshot_path)));
        }
        // This VMM's own logging and metrics, not the snapshotted one's; dirty pages tracked
        // as the load asks (for Diff snapshots of the restored guest).
        let mut config = VmConfig { logger, metrics, ..config };
        for o in l.network_overrides.iter().flatten() {
            let nic = config.network_interfaces.iter_mut().find(|n| n.iface_id == o.iface_id);
            let nic = nic
                .ok_or_else(|| Fault(format!("The snapshot has no network interface {:?} to override.", o.iface_id)))?;
            nic.host_dev_name.clone_from(&o.host_dev_name);
        }
        config.machine_config.track_dirty_pages = l.track_dirty_pages.or(l.enable_diff_snapshots).unwrap_or(false);
        let path = &backend.backend_path;
        let memory = match backend.backend_type {
            // Opened without waiting on a FIFO; a regular file of the RAM's size is
            // checked on this descriptor before it is mapped (check_restore).
            MemBackendType::File => MemoryBackend::File(
                exitless_vmm::files::open_regular(path.as_ref(), false)
                    .map_err(|e| Fault(format!("Cannot open the memory file: {e}.")))?
                    .0,
            ),
            MemBackendType::Uffd => MemoryBackend::Uffd(path.into()),
        };
        if let Some(o) = &l.vsock_override {
            let vsock =
                config.vsock.as_mut().ok_or_else(|| Fault("The snapshot has no vsock device to override.".into()))?;
            vsock.uds_path.clone_from(&o.uds_path);
        }
        let clock_realtime = l.clock_realtime.unwrap_or(false);
        if clock_realtime && !file.machine.vm.has_realtime() {
            return Err(Fault("clock_realtime requested but not present in the snapshot state.".into()));
        }
        if let Some(v) = &config.vsock {
            remove_stale_socket(std::path::Path::new(&v.uds_path));
        }
        self.config = config;
        let restore = Restore { state: file.machine, memory, clock_realtime };
        let built = self.build(Some(restore));
        if built.is_err() {
            // Nothing started: the VMM is as unconfigured as before.
            self.config = unconfigured;
        }
        Ok((built?, !l.resume_vm.unwrap_or(false)))
    }
}

/// The vsock socket the snapshotted VMM left behind (it was killed, as a restore's source
/// usually is): removed if nothing listens on it, so the restored device can bind it. A
/// socket someone listens on stays, and the load fails on it with the bind's error.
fn remove_stale_socket(path: &std::path::Path) {
    use std::os::unix::fs::FileTypeExt;
    let is_socket = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket());
    if is_socket && nobody_listens(path) {
        tracing::info!("removing {}: a vsock socket nothing listens on (left by the snapshotted VMM)", path.display());
        let _ = std::fs::remove_file(path);
    }
}

/// Whether a connection to the Unix socket at `path` is refused. The connect does not
/// block: the path comes from the state file, and a listener that never accepts (its
/// backlog full) would hold the API thread for good.
fn nobody_listens(path: &std::path::Path) -> bool {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: sockaddr_un is plain data, for which all zeros is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let bytes = path.as_os_str().as_encoded_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return false; // no socket can be bound there either
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (to, &b) in addr.sun_path.iter_mut().zip(bytes) {
        *to = b as libc::c_char;
    }
    // SAFETY: socket(2) takes no memory; the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return false;
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: connect reads `len` bytes of `addr`, a sockaddr_un on our stack.
    let r = unsafe { libc::connect(fd.as_raw_fd(), (&raw const addr).cast(), len) };
    r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECONNREFUSED)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    #[test]
    fn a_stale_socket_goes_and_a_listener_that_never_accepts_holds_nobody() {
        let dir = std::env::temp_dir().join(format!("exitless-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (stale, busy) = (dir.join("stale.sock"), dir.join("busy.sock"));
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        let listener = std::os::unix::net::UnixListener::bind(&busy).unwrap();
        // SAFETY: listen(2) again on our own socket: a backlog of 0, so one connection
        // nobody accepts fills it and the next blocking connect would wait.
        assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
        let _queued = std::os::unix::net::UnixStream::connect(&busy).unwrap();
        let (done, finished) = std::sync::mpsc::channel();
        let (s, b) = (stale.clone(), busy.clone());
        std::thread::spawn(move || {
            super::remove_stale_socket(&s);
            super::remove_stale_socket(&b);
            let _ = done.send(());
        });
        assert!(finished.recv_timeout(Duration::from_secs(10)).is_ok(), "the check waited on a full backlog");
        assert!(!stale.exists(), "nothing listened: removed");
        assert!(busy.exists(), "a listener: kept");
        drop(listener);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
