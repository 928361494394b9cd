//! The virtio-blk device thread: takes requests off the queue while it has a free slot,
//! starts their I/O, and puts each on the used ring when its I/O completes. A slot holds
//! one request in flight (its chain head, status byte and iovecs), so the iovecs the
//! kernel reads stay put until the request completes.

use super::disk::Disk;
use super::engine::{Completion, Engine, Op};
use super::request::{self, Kind, Parser, Range, Request, RequestError, SECTOR_SIZE};
use super::slot::DiskSlot;
use super::{BlkStats, QUEUE_SIZE, SEG_MAX};
use crate::guest_memory::GuestMemoryMmap;
use crate::poll::{PollMode, PollStats};
use crate::rate_limiter::{LimiterSlot, Throttle};
use crate::virtio::event_loop::{self, EventSource};
use crate::virtio::thread::{DeviceJob, QueuePosition};
use crate::virtio::{chain, Activation, ActiveQueue, DeviceStatus, Interrupt};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

/// What the device lends its thread while it runs; the thread hands back the engine and
/// the slots once no request is in flight.
pub(super) struct Parts {
    pub queue: ActiveQueue,
    pub activation: Activation,
    pub disk: Arc<DiskSlot>,
    pub limits: Arc<LimiterSlot>,
    pub stats: Arc<BlkStats>,
    pub engine: Engine,
    pub slots: Slots,
    pub poll: PollMode,
    /// Set while a snapshot stops the thread.
    pub pausing: Arc<AtomicBool>,
}

/// Everything a device thread owns across activations.
pub(super) struct Kept {
    pub engine: Engine,
    pub slots: Slots,
}

const TOKEN_KICK: u64 = 0;
const TOKEN_DONE: u64 = 1;

/// The request slots, made once with the device: made and freed in the device thread,
/// their 1 MiB of iovecs would make glibc shrink that thread's heap, which reads a /proc
/// file its seccomp filter forbids.
pub(super) struct Slots(Vec<Slot>);

impl Slots {
    pub fn new() -> Self {
        let empty = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };
        let slot =
            || Slot { head: 0, status: 0, used_len: 0, expect: 0, kind: Kind::In, iov: vec![empty; SEG_MAX as usize] };
        Slots((0..QUEUE_SIZE).map(|_| slot()).collect())
    }
}

// SAFETY: the iovecs' pointers are only dereferenced by the kernel while a request is in
// flight, and the slots move between threads only when none is (the device thread waits
// out every request before it hands them back).
unsafe impl Send for Slots {}

/// One request in flight.
struct Slot {
    head: u16,
    status: u64,
    /// What the used ring reports on success: bytes the device wrote, status included.
    used_len: u32,
    /// What the I/O must return to have succeeded.
    expect: i64,
    kind: Kind,
    iov: Vec<libc::iovec>,
}

pub(super) struct Worker {
    queue: Queue,
    kick: Arc<EventFd>,
    mem: GuestMemoryMmap,
    interrupt: Arc<Interrupt>,
    status: Arc<DeviceStatus>,
    /// The backing file requests go to, and the slot a swap arrives in (with the
    /// generation of the file in use).
    disk: Arc<Disk>,
    slot: Arc<DiskSlot>,
    generation: u64,
    /// The drive's rate limits (crate::rate_limiter).
    throttle: Throttle,
    stats: Arc<BlkStats>,
    engine: Engine,
    parser: Parser,
    slots: Slots,
    free: Vec<u16>,
    done: Vec<Completion>,
    used_any: bool,
    broken: bool,
    poll: PollMode,
    /// False while the thread polls: the queue's notifications stay off (crate::poll).
    kicks_wanted: bool,
    pausing: Arc<AtomicBool>,
}

impl DeviceJob for Worker {
    fn run(&mut self, stop: &EventFd) {
        // SAFETY: pthread_self has no preconditions.
        self.stats.thread.store(unsafe { libc::pthread_self() } as u64, Ordering::Release);
        event_loop::run(self, stop);
        // A snapshot wants every request it took answered in guest memory; a reset wants
        // the rings left alone.
        match self.pausing.load(Ordering::Acquire) {
            true => self.finish_in_flight(),
            false => self.drain(),
        }
    }

    fn positions(&self) -> Vec<QueuePosition> {
        vec![QueuePosition::of(&self.queue)]
    }
}

/// The kick, the I/O engine's completions and the rate limiter's wait.
impl EventSource for Worker {
    const NAME: &'static str = "virtio-blk";

    fn watch(&self, epoll: &Epoll) -> std::io::Result<()> {
        epoll.ctl(ControlOperation::Add, self.kick.as_raw_fd(), EpollEvent::new(EventSet::IN, TOKEN_KICK))?;
        let done = self.engine.eventfd();
        epoll.ctl(ControlOperation::Add, done.as_raw_fd(), EpollEvent::new(EventSet::IN, TOKEN_DONE))
    }

    fn start(&mut self, _: &Epoll) {
        // Requests may have been queued before the kick was watched (or a pause).
        self.process_queue();
    }

    fn event(&mut self, _: &Epoll, event: &EpollEvent) {
        match event.data() {
            TOKEN_KICK => {
                if let Ok(k) = self.kick.read() {
                    self.stats.kicks.fetch_add(k, Ordering::Relaxed);
                }
                self.process_queue();
            }
            _ => self.complete_finished(),
        }
    }

    fn timeout_ms(&mut self) -> i32 {
        self.throttle.timeout_ms()
    }

    fn timers(&mut self, _: &Epoll) {
        if self.throttle.expired() {
            // The tokens the waiting request needs are back.
            self.process_queue();
        }
    }

    fn before_sleep(&mut self, _: &Epoll, polled: bool) {
        if polled {
            self.process_queue();
        }
    }

    fn notifications(&mut self, wanted: bool) {
        self.kicks_wanted = wanted;
    }

    /// The kick, the queue and the finished I/O.
    fn look(&mut self, _: &Epoll) -> bool {
        let progress = |w: &Self| {
            let c = w.stats.snapshot();
            (w.free.len(), c.reads + c.writes + c.flushes + c.discards + c.errors + c.bad_requests)
        };
        let before = progress(self);
        let kicked = self.kick.read().map(|k| self.stats.kicks.fetch_add(k, Ordering::Relaxed)).is_ok();
        self.process_queue();
        self.complete_finished();
        kicked || progress(self) != before
    }

    fn poll_mode(&self) -> PollMode {
        self.poll
    }

    fn poll_stats(&self) -> Option<Arc<dyn AsRef<PollStats> + Send + Sync>> {
        Some(self.stats.clone())
    }
}

impl Worker {
    pub(super) fn new(p: Parts) -> Self {
        Worker {
            queue: p.queue.queue,
            kick: p.queue.kick,
            mem: p.activation.mem,
            interrupt: p.activation.interrupt,
            status: p.activation.status,
            generation: p.disk.generation(),
            disk: p.disk.current(),
            slot: p.disk,
            throttle: Throttle::new(p.limits),
            stats: p.stats,
            engine: p.engine,
            parser: Parser::default(),
            slots: p.slots,
            free: (0..QUEUE_SIZE).rev().collect(),
            done: Vec::with_capacity(usize::from(QUEUE_SIZE)),
            used_any: false,
            broken: false,
            poll: p.poll,
            kicks_wanted: true,
            pausing: p.pausing,
        }
    }

    /// What outlives the activation, once nothing is in flight.
    pub(super) fn into_kept(mut self) -> Kept {
        self.drain();
        Kept { engine: self.engine, slots: self.slots }
    }

    /// Waits out the requests in flight without touching the rings (the driver is
    /// resetting the device, or the VM is going away).
    fn drain(&mut self) {
        while self.engine.inflight() > 0 {
            self.engine.wait();
            self.done.clear();
            self.engine.reap(&mut self.done);
        }
    }

    /// The driver broke the queue (its rings left guest memory): stop and ask for a reset.
    fn fail(&mut self, what: &str) {
        self.status.break_once(&mut self.broken, "virtio-blk", what, &self.interrupt);
    }

    /// Whether the rate limits let `req` start now (one op, and its bytes for a transfer).
    fn admit(&mut self, req: &Request) -> bool {
        let bytes = || match req.kind {
            Kind::In | Kind::Out => req.data_len as u64,
            _ => 0,
        };
        self.throttle.admit(1, bytes, &self.stats.throttled)
    }

    /// Follows a swap of the backing file once no request is in flight on the old one;
    /// false while some still are (their completions bring the thread back here).
    fn follow_swap(&mut self) -> bool {
        let generation = self.slot.generation();
        if generation == self.generation {
            return true;
        }
        if self.engine.inflight() > 0 {
            return false;
        }
        self.disk = self.slot.current();
        self.generation = generation;
        tracing::info!("virtio-blk: now on {} ({} bytes)", self.disk.path.display(), self.disk.capacity);
        true
    }

    /// Starts every request the driver queued, while slots last.
    fn process_queue(&mut self) {
        if self.broken || !self.queue.ready() || !self.follow_swap() {
            return;
        }
        loop {
            if self.queue.disable_notification(&self.mem).is_err() {
                return self.fail("cannot write the queue's avail_event");
            }
            let mut throttled = false;
            while !self.free.is_empty() {
                let Some(chain) = self.queue.pop_descriptor_chain(&self.mem) else { break };
                let head = chain.head_index();
                match self.parser.parse(chain, &self.mem) {
                    Ok(req) if !self.admit(&req) => {
                        // Left on the queue until its tokens are back.
                        self.queue.go_to_previous_position();
                        throttled = true;
                        break;
                    }
                    Ok(req) => self.start(head, req),
                    Err(e) => self.bad_request(head, e),
                }
            }
            if self.free.is_empty() || throttled {
                // Notifications stay off: completions (or the end of the throttle) free
                // slots and bring us back here.
                break;
            }
            match crate::virtio::rearm_notifications(&mut self.queue, &self.mem, self.kicks_wanted) {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => return self.fail(&format!("queue: {e}")),
            }
        }
        self.engine.submit();
        self.interrupt_if_needed();
    }

    fn bad_request(&mut self, head: u16, e: RequestError) {
        if self.stats.bad_requests.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!("virtio-blk: a malformed request: {e} (further ones are only counted)");
        }
        match e.status(&self.parser.segs) {
            Some(status) => self.finish(head, status, request::VIRTIO_BLK_S_IOERR, 1),
            None => self.put_used(head, 0),
        }
    }

    fn start(&mut self, head: u16, req: Request) {
        use request::{VIRTIO_BLK_S_OK as OK, VIRTIO_BLK_S_UNSUPP as UNSUPP};
        match req.kind {
            Kind::In | Kind::Out => self.start_transfer(head, req),
            Kind::Flush => self.start_io(head, req, Op::Flush, 0, 1),
            Kind::GetId => {
                let n = chain::scatter(&self.mem, &self.parser.data, &self.disk.id);
                self.finish(head, req.status, OK, n as u32 + 1);
            }
            Kind::Discard | Kind::WriteZeroes => {
                let status = self.discard(req);
                self.finish(head, req.status, status, 1);
            }
            Kind::Unsupported(_) => self.finish(head, req.status, UNSUPP, 1),
        }
    }

    fn start_transfer(&mut self, head: u16, req: Request) {
        let ioerr = request::VIRTIO_BLK_S_IOERR;
        let write = req.kind == Kind::Out;
        let range = request::byte_range(req.sector, req.data_len as u64, self.disk.capacity);
        let fits = self.parser.data.len() <= SEG_MAX as usize && (req.data_len as u64).is_multiple_of(SECTOR_SIZE);
        let Some((offset, len)) = range.filter(|_| fits && !(write && self.disk.readonly)) else {
            return self.finish(head, req.status, ioerr, 1);
        };
        let (op, used_len) = if write { (Op::Write { offset }, 1) } else { (Op::Read { offset }, len as u32 + 1) };
        self.start_io(head, req, op, len as i64, used_len);
    }

    /// Takes a slot and hands the request's I/O to the engine.
    fn start_io(&mut self, head: u16, req: Request, op: Op, expect: i64, used_len: u32) {
        let Some(tag) = self.free.pop() else { return self.finish(head, req.status, request::VIRTIO_BLK_S_IOERR, 1) };
        let slot = &mut self.slots.0[usize::from(tag)];
        *slot = Slot { head, status: req.status, used_len, expect, kind: req.kind, iov: std::mem::take(&mut slot.iov) };
        let n = match op {
            Op::Flush => 0,
            _ => match chain::host_iovecs(&self.mem, &self.parser.data, &mut slot.iov) {
                Some(n) => n,
                None => {
                    self.free.push(tag);
                    return self.finish(head, req.status, request::VIRTIO_BLK_S_IOERR, 1);
                }
            },
        };
        let fd = match op {
            Op::Read { offset } | Op::Write { offset } => self.disk.fd_for(offset, &slot.iov[..n]),
            Op::Flush => self.disk.fd(),
        };
        // SAFETY: the iovecs live in the slot, untouched until its completion is reaped, and
        // point into `self.mem`, which stays mapped as long as this worker (which waits out
        // every request in flight before it returns).
        if !unsafe { self.engine.push(u64::from(tag), fd, op, slot.iov.as_ptr(), n) } {
            self.free.push(tag);
            self.finish(head, req.status, request::VIRTIO_BLK_S_IOERR, 1);
        }
    }

    fn discard(&mut self, req: Request) -> u8 {
        use request::{VIRTIO_BLK_S_IOERR as IOERR, VIRTIO_BLK_S_OK as OK, VIRTIO_BLK_S_UNSUPP as UNSUPP};
        if !self.disk.can_discard {
            return UNSUPP;
        }
        let Some(range) = Range::read(&self.mem, &self.parser.data).filter(|_| req.data_len == request::RANGE_LEN)
        else {
            return IOERR;
        };
        let unmap = match req.kind {
            Kind::Discard if range.flags == 0 => true,
            Kind::WriteZeroes if range.flags & !request::WRITE_ZEROES_FLAG_UNMAP == 0 => {
                range.flags & request::WRITE_ZEROES_FLAG_UNMAP != 0
            }
            _ => return UNSUPP,
        };
        let len = u64::from(range.sectors) * SECTOR_SIZE;
        let Some((offset, len)) = request::byte_range(range.sector, len, self.disk.capacity) else { return IOERR };
        self.stats.discards.fetch_add(1, Ordering::Relaxed);
        // Punching a hole reads back as zeroes too, so unmap serves both requests.
        match self.disk.discard(offset, len, unmap) {
            Ok(()) => OK,
            Err(_) => IOERR,
        }
    }

    /// Puts every request whose I/O has completed on the used ring, then starts what
    /// waited for a free slot.
    fn complete_finished(&mut self) {
        self.complete_reaped();
        self.process_queue();
    }

    /// For a snapshot: waits out the requests in flight and answers each, taking no more.
    fn finish_in_flight(&mut self) {
        while self.engine.inflight() > 0 {
            self.engine.wait();
            self.complete_reaped();
        }
        self.interrupt_if_needed();
    }

    /// Puts every request whose I/O has completed on the used ring.
    fn complete_reaped(&mut self) {
        let mut done = std::mem::take(&mut self.done);
        self.engine.reap(&mut done);
        for c in done.drain(..) {
            let Some(slot) = self.slots.0.get(c.tag as usize) else { continue };
            let (head, status, kind) = (slot.head, slot.status, slot.kind);
            let ok = c.result == slot.expect;
            let used_len = if ok { slot.used_len } else { 1 };
            if ok {
                self.stats.count_done(kind, c.result as u64);
            } else if self.stats.errors.load(Ordering::Relaxed) == 0 {
                tracing::warn!("virtio-blk: {kind:?} failed on {}: {}", self.disk.path.display(), c.result);
            }
            self.free.push(c.tag as u16);
            let code = if ok { request::VIRTIO_BLK_S_OK } else { request::VIRTIO_BLK_S_IOERR };
            self.finish(head, status, code, used_len);
        }
        self.done = done;
    }

    /// Writes the status byte and returns the chain to the driver.
    fn finish(&mut self, head: u16, status_addr: u64, status: u8, used_len: u32) {
        if status != request::VIRTIO_BLK_S_OK {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        // The status byte was inside guest memory when the request was parsed, and guest
        // memory does not shrink; a failure here would only mean a bug, so it is ignored.
        let _ = self.mem.write_obj(status, GuestAddress(status_addr));
        self.put_used(head, used_len);
    }

    fn put_used(&mut self, head: u16, len: u32) {
        if self.queue.add_used(&self.mem, head, len).is_err() {
            return self.fail("cannot write the used ring");
        }
        self.used_any = true;
    }

    fn interrupt_if_needed(&mut self) {
        if !std::mem::take(&mut self.used_any) {
            return;
        }
        if let Err(e) =
            crate::virtio::interrupt_if_needed(&mut self.queue, &self.mem, &self.interrupt, 0, &self.stats.irqs)
        {
            self.fail(e);
        }
    }
}
