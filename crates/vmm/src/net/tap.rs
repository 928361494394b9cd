//! A tap interface opened with a virtio-net header on every frame (IFF_VNET_HDR), so a
//! guest's TX buffer, header included, can be handed to the kernel as it is.

use std::fs::{File, OpenOptions};
use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

const IFF_TAP: i16 = 0x0002;
const IFF_NO_PI: i16 = 0x1000;
const IFF_VNET_HDR: i16 = 0x4000;
// _IOW('T', 202, int), _IOW('T', 216, int), _IOW('T', 208, unsigned int)
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
pub const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const SIOCGIFFLAGS: libc::c_ulong = 0x8913;
const SIOCSIFFLAGS: libc::c_ulong = 0x8914;
const IFF_UP: i16 = 0x1;

/// Receive offloads (TUNSETOFFLOAD): what the tap may hand us.
pub const TUN_F_CSUM: u32 = 0x01;
pub const TUN_F_TSO4: u32 = 0x02;
pub const TUN_F_TSO6: u32 = 0x04;
pub const TUN_F_TSO_ECN: u32 = 0x08;
pub const TUN_F_UFO: u32 = 0x10;

/// The virtio-net header with VIRTIO_F_VERSION_1 (num_buffers included).
pub const VNET_HDR_LEN: usize = 12;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: i16,
    _pad: [u8; 22],
}

#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error("tap name '{0}' is not an interface name: {1}")]
    Name(String, &'static str),
    #[error("cannot open /dev/net/tun: {0}")]
    Open(std::io::Error),
    #[error("cannot set up tap {name}: {what}")]
    Ioctl { name: String, what: &'static str, source: std::io::Error },
}

/// Whether `name` can be an interface name, and which rule it breaks if not.
pub fn check_name(name: &str) -> Result<(), TapError> {
    let bad = match name {
        "" => Some("it is empty"),
        n if n.len() >= libc::IFNAMSIZ => Some("it is longer than 15 bytes"),
        n if n.contains(['/', ' ', ':']) || n == "." || n == ".." => {
            Some("it holds '/', ':' or a space, or is . or ..")
        }
        _ => None,
    };
    match bad {
        Some(why) => Err(TapError::Name(name.into(), why)),
        None => Ok(()),
    }
}

pub struct Tap {
    file: File,
    name: String,
}

impl Tap {
    /// Opens tap `name` (the kernel creates it if it does not exist), non-blocking, with
    /// a 12-byte virtio-net header and no offloads.
    pub fn open(name: &str) -> Result<Tap, TapError> {
        check_name(name)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(TapError::Open)?;
        let mut req = IfReq { name: [0; libc::IFNAMSIZ], flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR, _pad: [0; 22] };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        let ioctl = |what, request, arg: *const libc::c_void| {
            // SAFETY: `file` is a tun fd; each request gets the argument type the tun driver
            // expects, and the return value is checked.
            let ret = unsafe { libc::ioctl(file.as_raw_fd(), request as _, arg) };
            if ret < 0 {
                Err(TapError::Ioctl { name: name.into(), what, source: std::io::Error::last_os_error() })
            } else {
                Ok(())
            }
        };
        ioctl("TUNSETIFF", TUNSETIFF, (&req as *const IfReq).cast())?;
        let hdr_len = VNET_HDR_LEN as libc::c_int;
        ioctl("TUNSETVNETHDRSZ", TUNSETVNETHDRSZ, (&hdr_len as *const libc::c_int).cast())?;
        ioctl("TUNSETOFFLOAD", TUNSETOFFLOAD, std::ptr::null())?;
        let end = req.name.iter().position(|&b| b == 0).unwrap_or(req.name.len());
        let tap = Tap { file, name: String::from_utf8_lossy(&req.name[..end]).into_owned() };
        tap.set_up(&req)?;
        Ok(tap)
    }

    /// Brings the interface up (a tap that is down refuses every frame).
    fn set_up(&self, req: &IfReq) -> Result<(), TapError> {
        let err = |what| TapError::Ioctl { name: self.name.clone(), what, source: std::io::Error::last_os_error() };
        // SAFETY: a plain socket() call; the fd is owned below.
        let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if sock < 0 {
            return Err(err("socket"));
        }
        // SAFETY: `sock` is a fresh fd that nothing else owns.
        let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(sock) };
        let mut flags = IfReq { name: req.name, flags: 0, _pad: [0; 22] };
        // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS take a struct ifreq, which IfReq lays out.
        if unsafe { libc::ioctl(sock.as_raw_fd(), SIOCGIFFLAGS as _, &mut flags as *mut IfReq) } < 0 {
            return Err(err("SIOCGIFFLAGS"));
        }
        // A tap made beforehand and already up needs no privilege at all.
        if flags.flags & IFF_UP != 0 {
            return Ok(());
        }
        flags.flags |= IFF_UP;
        // SAFETY: as above.
        if unsafe { libc::ioctl(sock.as_raw_fd(), SIOCSIFFLAGS as _, &flags as *const IfReq) } < 0 {
            return Err(err("SIOCSIFFLAGS: bringing it up needs CAP_NET_ADMIN, or run `ip link set <tap> up` first"));
        }
        Ok(())
    }

    /// A stand-in tap on any frame-preserving descriptor (a datagram socket), for the
    /// fuzz targets: frames read from it and written to it exactly as from a tap.
    #[doc(hidden)]
    pub fn from_file(file: File, name: &str) -> Tap {
        Tap { file, name: name.into() }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Lets the tap hand us frames with the receive offloads `flags` (TUN_F_*).
    pub fn set_offloads(&self, flags: u32) -> std::io::Result<()> {
        // SAFETY: TUNSETOFFLOAD takes its flags by value; the return value is checked.
        let ret = unsafe { libc::ioctl(self.file.as_raw_fd(), TUNSETOFFLOAD as _, libc::c_ulong::from(flags)) };
        if ret < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// The most of the receive offloads this tap's kernel accepts (tried from all to
    /// checksums only); the tap is left with none until a driver negotiates them.
    pub fn supported_offloads(&self) -> u32 {
        let all = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;
        let found = [all | TUN_F_UFO, all, TUN_F_CSUM].into_iter().find(|&f| self.set_offloads(f).is_ok());
        let _ = self.set_offloads(0);
        found.unwrap_or(0)
    }

    /// One frame read straight into `iov` (guest memory); its length, header included.
    pub fn read_frame_into(&self, iov: &[libc::iovec]) -> std::io::Result<usize> {
        // SAFETY: the caller's iovecs point into guest memory it keeps mapped for the call;
        // the kernel writes at most their lengths.
        let n = unsafe { libc::readv(self.file.as_raw_fd(), iov.as_ptr(), iov.len() as libc::c_int) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// One frame (virtio-net header first) from several buffers; `WouldBlock` when the
    /// tap's queue is full.
    pub fn write_frame(&self, parts: &[IoSlice]) -> std::io::Result<usize> {
        (&self.file).write_vectored(parts)
    }

    /// One frame (virtio-net header first); `WouldBlock` when none is waiting.
    pub fn read_frame(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        (&self.file).read(buf)
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}
