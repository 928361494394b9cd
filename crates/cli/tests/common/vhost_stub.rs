//! A vhost-user backend of the tests' own, speaking just enough of the protocol (the
//! handshake, vhost-user-blk's GET_CONFIG, a reply to whatever asks for one), and
//! misbehaving as told; it records the memory tables it is given, with their files.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// One region of a memory table (SET_MEM_TABLE) as the backend got it: its file too.
#[derive(Debug)]
pub struct TableRegion {
    pub guest_phys_addr: u64,
    pub memory_size: u64,
    pub mmap_offset: u64,
    pub file: std::fs::File,
}

impl TableRegion {
    /// `len` bytes at guest address `gpa` (inside the region), read through a mapping of
    /// the region's file of the backend's own, as a backend reads guest buffers.
    pub fn read(&self, gpa: u64, len: usize) -> Vec<u8> {
        let offset = gpa - self.guest_phys_addr;
        assert!(offset + len as u64 <= self.memory_size, "{gpa:#x}+{len} is outside the region");
        let size = (self.mmap_offset + self.memory_size) as usize;
        // SAFETY: a new shared read-only mapping of the region's file, unmapped below;
        // nothing else of this process lives there.
        let at = unsafe {
            libc::mmap(std::ptr::null_mut(), size, libc::PROT_READ, libc::MAP_SHARED, self.file.as_raw_fd(), 0)
        };
        assert_ne!(at, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        let from = (self.mmap_offset + offset) as usize;
        // SAFETY: `from + len` lies inside the mapping just made, readable.
        let bytes = unsafe { std::slice::from_raw_parts(at.cast::<u8>().add(from), len) }.to_vec();
        // SAFETY: the mapping made above, no longer borrowed.
        unsafe { libc::munmap(at, size) };
        bytes
    }

    /// The bytes of the region's file that hold pages (what the host spends on it).
    pub fn allocated(&self) -> u64 {
        std::os::unix::fs::MetadataExt::blocks(&self.file.metadata().unwrap()) * 512
    }
}

/// Every memory table the stub was given, in order.
pub type Tables = Arc<Mutex<Vec<Vec<TableRegion>>>>;

/// The 12-byte header, with the descriptors that came with it (SCM_RIGHTS).
fn read_header(s: &mut UnixStream, header: &mut [u8; 12]) -> std::io::Result<Vec<OwnedFd>> {
    let mut iov = libc::iovec { iov_base: header.as_mut_ptr().cast(), iov_len: header.len() };
    let mut control = [0u64; 32];
    // SAFETY: msghdr is plain data, for which all zeros is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: the iovec and the control buffer are this frame's, of the sizes given.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n <= 0 {
        return Err(std::io::Error::other("closed"));
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages recvmsg filled in, within msg_controllen.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: a control message header inside the buffer.
        let c = unsafe { &*cmsg };
        if c.cmsg_level == libc::SOL_SOCKET && c.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: a pure computation on a constant.
            let header_len = unsafe { libc::CMSG_LEN(0) } as usize;
            let data_len = c.cmsg_len as usize - header_len;
            // SAFETY: SCM_RIGHTS data is `data_len / 4` descriptors, now this process's.
            let data = unsafe { libc::CMSG_DATA(cmsg) }.cast::<i32>();
            for i in 0..data_len / 4 {
                // SAFETY: as above; each descriptor is owned by nothing else.
                fds.push(unsafe { OwnedFd::from_raw_fd(data.add(i).read_unaligned()) });
            }
        }
        // SAFETY: as above.
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    s.read_exact(&mut header[n as usize..])?;
    Ok(fds)
}

/// A SET_MEM_TABLE body (count, padding, then per region: guest address, size, user
/// address, mmap offset) with its files.
fn table(body: &[u8], fds: Vec<OwnedFd>) -> Vec<TableRegion> {
    let word = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().unwrap());
    let count = u32::from_le_bytes(body[..4].try_into().unwrap()) as usize;
    fds.into_iter()
        .take(count)
        .enumerate()
        .map(|(i, fd)| TableRegion {
            guest_phys_addr: word(8 + i * 32),
            memory_size: word(16 + i * 32),
            mmap_offset: word(32 + i * 32),
            file: fd.into(),
        })
        .collect()
}

/// How the stub backend behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stub {
    /// Answers the handshake as virtiofsd (or a block backend) does.
    Good,
    /// Closes its socket after the first message.
    Close,
    /// Offers no VIRTIO_F_VERSION_1.
    NoVersion1,
    /// Answers GET_FEATURES with the header of another request.
    Malformed,
    /// Reads everything, answers nothing.
    Silent,
    /// Shakes hands, then closes its socket when given the memory table (at activation).
    CloseAtMemTable,
    /// Answers GET_CONFIG with a configuration space of the wrong size.
    ShortConfig,
    /// Shakes hands and takes the vrings as Good does, then dies (closes its socket)
    /// once the last is enabled: a backend killed mid-run.
    Crash,
}

pub const GET_FEATURES: u32 = 1;
pub const SET_MEM_TABLE: u32 = 5;
pub const GET_VRING_BASE: u32 = 11;
pub const GET_PROTOCOL_FEATURES: u32 = 15;
pub const GET_QUEUE_NUM: u32 = 17;
pub const GET_CONFIG: u32 = 24;
pub const SET_VRING_ENABLE: u32 = 18;
pub const VERSION_1: u64 = 1 << 32;
pub const PROTOCOL_FEATURES: u64 = 1 << 30;
pub const EVENT_IDX: u64 = 1 << 29;
/// MQ, REPLY_ACK and CONFIG.
pub const PROTOCOL: u64 = 0x1 | 0x8 | 0x200;
/// A reply's flags: version 1, the reply bit.
const REPLY: u32 = 0x1 | 0x4;
const NEED_REPLY: u32 = 0x8;

/// The block device's capacity the stub reports (sectors).
pub const CAPACITY: u64 = 8192;

fn send(s: &mut UnixStream, request: u32, body: &[u8]) {
    let mut m = Vec::new();
    for w in [request, REPLY, body.len() as u32] {
        m.extend_from_slice(&w.to_le_bytes());
    }
    m.extend_from_slice(body);
    let _ = s.write_all(&m);
}

/// A stub backend listening on `path`, serving one connection as `mode` says.
pub fn stub(path: &Path, mode: Stub) -> std::thread::JoinHandle<()> {
    stub_recording(path, mode, Tables::default())
}

/// [`stub`], each memory table it is given pushed onto `tables`.
pub fn stub_recording(path: &Path, mode: Stub, tables: Tables) -> std::thread::JoinHandle<()> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else { return };
        let reply = |s: &mut UnixStream, request: u32, value: u64| send(s, request, &value.to_le_bytes());
        loop {
            let mut header = [0u8; 12];
            let Ok(fds) = read_header(&mut s, &mut header) else { return };
            let word = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().unwrap());
            let (request, flags, size) = (word(0), word(4), word(8));
            let mut body = vec![0u8; size as usize];
            if s.read_exact(&mut body).is_err() {
                return;
            }
            if request == SET_MEM_TABLE && mode != Stub::CloseAtMemTable {
                tables.lock().unwrap().push(table(&body, fds));
            }
            match (mode, request) {
                (Stub::Close, _) => return,
                (Stub::Silent, _) => continue,
                (Stub::CloseAtMemTable, SET_MEM_TABLE) => return,
                (Stub::Malformed, GET_FEATURES) => reply(&mut s, GET_QUEUE_NUM, VERSION_1),
                (Stub::NoVersion1, GET_FEATURES) => reply(&mut s, request, PROTOCOL_FEATURES | EVENT_IDX),
                (_, GET_FEATURES) => reply(&mut s, request, VERSION_1 | PROTOCOL_FEATURES | EVENT_IDX),
                (_, GET_PROTOCOL_FEATURES) => reply(&mut s, request, PROTOCOL),
                (_, GET_QUEUE_NUM) => reply(&mut s, request, 2),
                (_, GET_CONFIG) => {
                    // offset, size, flags, then the space: virtio-blk's capacity first.
                    let want = u32::from_le_bytes(body[4..8].try_into().unwrap());
                    let want = if mode == Stub::ShortConfig { want - 4 } else { want };
                    let mut space = vec![0u8; want as usize];
                    space[..8].copy_from_slice(&CAPACITY.to_le_bytes());
                    let mut answer = body[..4].to_vec();
                    answer.extend_from_slice(&want.to_le_bytes());
                    answer.extend_from_slice(&body[8..12]);
                    answer.extend_from_slice(&space);
                    send(&mut s, request, &answer);
                }
                (_, GET_VRING_BASE) => {
                    let mut answer = body[..4].to_vec();
                    answer.extend_from_slice(&0u32.to_le_bytes());
                    send(&mut s, request, &answer);
                }
                (Stub::Crash, SET_VRING_ENABLE) => {
                    reply(&mut s, request, 0);
                    return;
                }
                _ if flags & NEED_REPLY != 0 => reply(&mut s, request, 0),
                _ => {}
            }
        }
    })
}
