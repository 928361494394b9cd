//! Turning a guest's descriptor chain into host memory segments, distrusting all of it:
//! every buffer must lie inside guest memory (the guest's: hotpluggable memory it has not
//! plugged is refused like an address past RAM, guest_memory), the chain must end (no
//! loop, no broken table), its total length is bounded, and each buffer must point the
//! expected way.

use crate::guest_memory::GuestMemoryMmap;
use virtio_queue::DescriptorChain;
use vm_memory::{Bytes, GuestMemoryBackend};

/// One buffer of a chain, checked to lie inside guest memory. It holds the guest address,
/// not a host pointer: a host pointer is taken only where guest memory is borrowed (see
/// `host_iovecs`), so none outlives the borrow.
#[derive(Clone, Copy, Debug)]
pub struct Segment {
    pub addr: u64,
    pub len: usize,
    /// Device-writable (the guest expects data in it).
    pub writable: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("the chain does not end (a loop, more descriptors than the queue holds, or an unreadable table)")]
    Unterminated,
    #[error("a buffer at {0:#x}+{1:#x} is not inside guest memory")]
    OutsideMemory(u64, u32),
    #[error("the chain holds more than {0} bytes")]
    TooLong(usize),
    #[error("a buffer points the wrong way (device-writable in a TX chain, or the reverse)")]
    WrongDirection,
}

/// Fills `out` with the chain's buffers, all device-writable (`writable`) or all readable;
/// returns their total length.
pub fn segments(
    chain: DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    writable: bool,
    max_len: usize,
    out: &mut Vec<Segment>,
) -> Result<usize, ChainError> {
    let total = walk(chain, mem, max_len, out)?;
    if out.iter().any(|s| s.writable != writable) {
        return Err(ChainError::WrongDirection);
    }
    Ok(total)
}

/// Fills `out` with the chain's buffers in order, whichever way each points; returns
/// their total length.
pub fn walk(
    chain: DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    max_len: usize,
    out: &mut Vec<Segment>,
) -> Result<usize, ChainError> {
    out.clear();
    let (mut total, mut ended) = (0usize, false);
    for desc in chain {
        let (addr, len) = (desc.addr().0, desc.len());
        total = total.saturating_add(len as usize);
        if total > max_len {
            return Err(ChainError::TooLong(max_len));
        }
        mem.get_slice(desc.addr(), len as usize).map_err(|_| ChainError::OutsideMemory(addr, len))?;
        out.push(Segment { addr, len: len as usize, writable: desc.is_write_only() });
        ended = !desc.has_next();
    }
    if !ended {
        return Err(ChainError::Unterminated);
    }
    Ok(total)
}

/// The segments as iovecs into `mem`'s mapping, valid while `mem` is borrowed; `None` if
/// one is no longer inside guest memory or there are more than `iov` holds. For system
/// calls only: the pointers hold no pin, and a block unplugged meanwhile makes the kernel
/// fail the call (EFAULT) where a copy in the VMM would fault.
pub fn host_iovecs(mem: &GuestMemoryMmap, segs: &[Segment], iov: &mut [libc::iovec]) -> Option<usize> {
    if segs.len() > iov.len() {
        return None;
    }
    for (v, s) in iov.iter_mut().zip(segs) {
        let slice = mem.get_slice(vm_memory::GuestAddress(s.addr), s.len).ok()?;
        *v = libc::iovec { iov_base: slice.ptr_guard_mut().as_ptr().cast(), iov_len: s.len };
    }
    Some(segs.len())
}

/// The segments after the first `n` bytes.
pub fn skip(segs: &[Segment], mut n: usize) -> Vec<Segment> {
    let mut out = Vec::with_capacity(segs.len());
    for s in segs {
        if n >= s.len {
            n -= s.len;
            continue;
        }
        out.push(Segment { addr: s.addr + n as u64, len: s.len - n, writable: s.writable });
        n = 0;
    }
    out
}

/// Copies the segments' bytes into `buf`, as many as it holds; returns how many.
pub fn gather(mem: &GuestMemoryMmap, segs: &[Segment], buf: &mut [u8]) -> usize {
    let mut at = 0;
    for s in segs {
        let n = s.len.min(buf.len() - at);
        if n == 0 || mem.read_slice(&mut buf[at..at + n], vm_memory::GuestAddress(s.addr)).is_err() {
            break;
        }
        at += n;
    }
    at
}

/// Copies `data` into the segments in order; returns how much fit.
pub fn scatter(mem: &GuestMemoryMmap, segs: &[Segment], data: &[u8]) -> usize {
    let mut at = 0;
    for s in segs {
        let n = s.len.min(data.len() - at);
        if n == 0 || mem.write_slice(&data[at..at + n], vm_memory::GuestAddress(s.addr)).is_err() {
            break;
        }
        at += n;
    }
    at
}
