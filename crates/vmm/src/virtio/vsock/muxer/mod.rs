//! The vsock device thread: moves packets between the guest's queues and the host's Unix
//! sockets. One epoll set holds the three queues' kick eventfds, the stop eventfd, the
//! listening socket, host connections still writing their `CONNECT <port>\n`, and every
//! established stream (edge-triggered). Packets for the guest are control packets first
//! (in the order they arose), then data from the streams in turn, one packet per stream
//! per turn, so that no stream starves another.

mod control;
mod event;
mod rx;
mod tx;

use super::conn::{self, Conn, Read, State};
use super::packet::HEADER_LEN;
use super::{VsockConfig, VsockStats};
use crate::guest_memory::GuestMemoryMmap;
use crate::virtio::chain::Segment;
use crate::virtio::event_loop::{self, EventSource};
use crate::virtio::thread::{DeviceJob, QueuePosition};
use crate::virtio::{Activation, ActiveQueue, DeviceStatus, Interrupt};
use control::{Control, REPLY_CREDIT_UPDATE, REPLY_REQUEST, REPLY_RESPONSE};
use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read as _};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use virtio_queue::Queue;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

const RX: usize = 0;
const TX: usize = 1;
const EVT: usize = 2;
const TOKEN_LISTENER: u64 = 4;
const FIRST_TOKEN: u64 = 8;
/// Connections at once; more are refused (the host's closed, the guest's reset).
const MAX_CONNECTIONS: usize = 1024;
/// Host ports for host-initiated connections start here, as Firecracker's do.
const FIRST_LOCAL_PORT: u32 = 1 << 30;
/// The longest `CONNECT <port>\n` line.
const MAX_CONNECT_LINE: usize = 32;
/// How long a host connection waits for the guest's RESPONSE before it is closed (and
/// the guest reset), as Firecracker's does: a guest that ignores a REQUEST must not leave
/// the host's agent client hanging.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

type Key = (u32, u32); // (host port, guest port)

/// A host connection that has not said which guest port it wants yet.
struct Connecting {
    stream: UnixStream,
    line: Vec<u8>,
}

enum Entry {
    Host(Connecting),
    Conn(Key),
}

pub struct Muxer {
    guest_cid: u64,
    uds_path: PathBuf,
    listener: Arc<UnixListener>,
    stats: Arc<VsockStats>,
    queues: Vec<Queue>,
    kicks: Vec<Arc<EventFd>>,
    mem: GuestMemoryMmap,
    interrupt: Arc<Interrupt>,
    status: Arc<DeviceStatus>,
    conns: HashMap<Key, (u64, Conn)>,
    tokens: HashMap<u64, Entry>,
    next_token: u64,
    next_local_port: u32,
    /// Packets for the guest without payload, in order, bounded (control.rs).
    control: Control,
    /// Streams with data for the guest, in turn; each at most once (`Conn::readable`).
    ready: VecDeque<Key>,
    /// Host-initiated streams waiting for the guest's RESPONSE, oldest first.
    connecting: VecDeque<(std::time::Instant, Key)>,
    segs: Vec<Segment>,
    used: [bool; 3],
    broken: bool,
    /// How long the thread looks for more work before it sleeps (crate::poll).
    pub poll: crate::poll::PollMode,
    /// The epoll set, kept between runs: a paused device's streams stay in it.
    epoll: Option<Epoll>,
    /// A TRANSPORT_RESET waits for an event buffer (event.rs).
    transport_reset: bool,
    /// Data packets from the guest waiting for one writev (tx.rs).
    tx_batch: tx::TxBatch,
}

impl DeviceJob for Muxer {
    fn run(&mut self, stop: &EventFd) {
        // Kept across pauses: the host connections' sockets stay registered in it.
        let epoll = match self.epoll.take().map_or_else(|| event_loop::epoll_for(self, stop), Ok) {
            Ok(e) => e,
            Err(e) => return tracing::error!("virtio-vsock: cannot start its thread: {e}"),
        };
        event_loop::serve(self, &epoll, stop);
        self.epoll = Some(epoll);
    }

    fn positions(&self) -> Vec<QueuePosition> {
        self.queues.iter().map(QueuePosition::of).collect()
    }
}

/// The three queues' kicks, the listener and every host connection's socket; the
/// connections' wait for the guest's RESPONSE.
impl EventSource for Muxer {
    const NAME: &'static str = "virtio-vsock";

    fn watch(&self, epoll: &Epoll) -> std::io::Result<()> {
        for (i, kick) in self.kicks.iter().enumerate() {
            epoll.ctl(ControlOperation::Add, kick.as_raw_fd(), EpollEvent::new(EventSet::IN, i as u64))?;
        }
        epoll.ctl(ControlOperation::Add, self.listener.as_raw_fd(), EpollEvent::new(EventSet::IN, TOKEN_LISTENER))
    }

    fn start(&mut self, epoll: &Epoll) {
        self.process_tx(epoll);
    }

    fn event(&mut self, epoll: &Epoll, event: &EpollEvent) {
        match event.data() {
            t if t < 3 => {
                if let Ok(k) = self.kicks[t as usize].read() {
                    self.stats.kicks.fetch_add(k, Ordering::Relaxed);
                }
                match t as usize {
                    TX => self.process_tx(epoll),
                    EVT => self.send_transport_reset(),
                    _ => {}
                }
            }
            TOKEN_LISTENER => self.accept(epoll),
            token => self.socket_event(epoll, token, event.event_set()),
        }
    }

    fn timeout_ms(&mut self) -> i32 {
        self.connect_timeout_ms()
    }

    fn timers(&mut self, epoll: &Epoll) {
        self.expire_connecting(epoll);
    }

    /// What the guest and the sockets left ready goes out before the thread sleeps.
    fn before_sleep(&mut self, _: &Epoll, _: bool) {
        self.send_transport_reset();
        self.process_rx();
        self.interrupts();
    }

    /// The tx ring, and the guest's receive buffers for what is ready.
    fn look(&mut self, epoll: &Epoll) -> bool {
        let before = (self.stats.tx_packets.load(Ordering::Relaxed), self.stats.rx_packets.load(Ordering::Relaxed));
        self.process_tx(epoll);
        self.process_rx();
        self.interrupts();
        let after = (self.stats.tx_packets.load(Ordering::Relaxed), self.stats.rx_packets.load(Ordering::Relaxed));
        after != before
    }

    fn poll_mode(&self) -> crate::poll::PollMode {
        self.poll
    }

    fn poll_stats(&self) -> Option<Arc<dyn AsRef<crate::poll::PollStats> + Send + Sync>> {
        Some(self.stats.clone())
    }
}

impl Muxer {
    pub fn new(
        config: &VsockConfig,
        listener: Arc<UnixListener>,
        stats: Arc<VsockStats>,
        queues: [ActiveQueue; 3],
        a: Activation,
    ) -> Muxer {
        let (queues, kicks) = queues.into_iter().map(|q| (q.queue, q.kick)).unzip();
        Muxer {
            guest_cid: config.guest_cid,
            uds_path: config.uds_path.clone(),
            listener,
            stats,
            queues,
            kicks,
            mem: a.mem,
            interrupt: a.interrupt,
            status: a.status,
            conns: HashMap::new(),
            tokens: HashMap::new(),
            next_token: FIRST_TOKEN,
            next_local_port: FIRST_LOCAL_PORT,
            control: Control::default(),
            ready: VecDeque::new(),
            connecting: VecDeque::new(),
            segs: Vec::with_capacity(16),
            used: [false; 3],
            broken: false,
            poll: crate::poll::PollMode::Off,
            epoll: None,
            transport_reset: a.restored,
            tx_batch: tx::TxBatch::default(),
        }
    }

    /// Until the oldest host connection's wait for a RESPONSE ends (epoll's -1: none).
    fn connect_timeout_ms(&self) -> i32 {
        self.connecting.front().map_or(-1, |(since, _)| {
            let left = CONNECT_TIMEOUT.saturating_sub(since.elapsed());
            i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX)
        })
    }

    /// Host connections the guest did not answer in time: closed, and the guest reset.
    fn expire_connecting(&mut self, epoll: &Epoll) {
        while let Some(&(since, key)) = self.connecting.front() {
            if since.elapsed() < CONNECT_TIMEOUT {
                break;
            }
            self.connecting.pop_front();
            if self.conns.get(&key).is_some_and(|(_, c)| c.state == State::Connecting) {
                self.reset(epoll, key);
            }
        }
    }

    /// The guest's packets and the replies to them, once (super::process_once).
    pub fn process_once(&mut self) {
        if let Ok(epoll) = Epoll::new() {
            self.process_tx(&epoll);
            self.process_rx();
            self.interrupts();
        }
    }

    fn watch(&mut self, epoll: &Epoll, fd: i32, entry: Entry) -> Option<u64> {
        let token = self.next_token;
        self.next_token += 1;
        let events = EventSet::IN | EventSet::OUT | EventSet::READ_HANG_UP | EventSet::EDGE_TRIGGERED;
        epoll.ctl(ControlOperation::Add, fd, EpollEvent::new(events, token)).ok()?;
        self.tokens.insert(token, entry);
        Some(token)
    }

    /// A host process connected to `uds_path`: it will say which port it wants.
    fn accept(&mut self, epoll: &Epoll) {
        while let Ok((stream, _)) = self.listener.accept() {
            if self.tokens.len() >= MAX_CONNECTIONS || stream.set_nonblocking(true).is_err() {
                continue; // dropped: the host sees its connection closed
            }
            let fd = stream.as_raw_fd();
            self.watch(epoll, fd, Entry::Host(Connecting { stream, line: Vec::new() }));
        }
    }

    fn socket_event(&mut self, epoll: &Epoll, token: u64, events: EventSet) {
        match self.tokens.get_mut(&token) {
            Some(Entry::Host(c)) => {
                let mut byte = [0u8; 1];
                // One byte at a time: nothing after the line is ours to consume.
                loop {
                    match c.stream.read(&mut byte) {
                        Ok(1) if byte[0] == b'\n' => break self.host_connect(epoll, token),
                        Ok(1) if c.line.len() < MAX_CONNECT_LINE => c.line.push(byte[0]),
                        Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        _ => break self.forget(epoll, token),
                    }
                }
            }
            Some(Entry::Conn(key)) => {
                let key = *key;
                let Some((_, conn)) = self.conns.get_mut(&key) else { return };
                if events.contains(EventSet::OUT) {
                    conn.flush();
                    // What the socket took is credit the guest may be waiting for.
                    if conn.credit_update_due() {
                        self.control.reply(key, conn, REPLY_CREDIT_UPDATE);
                    }
                }
                if events.intersects(EventSet::IN | EventSet::READ_HANG_UP | EventSet::HANG_UP) && !conn.readable {
                    conn.readable = true;
                    self.ready.push_back(key);
                }
            }
            None => {}
        }
    }

    /// `CONNECT <port>`: a REQUEST to the guest's port from a fresh host port.
    fn host_connect(&mut self, epoll: &Epoll, token: u64) {
        let Some(Entry::Host(c)) = self.tokens.remove(&token) else { return };
        let line = String::from_utf8_lossy(&c.line);
        let port = line.strip_prefix("CONNECT ").and_then(|p| p.trim().parse::<u32>().ok());
        let Some(peer_port) = port else {
            let _ = epoll.ctl(ControlOperation::Delete, c.stream.as_raw_fd(), EpollEvent::default());
            return; // closed: not a request this device understands
        };
        let local_port = self.free_local_port(peer_port);
        let key = (local_port, peer_port);
        let mut conn = Conn::new(c.stream, local_port, peer_port, State::Connecting);
        self.control.reply(key, &mut conn, REPLY_REQUEST);
        self.tokens.insert(token, Entry::Conn(key));
        self.conns.insert(key, (token, conn));
        // Entries outlive their connections until they expire: a host that connects and
        // leaves quickly must not grow the list, so the stale ones go when it is long.
        if self.connecting.len() >= MAX_CONNECTIONS {
            let conns = &self.conns;
            self.connecting.retain(|(_, k)| conns.get(k).is_some_and(|(_, c)| c.state == State::Connecting));
        }
        self.connecting.push_back((std::time::Instant::now(), key));
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
    }

    fn free_local_port(&mut self, peer_port: u32) -> u32 {
        loop {
            let port = self.next_local_port;
            self.next_local_port = self.next_local_port.checked_add(1).unwrap_or(FIRST_LOCAL_PORT);
            if !self.conns.contains_key(&(port, peer_port)) {
                return port;
            }
        }
    }

    /// Closes token's socket and forgets it.
    fn forget(&mut self, epoll: &Epoll, token: u64) {
        match self.tokens.remove(&token) {
            Some(Entry::Host(c)) => {
                let _ = epoll.ctl(ControlOperation::Delete, c.stream.as_raw_fd(), EpollEvent::default());
            }
            Some(Entry::Conn(key)) => {
                if let Some((_, conn)) = self.conns.remove(&key) {
                    let _ = epoll.ctl(ControlOperation::Delete, conn.stream.as_raw_fd(), EpollEvent::default());
                    // What it owed or had ready goes with it: a guest that opens and
                    // resets connections while taking no packets must not grow either
                    // queue (each holds a connection at most once, so this is short).
                    self.control.forget(key, &conn);
                    if conn.readable {
                        self.ready.retain(|k| *k != key);
                    }
                }
            }
            None => {}
        }
    }

    fn reset(&mut self, epoll: &Epoll, key: Key) {
        if let Some((token, _)) = self.conns.get(&key) {
            let token = *token;
            self.forget(epoll, token);
        }
        self.stats.resets.fetch_add(1, Ordering::Relaxed);
        self.push_rst(key);
    }

    /// The guest connects to the host's port P: `<uds_path>_P`.
    fn guest_connect(&mut self, epoll: &Epoll, key: Key) {
        if self.conns.contains_key(&key) || self.tokens.len() >= MAX_CONNECTIONS {
            return self.reset(epoll, key);
        }
        let mut path = self.uds_path.clone().into_os_string();
        path.push(format!("_{}", key.0));
        // Never blocks: a host listener with a full backlog (EAGAIN) is a refusal.
        let stream = match conn::connect(&path) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("virtio-vsock: cannot connect to {}: {e}", path.to_string_lossy());
                return self.reset(epoll, key);
            }
        };
        let mut conn = Conn::new(stream, key.0, key.1, State::Established);
        let fd = conn.stream.as_raw_fd();
        let Some(token) = self.watch(epoll, fd, Entry::Conn(key)) else { return self.reset(epoll, key) };
        self.control.reply(key, &mut conn, REPLY_RESPONSE);
        self.conns.insert(key, (token, conn));
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
    }

    fn interrupts(&mut self) {
        for q in [RX, TX, EVT] {
            if std::mem::take(&mut self.used[q]) {
                let (queue, irqs) = (&mut self.queues[q], &self.stats.irqs);
                if let Err(e) = crate::virtio::interrupt_if_needed(queue, &self.mem, &self.interrupt, q, irqs) {
                    self.fail(e);
                }
            }
        }
    }

    fn fail(&mut self, what: &str) {
        self.status.break_once(&mut self.broken, "virtio-vsock", what, &self.interrupt);
    }
}

#[cfg(test)]
mod tests;
