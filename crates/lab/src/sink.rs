//! The host end of the net labs: a thread inside the lab's namespace with a raw packet
//! socket on the tap, which checks every frame the guest sends (length, ethertype,
//! sequence number, payload bytes) and can send frames to the guest too.

use crate::netns::{enter_current_thread, Netns};
use exitless_payloads::abi::LAB_ETHERTYPE;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Byte `j` of a lab frame (from the Ethernet header on, past the sequence number).
pub fn pattern(j: usize) -> u8 {
    (j * 7 + 3) as u8
}

const SEQ_AT: usize = 14;
const PATTERN_FROM: usize = 22;
/// In a TCP frame: the sequence number at the start of the TCP payload, then the pattern.
const TCP_SEQ_AT: usize = 54;
const TCP_PATTERN_FROM: usize = 62;
/// The virtio_net_hdr a packet socket with PACKET_VNET_HDR puts before each frame.
const VNET_HDR: usize = 10;

/// What the guest sends (nettx's param 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// The lab's ethertype, sequence number at byte 14.
    Lab,
    /// IPv4/TCP with checksum and segmentation offloads: frames arrive whole, with the
    /// virtio-net header the guest wrote (NEEDS_CSUM; TSO4 with an MSS of 1448 above it).
    Tso,
    /// IPv4/TCP with the guest's own checksums, which the sink verifies.
    Plain,
}

impl FrameKind {
    /// nettx's param 6.
    pub fn param(self) -> u64 {
        match self {
            FrameKind::Lab => 0,
            FrameKind::Tso => 1,
            FrameKind::Plain => 2,
        }
    }
}

/// A lab frame: broadcast, from `src`, the lab ethertype, `seq`, then the pattern.
pub fn frame(src: [u8; 6], size: usize, seq: u64) -> Vec<u8> {
    let mut f: Vec<u8> = (0..size).map(pattern).collect();
    f[..6].fill(0xff);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&(LAB_ETHERTYPE as u16).to_be_bytes());
    f[SEQ_AT..PATTERN_FROM].copy_from_slice(&seq.to_le_bytes());
    f
}

/// What the sink saw.
#[derive(Clone, Debug, Default)]
pub struct SinkReport {
    /// Intact frames (right length, ethertype and bytes), each sequence number once.
    pub frames: u64,
    pub bytes: u64,
    /// Frames with the lab ethertype but a wrong length or payload.
    pub corrupt: u64,
    pub duplicates: u64,
    /// Sequence numbers seen (for the echo test).
    pub seqs: Vec<u64>,
    /// Frames the kernel dropped at the sink's own socket (the sink fell behind): lost
    /// on the host side of the tap, not by the VMM.
    pub socket_drops: u64,
}

#[derive(Default)]
struct Shared {
    frames: AtomicU64,
    stop: AtomicBool,
}

pub struct Sink {
    shared: Arc<Shared>,
    socket: Arc<OwnedFd>,
    ifindex: i32,
    thread: Option<JoinHandle<SinkReport>>,
}

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error(transparent)]
    Netns(#[from] crate::netns::NetnsError),
    #[error("packet socket on {0}: {1}")]
    Socket(String, std::io::Error),
}

fn packet_socket(ifname: &str, kind: FrameKind) -> Result<(OwnedFd, i32), SinkError> {
    let err = |e| SinkError::Socket(ifname.into(), e);
    let ethertype = if kind == FrameKind::Lab { LAB_ETHERTYPE as u16 } else { libc::ETH_P_IP as u16 };
    let proto = ethertype.to_be();
    // SAFETY: plain socket(2); the fd is owned right below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, i32::from(proto)) };
    if fd < 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is fresh and owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let name = std::ffi::CString::new(ifname).map_err(|e| err(std::io::Error::other(e)))?;
    // SAFETY: a NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) } as i32;
    if ifindex == 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    // SAFETY: zeroed sockaddr_ll is valid; the fields we need are set below.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = proto;
    addr.sll_ifindex = ifindex;
    // SAFETY: binding with a sockaddr_ll of the right size.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    if r != 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    if kind != FrameKind::Lab {
        let on: libc::c_int = 1;
        // SAFETY: setsockopt with an int option value.
        let r = unsafe {
            libc::setsockopt(fd.as_raw_fd(), libc::SOL_PACKET, libc::PACKET_VNET_HDR, (&on as *const i32).cast(), 4)
        };
        if r != 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
    }
    let rcvbuf: libc::c_int = 512 << 20;
    let timeout = libc::timeval { tv_sec: 0, tv_usec: 50_000 };
    // SAFETY: setsockopt with correctly sized option values; failures only cost headroom.
    unsafe {
        libc::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, (&rcvbuf as *const i32).cast(), 4);
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
    }
    Ok((fd, ifindex))
}

impl Sink {
    /// Starts a sink on `ifname` inside `netns`, expecting frames of `size` bytes (any size if 0).
    pub fn spawn(netns: &Netns, ifname: &str, size: usize) -> Result<Sink, SinkError> {
        Sink::spawn_for(netns, ifname, size, FrameKind::Lab)
    }

    /// The same for frames of `kind`.
    pub fn spawn_for(netns: &Netns, ifname: &str, size: usize, kind: FrameKind) -> Result<Sink, SinkError> {
        // The socket is made on a thread that entered the namespace, then shared.
        let (tx, rx) = std::sync::mpsc::channel();
        let (ns, name) = (netns.name.clone(), ifname.to_string());
        std::thread::spawn(move || {
            let result = enter_current_thread(&ns).map_err(SinkError::from).and_then(|()| packet_socket(&name, kind));
            let _ = tx.send(result);
        });
        let socket = rx.recv().map_err(|e| SinkError::Socket(ifname.into(), std::io::Error::other(e)))??;
        Ok(Sink::start(socket, size, kind))
    }

    /// A sink of lab frames on `ifname` in this process's own namespace (a tap that
    /// outlives the VMMs using it, as in the snapshot tests).
    pub fn on_host(ifname: &str, size: usize) -> Result<Sink, SinkError> {
        Ok(Sink::start(packet_socket(ifname, FrameKind::Lab)?, size, FrameKind::Lab))
    }

    fn start((socket, ifindex): (OwnedFd, i32), size: usize, kind: FrameKind) -> Sink {
        let socket = Arc::new(socket);
        let shared = Arc::new(Shared::default());
        let (s2, sock2) = (shared.clone(), socket.clone());
        let thread =
            std::thread::Builder::new().name("sink".into()).spawn(move || receive(&sock2, &s2, size, kind)).ok();
        Sink { shared, socket, ifindex, thread }
    }

    /// A handle that sends frames from another thread.
    pub fn sender(&self) -> Sender {
        Sender { socket: self.socket.clone(), ifindex: self.ifindex }
    }

    pub fn frames(&self) -> u64 {
        self.shared.frames.load(Ordering::Acquire)
    }

    /// A handle that reads [`Sink::frames`] from another thread.
    pub fn frames_seen(&self) -> FramesSeen {
        FramesSeen(self.shared.clone())
    }
}

/// How many good frames the sink has received so far.
pub struct FramesSeen(Arc<Shared>);

impl FramesSeen {
    pub fn get(&self) -> u64 {
        self.0.frames.load(Ordering::Acquire)
    }
}

/// Sends raw frames into the tap, towards the guest.
pub struct Sender {
    socket: Arc<OwnedFd>,
    ifindex: i32,
}

impl Sender {
    pub fn send(&self, frame: &[u8]) -> std::io::Result<()> {
        // SAFETY: zeroed sockaddr_ll is valid; we fill in what sendto needs.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_ifindex = self.ifindex;
        addr.sll_halen = 6;
        addr.sll_addr[..6].fill(0xff);
        // SAFETY: `frame` is a live buffer and `addr` a sockaddr_ll of the right size.
        let r = unsafe {
            libc::sendto(
                self.socket.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}

impl Sink {
    /// Waits (up to `grace`) until `expected` frames came or arrivals stop, then stops.
    pub fn finish(mut self, expected: u64, grace: Duration) -> SinkReport {
        let (mut last, mut since) = (self.frames(), Instant::now());
        while self.frames() < expected && since.elapsed() < grace {
            std::thread::sleep(Duration::from_millis(5));
            if self.frames() != last {
                (last, since) = (self.frames(), Instant::now());
            }
        }
        self.shared.stop.store(true, Ordering::Release);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default()
    }
}

fn receive(socket: &OwnedFd, shared: &Shared, size: usize, kind: FrameKind) -> SinkReport {
    let mut report = SinkReport::default();
    if !exitless_vmm::seccomp::confine_or_log(exitless_vmm::seccomp::ThreadKind::Helper) {
        return report;
    }
    let mut seen = std::collections::HashSet::new();
    let mut buf = vec![0u8; 65536 + 64];
    // Every lab frame's payload is the same pattern: compare whole slices against it.
    let expected: Vec<u8> = (0..buf.len()).map(pattern).collect();
    while !shared.stop.load(Ordering::Acquire) {
        // SAFETY: zeroed sockaddr_ll is valid for recvfrom to fill.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut from_len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
        // SAFETY: `buf` and `from` are live and sized as passed.
        let n = unsafe {
            libc::recvfrom(
                socket.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&mut from as *mut libc::sockaddr_ll).cast(),
                &mut from_len,
            )
        };
        if n < 0 || from.sll_pkttype == libc::PACKET_OUTGOING {
            continue; // timeout, or a frame we sent ourselves
        }
        let seq = match check(&buf[..n as usize], size, kind, &expected) {
            Checked::Intact(seq) => seq,
            Checked::NotOurs => continue,
            Checked::Corrupt => {
                report.corrupt += 1;
                continue;
            }
        };
        let f_len = n as usize - if kind == FrameKind::Lab { 0 } else { VNET_HDR };
        if !seen.insert(seq) {
            report.duplicates += 1;
            continue;
        }
        report.frames += 1;
        report.bytes += f_len as u64;
        report.seqs.push(seq);
        shared.frames.store(report.frames, Ordering::Release);
    }
    report.socket_drops = socket_drops(socket);
    report
}

enum Checked {
    Intact(u64),
    /// Another flow's frame (the namespace's own traffic).
    NotOurs,
    Corrupt,
}

/// Whether `got` (after its virtio-net header, for TCP kinds) is an intact frame of
/// `size` bytes (any if 0) of `kind`, and its sequence number.
fn check(got: &[u8], size: usize, kind: FrameKind, expected: &[u8]) -> Checked {
    let seq_at = |f: &[u8], at: usize| u64::from_le_bytes(f[at..at + 8].try_into().unwrap_or_default());
    if kind == FrameKind::Lab {
        let intact = got.len() >= PATTERN_FROM
            && (size == 0 || got.len() == size)
            && got[12..14] == (LAB_ETHERTYPE as u16).to_be_bytes()
            && got[PATTERN_FROM..] == expected[PATTERN_FROM..got.len()];
        return if intact { Checked::Intact(seq_at(got, SEQ_AT)) } else { Checked::Corrupt };
    }
    if got.len() < VNET_HDR + TCP_PATTERN_FROM {
        return Checked::NotOurs;
    }
    let (hdr, f) = got.split_at(VNET_HDR);
    if f[23] != 6 || f[36..38] != 5001u16.to_be_bytes() {
        return Checked::NotOurs;
    }
    let bytes_ok = (size == 0 || f.len() == size) && f[TCP_PATTERN_FROM..] == expected[TCP_PATTERN_FROM..f.len()];
    let header_ok = match kind {
        // What the guest wrote: a partial checksum from byte 34; TSO4 with its MSS above one.
        FrameKind::Tso => {
            let gso = f.len() > 14 + 40 + 1448;
            hdr[0] & 1 == 1 && hdr[1] == u8::from(gso) && (!gso || hdr[4..6] == 1448u16.to_le_bytes())
        }
        _ => tcp_checksum_ok(f),
    };
    if bytes_ok && header_ok {
        Checked::Intact(seq_at(f, TCP_SEQ_AT))
    } else {
        Checked::Corrupt
    }
}

/// The ones' complement sum over the TCP pseudo-header and segment is all ones.
fn tcp_checksum_ok(f: &[u8]) -> bool {
    let segment = &f[34..];
    let mut sum: u64 = 6 + segment.len() as u64;
    for w in f[26..34].chunks(2).chain(segment.chunks(2)) {
        sum += u64::from(w[0]) << 8 | u64::from(*w.get(1).unwrap_or(&0));
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum == 0xffff
}

/// PACKET_STATISTICS: frames the kernel dropped for want of room at this socket.
fn socket_drops(socket: &OwnedFd) -> u64 {
    let mut stats = libc::tpacket_stats { tp_packets: 0, tp_drops: 0 };
    let mut len = std::mem::size_of::<libc::tpacket_stats>() as u32;
    // SAFETY: getsockopt fills a tpacket_stats of the size passed.
    let r = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            (&mut stats as *mut libc::tpacket_stats).cast(),
            &mut len,
        )
    };
    if r == 0 {
        u64::from(stats.tp_drops)
    } else {
        0
    }
}
