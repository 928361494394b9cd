//! A virtio device whose queues a vhost-user backend serves: the transport's registers and
//! the device's configuration stay in the VMM; at DRIVER_OK the device's thread hands the
//! backend guest memory and each queue, the guest's ioeventfd as its kick and an irqfd as
//! its call, so a request costs the VMM no userspace exit and no thread wake-up. The
//! thread then only watches the backend's socket: a backend that closes it (killed, or
//! crashed) or fails a request marks the device failed (said once, NEEDS_RESET for the
//! driver) and nothing else; where the spec allows it (vhost-user-blk), a backend that
//! hung up is reconnected instead (reconnect.rs), the driver told nothing.
//!
//! The call: over PCI, the queue's MSI-X vector's irqfd (a vector the guest masks still
//! delivers: KVM's route is not torn down while masked; Linux masks vectors only while
//! it moves them, where a spurious interrupt is harmless); over MMIO with the mapped
//! register page, the line's irqfd, with InterruptStatus's used-buffer bit set once and
//! kept (as the page keeps it, see virtio::mmio); otherwise (trapped MMIO, a queue without
//! a vector) an eventfd the thread relays to the transport's interrupt.

use super::backend::{Backend, BackendError, ConfigReader};
use super::metrics::{count, store_since, VhostUserMetrics};
use super::reconnect::{replay_is_exact, Reconnect, Retries};
use crate::seccomp::ThreadKind;
use crate::sync::lock;
use crate::virtio::thread::{DeviceJob, DeviceThread};
use crate::virtio::{ActivateError, Activation, ActiveQueue, Delivery, QueuePosition, VirtioDevice, ISR_QUEUE};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use virtio_queue::QueueT;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

/// A device's backend, as the API and metrics see it: failed, and why, or not.
#[derive(Debug, Default)]
pub struct Health {
    failed: Mutex<Option<String>>,
}

impl Health {
    /// Why the backend failed, if it did.
    pub fn failure(&self) -> Option<String> {
        lock(&self.failed).clone()
    }

    /// Marks the device failed for `why` (the first reason is kept and logged, once);
    /// true the first time.
    pub fn fail(&self, device: &str, why: &str) -> bool {
        let mut failed = lock(&self.failed);
        if failed.is_some() {
            return false;
        }
        tracing::error!("{device}: the vhost-user backend failed: {why}; the device is marked failed");
        *failed = Some(why.to_string());
        true
    }

    /// A failed device's reason, restated (a reconnection's latest failure).
    fn restate(&self, why: String) {
        if let Some(failed) = lock(&self.failed).as_mut() {
            *failed = why;
        }
    }

    /// The backend is back.
    fn recover(&self) {
        *lock(&self.failed) = None;
    }
}

/// What a vhost-user device is, beyond its backend: its virtio type, configuration space
/// and queues, and which of the backend's features the guest is offered.
pub struct Spec {
    /// Its name in logs (`virtio-fs0`).
    pub label: String,
    pub device_type: u16,
    pub config: Vec<u8>,
    pub queue_sizes: Vec<u16>,
    /// The features the device may offer (those the backend offers too are).
    pub features: u64,
    /// Where a backend that hung up is reconnected (None: never, the device stays failed).
    pub reconnect: Option<Reconnect>,
}

pub struct VhostUserDevice {
    spec: Arc<Spec>,
    /// The configuration space the driver reads: the spec's, or the backend's as last read
    /// (a block device's capacity changes).
    config: Arc<Mutex<Vec<u8>>>,
    metrics: Arc<VhostUserMetrics>,
    features: u64,
    /// The backend while no activation runs (the running session holds it otherwise);
    /// None if its handshake failed.
    backend: Option<Backend>,
    relays: Option<Vec<EventFd>>,
    health: Arc<Health>,
    /// The connected backend's configuration reader (a reconnection replaces it).
    reader: Arc<Mutex<Option<ConfigReader>>>,
    thread: DeviceThread<Session>,
}

impl VhostUserDevice {
    /// A device over `backend` (its handshake done), or over a backend whose handshake
    /// failed (`Err`): that device is failed from the start and never runs, the guest and
    /// the other devices go on.
    pub fn new(spec: Spec, backend: Result<Backend, BackendError>) -> std::io::Result<VhostUserDevice> {
        let health = Arc::new(Health::default());
        let (features, backend) = match backend {
            Ok(b) => (b.features & spec.features, Some(b)),
            Err(e) => {
                health.fail(&spec.label, &e.to_string());
                (crate::virtio::VIRTIO_F_VERSION_1, None)
            }
        };
        let relays = (0..spec.queue_sizes.len()).map(|_| EventFd::new(libc::EFD_NONBLOCK)).collect::<Result<_, _>>()?;
        let thread = DeviceThread::spawn("vhost-user", ThreadKind::VhostUser)?;
        let config = Arc::new(Mutex::new(spec.config.clone()));
        let metrics = Arc::new(VhostUserMetrics::default());
        let (relays, spec) = (Some(relays), Arc::new(spec));
        let reader = Arc::new(Mutex::new(backend.as_ref().map(Backend::config)));
        Ok(VhostUserDevice { spec, config, metrics, features, backend, relays, health, reader, thread })
    }

    /// Its backend's configuration reader (None while its handshake failed), for a
    /// configuration change read from the backend.
    pub fn reader_slot(&self) -> Arc<Mutex<Option<ConfigReader>>> {
        self.reader.clone()
    }

    /// Its backend's health, for the API and metrics.
    pub fn health(&self) -> Arc<Health> {
        self.health.clone()
    }

    /// Its configuration space, for a change read from the backend.
    pub fn config_slot(&self) -> Arc<Mutex<Vec<u8>>> {
        self.config.clone()
    }

    /// Its counters.
    pub fn metrics(&self) -> Arc<VhostUserMetrics> {
        self.metrics.clone()
    }
}

impl VirtioDevice for VhostUserDevice {
    fn device_type(&self) -> u16 {
        self.spec.device_type
    }

    fn features(&self) -> u64 {
        self.features
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        self.spec.queue_sizes.clone()
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let config = lock(&self.config);
        // Firecracker counts a read that starts past the space.
        if usize::try_from(offset).map_or(true, |o| o >= config.len()) {
            count(&self.metrics.cfg_fails);
        }
        crate::virtio::copy_config(&config, offset, data);
    }

    fn activate(&mut self, queues: Vec<ActiveQueue>, activation: Activation) -> Result<(), ActivateError> {
        let failed = |why: String| {
            count(&self.metrics.activate_fails);
            ActivateError::Backend(why)
        };
        if let Some(why) = self.health.failure() {
            return Err(failed(why));
        }
        let (Some(backend), Some(relays)) = (self.backend.take(), self.relays.take()) else {
            return Err(failed("the backend is gone".into()));
        };
        let session = Session {
            spec: self.spec.clone(),
            metrics: self.metrics.clone(),
            backend,
            relays,
            health: self.health.clone(),
            reader: self.reader.clone(),
            queues,
            activation,
            started: 0,
            retries: None,
        };
        // The messages go from the device's thread: a vCPU never waits for a backend.
        self.thread.start(session)
    }

    fn reset(&mut self) {
        if let Some(session) = self.thread.stop() {
            self.backend = Some(session.backend);
            self.relays = Some(session.relays);
        }
    }

    /// Stops the backend's vrings (GET_VRING_BASE: each queue's next avail entry is the
    /// backend's) and keeps the session to start them again where they stopped.
    fn pause(&mut self) -> Option<Vec<QueuePosition>> {
        self.thread.pause()
    }

    fn resume(&mut self) -> Result<(), ActivateError> {
        self.thread.resume()
    }
}

/// One activation, on the device's thread: the backend started on the driver's queues,
/// then its socket watched until the driver resets the device.
struct Session {
    spec: Arc<Spec>,
    metrics: Arc<VhostUserMetrics>,
    backend: Backend,
    relays: Vec<EventFd>,
    health: Arc<Health>,
    reader: Arc<Mutex<Option<ConfigReader>>>,
    queues: Vec<ActiveQueue>,
    activation: Activation,
    /// How many vrings the backend was given (stopped on reset).
    started: usize,
    /// The reconnection under way, after the backend hung up.
    retries: Option<Retries>,
}

const TOKEN_STOP: u64 = u64::MAX;
/// The longest wait for the requests a stopped backend still had in hand.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(2);
const TOKEN_SOCKET: u64 = u64::MAX - 1;

impl Session {
    /// Everything the backend needs to serve the queues; the relays the thread must serve.
    fn start(&mut self) -> Result<Vec<usize>, BackendError> {
        let since = std::time::Instant::now();
        let relayed = self.start_vrings()?;
        store_since(&self.metrics.activate_time_us, since);
        Ok(relayed)
    }

    fn start_vrings(&mut self) -> Result<Vec<usize>, BackendError> {
        let a = &self.activation;
        self.backend.set_features_and_memory(a.features, &a.mem)?;
        let mut relayed = Vec::new();
        for (i, q) in self.queues.iter().enumerate() {
            if !q.queue.ready() {
                continue;
            }
            let call = match &a.interrupt.delivery {
                Delivery::Msix { msix, queue_vectors, .. } => {
                    queue_vectors.get(i).and_then(|&v| lock(msix).vector_irqfd(v).and_then(|fd| fd.try_clone().ok()))
                }
                Delivery::Line { irqfd, mirror: Some((mirror, status)) } => {
                    // The used-buffer bit stays set on the mapped page: every interrupt the
                    // backend raises sends the driver to its queues.
                    a.interrupt.isr.fetch_or(ISR_QUEUE, std::sync::atomic::Ordering::AcqRel);
                    mirror.raise(ISR_QUEUE, status.get());
                    irqfd.try_clone().ok()
                }
                Delivery::Line { mirror: None, .. } => None,
            };
            let relay = call.is_none();
            let call = match call {
                Some(fd) => fd,
                None => self.relays[i].try_clone().map_err(|e| BackendError::Lacks(format!("an eventfd: {e}")))?,
            };
            let queue = &q.queue;
            self.backend.start_vring(i, queue, &a.mem, &q.kick, &call)?;
            self.started = i + 1;
            if relay {
                relayed.push(i);
            }
        }
        Ok(relayed)
    }

    /// The queues where the backend stopped them: its bases, and the used index it left
    /// in guest memory (what a snapshot saves and a resume starts from).
    /// A request the backend took before it stopped may still be finishing (a disk
    /// write): its used entry is waited for, up to [`DRAIN`], so a snapshot holds it.
    fn stopped_at(&mut self, bases: &[u16]) {
        let mem = &self.activation.mem;
        let until = std::time::Instant::now() + DRAIN;
        for (i, (q, &base)) in self.queues.iter_mut().zip(bases).enumerate() {
            q.queue.set_next_avail(base);
            let used = || q.queue.used_idx(mem, std::sync::atomic::Ordering::Acquire).map(|u| u.0);
            while used().is_ok_and(|u| u != base) && std::time::Instant::now() < until {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            match used() {
                Ok(u) if u != base => tracing::warn!(
                    "{}: queue {i}: the backend stopped at {base} with {} requests unfinished",
                    self.spec.label,
                    base.wrapping_sub(u)
                ),
                _ => {}
            }
            if let Ok(u) = used() {
                q.queue.set_next_used(u);
            }
        }
    }

    fn fail(&self, why: &str) {
        if self.health.fail(&self.spec.label, why) {
            self.activation.status.needs_reset(&self.activation.interrupt);
        }
    }

    /// Waits for the driver's reset, relaying calls where the backend cannot reach the
    /// guest's interrupt itself, and watching the socket close.
    fn watch(&mut self, stop: &EventFd, relayed: &[usize]) {
        let epoll = match self.epoll(stop, relayed) {
            Ok(epoll) => epoll,
            Err(e) => return self.fail(&format!("cannot watch its socket: {e}")),
        };
        let mut events = [EpollEvent::default(); 8];
        loop {
            let timeout = self.retries.as_ref().map_or(-1, |r| r.wait().as_millis() as i32);
            let n = match epoll.wait(timeout, &mut events) {
                Ok(0) if self.retries.is_some() => {
                    self.retry(&epoll);
                    continue;
                }
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return self.fail(&format!("epoll failed: {e}")),
            };
            for event in &events[..n] {
                match event.data() {
                    TOKEN_STOP => return,
                    TOKEN_SOCKET => {
                        let _ = epoll.ctl(ControlOperation::Delete, self.backend.socket_fd(), EpollEvent::default());
                        self.lost("it closed its socket");
                    }
                    q => {
                        let q = q as usize;
                        if self.relays.get(q).is_some_and(|fd| fd.read().is_ok()) {
                            self.activation.interrupt.signal_queue(q);
                        }
                    }
                }
            }
        }
    }

    fn epoll(&self, stop: &EventFd, relayed: &[usize]) -> std::io::Result<Epoll> {
        let epoll = Epoll::new()?;
        epoll.ctl(ControlOperation::Add, stop.as_raw_fd(), EpollEvent::new(EventSet::IN, TOKEN_STOP))?;
        self.watch_socket(&epoll)?;
        for &q in relayed {
            epoll.ctl(ControlOperation::Add, self.relays[q].as_raw_fd(), EpollEvent::new(EventSet::IN, q as u64))?;
        }
        Ok(epoll)
    }

    /// Watches only the socket's end: its replies are read where each request is sent.
    fn watch_socket(&self, epoll: &Epoll) -> std::io::Result<()> {
        let hang_up = EventSet::READ_HANG_UP | EventSet::HANG_UP;
        epoll.ctl(ControlOperation::Add, self.backend.socket_fd(), EpollEvent::new(hang_up, TOKEN_SOCKET))
    }

    /// The backend is gone (it closed its socket, or was gone or broken by the time its
    /// vrings were to start): the device fails, and is reconnected where it can be.
    fn lost(&mut self, why: &str) {
        let Some(at) = &self.spec.reconnect else { return self.fail(why) };
        let why = format!("{why}; reconnecting to {}", at.socket.display());
        // The driver is not told: its requests wait for the backend to come back.
        self.health.fail(&self.spec.label, &why);
        self.retries.get_or_insert_with(Retries::default);
    }

    /// One attempt to reconnect; on success the socket is watched again.
    fn retry(&mut self, epoll: &Epoll) {
        let (Some(at), Some(mut retries)) = (self.spec.reconnect.clone(), self.retries.take()) else { return };
        let broken = match self.reconnect(&at) {
            Ok(relayed) => match self.watch_socket(epoll) {
                Ok(()) => {
                    for q in relayed {
                        // Already watched if the first activation started it (EEXIST).
                        let relay = EpollEvent::new(EventSet::IN, q as u64);
                        let _ = epoll.ctl(ControlOperation::Add, self.relays[q].as_raw_fd(), relay);
                    }
                    self.health.recover();
                    // A warning, not info: the default level shows it, as it showed the failure.
                    return tracing::warn!("{}: reconnected to {}", self.spec.label, at.socket.display());
                }
                Err(e) => BackendError::Lacks(format!("a watch on its socket: {e}")),
            },
            // The guest's rings will not change their past: no attempt will do.
            Err(e @ BackendError::Unreplayable(_)) => {
                let why = format!("it closed its socket; not reconnected: {e}");
                self.health.restate(why.clone());
                tracing::error!("{}: {why}", self.spec.label);
                return self.activation.status.needs_reset(&self.activation.interrupt);
            }
            // Nobody listens yet: tried again, unsaid.
            Err(BackendError::Connect { .. }) => {
                retries.refused();
                self.retries = Some(retries);
                return;
            }
            Err(e) => e,
        };
        let more = retries.broken();
        let tries = retries.broken_count();
        let why = format!("it closed its socket; {tries} reconnections to {} failed: {broken}", at.socket.display());
        self.health.restate(why.clone());
        if more {
            self.retries = Some(retries);
        } else {
            tracing::error!("{}: {why}; not reconnected again", self.spec.label);
            self.activation.status.needs_reset(&self.activation.interrupt);
        }
    }

    /// The handshake again, then the vrings where the guest's used rings stand: requests
    /// the dead backend took but never completed are taken again (a block read or write
    /// done twice is the same read or write), and each queue kicked once for them.
    fn reconnect(&mut self, at: &Reconnect) -> Result<Vec<usize>, BackendError> {
        self.replayable()?;
        self.backend.reconnect(&at.socket, at.protocol)?;
        let driver = self.activation.features & self.spec.features;
        let lacking = driver & !self.backend.features;
        if lacking != 0 {
            return Err(BackendError::Lacks(format!("features the driver uses ({lacking:#x})")));
        }
        self.at_used_index()?;
        let relayed = self.start_vrings()?;
        for q in self.queues.iter().filter(|q| q.queue.ready()) {
            let _ = q.kick.write(1);
        }
        *lock(&self.reader) = Some(self.backend.config());
        Ok(relayed)
    }

    /// Whether each queue can be taken again at its used index (reconnect::replay_is_exact),
    /// over the entries both rings still hold before it.
    fn replayable(&self) -> Result<(), BackendError> {
        use vm_memory::{Bytes, GuestAddress};
        let mem = &self.activation.mem;
        for (i, q) in self.queues.iter().enumerate().filter(|(_, q)| q.queue.ready()) {
            let q = &q.queue;
            let size = q.size();
            let rings = |_| BackendError::Rings(i);
            if size == 0 {
                continue;
            }
            let avail_idx: u16 = mem.read_obj(GuestAddress(q.avail_ring() + 2)).map_err(rings)?;
            let used_idx: u16 = mem.read_obj(GuestAddress(q.used_ring() + 2)).map_err(rings)?;
            // The avail ring holds its last `size` entries; the driver may publish more
            // meanwhile, but with no indirect descriptors (none offered) a request takes
            // two or more, so at most half the ring is in hand: the half before stays.
            let window = size.saturating_sub(avail_idx.wrapping_sub(used_idx)).min(size / 2);
            let (mut avail, mut used) = (Vec::new(), Vec::new());
            for k in 1..=window {
                let slot = u64::from(used_idx.wrapping_sub(k) % size);
                avail.push(mem.read_obj::<u16>(GuestAddress(q.avail_ring() + 4 + 2 * slot)).map_err(rings)?);
                used.push(mem.read_obj::<u32>(GuestAddress(q.used_ring() + 4 + 8 * slot)).map_err(rings)?);
            }
            if !replay_is_exact(&avail, &used) {
                return Err(BackendError::Unreplayable(i));
            }
        }
        Ok(())
    }

    /// Each queue where its used ring stands: where a backend that comes back (now, at a
    /// resume, or in a snapshot's load) starts, what it had not completed taken again.
    fn at_used_index(&mut self) -> Result<(), BackendError> {
        let mem = &self.activation.mem;
        for (i, q) in self.queues.iter_mut().enumerate().filter(|(_, q)| q.queue.ready()) {
            let used =
                q.queue.used_idx(mem, std::sync::atomic::Ordering::Acquire).map_err(|_| BackendError::Rings(i))?;
            q.queue.set_next_avail(used.0);
            q.queue.set_next_used(used.0);
        }
        Ok(())
    }
}

impl DeviceJob for Session {
    fn run(&mut self, stop: &EventFd) {
        let relayed = match self.start() {
            Ok(relayed) => relayed,
            Err(e) => {
                count(&self.metrics.activate_fails);
                self.lost(&e.to_string());
                Vec::new()
            }
        };
        self.watch(stop, &relayed);
        if self.health.failure().is_none() {
            match self.backend.stop_vrings(self.started) {
                Ok(bases) => self.stopped_at(&bases),
                Err(e) => self.fail(&e.to_string()),
            }
        }
        if self.health.failure().is_some() && self.spec.reconnect.is_some() {
            // No base from a dead backend: a snapshot saves, and a resume starts, at the
            // used index.
            let _ = self.at_used_index();
        }
        self.started = 0;
    }

    fn positions(&self) -> Vec<QueuePosition> {
        self.queues.iter().map(|q| QueuePosition::of(&q.queue)).collect()
    }
}
