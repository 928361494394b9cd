//! Packets for the guest without payload, in the order they arose, held to a bound the
//! guest cannot raise by sending. A connection's replies (REQUEST, RESPONSE,
//! CREDIT_UPDATE) are flags on it and the connection waits in the queue at most once, so
//! there are never more of those than connections; each header is made when it goes out,
//! with the credit of that moment. An RST outlives its connection (or never had one), so
//! RSTs wait as entries of their own, at most `MAX_RSTS`; one beyond is dropped.
//!
//! Why drop rather than stop taking the guest's packets until it posts receive buffers:
//! Linux's driver stops taking what it received while its own replies wait for room in
//! the transmit queue (virtio_transport_more_replies), so a device that stops the
//! transmit queue until the receive queue drains can stall a well-behaved guest for
//! good under a burst. An RST for a connection the muxer does not have carries no state:
//! the guest's next packet on it is answered again. Firecracker bounds its muxer's queue
//! at 256 and drops RSTs beyond it the same way.

use super::{Key, Muxer};
use crate::virtio::vsock::conn::Conn;
use crate::virtio::vsock::packet::{self, Header};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

/// RSTs waiting for the guest's receive buffers, at most (Firecracker's MUXER_RXQ_SIZE).
pub(super) const MAX_RSTS: usize = 256;

/// Replies a connection owes the guest (`Conn::replies`), sent in this order.
pub(super) const REPLY_REQUEST: u8 = 1;
pub(super) const REPLY_RESPONSE: u8 = 2;
pub(super) const REPLY_CREDIT_UPDATE: u8 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Item {
    /// The connection owes the replies its flags say.
    Conn(Key),
    Rst(Key),
}

#[derive(Default)]
pub(super) struct Control {
    items: VecDeque<Item>,
    rsts: usize,
    /// RSTs dropped because `MAX_RSTS` were waiting; the first is logged.
    dropped: u64,
}

impl Control {
    pub(super) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// `conn` (at `key`) owes the guest `reply`: it joins the queue unless it is there.
    pub(super) fn reply(&mut self, key: Key, conn: &mut Conn, reply: u8) {
        if conn.replies == 0 {
            self.items.push_back(Item::Conn(key));
        }
        conn.replies |= reply;
    }

    /// An RST to `key`; false if `MAX_RSTS` wait already (it is dropped).
    fn rst(&mut self, key: Key) -> bool {
        if self.rsts >= MAX_RSTS {
            self.dropped += 1;
            if self.dropped == 1 {
                tracing::warn!("virtio-vsock: the guest takes no packets; RSTs beyond {MAX_RSTS} are dropped");
            }
            return false;
        }
        self.rsts += 1;
        self.items.push_back(Item::Rst(key));
        true
    }

    /// A connection closed: the replies it owed go with it (an RST may follow instead).
    pub(super) fn forget(&mut self, key: Key, conn: &Conn) {
        if conn.replies != 0 {
            self.items.retain(|i| *i != Item::Conn(key));
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.items.len()
    }
}

impl Muxer {
    /// An RST to the guest's `key` (`key.0` the host port), or none if too many wait.
    pub(super) fn push_rst(&mut self, key: Key) {
        if !self.control.rst(key) {
            self.stats.resets_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The next control packet for the guest, if any is waiting.
    pub(super) fn next_control(&mut self) -> Option<Header> {
        loop {
            match *self.control.items.front()? {
                Item::Rst(key) => {
                    self.control.items.pop_front();
                    self.control.rsts -= 1;
                    return Some(Header::to_guest(self.guest_cid, key.0, key.1, packet::OP_RST));
                }
                Item::Conn(key) => {
                    let Some((_, conn)) = self.conns.get_mut(&key).filter(|(_, c)| c.replies != 0) else {
                        self.control.items.pop_front();
                        continue;
                    };
                    // The lowest flag first: a REQUEST or RESPONSE before any credit.
                    let reply = conn.replies & conn.replies.wrapping_neg();
                    conn.replies &= !reply;
                    if conn.replies == 0 {
                        self.control.items.pop_front();
                    }
                    let op = match reply {
                        REPLY_REQUEST => packet::OP_REQUEST,
                        REPLY_RESPONSE => packet::OP_RESPONSE,
                        _ => {
                            conn.credit_told();
                            packet::OP_CREDIT_UPDATE
                        }
                    };
                    return Some(conn.header(self.guest_cid, op, 0));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::vsock::conn::State;
    use std::os::unix::net::UnixStream;

    #[test]
    fn rsts_stop_at_the_bound_and_a_connection_waits_once() {
        let mut c = Control::default();
        for port in 0..(MAX_RSTS as u32 + 100) {
            let kept = c.rst((port, 1));
            assert_eq!(kept, (port as usize) < MAX_RSTS);
        }
        assert_eq!((c.len(), c.dropped), (MAX_RSTS, 100));
        let (a, _b) = UnixStream::pair().unwrap();
        let mut conn = Conn::new(a, 7, 8, State::Established);
        for _ in 0..1000 {
            c.reply((7, 8), &mut conn, REPLY_CREDIT_UPDATE);
        }
        c.reply((7, 8), &mut conn, REPLY_RESPONSE);
        assert_eq!(c.len(), MAX_RSTS + 1, "a connection's replies are flags, not entries");
        c.forget((7, 8), &conn);
        assert_eq!(c.len(), MAX_RSTS);
    }
}
