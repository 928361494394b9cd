//! Polling for device threads: after handling work, a device thread keeps checking its
//! sources (without sleeping) for a window of time before it goes back to epoll. A guest
//! notification that arrives meanwhile costs KVM an eventfd signal with no one to wake,
//! and the device thread no sleep and wake-up: on this host the wake-up is 40% of an
//! ioeventfd ring.
//!
//! `--poll-us off|N|adaptive`. The adaptive window follows QEMU's IOThread rule: it
//! doubles (from 2 us, up to 100 us) when polling found work or when a sleep ended within
//! the largest window (polling would have caught it), and halves when a whole window
//! passed without work, down to zero below 1 us. A busy device thread so never sleeps, and
//! an idle one stops polling after a few empty windows: it costs no CPU then.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The largest adaptive window.
pub const MAX_WINDOW: Duration = Duration::from_micros(100);
/// Where an adaptive window starts growing from.
const START_NS: u64 = 2_000;
/// Below this an adaptive window is not worth spinning for: it becomes zero.
const MIN_NS: u64 = 1_000;

/// `--poll-us`: how long a device thread polls after work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PollMode {
    /// Sleep in epoll right after the work, as without polling.
    Off,
    /// A fixed window.
    Fixed(Duration),
    /// Grow and shrink with what polling finds (the default).
    #[default]
    Adaptive,
}

impl std::str::FromStr for PollMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" | "0" => Ok(PollMode::Off),
            "adaptive" => Ok(PollMode::Adaptive),
            n => match n.parse::<u64>() {
                Ok(us) if us <= 1_000_000 => Ok(PollMode::Fixed(Duration::from_micros(us))),
                _ => Err(format!("'{s}' is not a poll window: off, adaptive, or microseconds up to 1000000")),
            },
        }
    }
}

/// What `--poll-us` takes back: off, adaptive, or the window in microseconds.
impl std::fmt::Display for PollMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PollMode::Off => f.write_str("off"),
            PollMode::Adaptive => f.write_str("adaptive"),
            PollMode::Fixed(d) => write!(f, "{}", d.as_micros()),
        }
    }
}

impl PollMode {
    /// A mode as one word, for sharing through an atomic (see [`SharedPollMode`]).
    fn encode(self) -> u64 {
        match self {
            PollMode::Off => 0,
            PollMode::Adaptive => u64::MAX,
            PollMode::Fixed(d) => (d.as_nanos() as u64).clamp(1, u64::MAX - 1),
        }
    }

    fn decode(v: u64) -> Self {
        match v {
            0 => PollMode::Off,
            u64::MAX => PollMode::Adaptive,
            ns => PollMode::Fixed(Duration::from_nanos(ns)),
        }
    }
}

/// Modes as given, each once, in order (for labs that measure several).
pub fn distinct(modes: impl IntoIterator<Item = PollMode>) -> Vec<PollMode> {
    modes.into_iter().fold(Vec::new(), |mut v, p| {
        if !v.contains(&p) {
            v.push(p);
        }
        v
    })
}

/// A mode another thread may change while the device thread runs (a lab switches it
/// between paths).
#[derive(Debug, Default)]
pub struct SharedPollMode(AtomicU64);

impl SharedPollMode {
    pub fn new(mode: PollMode) -> Self {
        SharedPollMode(AtomicU64::new(mode.encode()))
    }
    pub fn set(&self, mode: PollMode) {
        self.0.store(mode.encode(), Ordering::Relaxed);
    }
    pub fn get(&self) -> PollMode {
        PollMode::decode(self.0.load(Ordering::Relaxed))
    }
}

/// A device thread's polling, as the exit profile and `--json` report it.
#[derive(Debug, Default)]
pub struct PollStats {
    /// Polls that found work (each saved a sleep and a wake-up).
    pub found: AtomicU64,
    /// Times the thread went to sleep in epoll.
    pub sleeps: AtomicU64,
    /// Times it woke from epoll with work.
    pub wakeups: AtomicU64,
    /// CPU time spent polling without finding work, in nanoseconds.
    pub idle_poll_ns: AtomicU64,
}

/// The numbers of [`PollStats`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollCounts {
    pub polls_found_work: u64,
    pub sleeps: u64,
    pub wakeups: u64,
    pub idle_poll_us: u64,
}

impl PollStats {
    pub fn counts(&self) -> PollCounts {
        PollCounts {
            polls_found_work: self.found.load(Ordering::Relaxed),
            sleeps: self.sleeps.load(Ordering::Relaxed),
            wakeups: self.wakeups.load(Ordering::Relaxed),
            idle_poll_us: self.idle_poll_ns.load(Ordering::Relaxed) / 1000,
        }
    }
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// CPU time a thread has used so far, from its pthread CPU clock (what a device thread's
/// polling costs is read this way; clock_gettime is allowed under every filter).
///
/// # Safety
/// `thread` must not have ended (a pthread_t is a pointer on musl).
pub unsafe fn thread_cpu_time(thread: libc::pthread_t) -> Option<Duration> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: the caller guarantees a live thread; a clockid we own.
    if unsafe { libc::pthread_getcpuclockid(thread, &mut clock) } != 0 {
        return None;
    }
    // SAFETY: a zeroed timespec is valid for clock_gettime to fill.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a clock id from pthread_getcpuclockid and a live timespec.
    (unsafe { libc::clock_gettime(clock, &mut ts) } == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// One device thread's window.
#[derive(Debug, Default)]
pub struct PollWindow {
    adaptive_ns: u64,
    slept_at: Option<Instant>,
}

impl PollWindow {
    /// Polls `check` (which handles whatever work it finds and says whether there was any)
    /// until it finds work or the window passes. True: work was found, call again after
    /// handling it; false: go to sleep ([`PollWindow::sleeping`] first).
    pub fn poll(&mut self, mode: PollMode, stats: &PollStats, mut check: impl FnMut() -> bool) -> bool {
        let window = self.window_ns(mode);
        if window == 0 {
            return false;
        }
        let start = Instant::now();
        loop {
            if check() {
                PollStats::add(&stats.found, 1);
                if mode == PollMode::Adaptive {
                    self.adaptive_ns = (self.adaptive_ns * 2).min(MAX_WINDOW.as_nanos() as u64);
                }
                return true;
            }
            let spent = start.elapsed().as_nanos() as u64;
            if spent >= window {
                PollStats::add(&stats.idle_poll_ns, spent);
                if mode == PollMode::Adaptive {
                    self.adaptive_ns /= 2;
                    if self.adaptive_ns < MIN_NS {
                        self.adaptive_ns = 0;
                    }
                }
                return false;
            }
            // Yield rather than spin: on a small host the vCPU and the threads that feed
            // the device (a tap's reader, the sender) need the same cores, and a poller
            // that never lets go delays the very work it waits for. With nothing else
            // runnable, sched_yield returns at once.
            std::thread::yield_now();
        }
    }

    /// A virtio device thread's look-around after work: [`PollWindow::poll`] again and
    /// again while it finds work, until a window passes empty (true: go to sleep) or `stop`
    /// is signalled (false: end the thread).
    pub fn poll_while_working(
        &mut self,
        mode: PollMode,
        stats: &PollStats,
        stop: &vmm_sys_util::eventfd::EventFd,
        mut check: impl FnMut() -> bool,
    ) -> bool {
        while self.poll(mode, stats, &mut check) {
            if stop.read().is_ok() {
                return false;
            }
        }
        true
    }

    /// The thread goes to sleep in epoll now.
    pub fn sleeping(&mut self, stats: &PollStats) {
        PollStats::add(&stats.sleeps, 1);
        self.slept_at = Some(Instant::now());
    }

    /// The thread woke with work: a sleep shorter than the largest window is one polling
    /// would have saved, so the adaptive window grows.
    pub fn woke(&mut self, mode: PollMode, stats: &PollStats) {
        let slept = self.slept_at.take().map(|t| t.elapsed());
        self.woke_after(slept, mode, stats);
    }

    /// [`PollWindow::woke`] after a sleep of `slept` (None: it never went to sleep).
    fn woke_after(&mut self, slept: Option<Duration>, mode: PollMode, stats: &PollStats) {
        PollStats::add(&stats.wakeups, 1);
        if mode == PollMode::Adaptive && slept.is_some_and(|s| s <= MAX_WINDOW) {
            self.adaptive_ns = (self.adaptive_ns * 2).clamp(START_NS, MAX_WINDOW.as_nanos() as u64);
        }
    }

    fn window_ns(&self, mode: PollMode) -> u64 {
        match mode {
            PollMode::Off => 0,
            PollMode::Fixed(d) => d.as_nanos() as u64,
            PollMode::Adaptive => self.adaptive_ns,
        }
    }

    /// Whether the thread will poll after the work it woke for: if so, a virtio device
    /// leaves the driver's notifications off until it is about to sleep again.
    pub fn will_poll(&self, mode: PollMode) -> bool {
        self.window_ns(mode) > 0
    }

    /// The adaptive window now (for tests and reports).
    pub fn adaptive_window(&self) -> Duration {
        Duration::from_nanos(self.adaptive_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_bad_ones_say_why() {
        assert_eq!("off".parse::<PollMode>(), Ok(PollMode::Off));
        assert_eq!("adaptive".parse::<PollMode>(), Ok(PollMode::Adaptive));
        assert_eq!("50".parse::<PollMode>(), Ok(PollMode::Fixed(Duration::from_micros(50))));
        assert!("fast".parse::<PollMode>().unwrap_err().contains("off, adaptive, or microseconds"));
        assert!("99999999".parse::<PollMode>().is_err());
        for m in [PollMode::Off, PollMode::Adaptive, PollMode::Fixed(Duration::from_micros(7))] {
            assert_eq!(SharedPollMode::new(m).get(), m);
            assert_eq!(m.to_string().parse::<PollMode>(), Ok(m));
        }
    }

    #[test]
    fn the_adaptive_window_grows_with_work_and_shrinks_to_zero_when_idle() {
        let (mut w, stats) = (PollWindow::default(), PollStats::default());
        // Starts at zero: no polling before a sleep showed that work comes quickly (a
        // sleep of 10 us, given rather than timed: a preempted test would sleep longer).
        assert!(!w.poll(PollMode::Adaptive, &stats, || true));
        w.sleeping(&stats);
        w.woke_after(Some(Duration::from_micros(10)), PollMode::Adaptive, &stats);
        assert_eq!(w.adaptive_window(), Duration::from_nanos(START_NS));
        // Work found while polling doubles it, up to the bound.
        for _ in 0..10 {
            assert!(w.poll(PollMode::Adaptive, &stats, || true));
        }
        assert_eq!(w.adaptive_window(), MAX_WINDOW);
        // Empty windows halve it, to zero: an idle thread stops spinning.
        let mut empty = 0;
        while w.adaptive_window() > Duration::ZERO {
            assert!(!w.poll(PollMode::Adaptive, &stats, || false));
            empty += 1;
        }
        assert!(empty <= 8, "{empty} empty windows");
        let c = stats.counts();
        assert_eq!((c.polls_found_work, c.sleeps, c.wakeups), (10, 1, 1));
        assert!(c.idle_poll_us >= 100, "{c:?}");
        // A long sleep does not start it again.
        w.sleeping(&stats);
        std::thread::sleep(MAX_WINDOW * 3);
        w.woke(PollMode::Adaptive, &stats);
        assert_eq!(w.adaptive_window(), Duration::ZERO);
    }

    #[test]
    fn off_never_polls_and_fixed_keeps_its_window() {
        let (mut w, stats) = (PollWindow::default(), PollStats::default());
        let mut calls = 0;
        assert!(!w.poll(PollMode::Off, &stats, || {
            calls += 1;
            true
        }));
        assert_eq!(calls, 0);
        let t = Instant::now();
        assert!(!w.poll(PollMode::Fixed(Duration::from_micros(200)), &stats, || false));
        assert!(t.elapsed() >= Duration::from_micros(200));
    }
}
