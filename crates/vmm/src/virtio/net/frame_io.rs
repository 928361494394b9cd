//! The device's side of frames: the tap, the scratch buffers, and MMDS for a NIC that
//! has it (frames to its address never reach the tap; its answers come before the tap's).

use super::header::{complete_checksum, VnetHdr, GSO_NONE, NEEDS_CSUM};
use super::stats::NetStats;
use super::{TxMode, COPY_BELOW, MAX_FRAME, MAX_IOVECS};
use crate::guest_memory::GuestMemoryMmap;
use crate::net::mmds::{self, MmdsStack};
use crate::net::tap::{Tap, VNET_HDR_LEN};
use crate::virtio::chain::{self, ChainError, Segment};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The tap and the scratch space frames pass through (apart from the queues, so a chain
/// that borrows guest memory can be handed to it).
pub(super) struct FrameIo {
    pub tap: Arc<Tap>,
    tx_mode: TxMode,
    pub stats: Arc<NetStats>,
    pub segs: Vec<Segment>,
    /// Where the copy path gathers a TX chain.
    tx_buf: Vec<u8>,
    pub mmds: Option<MmdsStack>,
    /// The features the driver negotiated (which headers it may send).
    pub features: u64,
}

impl FrameIo {
    pub fn new(tap: Arc<Tap>, tx_mode: TxMode, stats: Arc<NetStats>, mmds: Option<MmdsStack>, features: u64) -> Self {
        let segs = Vec::with_capacity(super::QUEUE_SIZE as usize);
        FrameIo { tap, tx_mode, stats, segs, tx_buf: vec![0; MAX_FRAME], mmds, features }
    }

    /// Whether MMDS has answers waiting for RX buffers.
    pub fn mmds_pending(&self) -> bool {
        self.mmds.as_ref().is_some_and(MmdsStack::has_frames)
    }

    /// Hands a TX frame to MMDS if it is for MMDS; true if it was taken.
    fn detour(&mut self, mem: &GuestMemoryMmap, len: usize, header: &VnetHdr) -> bool {
        let Some(stack) = self.mmds.as_mut() else { return false };
        let mut head = [0u8; VNET_HDR_LEN + 42];
        let n = chain::gather(mem, &self.segs, &mut head);
        if n <= VNET_HDR_LEN || !mmds::wants(stack.ip(), &head[VNET_HDR_LEN..n]) {
            return false;
        }
        // Requests are small: a segmentation-offloaded frame to MMDS is not one (dropped).
        if header.gso_type == GSO_NONE {
            let n = chain::gather(mem, &self.segs, &mut self.tx_buf[..len]);
            let frame = &mut self.tx_buf[VNET_HDR_LEN..n];
            let (start, offset) = (usize::from(header.csum_start), usize::from(header.csum_offset));
            if header.flags & NEEDS_CSUM == 0 || complete_checksum(frame, start, offset) {
                stack.receive(frame);
            }
        }
        self.stats.mmds.store(stack.counters);
        true
    }

    /// The frame's virtio-net header, if the tap may be handed it (header.rs); a refused
    /// one is counted and logged once.
    fn header(&self, mem: &GuestMemoryMmap, len: usize) -> Option<VnetHdr> {
        let mut raw = [0u8; 10];
        chain::gather(mem, &self.segs, &mut raw);
        let header = VnetHdr::parse(&raw);
        match header.check_tx(len - VNET_HDR_LEN, self.features) {
            Ok(()) => Some(header),
            Err(e) => {
                if self.stats.bad_headers.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!("virtio-net: dropped a frame: {e} (further ones are only counted)");
                }
                None
            }
        }
    }

    pub fn bad_chain(&self, queue: &str, e: ChainError) {
        if self.stats.bad_chains.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!("virtio-net: dropped a {queue} chain: {e} (further ones are only counted)");
        }
    }

    pub fn send(
        &mut self,
        mem: &GuestMemoryMmap,
        chain: virtio_queue::DescriptorChain<&GuestMemoryMmap>,
    ) -> Result<(), SendError> {
        let len = match chain::segments(chain, mem, false, MAX_FRAME, &mut self.segs) {
            Ok(len) if len > VNET_HDR_LEN => len,
            Ok(_) => {
                self.stats.tx_dropped.fetch_add(1, Ordering::Relaxed);
                return Err(SendError::Dropped);
            }
            Err(e) => {
                self.bad_chain("TX", e);
                self.stats.tx_dropped.fetch_add(1, Ordering::Relaxed);
                return Err(SendError::Dropped);
            }
        };
        let Some(header) = self.header(mem, len) else {
            self.stats.tx_dropped.fetch_add(1, Ordering::Relaxed);
            return Err(SendError::Dropped);
        };
        if self.detour(mem, len, &header) {
            return Ok(());
        }
        let copy = self.tx_mode == TxMode::Copy || len < COPY_BELOW || self.segs.len() > MAX_IOVECS;
        let written = if copy {
            let start = crate::stats::cycles();
            let n = chain::gather(mem, &self.segs, &mut self.tx_buf[..len]);
            self.stats.tx_copy_cycles.fetch_add(crate::stats::cycles() - start, Ordering::Relaxed);
            self.tap.write_frame(&[std::io::IoSlice::new(&self.tx_buf[..n])])
        } else {
            let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_IOVECS];
            match chain::host_iovecs(mem, &self.segs, &mut iov) {
                Some(n) => {
                    // SAFETY: the iovecs point into slices of `mem`, which stays borrowed (so
                    // mapped) for this whole call; the kernel only reads them during writev.
                    let r = unsafe { libc::writev(self.tap.as_raw_fd(), iov.as_ptr(), n as i32) };
                    if r < 0 {
                        Err(std::io::Error::last_os_error())
                    } else {
                        Ok(r as usize)
                    }
                }
                None => Err(std::io::Error::other("a TX buffer left guest memory")),
            }
        };
        match written {
            Ok(_) => {
                self.stats.tx_frames.fetch_add(1, Ordering::Relaxed);
                self.stats.tx_bytes.fetch_add((len - VNET_HDR_LEN) as u64, Ordering::Relaxed);
                if copy {
                    self.stats.tx_copied.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Err(SendError::Full),
            Err(e) => {
                if self.stats.tx_dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!("virtio-net: the tap refused a frame: {e} (further ones are only counted)");
                }
                Err(SendError::Dropped)
            }
        }
    }
}

pub(super) enum SendError {
    /// The tap's queue is full: try the same chain again later.
    Full,
    /// The chain was bad or the kernel refused it: it goes back used, unsent.
    Dropped,
}
