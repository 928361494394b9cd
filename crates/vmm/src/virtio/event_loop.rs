//! The one event loop every virtio device thread runs: epoll over the device's sources and
//! the stop eventfd, the device's timers, and polling after work (crate::poll) with the
//! driver's notifications off while the thread polls. A device says what it watches and
//! what each event means ([`EventSource`]); how its thread sleeps, wakes, polls and stops
//! is written here once.

use crate::poll::{PollMode, PollStats, PollWindow};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

/// The stop eventfd's token; a device's own sources take any other.
pub const TOKEN_STOP: u64 = u64::MAX;

/// The most events one wake-up takes.
const EVENTS: usize = 32;

/// What a device's thread serves.
pub trait EventSource {
    /// The device, in log lines.
    const NAME: &'static str;
    /// Adds the device's own sources to `epoll`.
    fn watch(&self, epoll: &Epoll) -> std::io::Result<()>;
    /// The first look, before any sleep: work queued before the sources were watched.
    fn start(&mut self, epoll: &Epoll);
    /// One event epoll reported (never the stop eventfd's).
    fn event(&mut self, epoll: &Epoll, event: &EpollEvent);
    /// The longest sleep the device's timers allow, in epoll's milliseconds (-1: none).
    fn timeout_ms(&mut self) -> i32 {
        -1
    }
    /// After every wake-up: the timers that expired.
    fn timers(&mut self, _epoll: &Epoll) {}
    /// Before every sleep; `polled`: the driver's notifications were off until now, so
    /// what it queued meanwhile must be looked at.
    fn before_sleep(&mut self, _epoll: &Epoll, _polled: bool) {}
    /// The driver's notifications wanted (true) or left off while the thread polls.
    fn notifications(&mut self, _wanted: bool) {}
    /// One look at what the driver does not notify about while the thread polls; true if
    /// it found work (done here).
    fn look(&mut self, _epoll: &Epoll) -> bool {
        false
    }
    /// How long the thread polls after work.
    fn poll_mode(&self) -> PollMode {
        PollMode::Off
    }
    /// The counters of its polling, where it polls.
    fn poll_stats(&self) -> Option<Arc<dyn AsRef<PollStats> + Send + Sync>> {
        None
    }
}

/// A device of one queue, kicked through an eventfd and held to a rate limiter, that
/// serves everything posted in one pass (virtio-rng, virtio-pmem, virtio-mem): its events
/// and its thread's job written once.
pub trait LimitedQueue {
    const NAME: &'static str;
    fn kick(&self) -> &EventFd;
    /// Where the kicks are counted.
    fn kicks(&self) -> &std::sync::atomic::AtomicU64;
    fn throttle(&mut self) -> &mut crate::rate_limiter::Throttle;
    /// Serves what the driver posted, as the limiter allows.
    fn process(&mut self);
    /// The one queue, for its position while paused.
    fn queue(&self) -> &virtio_queue::Queue;
}

/// Such a device's thread runs this loop, and its one queue is its position.
impl<Q: LimitedQueue + Send + 'static> super::thread::DeviceJob for Q {
    fn run(&mut self, stop: &EventFd) {
        run(self, stop);
    }

    fn positions(&self) -> Vec<super::thread::QueuePosition> {
        vec![super::thread::QueuePosition::of(self.queue())]
    }
}

/// The kick and the rate limiter's wait; it never polls.
impl<Q: LimitedQueue> EventSource for Q {
    const NAME: &'static str = Q::NAME;

    fn watch(&self, epoll: &Epoll) -> std::io::Result<()> {
        epoll.ctl(ControlOperation::Add, self.kick().as_raw_fd(), EpollEvent::new(EventSet::IN, 0))
    }

    fn start(&mut self, _: &Epoll) {
        // Buffers may have been posted before the kick was watched.
        self.process();
    }

    fn event(&mut self, _: &Epoll, _: &EpollEvent) {
        if let Ok(kicks) = self.kick().read() {
            self.kicks().fetch_add(kicks, std::sync::atomic::Ordering::Relaxed);
        }
        self.process();
    }

    fn timeout_ms(&mut self) -> i32 {
        self.throttle().timeout_ms()
    }

    fn timers(&mut self, _: &Epoll) {
        if self.throttle().expired() {
            self.process();
        }
    }
}

/// An epoll set with `stop` and the device's sources.
pub fn epoll_for<S: EventSource>(source: &S, stop: &EventFd) -> std::io::Result<Epoll> {
    let epoll = Epoll::new()?;
    epoll.ctl(ControlOperation::Add, stop.as_raw_fd(), EpollEvent::new(EventSet::IN, TOKEN_STOP))?;
    source.watch(&epoll)?;
    Ok(epoll)
}

/// A device thread's job: its epoll set made, then [`serve`]; a set that cannot be made is
/// logged and the job ends.
pub fn run<S: EventSource>(source: &mut S, stop: &EventFd) {
    match epoll_for(source, stop) {
        Ok(epoll) => serve(source, &epoll, stop),
        Err(e) => tracing::error!("{}: cannot start its thread: {e}", S::NAME),
    }
}

/// Serves `source` until `stop` is signalled (or epoll fails, which is logged).
pub fn serve<S: EventSource>(source: &mut S, epoll: &Epoll, stop: &EventFd) {
    let mut events = [EpollEvent::default(); EVENTS];
    let (own, shared) = (PollStats::default(), source.poll_stats());
    let stats: &PollStats = shared.as_ref().map_or(&own, |s| (**s).as_ref());
    let mut window = PollWindow::default();
    let mut polled = false;
    source.start(epoll);
    loop {
        if polled {
            // Done polling: the driver must notify again.
            source.notifications(true);
        }
        source.before_sleep(epoll, std::mem::take(&mut polled));
        window.sleeping(stats);
        let n = match epoll.wait(source.timeout_ms(), &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return tracing::error!("{}: epoll failed: {e}", S::NAME),
        };
        source.timers(epoll);
        let mode = source.poll_mode();
        window.woke(mode, stats);
        if window.will_poll(mode) {
            polled = true;
            source.notifications(false);
        }
        if !dispatch(source, epoll, &events[..n]) {
            return;
        }
        // Keep looking for a while before sleeping: notifications land on eventfds no one
        // waits on, and the sources stay in epoll, so what comes after the last look wakes
        // the thread.
        let look = || {
            let n = epoll.wait(0, &mut events).unwrap_or(0);
            let stopped = !dispatch(source, epoll, &events[..n]);
            let found = source.look(epoll);
            stopped || n > 0 || found
        };
        if !window.poll_while_working(mode, stats, stop, look) {
            return;
        }
    }
}

/// Hands `events` to the device; false once the stop eventfd is among them.
fn dispatch<S: EventSource>(source: &mut S, epoll: &Epoll, events: &[EpollEvent]) -> bool {
    for event in events {
        if event.data() == TOKEN_STOP {
            return false;
        }
        source.event(epoll, event);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A device with one eventfd: counts what it was handed, polls a fixed window.
    struct Counter {
        kick: EventFd,
        events: u64,
        started: bool,
        notifications: Vec<bool>,
        stats: Arc<Stats>,
        mode: PollMode,
    }

    #[derive(Default)]
    struct Stats {
        poll: PollStats,
        looks: AtomicU64,
    }

    impl AsRef<PollStats> for Stats {
        fn as_ref(&self) -> &PollStats {
            &self.poll
        }
    }

    impl EventSource for Counter {
        const NAME: &'static str = "counter";
        fn watch(&self, epoll: &Epoll) -> std::io::Result<()> {
            epoll.ctl(ControlOperation::Add, self.kick.as_raw_fd(), EpollEvent::new(EventSet::IN, 7))
        }
        fn start(&mut self, _: &Epoll) {
            self.started = true;
        }
        fn event(&mut self, _: &Epoll, event: &EpollEvent) {
            assert_eq!(event.data(), 7);
            self.events += self.kick.read().unwrap_or(0);
        }
        fn notifications(&mut self, wanted: bool) {
            self.notifications.push(wanted);
        }
        fn look(&mut self, _: &Epoll) -> bool {
            self.stats.looks.fetch_add(1, Ordering::Relaxed);
            false
        }
        fn poll_mode(&self) -> PollMode {
            self.mode
        }
        fn poll_stats(&self) -> Option<Arc<dyn AsRef<PollStats> + Send + Sync>> {
            Some(self.stats.clone())
        }
    }

    fn counter(mode: PollMode) -> Counter {
        let kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let stats = Arc::new(Stats::default());
        Counter { kick, events: 0, started: false, notifications: Vec::new(), stats, mode }
    }

    #[test]
    fn events_reach_the_device_and_stop_ends_the_loop() {
        for mode in [PollMode::Off, PollMode::Fixed(std::time::Duration::from_micros(200))] {
            let mut device = counter(mode);
            let (kick, stop) = (device.kick.try_clone().unwrap(), EventFd::new(libc::EFD_NONBLOCK).unwrap());
            let stopper = stop.try_clone().unwrap();
            let epoll = epoll_for(&device, &stop).unwrap();
            let thread = std::thread::spawn(move || {
                for _ in 0..5 {
                    kick.write(2).unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                stopper.write(1).unwrap();
            });
            serve(&mut device, &epoll, &stop);
            thread.join().unwrap();
            assert!(device.started);
            assert_eq!(device.events, 10, "{mode:?}");
            let polls = device.stats.looks.load(Ordering::Relaxed);
            match mode {
                PollMode::Off => assert_eq!((polls, device.notifications.len()), (0, 0)),
                _ => {
                    assert!(polls > 0, "a fixed window looks after work");
                    // Off while polling, back on before each sleep.
                    assert_eq!(device.notifications.first(), Some(&false), "{:?}", device.notifications);
                    assert!(device.notifications.windows(2).all(|w| w[0] != w[1]), "{:?}", device.notifications);
                }
            }
        }
    }
}
