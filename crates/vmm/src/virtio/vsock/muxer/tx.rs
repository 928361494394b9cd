//! The transmit queue: each packet from the guest acted on in order. Data packets for the
//! same stream in a row are written to its socket with one writev (up to `TX_BATCH`
//! packets, 64 iovecs), their buffers returned once it is done: a write per 4 KiB packet
//! made the socket calls the bound (see rx.rs).

use super::{Muxer, State, HEADER_LEN, TX};
use crate::virtio::chain::{self, Segment};
use crate::virtio::vsock::packet::{self, Header};
use std::io::Write;
use std::sync::atomic::Ordering;
use virtio_queue::QueueT;
use vmm_sys_util::epoll::Epoll;

/// The most data packets one writev takes, and the most segments.
const TX_BATCH: usize = 16;
const TX_SEGMENTS: usize = 64;

/// What became of a packet: acted on (its buffer goes back now), or batched.
pub(super) enum Taken {
    Done,
    Batched,
}

/// Data packets waiting for one writev to their stream.
#[derive(Default)]
pub(super) struct TxBatch {
    key: Option<super::Key>,
    heads: Vec<u16>,
    segs: Vec<Segment>,
    bytes: usize,
}

impl TxBatch {
    /// Whether a data packet for `key` (its chain in `segs`) may join the batch.
    fn fits(&self, key: super::Key, segs: &[Segment]) -> bool {
        self.key.is_none_or(|k| k == key) && self.heads.len() < TX_BATCH && self.segs.len() + segs.len() <= TX_SEGMENTS
    }

    fn add(&mut self, key: super::Key, head: u16, segs: &[Segment], len: usize) {
        self.key = Some(key);
        self.heads.push(head);
        let payload = chain::skip(segs, HEADER_LEN);
        let mut left = len;
        for s in payload {
            if left == 0 {
                break;
            }
            let n = s.len.min(left);
            self.segs.push(Segment { len: n, ..s });
            left -= n;
        }
        self.bytes += len - left;
    }

    /// Empties the batch, keeping its allocations (`heads` handed back).
    fn clear(&mut self, mut heads: Vec<u16>) {
        heads.clear();
        self.heads = heads;
        self.segs.clear();
        self.bytes = 0;
        self.key = None;
    }
}

impl Muxer {
    /// The guest's packets: each acted on and returned (data packets once their batch is
    /// written).
    pub(super) fn process_tx(&mut self, epoll: &Epoll) {
        if self.broken || !self.queues[TX].ready() {
            return;
        }
        loop {
            if self.queues[TX].disable_notification(&self.mem).is_err() {
                return self.fail("cannot write the tx queue's avail_event");
            }
            while let Some(chain) = self.queues[TX].pop_descriptor_chain(&self.mem) {
                let head = chain.head_index();
                let total = chain::segments(chain, &self.mem, false, usize::MAX, &mut self.segs);
                match total.map_err(|e| e.to_string()).and_then(|total| self.tx_packet(epoll, head, total)) {
                    Ok(Taken::Batched) => continue,
                    Ok(Taken::Done) => {}
                    Err(e) => {
                        self.stats.bad_packets.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!("virtio-vsock: a packet from the guest: {e}");
                    }
                }
                self.tx_used(head);
            }
            self.flush_tx_batch(epoll);
            match crate::virtio::rearm_notifications(&mut self.queues[TX], &self.mem, true) {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => return self.fail(e),
            }
        }
    }

    /// One packet from the guest (chain `head`), its chain's `total` bytes in `self.segs`.
    fn tx_packet(&mut self, epoll: &Epoll, head: u16, total: usize) -> Result<Taken, String> {
        let mut raw = [0u8; HEADER_LEN];
        if total < HEADER_LEN || chain::gather(&self.mem, &self.segs, &mut raw) < HEADER_LEN {
            return Err(packet::BadPacket::Short.to_string());
        }
        let h = Header::parse(&raw);
        packet::check(&h, self.guest_cid, total - HEADER_LEN).map_err(|e| e.to_string())?;
        let key = (h.dst_port, h.src_port);
        self.stats.tx_packets.fetch_add(1, Ordering::Relaxed);
        let data = h.op == packet::OP_RW && self.conns.get(&key).is_some_and(|(_, c)| c.state == State::Established);
        // Anything but data for the stream being batched is acted on after the batch is
        // written, in the order the guest sent it.
        if !(data && self.tx_batch.fits(key, &self.segs)) {
            self.flush_tx_batch(epoll);
        }
        if let Some((_, conn)) = self.conns.get_mut(&key) {
            conn.peer_credit_from(&h);
            // Every packet carries the guest's credit: a stream that stopped for it goes on.
            if conn.waiting_for_credit && conn.peer_credit() > 0 {
                conn.waiting_for_credit = false;
                // Unless the socket put it back already: a stream is in `ready` once.
                if !conn.readable {
                    conn.readable = true;
                    self.ready.push_back(key);
                }
            }
        }
        if data {
            self.tx_batch.add(key, head, &self.segs, h.len as usize);
            return Ok(Taken::Batched);
        }
        match h.op {
            packet::OP_REQUEST => self.guest_connect(epoll, key),
            packet::OP_RESPONSE => match self.conns.get_mut(&key) {
                Some((_, conn)) if conn.state == State::Connecting => {
                    conn.state = State::Established;
                    // Firecracker's answer to CONNECT: the host port, on its own line.
                    let _ = conn.stream.write_all(format!("OK {}\n", key.0).as_bytes());
                    if !conn.readable {
                        conn.readable = true;
                        self.ready.push_back(key);
                    }
                }
                _ => self.reset(epoll, key),
            },
            // Data for a stream that is not established (an established one's was batched).
            packet::OP_RW => self.reset(epoll, key),
            packet::OP_CREDIT_REQUEST => match self.conns.get_mut(&key) {
                Some((_, conn)) => {
                    // One answer however often it asks before the answer goes out.
                    self.control.reply(key, conn, super::REPLY_CREDIT_UPDATE);
                    // If that frees nothing, the next byte the socket takes will be told.
                    conn.credit_requested = true;
                }
                None => self.reset(epoll, key),
            },
            // The credit it brings was taken above.
            packet::OP_CREDIT_UPDATE if self.conns.contains_key(&key) => {}
            packet::OP_CREDIT_UPDATE => self.reset(epoll, key),
            packet::OP_SHUTDOWN => match self.conns.get_mut(&key) {
                Some((_, conn)) => {
                    let both = packet::SHUTDOWN_RCV | packet::SHUTDOWN_SEND;
                    if h.flags & both == both || conn.host_closed {
                        self.reset(epoll, key);
                    } else if h.flags & packet::SHUTDOWN_SEND != 0 {
                        conn.guest_done_sending = true;
                        conn.flush();
                    }
                }
                None => self.reset(epoll, key),
            },
            // RST: the connection is gone (if it was ever there); nothing to answer.
            _ => {
                if let Some((token, _)) = self.conns.get(&key) {
                    let token = *token;
                    self.forget(epoll, token);
                }
            }
        }
        Ok(Taken::Done)
    }

    fn tx_used(&mut self, head: u16) {
        if self.queues[TX].add_used(&self.mem, head, 0).is_err() {
            return self.fail("cannot write the tx used ring");
        }
        self.used[TX] = true;
    }

    /// Writes the batched data packets to their stream with one writev, then returns
    /// their buffers to the guest.
    pub(super) fn flush_tx_batch(&mut self, epoll: &Epoll) {
        let Some(key) = self.tx_batch.key else { return };
        let bytes = self.tx_batch.bytes;
        let written = match self.conns.get_mut(&key) {
            Some((_, conn)) => conn.write_guest_bytes(&self.mem, &self.tx_batch.segs, bytes).map(|()| {
                if conn.credit_update_due() {
                    self.control.reply(key, conn, super::REPLY_CREDIT_UPDATE);
                }
            }),
            None => Err(()),
        };
        match written {
            Ok(()) => {
                self.stats.tx_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
            }
            Err(()) => {
                self.stats.bad_packets.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("virtio-vsock: port {}: more than its credit", key.1);
                self.reset(epoll, key);
            }
        }
        let heads = std::mem::take(&mut self.tx_batch.heads);
        for &head in &heads {
            self.tx_used(head);
        }
        self.tx_batch.clear(heads);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_takes_one_streams_payloads_cut_to_their_lengths_up_to_its_bounds() {
        let chain = |addr: u64, len: usize| {
            vec![
                Segment { addr, len: HEADER_LEN, writable: false },
                Segment { addr: addr + 0x100, len, writable: false },
            ]
        };
        let mut b = TxBatch::default();
        assert!(b.fits((1, 2), &chain(0x1000, 4096)), "an empty batch takes any stream");
        b.add((1, 2), 7, &chain(0x1000, 4096), 4096);
        // A header that says less than the buffer holds: only its length is written.
        b.add((1, 2), 8, &chain(0x3000, 4096), 100);
        assert_eq!((b.bytes, b.heads.clone()), (4196, vec![7, 8]));
        assert_eq!(b.segs.iter().map(|s| (s.addr, s.len)).collect::<Vec<_>>(), [(0x1100, 4096), (0x3100, 100)]);
        assert!(!b.fits((1, 3), &chain(0x5000, 10)), "another stream waits for the flush");
        for head in 9..(9 + TX_BATCH as u16 - 2) {
            assert!(b.fits((1, 2), &chain(0x5000, 10)));
            b.add((1, 2), head, &chain(0x5000, 10), 10);
        }
        assert!(!b.fits((1, 2), &chain(0x5000, 10)), "at most {TX_BATCH} packets");
        b.clear(Vec::new());
        assert!(b.key.is_none() && b.segs.is_empty() && b.bytes == 0);
    }
}
