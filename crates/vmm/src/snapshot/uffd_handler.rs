//! A page-fault handler for the Uffd backend (`exitless uffd-handler`), the other side of
//! uffd.rs, as Firecracker's example handler is for Firecracker: it listens on a Unix
//! socket, takes one VMM's userfaultfd and region list, and fills each page the guest (or
//! the VMM) touches from a snapshot's memory file, mapped privately, in the region's page
//! size (4 KiB, or 2 MiB for a guest on hugetlbfs pages: a 2 MiB page is copied whole, as
//! the kernel requires). It serves until the VMM is gone.
//!
//! It distrusts what reaches it: a peer whose uid is neither the handler's nor root's is
//! refused (and the handler goes on listening), and the region list must lie inside the
//! memory file, in whole pages, without wrapping. A range the VMM discards (the balloon,
//! free page reporting: MADV_DONTNEED) arrives as a REMOVE event; the handler unregisters
//! it (in whole pages of the region), so that the kernel fills it with zeros from then on,
//! as any anonymous memory, rather than the handler with the snapshot's bytes.

use super::uffd::UffdMapping;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// _IOWR(0xaa, 0x03, struct uffdio_copy); _IOR(0xaa, 0x01, struct uffdio_range).
const UFFDIO_COPY: u64 = 0xc028_aa03;
const UFFDIO_UNREGISTER: u64 = 0x8010_aa01;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_EVENT_REMOVE: u8 = 0x15;
/// sizeof(struct uffd_msg).
const MSG: usize = 32;
const PAGE: u64 = 4096;
/// The page sizes a region may have: 4 KiB, or hugetlbfs's 2 MiB.
const PAGE_SIZES: [u64; 2] = [PAGE, 2 << 20];

#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}

/// Why the handler stopped before serving.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    #[error("cannot open {path}: {source}")]
    Open { path: String, source: std::io::Error },
    #[error("{0} is not a regular file")]
    NotAFile(String),
    #[error("cannot listen on {path}: {source}")]
    Listen { path: String, source: std::io::Error },
    #[error("accept: {0}")]
    Accept(std::io::Error),
    #[error("the VMM's handshake: {0}")]
    Handshake(String),
    #[error("the VMM's region list: {0}")]
    Regions(String),
    #[error("cannot map {path}: {source}")]
    Map { path: String, source: std::io::Error },
}

/// What a handler did, for its last line.
#[derive(Debug, Default)]
pub struct Served {
    pub faults: u64,
    pub pages: u64,
    /// Ranges the VMM discarded, unregistered (zeros from then on).
    pub removed: u64,
    /// Connections refused: a peer of another user.
    pub refused_peers: u64,
}

/// Serves one VMM on `socket` from `mem_file`; returns once the VMM has gone.
pub fn serve(socket: &Path, mem_file: &Path, ready: impl FnOnce()) -> Result<Served, HandlerError> {
    // SAFETY: kill with signal 0 only asks whether the process exists.
    serve_until(socket, mem_file, ready, |pid| pid > 0 && unsafe { libc::kill(pid, 0) } != 0)
}

/// [`serve`], until `gone` says the VMM (by its pid) has gone.
fn serve_until(
    socket: &Path,
    mem_file: &Path,
    ready: impl FnOnce(),
    gone: impl Fn(libc::pid_t) -> bool,
) -> Result<Served, HandlerError> {
    let shown = mem_file.display().to_string();
    // A regular file, its length from the descriptor mapped: a FIFO or a device has no
    // length to map, and would hang a blocking open.
    let (file, len) = crate::files::open_regular(mem_file, false).map_err(|e| match e {
        crate::files::FileError::NotRegular { .. } => HandlerError::NotAFile(shown.clone()),
        crate::files::FileError::Open { source, .. } => HandlerError::Open { path: shown.clone(), source },
        e => HandlerError::Open { path: shown.clone(), source: std::io::Error::other(e.to_string()) },
    })?;
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket)
        .map_err(|source| HandlerError::Listen { path: socket.display().to_string(), source })?;
    ready();
    let mut refused_peers = 0;
    let (stream, peer) = loop {
        let (stream, _) = listener.accept().map_err(HandlerError::Accept)?;
        match peer_credentials(&stream) {
            // SAFETY: geteuid has no arguments and cannot fail.
            Ok(peer) if allowed(peer.uid, unsafe { libc::geteuid() }) => break (stream, peer),
            Ok(peer) => tracing::warn!("uffd-handler: refused a connection from uid {} (pid {})", peer.uid, peer.pid),
            Err(e) => tracing::warn!("uffd-handler: refused a connection whose credentials are unknown: {e}"),
        }
        refused_peers += 1;
    };
    let (uffd, mappings) = handshake(&stream)?;
    check_mappings(&mappings, len).map_err(HandlerError::Regions)?;
    // SAFETY: a private read-only mapping of the whole file, unmapped when we return.
    let source = unsafe {
        libc::mmap(std::ptr::null_mut(), len.max(1) as usize, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0)
    };
    if source == libc::MAP_FAILED {
        return Err(HandlerError::Map { path: shown, source: std::io::Error::last_os_error() });
    }
    let mut served = Handler::new(&uffd, &mappings, source as u64).run(|| gone(peer.pid));
    served.refused_peers = refused_peers;
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(source, len.max(1) as usize) };
    Ok(served)
}

/// The VMM's one message: the region list, with its userfaultfd attached.
fn handshake(stream: &UnixStream) -> Result<(OwnedFd, Vec<UffdMapping>), HandlerError> {
    let mut buf = vec![0u8; 64 << 10];
    let (n, fd) = stream.recv_with_fd(&mut buf[..]).map_err(|e| HandlerError::Handshake(e.to_string()))?;
    let uffd = OwnedFd::from(fd.ok_or_else(|| HandlerError::Handshake("no userfaultfd came with it".into()))?);
    let mappings = serde_json::from_slice(&buf[..n]).map_err(|e| HandlerError::Regions(e.to_string()))?;
    Ok((uffd, mappings))
}

/// The peer's pid, uid and gid, as the kernel saw them when it connected.
fn peer_credentials(stream: &UnixStream) -> std::io::Result<libc::ucred> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut size = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED into a ucred of the right size.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut size,
        )
    };
    match r {
        0 => Ok(cred),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Whether a peer of uid `peer` may hand this handler (of effective uid `own`) its
/// memory: itself, or root.
fn allowed(peer: libc::uid_t, own: libc::uid_t) -> bool {
    peer == own || peer == 0
}

/// Every region of a page size this handler serves, in whole pages of it, inside the
/// address space and inside the `len` bytes of the memory file.
fn check_mappings(mappings: &[UffdMapping], len: u64) -> Result<(), String> {
    for m in mappings {
        let size = m.size as u64;
        let end = m.offset.checked_add(size).filter(|&end| end <= len);
        let Some(end) = end else {
            return Err(format!("a region of {size} bytes at offset {} passes the {len}-byte memory file", m.offset));
        };
        let page = m.page_size as u64;
        if !PAGE_SIZES.contains(&page) {
            return Err(format!("a region of {page}-byte pages (this handler serves 4 KiB and 2 MiB pages)"));
        }
        let whole = [m.base_host_virt_addr, size, m.offset].iter().all(|v| v % page == 0) && size > 0;
        if !whole || m.base_host_virt_addr.checked_add(size).is_none() {
            return Err(format!(
                "a region at {:#x}+{size:#x} (offset {}..{end}) is not whole {}-KiB pages",
                m.base_host_virt_addr,
                m.offset,
                page >> 10
            ));
        }
    }
    Ok(())
}

/// One VMM's faults and removals.
struct Handler<'a> {
    uffd: &'a OwnedFd,
    mappings: &'a [UffdMapping],
    /// Our mapping of the memory file.
    source: u64,
    served: Served,
    /// Faults a pending removal made the kernel refuse for now (EAGAIN): tried again
    /// once the removal is read.
    deferred: Vec<u64>,
    warned: bool,
}

/// What a copy into a faulting page came to.
enum Copied {
    Done,
    /// A removal is pending: try again after reading it.
    Again,
    Dropped,
}

impl<'a> Handler<'a> {
    fn new(uffd: &'a OwnedFd, mappings: &'a [UffdMapping], source: u64) -> Handler<'a> {
        Handler { uffd, mappings, source, served: Served::default(), deferred: Vec::new(), warned: false }
    }

    /// Serves until the userfaultfd hangs up or `gone` says the VMM has.
    fn run(mut self, gone: impl Fn() -> bool) -> Served {
        // Every event at once: a REMOVE must be read before any copy can succeed.
        // SAFETY: F_SETFL on our descriptor (the VMM made it non-blocking already).
        unsafe { libc::fcntl(self.uffd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        loop {
            let wait = if self.deferred.is_empty() { 500 } else { 1 };
            let mut poll = libc::pollfd { fd: self.uffd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one pollfd.
            let ready = unsafe { libc::poll(&mut poll, 1, wait) };
            if poll.revents & (libc::POLLERR | libc::POLLHUP) != 0 || (ready <= 0 && gone()) {
                return self.served;
            }
            let (faults, removals) = self.read_events();
            for range in removals {
                self.remove(range);
            }
            for address in std::mem::take(&mut self.deferred).into_iter().chain(faults) {
                if let Copied::Again = self.copy(address) {
                    self.deferred.push(address);
                }
            }
        }
    }

    /// Every event queued: the faulting pages and the removed ranges.
    fn read_events(&mut self) -> (Vec<u64>, Vec<std::ops::Range<u64>>) {
        let (mut faults, mut removals) = (Vec::new(), Vec::new());
        let mut buf = [0u8; MSG * 16];
        loop {
            // SAFETY: reading whole uffd_msgs into a buffer of that many bytes.
            let n = unsafe { libc::read(self.uffd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return (faults, removals);
            }
            for msg in buf[..n as usize].chunks_exact(MSG) {
                let word = |at: usize| u64::from_le_bytes(msg[at..at + 8].try_into().unwrap_or_default());
                match msg[0] {
                    // uffd_msg.arg.pagefault: flags at 8, address at 16.
                    UFFD_EVENT_PAGEFAULT => {
                        self.served.faults += 1;
                        faults.push(word(16) & !(PAGE - 1));
                    }
                    // uffd_msg.arg.remove: start at 8, end at 16.
                    UFFD_EVENT_REMOVE => removals.push(word(8)..word(16)),
                    other => self.warn_once(&format!("an event of type {other:#x}, not asked for")),
                }
            }
        }
    }

    /// A range the VMM discarded: unregistered where it lies in a region (the kernel
    /// serves zeros there from now on, and wakes any fault waiting in it).
    fn remove(&mut self, range: std::ops::Range<u64>) {
        for m in self.mappings {
            let (start, end) =
                (range.start.max(m.base_host_virt_addr), range.end.min(m.base_host_virt_addr + m.size as u64));
            let page = m.page_size as u64;
            let (start, end) = (start.next_multiple_of(page), end & !(page - 1));
            if start >= end {
                continue;
            }
            let mut r = UffdioRange { start, len: end - start };
            // SAFETY: UFFDIO_UNREGISTER with a struct of the kernel's layout, on a range of
            // the VMM's registered memory.
            if unsafe { libc::ioctl(self.uffd.as_raw_fd(), UFFDIO_UNREGISTER as _, &mut r) } == 0 {
                self.served.removed += 1;
            } else {
                let e = std::io::Error::last_os_error();
                self.warn_once(&format!("cannot unregister {start:#x}..{end:#x}: {e}"));
            }
        }
    }

    /// The file's page for the faulting `address`, copied in.
    fn copy(&mut self, address: u64) -> Copied {
        let Some(m) = self
            .mappings
            .iter()
            .find(|m| (m.base_host_virt_addr..m.base_host_virt_addr + m.size as u64).contains(&address))
        else {
            self.warn_once(&format!("a fault at {address:#x}, outside every region"));
            return Copied::Dropped;
        };
        // The whole page of the region's size (checked to divide its base and size).
        let page = m.page_size as u64;
        let dst = address & !(page - 1);
        let src = self.source + m.offset + (dst - m.base_host_virt_addr);
        let mut copy = UffdioCopy { dst, src, len: page, mode: 0, copy: 0 };
        // SAFETY: UFFDIO_COPY from our mapping of the file (the region checked to lie inside
        // it) into the VMM's registered range.
        if unsafe { libc::ioctl(self.uffd.as_raw_fd(), UFFDIO_COPY as _, &mut copy) } == 0 {
            self.served.pages += 1;
            return Copied::Done;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EAGAIN) => Copied::Again,
            // EEXIST: another fault on the page was served first. ENOENT: the range was
            // unregistered (removed), and the kernel serves the fault itself.
            Some(libc::EEXIST | libc::ENOENT) => Copied::Dropped,
            _ => {
                let e = std::io::Error::last_os_error();
                self.warn_once(&format!("cannot copy into {dst:#x} ({page} bytes): {e}"));
                Copied::Dropped
            }
        }
    }

    fn warn_once(&mut self, what: &str) {
        if !std::mem::replace(&mut self.warned, true) {
            tracing::warn!("uffd-handler: {what} (said once)");
        }
    }
}

#[cfg(test)]
mod tests;
