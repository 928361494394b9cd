//! The event queue. Its one event, TRANSPORT_RESET, goes to a guest restored from a
//! snapshot: its connections lived in the VMM that took it, so the guest resets them all
//! and reads its CID again; new connections work at once.

use super::{Muxer, EVT};
use crate::virtio::chain;
use virtio_queue::QueueT;

/// virtio_vsock_event.id for a transport reset (virtio 1.2, 5.10.6.5).
const TRANSPORT_RESET: u32 = 0;

impl Muxer {
    /// Puts a pending TRANSPORT_RESET in the guest's next event buffer; while it posts
    /// none, the reset waits (its kick of the event queue brings it here again).
    pub(super) fn send_transport_reset(&mut self) {
        if !self.transport_reset || self.broken || !self.queues[EVT].ready() {
            return;
        }
        let Some(chain) = self.queues[EVT].pop_descriptor_chain(&self.mem) else { return };
        let head = chain.head_index();
        let len = match chain::segments(chain, &self.mem, true, usize::MAX, &mut self.segs) {
            Ok(_) => chain::scatter(&self.mem, &self.segs, &TRANSPORT_RESET.to_le_bytes()),
            Err(_) => 0,
        };
        if self.queues[EVT].add_used(&self.mem, head, len as u32).is_err() {
            return self.fail("cannot write the event used ring");
        }
        self.used[EVT] = true;
        // A buffer too small for the event took it all the same: the driver's to post better.
        self.transport_reset = false;
        tracing::info!("virtio-vsock: TRANSPORT_RESET sent (restored from a snapshot)");
    }
}
