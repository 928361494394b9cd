//! Receiving: a frame goes straight from the tap into the guest's buffers (readv on
//! guest memory, no bounce buffer). The buffers are taken first: one chain, or with
//! MRG_RXBUF as many as the largest frame (64 KiB) needs; the frame fills them
//! in order, `num_buffers` says how many, and the ones it did not need go back on the
//! avail ring. MMDS's answers come before the tap's frames, copied in the same way.
//!
//! With MRG_RXBUF and fewer buffers posted than the largest frame needs, the frame is
//! read into a held copy instead: it goes in if it fits, and otherwise waits for the
//! driver to post more (a tap read cannot be undone, and a frame read short is lost).

use super::features::VIRTIO_NET_F_MRG_RXBUF;
use super::frame_io::FrameIo;
use super::MAX_FRAME;
use crate::guest_memory::GuestMemoryMmap;
use crate::net::tap::VNET_HDR_LEN;
use crate::rate_limiter::Throttle;
use crate::virtio::chain::{self, Segment};
use std::sync::atomic::Ordering;
use virtio_queue::{Queue, QueueOwnedT, QueueT};

/// The most buffers (descriptors) one frame is read into.
const MAX_SEGMENTS: usize = 128;

enum Received {
    /// A frame of this many bytes (header excluded) went to the guest.
    Frame(usize),
    /// Something was consumed without reaching the guest (counted): look again.
    Dropped,
    /// Buffers are held but nothing waits in MMDS or the tap.
    NoFrame,
    /// No buffers: the driver must post some.
    NoBuffers,
}

/// The receive side's own state: the chains a frame may be read into, and whether the
/// queue ran dry.
#[derive(Default)]
pub(super) struct Rx {
    segs: Vec<Segment>,
    /// Each chain's head and length; their segments follow one another in `segs`.
    chains: Vec<(u16, usize)>,
    /// The queue ran out of buffers with frames perhaps waiting: a look while polling (no
    /// kicks) tries again.
    pub starved: bool,
    /// A frame (virtio-net header first) already taken from MMDS or the tap, waiting for
    /// buffers enough to hold it.
    held: Option<Vec<u8>>,
}

impl Rx {
    /// Moves frames from MMDS and the tap into `queue` while buffers, frames and the rate
    /// limit last. True when buffers were used (the driver is owed an interrupt).
    pub fn process(
        &mut self,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
        io: &mut FrameIo,
        throttle: &mut Throttle,
        kicks_wanted: bool,
    ) -> Result<bool, String> {
        let mut used_any = false;
        loop {
            if !throttle.ready(&io.stats.rx_throttled) {
                break; // its expiry calls us again
            }
            match self.receive_frame(queue, mem, io)? {
                Received::Frame(bytes) => {
                    throttle.charge(1, bytes as u64);
                    used_any = true;
                }
                Received::Dropped => used_any = true,
                Received::NoFrame => {
                    self.starved = false;
                    break;
                }
                Received::NoBuffers => {
                    self.starved = true;
                    match crate::virtio::rearm_notifications(queue, mem, kicks_wanted) {
                        Ok(true) => continue,
                        Ok(false) => break, // wait for the driver's kick, or the next look
                        Err(e) => return Err(format!("RX queue: {e}")),
                    }
                }
            }
        }
        Ok(used_any)
    }

    /// Takes buffers, then one frame into them.
    fn receive_frame(
        &mut self,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
        io: &mut FrameIo,
    ) -> Result<Received, String> {
        // With MRG_RXBUF, room for the largest frame the tap may hold (its MTU may be
        // above 1500 even for a guest without GSO); without, the one chain must do.
        let mergeable = io.features & VIRTIO_NET_F_MRG_RXBUF != 0;
        let want = if mergeable { MAX_FRAME } else { 1 };
        self.segs.clear();
        self.chains.clear();
        let (mut room, mut ring_empty) = (0, false);
        while room < want && (mergeable || self.chains.is_empty()) {
            let Some(chain) = queue.pop_descriptor_chain(mem) else {
                ring_empty = true;
                break;
            };
            let head = chain.head_index();
            match chain::segments(chain, mem, true, MAX_FRAME, &mut io.segs) {
                Ok(len) if self.segs.len() + io.segs.len() <= MAX_SEGMENTS => {
                    self.segs.extend_from_slice(&io.segs);
                    self.chains.push((head, len));
                    room += len;
                }
                // Too many pieces for one read: it starts the next frame instead.
                Ok(_) if !self.chains.is_empty() => {
                    queue.go_to_previous_position();
                    break;
                }
                Ok(_) => return used_empty(queue, mem, head).map(|()| Received::Dropped),
                Err(e) if self.chains.is_empty() => {
                    io.bad_chain("RX", e);
                    return used_empty(queue, mem, head).map(|()| Received::Dropped);
                }
                Err(_) => {
                    // Returned on its own next time, so the chains before it can go back.
                    queue.go_to_previous_position();
                    break;
                }
            }
        }
        if self.chains.is_empty() {
            return Ok(Received::NoBuffers);
        }
        let read = match self.held.take() {
            Some(frame) => Ok(frame),
            None => match io.mmds.as_mut().and_then(|m| m.pop_frame()) {
                Some(frame) => {
                    let mut with_header = vec![0u8; VNET_HDR_LEN + frame.len()];
                    with_header[VNET_HDR_LEN..].copy_from_slice(&frame);
                    Ok(with_header)
                }
                None if room >= want => return self.read_tap(queue, mem, io, room),
                None => read_tap_copy(io),
            },
        };
        let frame = match read {
            Ok(frame) if frame.len() > VNET_HDR_LEN => frame,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                rewind(queue, self.chains.len());
                return Ok(Received::NoFrame);
            }
            _ => return Ok(self.drop_frame(queue, io)),
        };
        if frame.len() > room {
            // Only more buffers posted can make room: none come without MRG_RXBUF, and
            // none fit in a ring whose every buffer is already held.
            if !mergeable || !ring_empty || self.chains.len() >= usize::from(queue.size()) {
                return Ok(self.drop_frame(queue, io));
            }
            rewind(queue, self.chains.len());
            self.held = Some(frame);
            return Ok(Received::NoBuffers);
        }
        chain::scatter(mem, &self.segs, &frame);
        self.deliver(queue, mem, io, frame.len())
    }

    /// The zero-copy read: the tap's next frame straight into the buffers taken.
    fn read_tap(
        &mut self,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
        io: &mut FrameIo,
        room: usize,
    ) -> Result<Received, String> {
        let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_SEGMENTS];
        let read = match chain::host_iovecs(mem, &self.segs, &mut iov) {
            Some(n) => io.tap.read_frame_into(&iov[..n]),
            None => Err(std::io::Error::other("an RX buffer left guest memory")),
        };
        match read {
            Ok(n) if n > VNET_HDR_LEN && n <= room => self.deliver(queue, mem, io, n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                rewind(queue, self.chains.len());
                Ok(Received::NoFrame)
            }
            // Too short, larger than the buffers (truncated), or refused by the kernel.
            _ => Ok(self.drop_frame(queue, io)),
        }
    }

    /// Gives the buffers back and counts the frame dropped.
    fn drop_frame(&mut self, queue: &mut Queue, io: &FrameIo) -> Received {
        rewind(queue, self.chains.len());
        io.stats.rx_dropped.fetch_add(1, Ordering::Relaxed);
        Received::Dropped
    }

    /// Marks the buffers an `n`-byte frame (header included) filled as used.
    fn deliver(
        &mut self,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
        io: &FrameIo,
        n: usize,
    ) -> Result<Received, String> {
        let bufs = self;
        // How many buffers the frame filled; num_buffers says so before any is used.
        let mut used = 0;
        let mut left = n;
        while left > 0 {
            left -= left.min(bufs.chains[used].1);
            used += 1;
        }
        let num_buffers = (used as u16).to_le_bytes();
        chain::scatter(mem, &chain::skip(&bufs.segs, 10), &num_buffers);
        let mut left = n;
        for &(head, len) in &bufs.chains[..used] {
            let take = left.min(len);
            left -= take;
            queue.add_used(mem, head, take as u32).map_err(|_| "cannot write the RX used ring".to_string())?;
        }
        rewind(queue, bufs.chains.len() - used);
        io.stats.rx_frames.fetch_add(1, Ordering::Relaxed);
        Ok(Received::Frame(n - VNET_HDR_LEN))
    }
}

/// The tap's next frame into a buffer of its own, for buffers too few to read into.
fn read_tap_copy(io: &FrameIo) -> std::io::Result<Vec<u8>> {
    let mut frame = vec![0u8; MAX_FRAME];
    let iov = [libc::iovec { iov_base: frame.as_mut_ptr().cast(), iov_len: frame.len() }];
    let n = io.tap.read_frame_into(&iov)?;
    frame.truncate(n.min(MAX_FRAME));
    Ok(frame)
}

/// A chain no frame can go into goes back used and empty.
fn used_empty(queue: &mut Queue, mem: &GuestMemoryMmap, head: u16) -> Result<(), String> {
    queue.add_used(mem, head, 0).map_err(|_| "cannot write the RX used ring".to_string())
}

/// Puts the last `n` chains taken back on the avail ring.
fn rewind(queue: &mut Queue, n: usize) {
    let next = queue.next_avail();
    queue.set_next_avail(next.wrapping_sub(n as u16));
}
