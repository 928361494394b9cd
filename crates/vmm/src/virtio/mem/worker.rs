//! The device thread: each request the driver posts (a 24-byte request, then room for the
//! 10-byte response) answered in one pass, its change applied to the host before the
//! answer (a plugged slot is mapped before the driver touches it; an unplugged one is
//! removed and discarded before the driver may plug it again).

use super::blocks::{Change, Refusal};
use super::{MemShared, MemStats};
use crate::guest_memory::GuestMemoryMmap;
use crate::rate_limiter::{LimiterSlot, Limits, Throttle};
use crate::virtio::chain::{self, Segment};
use crate::virtio::event_loop;
use crate::virtio::{Activation, ActiveQueue, Interrupt};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

const REQ_PLUG: u16 = 0;
const REQ_UNPLUG: u16 = 1;
const REQ_UNPLUG_ALL: u16 = 2;
const REQ_STATE: u16 = 3;
const RESP_ACK: u16 = 0;
const RESP_NACK: u16 = 1;
const RESP_ERROR: u16 = 3;
const REQUEST_LEN: usize = 24;
const RESPONSE_LEN: usize = 10;

/// One pass over a queue the fuzzer set up, with a device of its own over `a.mem`'s
/// hotpluggable region at 32 KiB (32 KiB of it: slots of 16 KiB, blocks of 4 KiB, no KVM)
/// and `requested` bytes asked for (rounded down to blocks); what the device counted, or
/// None if `a.mem` has no such region.
pub fn process_once(q: ActiveQueue, a: Activation, requested: u64) -> Option<Arc<MemShared>> {
    let geometry = super::Geometry { start: 0x8000, size: 0x8000, block_size: 0x1000, slot_size: 0x4000 };
    super::plugs_of(&a.mem, &geometry)?;
    let shared = Arc::new(MemShared {
        blocks: std::sync::Mutex::new(super::Blocks::new(geometry)),
        stats: MemStats::default(),
        memslots: 0..2,
        sink: Arc::new(NoKvm),
    });
    let _ = shared.request(requested.min(geometry.size) / geometry.block_size * geometry.block_size);
    Worker::new(q, a, shared.clone()).process();
    Some(shared)
}

/// Memory slots nobody maps (for [`process_once`]).
struct NoKvm;

impl crate::kvm::MemslotSink for NoKvm {
    fn set_slot(&self, _: u32, _: u64, _: u64, _: u64, _: bool) -> std::io::Result<()> {
        Ok(())
    }
}

pub(super) struct Worker {
    queue: Queue,
    kick: Arc<EventFd>,
    mem: GuestMemoryMmap,
    interrupt: Arc<Interrupt>,
    status: Arc<crate::virtio::DeviceStatus>,
    shared: Arc<MemShared>,
    /// virtio-mem has no rate limiter; the event loop's queue wants one.
    throttle: Throttle,
    segs: Vec<Segment>,
    broken: bool,
    warned: bool,
}

impl Worker {
    pub(super) fn new(q: ActiveQueue, a: Activation, shared: Arc<MemShared>) -> Worker {
        Worker {
            queue: q.queue,
            kick: q.kick,
            mem: a.mem,
            interrupt: a.interrupt,
            status: a.status,
            shared,
            throttle: Throttle::new(Arc::new(LimiterSlot::new(Limits::default()))),
            segs: Vec::with_capacity(4),
            broken: false,
            warned: false,
        }
    }

    fn fail(&mut self, what: &str) {
        self.status.break_once(&mut self.broken, "virtio-mem", what, &self.interrupt);
    }

    /// Answers every request the driver posted.
    pub(super) fn process(&mut self) {
        if self.broken || !self.queue.ready() {
            return;
        }
        let mut used_any = false;
        loop {
            if self.queue.disable_notification(&self.mem).is_err() {
                return self.fail("cannot write its avail_event");
            }
            while let Some(chain) = self.queue.pop_descriptor_chain(&self.mem) {
                let head = chain.head_index();
                let written = match chain::walk(chain, &self.mem, 64, &mut self.segs).ok().and_then(|_| self.answer()) {
                    Some(written) => written,
                    None => {
                        self.stats().bad_chains.fetch_add(1, Ordering::Relaxed);
                        self.warn_once("a chain that is not a request and room for its response");
                        0
                    }
                };
                if self.queue.add_used(&self.mem, head, written).is_err() {
                    return self.fail("cannot write its used ring");
                }
                used_any = true;
            }
            match crate::virtio::rearm_notifications(&mut self.queue, &self.mem, true) {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => return self.fail(e),
            }
        }
        if used_any {
            // plugged_size and usable_region_size may have moved: the driver reads them
            // from the register page without an exit.
            self.interrupt.show_config(&self.shared.config_bytes());
            let irqs = &self.shared.stats.irqs;
            if let Err(e) = crate::virtio::interrupt_if_needed(&mut self.queue, &self.mem, &self.interrupt, 0, irqs) {
                self.fail(e);
            }
        }
    }

    fn stats(&self) -> &MemStats {
        &self.shared.stats
    }

    fn warn_once(&mut self, what: &str) {
        if !std::mem::replace(&mut self.warned, true) {
            tracing::warn!("virtio-mem: {what} (refused; said once)");
        }
    }

    /// The walked chain's request carried out and its response written; the bytes written,
    /// or None for a chain of another shape.
    fn answer(&mut self) -> Option<u32> {
        let [request, response] = self.segs.as_slice() else { return None };
        if request.writable || request.len < REQUEST_LEN || !response.writable || response.len < RESPONSE_LEN {
            return None;
        }
        let (request, response) = (request.addr, response.addr);
        let kind: u16 = self.mem.read_obj(GuestAddress(request)).ok()?;
        let addr: u64 = self.mem.read_obj(GuestAddress(request.checked_add(8)?)).ok()?;
        let count: u16 = self.mem.read_obj(GuestAddress(request.checked_add(16)?)).ok()?;
        let (answer, state) = match self.carry_out(kind, addr, count) {
            Ok(state) => (RESP_ACK, state),
            Err(refusal) => {
                self.stats().refused.fetch_add(1, Ordering::Relaxed);
                self.warn_once(&refusal.to_string());
                let not_now = matches!(refusal, Refusal::TooBig { .. } | Refusal::Host { .. });
                (if not_now { RESP_NACK } else { RESP_ERROR }, 0)
            }
        };
        let mut bytes = [0u8; RESPONSE_LEN];
        bytes[..2].copy_from_slice(&answer.to_le_bytes());
        bytes[8..].copy_from_slice(&state.to_le_bytes());
        self.mem.write_slice(&bytes, GuestAddress(response)).ok()?;
        Some(RESPONSE_LEN as u32)
    }

    /// The request applied; the state a STATE request asked for (0 for the others). A
    /// plug opens its blocks to the guest before the memory slot is mapped and the driver
    /// told; an unplug removes the slots, then closes the blocks and gives their memory
    /// back, before the driver may plug them again.
    fn carry_out(&mut self, kind: u16, addr: u64, count: u16) -> Result<u16, Refusal> {
        let shared = self.shared.clone();
        let mut blocks = crate::sync::lock(&shared.blocks);
        // The region's record, through the memory this thread holds: alive while we use it.
        let Some(plugs) = super::plugs_of(&self.mem, &blocks.geometry) else {
            return Err(Refusal::Host { blocks: count });
        };
        let change = match kind {
            REQ_STATE => {
                self.stats().state_requests.fetch_add(1, Ordering::Relaxed);
                return blocks.state(addr, count).map(|s| s as u16);
            }
            REQ_PLUG => {
                let change = blocks.plug(addr, count)?;
                if let Err(e) = shared.open(plugs, &change.range) {
                    // Not the guest's after all: the record as it was, and "not now".
                    let _ = blocks.unplug(addr, count);
                    self.stats().open_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("virtio-mem: {e}");
                    return Err(Refusal::Host { blocks: count });
                }
                change
            }
            REQ_UNPLUG => blocks.unplug(addr, count)?,
            REQ_UNPLUG_ALL => blocks.unplug_all(),
            _ => return Err(Refusal::Unknown(kind)),
        };
        let counter = match kind {
            REQ_PLUG => &self.stats().plugs,
            REQ_UNPLUG => &self.stats().unplugs,
            _ => &self.stats().unplug_alls,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let Change { range, slots } = change;
        for (slot, plugged) in slots {
            shared.map_slot(plugs, &mut blocks, slot, plugged);
        }
        if kind != REQ_PLUG {
            shared.close(plugs, &range);
        }
        Ok(0)
    }
}

impl event_loop::LimitedQueue for Worker {
    const NAME: &'static str = "virtio-mem";

    fn kick(&self) -> &EventFd {
        &self.kick
    }

    fn kicks(&self) -> &AtomicU64 {
        &self.shared.stats.kicks
    }

    fn throttle(&mut self) -> &mut Throttle {
        &mut self.throttle
    }

    fn process(&mut self) {
        Worker::process(self)
    }

    fn queue(&self) -> &Queue {
        &self.queue
    }
}
