//! The NIC's device thread, on the shared event loop (virtio::event_loop): both queues'
//! kicks, the tap and, with MMDS, TCP's next timer; moves frames between the queues and
//! `FrameIo`.

use super::frame_io::{FrameIo, SendError};
use super::rx::Rx;
use super::{RX, TX};
use crate::guest_memory::GuestMemoryMmap;
use crate::net::tap::VNET_HDR_LEN;
use crate::poll::{PollMode, PollStats};
use crate::rate_limiter::Throttle;
use crate::virtio::event_loop::{self, EventSource};
use crate::virtio::thread::{DeviceJob, QueuePosition};
use crate::virtio::{ActivateError, Activation, ActiveQueue, Interrupt};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

const TOKEN_RX_KICK: u64 = 0;
const TOKEN_TX_KICK: u64 = 1;
const TOKEN_TAP: u64 = 2;

pub(super) struct Worker {
    pub(super) queues: Vec<Queue>,
    pub(super) kicks: Vec<Arc<EventFd>>,
    pub(super) mem: GuestMemoryMmap,
    pub(super) interrupt: Arc<Interrupt>,
    pub(super) activation_status: Arc<crate::virtio::DeviceStatus>,
    pub(super) io: FrameIo,
    pub(super) rx: Rx,
    pub(super) broken: bool,
    pub(super) poll: PollMode,
    /// False while the thread polls: the queues' notifications stay off (crate::poll).
    pub(super) kicks_wanted: bool,
    /// The tap refused a frame; TX waits for its EPOLLOUT.
    pub(super) tx_blocked: bool,
    /// The RX and TX rate limits (crate::rate_limiter).
    pub(super) throttles: [Throttle; 2],
    /// When MMDS's TCP timers next need a look.
    pub(super) mmds_due: Option<Instant>,
}

impl DeviceJob for Worker {
    fn run(&mut self, stop: &EventFd) {
        // SAFETY: pthread_self has no preconditions.
        self.io.stats.thread.store(unsafe { libc::pthread_self() } as u64, Ordering::Release);
        event_loop::run(self, stop);
    }

    fn positions(&self) -> Vec<QueuePosition> {
        self.queues.iter().map(QueuePosition::of).collect()
    }
}

/// Both queues' kicks and the tap, MMDS's TCP timers and the rate limiters' waits.
impl EventSource for Worker {
    const NAME: &'static str = "virtio-net";

    fn watch(&self, epoll: &Epoll) -> std::io::Result<()> {
        epoll.ctl(ControlOperation::Add, self.kicks[RX].as_raw_fd(), EpollEvent::new(EventSet::IN, TOKEN_RX_KICK))?;
        epoll.ctl(ControlOperation::Add, self.kicks[TX].as_raw_fd(), EpollEvent::new(EventSet::IN, TOKEN_TX_KICK))?;
        let tap_events = EventSet::IN | EventSet::OUT | EventSet::EDGE_TRIGGERED;
        epoll.ctl(ControlOperation::Add, self.io.tap.as_raw_fd(), EpollEvent::new(tap_events, TOKEN_TAP))
    }

    fn start(&mut self, _: &Epoll) {
        // Buffers may have been posted before the kicks were watched.
        self.process_tx();
        self.process_rx();
    }

    fn event(&mut self, _: &Epoll, event: &EpollEvent) {
        match event.data() {
            TOKEN_TX_KICK => {
                self.count_kicks(TX);
                self.process_tx();
            }
            TOKEN_RX_KICK => {
                self.count_kicks(RX);
                self.process_rx();
            }
            _ => {
                if event.event_set().contains(EventSet::OUT) {
                    self.tx_blocked = false;
                    self.process_tx();
                }
                if event.event_set().contains(EventSet::IN) {
                    self.process_rx();
                }
            }
        }
    }

    fn timeout_ms(&mut self) -> i32 {
        let timeout = Throttle::sooner(self.throttles[RX].timeout_ms(), self.throttles[TX].timeout_ms());
        Throttle::sooner(timeout, self.mmds_timeout_ms())
    }

    fn timers(&mut self, _: &Epoll) {
        // A queue that waited for its rate limiter's tokens goes on.
        if self.throttles[TX].expired() {
            self.process_tx();
        }
        if self.throttles[RX].expired() {
            self.process_rx();
        }
        self.mmds_timers();
    }

    fn before_sleep(&mut self, _: &Epoll, polled: bool) {
        if polled {
            self.process_tx();
            self.process_rx();
        }
    }

    fn notifications(&mut self, wanted: bool) {
        self.kicks_wanted = wanted;
    }

    /// The TX ring (its kicks are off while the thread polls), and RX if it ran dry.
    fn look(&mut self, _: &Epoll) -> bool {
        let before = self.io.stats.snapshot();
        self.process_tx();
        if self.rx.starved {
            self.process_rx();
        }
        let after = self.io.stats.snapshot();
        (after.tx_frames, after.tx_dropped, after.rx_frames, after.rx_dropped, after.bad_chains)
            != (before.tx_frames, before.tx_dropped, before.rx_frames, before.rx_dropped, before.bad_chains)
    }

    fn poll_mode(&self) -> PollMode {
        self.poll
    }

    fn poll_stats(&self) -> Option<Arc<dyn AsRef<PollStats> + Send + Sync>> {
        Some(self.io.stats.clone())
    }
}

impl Worker {
    pub fn process_rx(&mut self) {
        if self.broken || !self.queues[RX].ready() {
            return;
        }
        let (queue, throttle) = (&mut self.queues[RX], &mut self.throttles[RX]);
        match self.rx.process(queue, &self.mem, &mut self.io, throttle, self.kicks_wanted) {
            Ok(true) => self.interrupt_if_needed(RX),
            Ok(false) => {}
            Err(e) => self.fail(&e),
        }
    }

    pub fn new(io: FrameIo, queues: Vec<ActiveQueue>, a: Activation) -> Result<Self, ActivateError> {
        if queues.len() != 2 {
            return Err(ActivateError::QueueCount { want: 2, have: queues.len() });
        }
        let (queues, kicks) = queues.into_iter().map(|q| (q.queue, q.kick)).unzip();
        Ok(Worker {
            queues,
            kicks,
            mem: a.mem,
            interrupt: a.interrupt,
            activation_status: a.status,
            io,
            rx: Rx::default(),
            broken: false,
            poll: PollMode::Off,
            kicks_wanted: true,
            tx_blocked: false,
            throttles: Default::default(),
            mmds_due: None,
        })
    }

    fn count_kicks(&self, queue: usize) {
        if let Ok(n) = self.kicks[queue].read() {
            self.io.stats.kicks.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// A queue the driver broke (its rings left guest memory): stop and ask for a reset.
    pub(super) fn fail(&mut self, what: &str) {
        self.activation_status.break_once(&mut self.broken, "virtio-net", what, &self.interrupt);
    }

    pub(super) fn interrupt_if_needed(&mut self, queue: usize) {
        let irqs = &self.io.stats.irqs;
        if let Err(e) =
            crate::virtio::interrupt_if_needed(&mut self.queues[queue], &self.mem, &self.interrupt, queue, irqs)
        {
            self.fail(e);
        }
    }

    pub fn process_tx(&mut self) {
        // Blocked: the tap's EPOLLOUT says when it takes frames again; trying before that
        // would gather (on the copy path, copy) a chain only to have it refused.
        if self.broken || self.tx_blocked || !self.queues[TX].ready() {
            return;
        }
        let mut used_any = false;
        loop {
            if self.queues[TX].disable_notification(&self.mem).is_err() {
                return self.fail("cannot write the TX queue's avail_event");
            }
            while let Some(chain) = self.queues[TX].pop_descriptor_chain(&self.mem) {
                let head = chain.head_index();
                let frame_len =
                    || chain.clone().map(|d| u64::from(d.len())).sum::<u64>().saturating_sub(VNET_HDR_LEN as u64);
                if !self.throttles[TX].admit(1, frame_len, &self.io.stats.tx_throttled) {
                    // Back on the avail ring until its tokens are back.
                    self.queues[TX].go_to_previous_position();
                    if used_any {
                        self.interrupt_if_needed(TX);
                    }
                    return;
                }
                match self.io.send(&self.mem, chain) {
                    Ok(()) => {}
                    Err(SendError::Full) => {
                        // The kernel did not take it: back on the avail ring, wait for EPOLLOUT.
                        self.queues[TX].go_to_previous_position();
                        self.tx_blocked = true;
                        if used_any {
                            self.interrupt_if_needed(TX);
                        }
                        return;
                    }
                    Err(SendError::Dropped) => {}
                }
                if self.queues[TX].add_used(&self.mem, head, 0).is_err() {
                    return self.fail("cannot write the TX used ring");
                }
                used_any = true;
            }
            match crate::virtio::rearm_notifications(&mut self.queues[TX], &self.mem, self.kicks_wanted) {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => return self.fail(&format!("TX queue: {e}")),
            }
        }
        if used_any {
            self.interrupt_if_needed(TX);
        }
        // What MMDS answered goes out now, ahead of the tap's frames.
        if self.io.mmds_pending() {
            self.process_rx();
        }
    }

    /// Milliseconds until MMDS's TCP timers are due; -1 (none) without MMDS or connections.
    fn mmds_timeout_ms(&mut self) -> i32 {
        let next = self.io.mmds.as_mut().and_then(|m| m.next_timer());
        self.mmds_due = next.map(|d| Instant::now() + d);
        next.map_or(-1, |d| d.as_millis().clamp(1, i32::MAX as u128) as i32)
    }

    /// Runs MMDS's TCP timers if they are due, and sends what they produced.
    fn mmds_timers(&mut self) {
        if self.mmds_due.is_some_and(|due| Instant::now() >= due) {
            self.mmds_due = None;
            if let Some(m) = self.io.mmds.as_mut() {
                m.poll_timers();
            }
            self.process_rx();
        }
    }
}
