//! One stream between a guest port and a host Unix socket, and its credit (virtio 1.2,
//! 5.10.6.3): the guest may have at most `BUF_ALLOC` bytes in flight to us beyond what we
//! forwarded (`fwd_cnt`); we send it no more than its own `buf_alloc` allows beyond what
//! it said it consumed. Bytes move between guest memory and the socket with readv/writev;
//! only what the socket refuses is copied, into a buffer the credit bounds.

use super::packet::Header;
use crate::guest_memory::GuestMemoryMmap;
use crate::virtio::chain::{self, Segment};
use std::io::{ErrorKind, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

/// What we let the guest have in flight to one connection.
pub const BUF_ALLOC: u32 = 256 << 10;
/// Freed credit worth telling the guest about without being asked.
const CREDIT_UPDATE_AFTER: u32 = BUF_ALLOC / 4;
const MAX_IOVECS: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Host-initiated: our REQUEST is out, the guest's RESPONSE not yet in.
    Connecting,
    Established,
}

pub struct Conn {
    pub stream: UnixStream,
    pub local_port: u32,
    pub peer_port: u32,
    pub state: State,
    /// Guest bytes the socket took (the credit we have returned).
    fwd_cnt: u32,
    /// `fwd_cnt` as the guest last heard it.
    fwd_cnt_sent: u32,
    peer_buf_alloc: u32,
    peer_fwd_cnt: u32,
    /// Bytes we have sent the guest.
    rx_cnt: u32,
    /// Guest bytes the socket would not take yet.
    pending: Vec<u8>,
    /// The socket has data for the guest (edge-triggered: until a read would block).
    pub readable: bool,
    /// The guest will send no more (its SHUTDOWN with SEND): the socket's write side closes
    /// once `pending` is out.
    pub guest_done_sending: bool,
    /// The host closed its end; the guest has been told.
    pub host_closed: bool,
    /// Data for the guest waits for the guest's credit (any packet of it may bring some).
    pub waiting_for_credit: bool,
    /// The guest asked for credit (CREDIT_REQUEST): the next byte the socket takes is
    /// worth a CREDIT_UPDATE, however few (the guest may be stopped until it hears).
    pub credit_requested: bool,
    /// Control packets this connection owes the guest (muxer/control.rs).
    pub replies: u8,
}

/// What a read from the socket into the guest's buffer gave.
pub enum Read {
    Bytes(usize),
    WouldBlock,
    Closed,
}

impl Conn {
    pub fn new(stream: UnixStream, local_port: u32, peer_port: u32, state: State) -> Conn {
        Conn {
            stream,
            local_port,
            peer_port,
            state,
            fwd_cnt: 0,
            fwd_cnt_sent: 0,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
            rx_cnt: 0,
            pending: Vec::new(),
            readable: false,
            guest_done_sending: false,
            host_closed: false,
            waiting_for_credit: false,
            credit_requested: false,
            replies: 0,
        }
    }

    /// The guest's side of the credit, from any packet it sends on this connection.
    pub fn peer_credit_from(&mut self, h: &Header) {
        self.peer_buf_alloc = h.buf_alloc;
        self.peer_fwd_cnt = h.fwd_cnt;
    }

    /// How many bytes the guest can take now.
    pub fn peer_credit(&self) -> u32 {
        self.peer_buf_alloc.saturating_sub(self.rx_cnt.wrapping_sub(self.peer_fwd_cnt))
    }

    /// A packet to the guest on this connection, carrying our credit.
    pub fn header(&mut self, guest_cid: u64, op: u16, len: u32) -> Header {
        self.fwd_cnt_sent = self.fwd_cnt;
        Header {
            len,
            buf_alloc: BUF_ALLOC,
            fwd_cnt: self.fwd_cnt,
            ..Header::to_guest(guest_cid, self.local_port, self.peer_port, op)
        }
    }

    /// Whether the guest should hear of credit we freed (it may be waiting for it).
    pub fn credit_update_due(&self) -> bool {
        let freed = self.fwd_cnt.wrapping_sub(self.fwd_cnt_sent);
        freed >= CREDIT_UPDATE_AFTER || (self.credit_requested && freed > 0)
    }

    /// A CREDIT_UPDATE goes out now: a request for credit is answered once one brings
    /// some the guest has not heard of.
    pub fn credit_told(&mut self) {
        if self.fwd_cnt != self.fwd_cnt_sent {
            self.credit_requested = false;
        }
    }

    /// The guest's payload (`segs`, `len` bytes): written to the socket from guest memory,
    /// what it refuses kept. Err: the guest sent beyond its credit (a protocol violation).
    pub fn write_guest_bytes(&mut self, mem: &GuestMemoryMmap, segs: &[Segment], len: usize) -> Result<(), ()> {
        let in_flight = self.pending.len() + len;
        if in_flight > BUF_ALLOC as usize {
            return Err(());
        }
        let mut written = 0;
        if self.pending.is_empty() {
            let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_IOVECS];
            if let Some(n) = chain::host_iovecs(mem, segs, &mut iov) {
                let iov = trim(&mut iov[..n], len);
                // SAFETY: the iovecs point into guest memory, checked by host_iovecs, and
                // `mem` keeps the mapping alive through the call.
                let r = unsafe { libc::writev(self.stream.as_raw_fd(), iov.as_ptr(), iov.len() as i32) };
                written = usize::try_from(r).unwrap_or(0);
            }
        }
        if written < len {
            // The rest waits for the socket's EPOLLOUT, copied (bounded by the credit).
            let mut rest = vec![0u8; len - written];
            let got = chain::gather(mem, &chain::skip(segs, written), &mut rest);
            self.pending.extend_from_slice(&rest[..got]);
        }
        self.fwd_cnt = self.fwd_cnt.wrapping_add(written as u32);
        Ok(())
    }

    /// Writes what the socket refused before; true once nothing is left.
    pub fn flush(&mut self) -> bool {
        while !self.pending.is_empty() {
            match self.stream.write(&self.pending) {
                Ok(0) => break,
                Ok(n) => {
                    self.pending.drain(..n);
                    self.fwd_cnt = self.fwd_cnt.wrapping_add(n as u32);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        if self.pending.is_empty() && self.guest_done_sending {
            let _ = self.stream.shutdown(std::net::Shutdown::Write);
        }
        self.pending.is_empty()
    }

    /// Reads from the socket into the guest's buffer (`segs`), at most what the guest's
    /// credit allows.
    pub fn read_for_guest(&mut self, mem: &GuestMemoryMmap, segs: &[Segment]) -> Read {
        let room = segs.iter().map(|s| s.len).sum::<usize>().min(self.peer_credit() as usize);
        let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_IOVECS];
        let Some(n) = chain::host_iovecs(mem, &segs[..segs.len().min(MAX_IOVECS)], &mut iov) else {
            return Read::WouldBlock;
        };
        let iov = trim(&mut iov[..n], room);
        if iov.is_empty() {
            return Read::WouldBlock;
        }
        // SAFETY: as in `from_guest`; readv writes only inside the iovecs.
        let r = unsafe { libc::readv(self.stream.as_raw_fd(), iov.as_ptr(), iov.len() as i32) };
        match r {
            0 => Read::Closed,
            n if n > 0 => {
                self.rx_cnt = self.rx_cnt.wrapping_add(n as u32);
                Read::Bytes(n as usize)
            }
            _ if std::io::Error::last_os_error().kind() == ErrorKind::WouldBlock => Read::WouldBlock,
            _ => Read::Closed,
        }
    }
}

/// Connects to the host's Unix socket `path` without blocking; the stream is
/// non-blocking. Linux completes or refuses a Unix-socket connect within the call: a
/// listener whose backlog is full answers EAGAIN at once (EINPROGRESS is TCP's answer),
/// where a blocking connect held the device thread, and with it a reset, a snapshot's
/// pause and shutdown, until the host accepted (issue 53, item 9).
pub fn connect(path: &std::ffi::OsStr) -> std::io::Result<UnixStream> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_bytes();
    // SAFETY: sockaddr_un is plain data, for which all zeros is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    // The path and its NUL must fit, as std's connect requires.
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(ErrorKind::InvalidInput.into());
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (to, &from) in addr.sun_path.iter_mut().zip(bytes) {
        *to = from as libc::c_char;
    }
    let kind = libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: makes a descriptor; no memory is passed.
    let fd = unsafe { libc::socket(libc::AF_UNIX, kind, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just made and nothing else owns it; the stream closes it.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + 1;
    // SAFETY: `addr` lives through the call and `len` covers its family and the path with
    // its NUL (checked to fit above).
    let r = unsafe { libc::connect(fd, (&raw const addr).cast(), len as libc::socklen_t) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stream)
}

/// The iovecs cut to `len` bytes in all.
fn trim(iov: &mut [libc::iovec], len: usize) -> &[libc::iovec] {
    let mut left = len;
    for (i, v) in iov.iter_mut().enumerate() {
        if left == 0 {
            return &iov[..i];
        }
        v.iov_len = v.iov_len.min(left);
        left -= v.iov_len;
    }
    iov
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_counts_what_the_guest_consumed() {
        let (a, _b) = UnixStream::pair().unwrap();
        let mut c = Conn::new(a, 1, 2, State::Established);
        c.peer_credit_from(&Header { buf_alloc: 1000, fwd_cnt: 0, ..Header::default() });
        assert_eq!(c.peer_credit(), 1000);
        c.rx_cnt = 600;
        assert_eq!(c.peer_credit(), 400);
        c.peer_credit_from(&Header { buf_alloc: 1000, fwd_cnt: 500, ..Header::default() });
        assert_eq!(c.peer_credit(), 900);
        // Counters wrap as the spec's do.
        c.rx_cnt = 10;
        c.peer_credit_from(&Header { buf_alloc: 1000, fwd_cnt: u32::MAX - 9, ..Header::default() });
        assert_eq!(c.peer_credit(), 980);
    }

    #[test]
    fn a_full_backlog_refuses_at_once_and_a_free_one_connects() {
        use std::os::unix::ffi::OsStrExt;
        let dir = std::env::temp_dir().join(format!("exitless-vsock-connect-{}", std::process::id()));
        let _ = std::fs::create_dir(&dir);
        let path = dir.join("l_1");
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        // Backlog 0: one connection waits, the next finds it full.
        // SAFETY: listen on a descriptor the listener owns.
        assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
        let mut held = Vec::new();
        let refused = loop {
            match connect(path.as_os_str()) {
                Ok(s) => held.push(s),
                Err(e) => break e,
            }
            assert!(held.len() < 64, "the backlog never filled");
        };
        assert_eq!(refused.kind(), ErrorKind::WouldBlock, "{refused}");
        assert!(!held.is_empty(), "a listener with room connects");
        // A path that does not fit sockaddr_un, and one nobody listens on.
        let long = std::ffi::OsStr::from_bytes(&[b'x'; 200]);
        assert_eq!(connect(long).unwrap_err().kind(), ErrorKind::InvalidInput);
        assert!(connect(dir.join("none").as_os_str()).is_err());
        drop(listener);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn trims_iovecs_to_a_length() {
        let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 10 }; 3];
        let t = trim(&mut iov, 15);
        assert_eq!(t.len(), 2);
        assert_eq!(t[1].iov_len, 5);
    }
}
