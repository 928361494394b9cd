//! MMDS on a NIC: frames the guest sends to the MMDS address are taken off the TX path
//! (`wants`) and handed to `receive`; what MMDS answers waits in `pop_frame` for the RX
//! path, ahead of the tap's frames. smoltcp does IP and TCP (Medium::Ip); this file only
//! adds Ethernet around it and answers ARP for the one address, so the guest may route
//! to MMDS directly or through its gateway: the destination MAC does not matter.

use super::http::{answer, Parsed, MAX_REQUEST};
use super::SharedMmds;
use crate::sync::lock;
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::time::Instant as NetInstant;
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr, HardwareAddress,
    IpAddress, IpCidr,
};
use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// MMDS's own MAC (locally administered, as Firecracker's).
const MMDS_MAC: [u8; 6] = [0x06, 0x01, 0x23, 0x45, 0x67, 0x01];
const HTTP_PORT: u16 = 80;
/// Connections open at once; a SYN beyond them gets RST.
const CONNECTIONS: usize = 16;
const RX_WINDOW: usize = 8192;
const TX_WINDOW: usize = 16384;
/// Frames kept for a guest that posts no RX buffers; beyond them frames are dropped (TCP resends).
const MAX_PENDING: usize = 256;
/// A connection silent this long is dropped.
const IDLE: Duration = Duration::from_secs(30);
const MTU: usize = 1500;
const ETH_HEADER: usize = 14;

/// Whether an Ethernet frame (no virtio header) is for MMDS at `ip`: an ARP request for
/// it or an IPv4 packet to it. `head` needs only the first 42 bytes.
pub fn wants(ip: Ipv4Addr, head: &[u8]) -> bool {
    let field = |at: usize| head.get(at..at + 4).is_some_and(|a| a == ip.octets());
    match head.get(12..14) {
        Some([0x08, 0x06]) => field(ETH_HEADER + 24),
        Some([0x08, 0x00]) => field(ETH_HEADER + 16),
        _ => false,
    }
}

/// Counters the device reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MmdsCounters {
    pub frames_in: u64,
    pub frames_out: u64,
    pub requests: u64,
    pub dropped: u64,
}

pub struct MmdsStack {
    mmds: SharedMmds,
    ip: Ipv4Addr,
    /// The guest's MAC, from its last IPv4 frame to MMDS: answers go there.
    guest_mac: EthernetAddress,
    iface: Interface,
    link: Link,
    sockets: SocketSet<'static>,
    conns: Vec<Conn>,
    out: VecDeque<Vec<u8>>,
    epoch: Instant,
    pub counters: MmdsCounters,
}

struct Conn {
    handle: SocketHandle,
    request: Vec<u8>,
    reply: Vec<u8>,
    sent: usize,
    close_after: bool,
    last: Instant,
}

impl MmdsStack {
    pub fn new(mmds: SharedMmds, ip: Ipv4Addr) -> Self {
        let mut seed = [0u8; 8];
        // SAFETY: getrandom writes at most `seed.len()` bytes into the buffer; a short
        // read leaves zeros, which only makes the initial sequence numbers guessable.
        unsafe { libc::getrandom(seed.as_mut_ptr().cast(), seed.len(), 0) };
        Self::with_seed(mmds, ip, u64::from_ne_bytes(seed))
    }

    /// With TCP's initial sequence numbers from `seed`: the same frames in get the same
    /// frames out (tests and fuzzing replay conversations).
    pub fn with_seed(mmds: SharedMmds, ip: Ipv4Addr, seed: u64) -> Self {
        let mut link = Link::default();
        let mut config = Config::new(HardwareAddress::Ip);
        config.random_seed = seed;
        let epoch = Instant::now();
        let mut iface = Interface::new(config, &mut link, NetInstant::ZERO);
        // Prefix 0: every guest address is on the link, so answers need no route.
        iface.update_ip_addrs(|addrs| {
            let _ = addrs.push(IpCidr::new(IpAddress::Ipv4(ip), 0));
        });
        let mut sockets = SocketSet::new(Vec::with_capacity(CONNECTIONS));
        let conns = (0..CONNECTIONS)
            .map(|_| {
                let mut socket = tcp::Socket::new(
                    tcp::SocketBuffer::new(vec![0; RX_WINDOW]),
                    tcp::SocketBuffer::new(vec![0; TX_WINDOW]),
                );
                let _ = socket.listen(HTTP_PORT);
                Conn {
                    handle: sockets.add(socket),
                    request: Vec::new(),
                    reply: Vec::new(),
                    sent: 0,
                    close_after: false,
                    last: epoch,
                }
            })
            .collect();
        MmdsStack {
            mmds,
            ip,
            guest_mac: EthernetAddress(MMDS_MAC),
            iface,
            link,
            sockets,
            conns,
            out: VecDeque::new(),
            epoch,
            counters: MmdsCounters::default(),
        }
    }

    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    fn now(&self) -> NetInstant {
        NetInstant::from_micros(self.epoch.elapsed().as_micros() as i64)
    }

    /// Takes one frame the guest sent to MMDS (Ethernet, no virtio header).
    pub fn receive(&mut self, frame: &[u8]) {
        self.counters.frames_in += 1;
        let Ok(eth) = EthernetFrame::new_checked(frame) else { return };
        match eth.ethertype() {
            EthernetProtocol::Arp => self.answer_arp(eth.payload()),
            EthernetProtocol::Ipv4 if eth.src_addr().is_unicast() => {
                self.guest_mac = eth.src_addr();
                self.link.rx = Some(eth.payload().to_vec());
                self.poll();
            }
            _ => {}
        }
    }

    /// The next frame for the guest, if any.
    pub fn pop_frame(&mut self) -> Option<Vec<u8>> {
        self.out.pop_front()
    }

    pub fn has_frames(&self) -> bool {
        !self.out.is_empty()
    }

    /// When TCP's timers (retransmission, idle connections) next want `poll_timers`.
    pub fn next_timer(&mut self) -> Option<Duration> {
        let now = self.now();
        let busy = self.conns.iter().any(|c| self.sockets.get::<tcp::Socket>(c.handle).state() != tcp::State::Listen);
        let tcp = self.iface.poll_delay(now, &self.sockets).map(|d| Duration::from_micros(d.total_micros()));
        match (tcp, busy) {
            (Some(d), _) => Some(d),
            (None, true) => Some(IDLE),
            (None, false) => None,
        }
    }

    /// Runs TCP's timers: resends what the guest did not acknowledge, drops idle connections.
    pub fn poll_timers(&mut self) {
        self.poll();
    }

    fn answer_arp(&mut self, payload: &[u8]) {
        let Ok(packet) = ArpPacket::new_checked(payload) else { return };
        let Ok(ArpRepr::EthernetIpv4 {
            operation,
            source_hardware_addr,
            source_protocol_addr,
            target_protocol_addr,
            ..
        }) = ArpRepr::parse(&packet)
        else {
            return;
        };
        if operation != ArpOperation::Request || target_protocol_addr != self.ip || !source_hardware_addr.is_unicast() {
            return;
        }
        let reply = ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Reply,
            source_hardware_addr: EthernetAddress(MMDS_MAC),
            source_protocol_addr: self.ip,
            target_hardware_addr: source_hardware_addr,
            target_protocol_addr: source_protocol_addr,
        };
        let mut frame = vec![0u8; ETH_HEADER + reply.buffer_len()];
        let mut arp = ArpPacket::new_unchecked(&mut frame[ETH_HEADER..]);
        reply.emit(&mut arp);
        self.push_frame(frame, source_hardware_addr, EthernetProtocol::Arp);
    }

    fn push_frame(&mut self, mut frame: Vec<u8>, to: EthernetAddress, ethertype: EthernetProtocol) {
        if self.out.len() >= MAX_PENDING {
            self.counters.dropped += 1;
            return;
        }
        let repr = EthernetRepr { src_addr: EthernetAddress(MMDS_MAC), dst_addr: to, ethertype };
        repr.emit(&mut EthernetFrame::new_unchecked(&mut frame[..]));
        self.counters.frames_out += 1;
        self.out.push_back(frame);
    }

    /// smoltcp takes the staged packet and runs its timers; the connections read requests
    /// and queue answers; smoltcp sends them; the packets go out as Ethernet frames.
    fn poll(&mut self) {
        let now = self.now();
        // A connection's idle time counts from when it left Listen, at the earliest.
        for conn in &mut self.conns {
            if self.sockets.get::<tcp::Socket>(conn.handle).state() == tcp::State::Listen {
                conn.last = Instant::now();
            }
        }
        self.iface.poll(now, &mut self.link, &mut self.sockets);
        self.link.rx = None;
        if self.serve() {
            self.iface.poll(self.now(), &mut self.link, &mut self.sockets);
        }
        while let Some(packet) = self.link.tx.pop_front() {
            let mut frame = vec![0u8; ETH_HEADER + packet.len()];
            frame[ETH_HEADER..].copy_from_slice(&packet);
            self.push_frame(frame, self.guest_mac, EthernetProtocol::Ipv4);
        }
    }

    /// Serves every connection; true if any socket has something new to send.
    fn serve(&mut self) -> bool {
        let now = Instant::now();
        let mut sent_any = false;
        for conn in &mut self.conns {
            let socket = self.sockets.get_mut::<tcp::Socket>(conn.handle);
            let state = socket.state();
            if state == tcp::State::Listen {
                continue;
            }
            let idle = now.duration_since(conn.last) > IDLE && state != tcp::State::SynReceived;
            if matches!(state, tcp::State::Closed | tcp::State::TimeWait) || idle {
                // Ours again for the next SYN; TIME_WAIT is the guest's to keep, not ours.
                socket.abort();
                let _ = socket.listen(HTTP_PORT);
                conn.request.clear();
                conn.reply.clear();
                (conn.sent, conn.close_after) = (0, false);
                sent_any = true;
                continue;
            }
            while socket.can_recv() && conn.request.len() < MAX_REQUEST {
                let mut chunk = [0u8; 1024];
                let room = (MAX_REQUEST - conn.request.len()).min(chunk.len());
                match socket.recv_slice(&mut chunk[..room]) {
                    Ok(n) if n > 0 => {
                        conn.request.extend_from_slice(&chunk[..n]);
                        conn.last = now;
                    }
                    _ => break,
                }
            }
            // One answer at a time: the next request waits until this one is queued.
            while conn.sent == conn.reply.len() && !conn.close_after && !conn.request.is_empty() {
                let parsed = answer(&mut lock(&self.mmds), &conn.request, now);
                let Parsed::Answered { consumed, reply, close } = parsed else { break };
                self.counters.requests += 1;
                conn.request.drain(..consumed.max(if close { conn.request.len() } else { 0 }));
                (conn.reply, conn.sent, conn.close_after) = (reply, 0, close);
            }
            if conn.sent < conn.reply.len() && socket.can_send() {
                if let Ok(n) = socket.send_slice(&conn.reply[conn.sent..]) {
                    conn.sent += n;
                    sent_any |= n > 0;
                }
            }
            let done = conn.sent == conn.reply.len();
            // Closed after its answer, or the guest closed and nothing is owed it.
            if done && (conn.close_after || (!socket.may_recv() && conn.request.is_empty())) && socket.may_send() {
                socket.close();
                sent_any = true;
            }
        }
        sent_any
    }
}

/// smoltcp's side of the NIC: one staged IP packet in, IP packets out.
#[derive(Default)]
struct Link {
    rx: Option<Vec<u8>>,
    tx: VecDeque<Vec<u8>>,
}

impl phy::Device for Link {
    type RxToken<'a> = RxToken;
    type TxToken<'a> = TxToken<'a>;

    fn receive(&mut self, _: NetInstant) -> Option<(RxToken, TxToken<'_>)> {
        let packet = self.rx.take()?;
        Some((RxToken(packet), TxToken(&mut self.tx)))
    }

    fn transmit(&mut self, _: NetInstant) -> Option<TxToken<'_>> {
        (self.tx.len() < MAX_PENDING).then_some(TxToken(&mut self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ip;
        caps.max_transmission_unit = MTU;
        caps
    }
}

struct RxToken(Vec<u8>);

impl phy::RxToken for RxToken {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

struct TxToken<'a>(&'a mut VecDeque<Vec<u8>>);

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut packet = vec![0u8; len];
        let r = f(&mut packet);
        self.0.push_back(packet);
        r
    }
}
