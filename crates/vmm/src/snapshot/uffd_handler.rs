//! A page-fault handler for the Uffd backend (`exitless uffd-handler`), the other side of
//! uffd.rs, as Firecracker's example handler is for Firecracker: it listens on a Unix
//! socket, takes one VMM's userfaultfd and region list, and fills each page the guest (or
//! the VMM) touches from a snapshot's memory file, mapped privately. It serves until the
//! VMM is gone.

use super::uffd::UffdMapping;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::Path;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// _IOWR(0xaa, 0x03, struct uffdio_copy).
const UFFDIO_COPY: u64 = 0xc028_aa03;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const PAGE: u64 = 4096;

#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

/// What a handler did, for its last line.
#[derive(Debug, Default)]
pub struct Served {
    pub faults: u64,
    pub pages: u64,
}

/// Serves one VMM on `socket` from `mem_file`; returns once the VMM has gone.
pub fn serve(socket: &Path, mem_file: &Path, ready: impl FnOnce()) -> Result<Served, String> {
    // A regular file, its length from the descriptor mapped (a FIFO would hang the open).
    let (file, len) = crate::files::open_regular(mem_file, false).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket).map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?;
    ready();
    let (stream, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
    let mut buf = vec![0u8; 64 << 10];
    let (n, fd) = stream.recv_with_fd(&mut buf[..]).map_err(|e| format!("the VMM's handshake: {e}"))?;
    let fd = fd.ok_or("the VMM's handshake came without a userfaultfd")?;
    let uffd = OwnedFd::from(fd);
    let mappings: Vec<UffdMapping> =
        serde_json::from_slice(&buf[..n]).map_err(|e| format!("the VMM's region list: {e}"))?;
    if let Some(m) = mappings.iter().find(|m| m.offset + m.size as u64 > len) {
        return Err(format!("a region ends at {} of a {len}-byte memory file", m.offset + m.size as u64));
    }
    let pid = peer_pid(&stream);
    // SAFETY: a private read-only mapping of the whole file, unmapped when we return.
    let source = unsafe {
        libc::mmap(std::ptr::null_mut(), len.max(1) as usize, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0)
    };
    if source == libc::MAP_FAILED {
        return Err(format!("cannot map {}: {}", mem_file.display(), std::io::Error::last_os_error()));
    }
    let served = fault_loop(&uffd, &mappings, source as u64, pid);
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(source, len.max(1) as usize) };
    Ok(served)
}

fn peer_pid(stream: &std::os::unix::net::UnixStream) -> Option<i32> {
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
    (r == 0 && cred.pid > 0).then_some(cred.pid)
}

/// Reads fault events and copies each faulting page in, until the VMM (`pid`) is gone.
fn fault_loop(uffd: &OwnedFd, mappings: &[UffdMapping], source: u64, pid: Option<i32>) -> Served {
    let mut served = Served::default();
    let mut msg = [0u8; 32];
    loop {
        let mut poll = libc::pollfd { fd: uffd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, 500) };
        // SAFETY: kill with signal 0 only asks whether the process exists.
        let gone = pid.is_some_and(|p| unsafe { libc::kill(p, 0) } != 0);
        if ready <= 0 || poll.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
            if gone || poll.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
                return served;
            }
            continue;
        }
        // SAFETY: reading one uffd_msg into a buffer of its size.
        let n = unsafe { libc::read(uffd.as_raw_fd(), msg.as_mut_ptr().cast(), msg.len()) };
        if n != msg.len() as isize || msg[0] != UFFD_EVENT_PAGEFAULT {
            continue;
        }
        // uffd_msg.arg.pagefault: flags at 8, address at 16.
        let address = u64::from_le_bytes(msg[16..24].try_into().unwrap_or_default()) & !(PAGE - 1);
        served.faults += 1;
        let Some(m) =
            mappings.iter().find(|m| (m.base_host_virt_addr..m.base_host_virt_addr + m.size as u64).contains(&address))
        else {
            continue;
        };
        let mut copy = UffdioCopy {
            dst: address,
            src: source + m.offset + (address - m.base_host_virt_addr),
            len: PAGE,
            mode: 0,
            copy: 0,
        };
        // SAFETY: UFFDIO_COPY from our mapping of the file into the VMM's registered range.
        if unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_COPY as _, &mut copy) } == 0 {
            served.pages += 1;
        }
        // EEXIST: another fault on the same page was served first; nothing to do.
    }
}
