//! The receive queue: control packets first, in the order they arose, then one packet of
//! data per ready stream in turn.

use super::{Muxer, Read, State, HEADER_LEN, RX};
use crate::virtio::chain;
use crate::virtio::vsock::packet::{self, Header};
use std::sync::atomic::Ordering;
use virtio_queue::{QueueOwnedT, QueueT};

impl Muxer {
    /// Fills the guest's receive buffers: control packets, then data in turn.
    pub(super) fn process_rx(&mut self) {
        if self.broken || !self.queues[RX].ready() {
            return;
        }
        while !self.control.is_empty() || !self.ready.is_empty() {
            let Some(chain) = self.queues[RX].pop_descriptor_chain(&self.mem) else {
                match crate::virtio::rearm_notifications(&mut self.queues[RX], &self.mem, true) {
                    Ok(true) => continue,
                    Ok(false) => return, // the guest's next kick brings buffers
                    Err(e) => return self.fail(e),
                }
            };
            let head = chain.head_index();
            if chain::segments(chain, &self.mem, true, usize::MAX, &mut self.segs).is_err() {
                self.stats.bad_packets.fetch_add(1, Ordering::Relaxed);
                self.put_rx(head, 0);
                continue;
            }
            let written = match self.control.pop_front() {
                Some(h) => self.write_header(&h),
                None => self.rx_data(),
            };
            match written {
                Some(len) => self.put_rx(head, len),
                // Nothing to put in it after all: back on the avail ring.
                None => self.queues[RX].go_to_previous_position(),
            }
        }
    }

    fn put_rx(&mut self, head: u16, len: u32) {
        if self.queues[RX].add_used(&self.mem, head, len).is_err() {
            return self.fail("cannot write the rx used ring");
        }
        self.used[RX] = true;
        self.stats.rx_packets.fetch_add(1, Ordering::Relaxed);
    }

    /// Puts `h` at the start of the receive buffer in `self.segs` (its payload, if any, is
    /// already after it); the packet's length, or None if the buffer cannot hold a header.
    fn write_header(&self, h: &Header) -> Option<u32> {
        (chain::scatter(&self.mem, &self.segs, &h.bytes()) == HEADER_LEN).then_some(HEADER_LEN as u32 + h.len)
    }

    /// One packet of data from the next ready stream, or a SHUTDOWN for one the host
    /// closed; None once no stream has anything (the buffer goes back).
    fn rx_data(&mut self) -> Option<u32> {
        let payload = chain::skip(&self.segs, HEADER_LEN);
        while let Some(key) = self.ready.pop_front() {
            let Some((_, conn)) = self.conns.get_mut(&key) else { continue };
            if conn.state != State::Established || conn.host_closed {
                conn.readable = false;
                continue;
            }
            if conn.peer_credit() == 0 {
                // Asked for credit; the next packet that brings some puts the stream back.
                conn.readable = false;
                conn.waiting_for_credit = true;
                let h = conn.header(self.guest_cid, packet::OP_CREDIT_REQUEST, 0);
                return self.write_header(&h);
            }
            let (h, keep) = match conn.read_for_guest(&self.mem, &payload) {
                Read::Bytes(n) => {
                    self.stats.rx_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    (conn.header(self.guest_cid, packet::OP_RW, n as u32), true)
                }
                Read::WouldBlock => {
                    conn.readable = false;
                    continue;
                }
                Read::Closed => {
                    conn.host_closed = true;
                    conn.readable = false;
                    let mut h = conn.header(self.guest_cid, packet::OP_SHUTDOWN, 0);
                    h.flags = packet::SHUTDOWN_RCV | packet::SHUTDOWN_SEND;
                    (h, false)
                }
            };
            if keep {
                self.ready.push_back(key);
            }
            return self.write_header(&h);
        }
        None
    }
}
