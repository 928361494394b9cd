//! The balloon's device thread: each queue's kick, and the statistics interval. Every
//! chain is used in the pass that takes it, but the statistics buffer, which the device
//! holds until the next interval (giving it back is the request for new statistics).

use super::discard::page_runs;
use super::stats::{self, BalloonStats};
use super::{BalloonShared, Role, HINT_CMD_DONE, HINT_CMD_STOP, PAGE_SHIFT};
use crate::guest_memory::GuestMemoryMmap;
use crate::virtio::chain::{self, Segment};
use crate::virtio::event_loop::{self, EventSource};
use crate::virtio::thread::{DeviceJob, QueuePosition};
use crate::virtio::{Activation, ActiveQueue, DeviceStatus, Interrupt};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

/// The most one inflate or deflate buffer is read: Linux sends 256 page numbers at a time.
const MAX_PFN_BUFFER: usize = 64 << 10;
/// How often the thread looks at the statistics interval the API may have changed.
const INTERVAL_CHECK: Duration = Duration::from_secs(1);
/// The log lines a driver's mistakes are worth, once each.
const WARN_PAGES: u8 = 1;
const WARN_CHAINS: u8 = 2;
const WARN_DISCARD: u8 = 4;
const WARN_STATS: u8 = 8;

struct RoleQueue {
    role: Role,
    queue: Queue,
    kick: Arc<EventFd>,
}

pub(super) struct Worker {
    queues: Vec<RoleQueue>,
    mem: GuestMemoryMmap,
    interrupt: Arc<Interrupt>,
    status: Arc<DeviceStatus>,
    shared: Arc<BalloonShared>,
    segs: Vec<Segment>,
    buf: Vec<u8>,
    /// When the statistics buffer last went back to the driver (the next goes back an
    /// interval later, the interval as the API last set it).
    last_stats: Instant,
    warned: u8,
    broken: bool,
}

impl Worker {
    pub(super) fn new(queues: Vec<(Role, ActiveQueue)>, a: Activation, shared: Arc<BalloonShared>) -> Worker {
        let queues = queues.into_iter().map(|(role, q)| RoleQueue { role, queue: q.queue, kick: q.kick }).collect();
        Worker {
            queues,
            mem: a.mem,
            interrupt: a.interrupt,
            status: a.status,
            shared,
            segs: Vec::new(),
            buf: Vec::new(),
            last_stats: Instant::now(),
            warned: 0,
            broken: false,
        }
    }

    fn warn_once(&mut self, kind: u8, what: std::fmt::Arguments) {
        if self.warned & kind == 0 {
            self.warned |= kind;
            tracing::warn!("virtio-balloon: {what} (refused; said once)");
        }
    }

    /// A queue the driver broke (its rings left guest memory): stop and ask for a reset.
    fn fail(&mut self, what: &str) {
        self.status.break_once(&mut self.broken, "virtio-balloon", what, &self.interrupt);
    }

    /// Serves every chain the driver posted on queue `index`, then rearms its kick.
    fn process(&mut self, index: usize) {
        if self.broken || !self.queues[index].queue.ready() {
            return;
        }
        let role = self.queues[index].role;
        let mut used_any = false;
        loop {
            if self.queues[index].queue.disable_notification(&self.mem).is_err() {
                return self.fail("cannot write an avail_event");
            }
            while let Some(chain) = self.queues[index].queue.pop_descriptor_chain(&self.mem) {
                let head = chain.head_index();
                let max = match role {
                    Role::Inflate | Role::Deflate => MAX_PFN_BUFFER,
                    Role::Stats => stats::MAX_BUFFER,
                    Role::Hint | Role::Report => usize::MAX,
                };
                let walked = chain::walk(chain, &self.mem, max, &mut self.segs);
                let walked = match walked {
                    Ok(_) => true,
                    Err(e) => {
                        self.shared.counters.bad_chains.fetch_add(1, Ordering::Relaxed);
                        self.warn_once(WARN_CHAINS, format_args!("{role:?} queue: {e}"));
                        false
                    }
                };
                match role {
                    Role::Inflate | Role::Deflate if walked => self.pages(role == Role::Inflate),
                    Role::Stats => {
                        // Held until the next interval (even a bad one, so the request
                        // and answer go on), not used now.
                        used_any |= self.statistics(head, walked);
                        continue;
                    }
                    Role::Report if walked => self.report(),
                    Role::Hint if walked => self.hint(),
                    _ => {}
                }
                if self.queues[index].queue.add_used(&self.mem, head, 0).is_err() {
                    return self.fail("cannot write a used ring");
                }
                used_any = true;
            }
            match crate::virtio::rearm_notifications(&mut self.queues[index].queue, &self.mem, true) {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => return self.fail(e),
            }
        }
        if used_any {
            self.interrupt(index);
        }
    }

    fn interrupt(&mut self, index: usize) {
        let q = &mut self.queues[index].queue;
        if let Err(e) =
            crate::virtio::interrupt_if_needed(q, &self.mem, &self.interrupt, index, &self.shared.counters.irqs)
        {
            self.fail(e);
        }
    }

    /// The walked chain's bytes into `buf`, if every buffer is driver-written.
    fn readable(&mut self) -> Option<usize> {
        if self.segs.iter().any(|s| s.writable) {
            self.shared.counters.bad_chains.fetch_add(1, Ordering::Relaxed);
            self.warn_once(WARN_CHAINS, format_args!("a device-writable buffer where the driver writes"));
            return None;
        }
        self.buf.resize(self.segs.iter().map(|s| s.len).sum(), 0);
        Some(chain::gather(&self.mem, &self.segs, &mut self.buf))
    }

    /// An inflate (`inflate`) or deflate buffer: little-endian 32-bit page numbers. A page
    /// outside guest RAM, given twice, or taken back though never given is refused.
    fn pages(&mut self, inflate: bool) {
        let Some(len) = self.readable() else { return };
        let counters = &self.shared.counters;
        let mut good = Vec::with_capacity(len / 4);
        let mut bad = 0u64;
        {
            let mut ballooned = crate::sync::lock(&self.shared.ballooned);
            for word in self.buf[..len].chunks_exact(4) {
                let pfn = u64::from(u32::from_le_bytes([word[0], word[1], word[2], word[3]]));
                let in_ram = self.mem.get_slice(GuestAddress(pfn << PAGE_SHIFT), 1 << PAGE_SHIFT).is_ok();
                let ok = in_ram && if inflate { ballooned.take(pfn) } else { ballooned.give(pfn) };
                match ok {
                    true => good.push(pfn),
                    false => bad += 1,
                }
            }
        }
        let (count, pages) = match inflate {
            true => (&counters.inflates, &counters.inflated_pages),
            false => (&counters.deflates, &counters.deflated_pages),
        };
        count.fetch_add(1, Ordering::Relaxed);
        pages.fetch_add(good.len() as u64, Ordering::Relaxed);
        if bad > 0 {
            counters.bad_pages.fetch_add(bad, Ordering::Relaxed);
            let what = if inflate { "inflated" } else { "deflated" };
            self.warn_once(WARN_PAGES, format_args!("{bad} page(s) {what} outside guest RAM or not in that state"));
        }
        if inflate {
            for (first, count) in page_runs(&mut good) {
                self.discard(first << PAGE_SHIFT, count << PAGE_SHIFT);
            }
        }
    }

    fn discard(&mut self, addr: u64, len: u64) -> bool {
        match crate::guest_memory::discard(&self.mem, addr, len) {
            Ok(()) => true,
            Err(e) => {
                self.shared.counters.bad_pages.fetch_add(len >> PAGE_SHIFT, Ordering::Relaxed);
                self.warn_once(WARN_DISCARD, format_args!("{e}"));
                false
            }
        }
    }

    /// A statistics buffer: read, then held (a second one returns the first). True if a
    /// chain was used (the one given back).
    fn statistics(&mut self, head: u16, walked: bool) -> bool {
        self.shared.counters.stats_updates.fetch_add(1, Ordering::Relaxed);
        if let Some(len) = walked.then(|| self.readable()).flatten() {
            let (new, unknown) = BalloonStats::parse(&self.buf[..len]);
            let counters = &self.shared.counters;
            counters.stats_update_fails.fetch_add(unknown, Ordering::Relaxed);
            let mut latest = crate::sync::lock(&self.shared.stats);
            let merged = latest.get_or_insert_with(BalloonStats::default);
            for (slot, value) in merged.values.iter_mut().zip(new.values) {
                if value.is_some() {
                    *slot = value;
                }
            }
        } else {
            self.shared.counters.stats_update_fails.fetch_add(1, Ordering::Relaxed);
        }
        let earlier = self.shared.stats_head.swap(u32::from(head), Ordering::AcqRel);
        let Ok(earlier) = u16::try_from(earlier) else { return false };
        self.warn_once(WARN_STATS, format_args!("a second statistics buffer while one was held"));
        let index = self.queue_of(Role::Stats).unwrap_or(0);
        if self.queues[index].queue.add_used(&self.mem, earlier, 0).is_err() {
            self.fail("cannot write the statistics queue's used ring");
            return false;
        }
        true
    }

    /// Free page reporting: every buffer is a range of pages the guest freed.
    fn report(&mut self) {
        for s in std::mem::take(&mut self.segs) {
            self.shared.counters.reported_ranges.fetch_add(1, Ordering::Relaxed);
            if self.page_range(s) && self.discard(s.addr, s.len as u64) {
                self.shared.counters.reported_bytes.fetch_add(s.len as u64, Ordering::Relaxed);
            }
        }
    }

    /// A free page hint: a 4-byte command id from the driver (the run it belongs to, or
    /// STOP at its end), or ranges of free pages, discarded while their run is the one
    /// the device asked for (Firecracker's rules: hints of an older run, or after the
    /// device said DONE or STOP, are ignored).
    fn hint(&mut self) {
        let mut finished = false;
        for s in std::mem::take(&mut self.segs) {
            let mut hint = crate::sync::lock(&self.shared.hint);
            if s.len == 4 && !s.writable {
                let cmd: u32 = self.mem.read_obj(GuestAddress(s.addr)).unwrap_or(HINT_CMD_STOP);
                hint.guest_cmd = Some(cmd);
                finished = cmd == HINT_CMD_STOP || cmd == HINT_CMD_DONE;
                continue;
            }
            let host = hint.host_cmd;
            if host <= HINT_CMD_DONE || hint.guest_cmd != Some(host) {
                continue;
            }
            drop(hint);
            self.shared.counters.hinted_ranges.fetch_add(1, Ordering::Relaxed);
            if self.page_range(s) && self.discard(s.addr, s.len as u64) {
                self.shared.counters.hinted_bytes.fetch_add(s.len as u64, Ordering::Relaxed);
            }
        }
        let mut hint = crate::sync::lock(&self.shared.hint);
        if finished && hint.acknowledge_on_stop && hint.host_cmd > HINT_CMD_DONE {
            hint.host_cmd = HINT_CMD_DONE;
            drop(hint);
            let mut config = [0u8; super::CONFIG_LEN];
            self.shared.config_bytes(&mut config);
            self.interrupt.config_changed(&config);
        }
    }

    /// A reported or hinted range must be whole 4 KiB pages.
    fn page_range(&mut self, s: Segment) -> bool {
        let page = 1u64 << PAGE_SHIFT;
        if s.addr.is_multiple_of(page) && (s.len as u64).is_multiple_of(page) && s.len > 0 {
            return true;
        }
        self.shared.counters.bad_pages.fetch_add(1, Ordering::Relaxed);
        self.warn_once(WARN_DISCARD, format_args!("a range {:#x}+{:#x} that is not whole pages", s.addr, s.len));
        false
    }

    /// Every queue once (the first look, and the fuzz target's).
    pub(super) fn process_all(&mut self) {
        for i in 0..self.queues.len() {
            self.process(i);
        }
    }

    /// The statistics buffer goes back now, whatever the interval.
    pub(super) fn request_statistics_now(&mut self) {
        self.request_statistics(true);
    }

    /// When the statistics buffer goes back next (never while the interval is 0).
    fn stats_due(&self) -> Instant {
        match self.shared.stats_interval_s.load(Ordering::Acquire) {
            0 => self.last_stats + Duration::from_secs(1 << 30),
            s => self.last_stats + Duration::from_secs(u64::from(s)),
        }
    }

    fn queue_of(&self, role: Role) -> Option<usize> {
        self.queues.iter().position(|q| q.role == role)
    }

    /// The statistics buffer goes back when its interval is over: the driver answers
    /// with fresh statistics in it.
    pub(super) fn request_statistics(&mut self, now: bool) {
        let Some(index) = self.queue_of(Role::Stats) else { return };
        if self.broken || (!now && Instant::now() < self.stats_due()) {
            return;
        }
        self.last_stats = Instant::now();
        let Ok(head) = u16::try_from(self.shared.stats_head.swap(u32::MAX, Ordering::AcqRel)) else { return };
        if self.queues[index].queue.add_used(&self.mem, head, 0).is_err() {
            return self.fail("cannot write the statistics queue's used ring");
        }
        self.interrupt(index);
    }
}

impl DeviceJob for Worker {
    fn run(&mut self, stop: &EventFd) {
        event_loop::run(self, stop);
    }

    fn positions(&self) -> Vec<QueuePosition> {
        self.queues.iter().map(|q| QueuePosition::of(&q.queue)).collect()
    }
}

/// Each queue's kick (its token is its index) and the statistics timer.
impl EventSource for Worker {
    const NAME: &'static str = "virtio-balloon";

    fn watch(&self, epoll: &Epoll) -> std::io::Result<()> {
        for (i, q) in self.queues.iter().enumerate() {
            epoll.ctl(ControlOperation::Add, q.kick.as_raw_fd(), EpollEvent::new(EventSet::IN, i as u64))?;
        }
        Ok(())
    }

    fn start(&mut self, _: &Epoll) {
        // Buffers may have been posted before the kicks were watched.
        self.process_all();
    }

    fn event(&mut self, _: &Epoll, event: &EpollEvent) {
        let index = event.data() as usize;
        let Some(q) = self.queues.get(index) else { return };
        if let Ok(kicks) = q.kick.read() {
            self.shared.counters.kicks.fetch_add(kicks, Ordering::Relaxed);
        }
        self.process(index);
    }

    fn timeout_ms(&mut self) -> i32 {
        if self.queue_of(Role::Stats).is_none() {
            return -1;
        }
        let left = self.stats_due().saturating_duration_since(Instant::now()).min(INTERVAL_CHECK);
        left.as_millis().max(1) as i32
    }

    fn timers(&mut self, _: &Epoll) {
        self.request_statistics(false);
    }
}
