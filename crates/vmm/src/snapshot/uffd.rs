//! Firecracker's Uffd memory backend: guest RAM is anonymous (4 KiB pages, or 2 MiB
//! hugetlbfs pages for a guest on huge pages, each region's `page_size` saying which),
//! registered with a userfaultfd, and a page-fault handler process the user runs fills
//! each page on first touch (UFFDIO_COPY from wherever it keeps the memory). The handshake is Firecracker's:
//! the VMM connects to the handler's Unix socket and sends, in one message, the JSON list
//! of the regions (`base_host_virt_addr`, `size`, `offset` in the memory file,
//! `page_size`, and the deprecated `page_size_kib`, in bytes too) with the userfaultfd
//! attached (SCM_RIGHTS). Nothing more passes on that socket. Beyond Firecracker, the load
//! waits for the handler to fill the first page, and is refused if it makes no progress
//! for a while (a handler that is not running, or copies pages of the wrong size:
//! uffd/probe.rs). The userfaultfd reports REMOVE events, as Firecracker's does: a range the VMM discards (guest_memory's
//! discard: MADV_DONTNEED) must read zeros afterwards, which only the handler can make
//! so. The few ioctls are written here (the `userfaultfd` crate builds its bindings with
//! libclang at compile time).

use super::SnapshotError;
use crate::guest_memory::GuestMemoryMmap;
use serde::Serialize;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

mod probe;

const UFFD_API: u64 = 0xaa;
/// _IOWR(0xaa, 0x3f, struct uffdio_api), _IOWR(0xaa, 0x00, struct uffdio_register).
const UFFDIO_API: u64 = 0xc018_aa3f;
const UFFDIO_REGISTER: u64 = 0xc020_aa00;
/// _IOR(0xaa, 0x01, struct uffdio_range).
const UFFDIO_UNREGISTER: u64 = 0x8010_aa01;
/// _IO(0xaa, 0x00) on /dev/userfaultfd.
const USERFAULTFD_IOC_NEW: u64 = 0xaa00;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
/// The handler hears of every range the VMM discards (balloon, free page reporting), so
/// that it serves zeros there from then on rather than the snapshot's bytes, as
/// Firecracker requires of a handler.
pub const UFFD_FEATURE_EVENT_REMOVE: u64 = 1 << 3;

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    start: u64,
    len: u64,
    mode: u64,
    ioctls: u64,
}

/// One region as the handler gets it (Firecracker's GuestRegionUffdMapping).
#[derive(Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct UffdMapping {
    pub base_host_virt_addr: u64,
    pub size: usize,
    pub offset: u64,
    pub page_size: usize,
    pub page_size_kib: usize,
}

/// Registers every region of `memory` (in pages of `page_size` bytes: 4 KiB anonymous
/// memory, or 2 MiB hugetlbfs memory) with a new userfaultfd, hands it to the handler
/// listening on `socket`, and waits for the handler to fill the first page (probe.rs).
/// The VMM keeps its own copy of the fd (returned) for as long as the memory lives.
pub fn hand_over(socket: &Path, memory: &GuestMemoryMmap, page_size: usize) -> Result<OwnedFd, SnapshotError> {
    hand_over_within(socket, memory, page_size, probe::HANDLER_IDLE_AT_MOST)
}

/// [`hand_over`], the handler given `within` without progress to fill the first page.
pub(crate) fn hand_over_within(
    socket: &Path,
    memory: &GuestMemoryMmap,
    page_size: usize,
    within: std::time::Duration,
) -> Result<OwnedFd, SnapshotError> {
    let fail = |what: &str, e: std::io::Error| SnapshotError::Refused(format!("the Uffd backend: {what}: {e}"));
    let uffd = create().map_err(|e| fail("cannot create a userfaultfd", e))?;
    let mut mappings = Vec::new();
    let mut offset = 0u64;
    for region in memory.iter() {
        let host = memory
            .get_host_address(region.start_addr())
            .map_err(|e| fail("a region without a mapping", std::io::Error::other(e.to_string())))?;
        let mut register =
            UffdioRegister { start: host as u64, len: region.len(), mode: UFFDIO_REGISTER_MODE_MISSING, ioctls: 0 };
        // SAFETY: UFFDIO_REGISTER with a struct of the kernel's layout, on our own mapping.
        if unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_REGISTER as _, &mut register) } != 0 {
            return Err(fail("cannot register guest memory", std::io::Error::last_os_error()));
        }
        // `page_size_kib` is in bytes too, as Firecracker v1.16.1 sends it.
        mappings.push(UffdMapping {
            base_host_virt_addr: host as u64,
            size: region.len() as usize,
            offset,
            page_size,
            page_size_kib: page_size,
        });
        offset += region.len();
    }
    let json = serde_json::to_vec(&mappings).map_err(|e| fail("the mappings", std::io::Error::other(e)))?;
    let stream = std::os::unix::net::UnixStream::connect(socket)
        .map_err(|e| fail(&format!("cannot connect to the handler at {}", socket.display()), e))?;
    stream
        .send_with_fd(&json[..], uffd.as_raw_fd())
        .map_err(|e| fail("cannot send the handler its userfaultfd", std::io::Error::from_raw_os_error(e.errno())))?;
    probe::first_page_served(memory, &uffd, page_size, within).map_err(|why| {
        SnapshotError::Refused(format!("the Uffd backend: the page-fault handler at {}: {why}", socket.display()))
    })?;
    // The connection stays open for the VMM's life, as Firecracker keeps it (`forget`):
    // Firecracker's example handlers poll it for further userfaultfds and, at its close,
    // read nothing and give up serving (they panic). The kernel closes it when we exit.
    std::mem::forget(stream);
    Ok(uffd)
}

/// A userfaultfd for faults from the kernel too (KVM touches guest memory on the guest's
/// behalf): the system call, or /dev/userfaultfd where the system call is closed to us.
fn create() -> std::io::Result<OwnedFd> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: userfaultfd(2) takes flags only.
    let mut fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) } as i32;
    if fd < 0 {
        let first = std::io::Error::last_os_error();
        let dev = std::fs::OpenOptions::new().read(true).write(true).open("/dev/userfaultfd").map_err(|_| first)?;
        // SAFETY: USERFAULTFD_IOC_NEW takes the new fd's flags.
        fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: a fresh fd, owned by nobody else.
    let uffd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut api = UffdioApi { api: UFFD_API, features: UFFD_FEATURE_EVENT_REMOVE, ..Default::default() };
    // SAFETY: UFFDIO_API with a struct of the kernel's layout.
    if unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_API as _, &mut api) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(e.kind(), format!("UFFDIO_API with UFFD_FEATURE_EVENT_REMOVE: {e}")));
    }
    Ok(uffd)
}
