//! Firecracker's rate limiter for a device's I/O: a bandwidth bucket (tokens are bytes)
//! and an operations bucket (tokens are requests or frames), each optional. A bucket holds
//! `size` tokens and refills completely in `refill_time`; `one_time_burst` tokens come on
//! top, once. A guest over its budget is throttled, never failed: the device leaves the
//! request on its queue and looks again when the tokens it needs have come back
//! ([`RateLimiter::consume`] says when).
//!
//! A request larger than a bucket can ever hold is let through when the bucket is full
//! and leaves it in debt, so the long-run rate still holds. A bucket of size 0 or refill
//! time 0 limits nothing, as in Firecracker. The limits of a running device are changed
//! through its [`LimiterSlot`] (the API's PATCH).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A bucket's configuration, as the API gives it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    pub size: u64,
    pub one_time_burst: u64,
    pub refill_time: Duration,
}

impl Bucket {
    /// Whether it limits anything.
    pub fn limits(&self) -> bool {
        self.size > 0 && !self.refill_time.is_zero()
    }
}

/// A device's limits: bytes and operations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub bandwidth: Option<Bucket>,
    pub ops: Option<Bucket>,
}

impl Limits {
    /// At most `ops` operations and `bytes` bytes a second (0: no limit of that kind), in
    /// buckets holding `window` of each: the burst a full bucket allows.
    pub fn per_second(ops: u64, bytes: u64, window: Duration) -> Self {
        let bucket = |rate: u64| {
            let size = (rate as f64 * window.as_secs_f64()).ceil() as u64;
            (rate > 0).then_some(Bucket { size: size.max(1), one_time_burst: 0, refill_time: window })
        };
        Limits { ops: bucket(ops), bandwidth: bucket(bytes) }
    }

    pub fn limits(&self) -> bool {
        [self.bandwidth, self.ops].into_iter().flatten().any(|b| b.limits())
    }
}

/// One bucket's state.
#[derive(Clone, Debug)]
struct TokenBucket {
    config: Bucket,
    /// Tokens now; negative after a request larger than the bucket (a debt).
    budget: i128,
    burst: u64,
    last: Instant,
}

impl TokenBucket {
    fn new(config: Bucket, now: Instant) -> Self {
        TokenBucket { config, budget: i128::from(config.size), burst: config.one_time_burst, last: now }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_nanos();
        let refill_ns = self.config.refill_time.as_nanos().max(1);
        let size = u128::from(self.config.size);
        // Whole tokens only; the remainder of the time is kept for the next refill.
        let tokens = elapsed * size / refill_ns;
        if tokens == 0 {
            return;
        }
        let used_ns = tokens * refill_ns / size;
        self.last += Duration::from_nanos(u64::try_from(used_ns).unwrap_or(u64::MAX));
        self.budget = (self.budget + i128::try_from(tokens).unwrap_or(i128::MAX)).min(i128::from(self.config.size));
        if self.budget == i128::from(self.config.size) {
            // A full bucket stores no time.
            self.last = now;
        }
    }

    /// What must be in the bucket before `n` can be taken.
    fn needed(&self, n: u64) -> i128 {
        i128::from(n.min(self.config.size)).max(0)
    }

    /// How long after `now` until `n` can be taken (zero if it can now); the time since
    /// the last whole token counts toward the next.
    fn wait_for(&self, n: u64, now: Instant) -> Duration {
        let missing = self.needed(n) - self.budget - i128::from(self.burst.min(n));
        if missing <= 0 {
            return Duration::ZERO;
        }
        let ns = u128::try_from(missing).unwrap_or(u128::MAX) * self.config.refill_time.as_nanos()
            / u128::from(self.config.size.max(1));
        let ns = ns.saturating_sub(now.saturating_duration_since(self.last).as_nanos());
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX)).max(Duration::from_micros(1))
    }

    fn take(&mut self, n: u64) {
        let from_burst = self.burst.min(n);
        self.burst -= from_burst;
        self.budget -= i128::from(n - from_burst);
    }
}

/// The state of a device's limits.
#[derive(Clone, Debug, Default)]
pub struct RateLimiter {
    bandwidth: Option<TokenBucket>,
    ops: Option<TokenBucket>,
}

impl RateLimiter {
    pub fn new(limits: Limits) -> Self {
        let now = Instant::now();
        let bucket = |b: Option<Bucket>| b.filter(Bucket::limits).map(|b| TokenBucket::new(b, now));
        RateLimiter { bandwidth: bucket(limits.bandwidth), ops: bucket(limits.ops) }
    }

    /// Whether it limits anything (a device skips it when not).
    pub fn limits(&self) -> bool {
        self.bandwidth.is_some() || self.ops.is_some()
    }

    /// Takes `ops` operations and `bytes` bytes, or takes nothing and says how long until
    /// both buckets have enough.
    pub fn consume(&mut self, ops: u64, bytes: u64) -> Result<(), Duration> {
        self.consume_at(ops, bytes, Instant::now())
    }

    /// Takes `ops` and `bytes` whether or not the buckets hold them (they may go below
    /// zero): for work whose size is known only once it is done.
    pub fn charge(&mut self, ops: u64, bytes: u64) {
        for (bucket, n) in [(&mut self.ops, ops), (&mut self.bandwidth, bytes)] {
            if let Some(b) = bucket {
                b.take(n);
            }
        }
    }

    /// How long until `ops` and `bytes` could be taken (zero: now); takes nothing.
    fn wait(&mut self, ops: u64, bytes: u64, now: Instant) -> Duration {
        let mut wait = Duration::ZERO;
        for (bucket, n) in [(&mut self.ops, ops), (&mut self.bandwidth, bytes)] {
            if let Some(b) = bucket {
                b.refill(now);
                wait = wait.max(b.wait_for(n, now));
            }
        }
        wait
    }

    fn consume_at(&mut self, ops: u64, bytes: u64, now: Instant) -> Result<(), Duration> {
        let wait = self.wait(ops, bytes, now);
        if !wait.is_zero() {
            return Err(wait);
        }
        for (bucket, n) in [(&mut self.ops, ops), (&mut self.bandwidth, bytes)] {
            if let Some(b) = bucket {
                b.take(n);
            }
        }
        Ok(())
    }
}

/// Where a running device's limits are changed: the device keeps its own [`RateLimiter`]
/// and takes the new limits when the generation moves (one atomic load per look).
#[derive(Default)]
pub struct LimiterSlot {
    limits: Mutex<Limits>,
    generation: AtomicU64,
}

impl LimiterSlot {
    pub fn new(limits: Limits) -> Self {
        LimiterSlot { limits: Mutex::new(limits), ..Default::default() }
    }

    pub fn set(&self, limits: Limits) {
        *crate::sync::lock(&self.limits) = limits;
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    pub fn limits(&self) -> Limits {
        *crate::sync::lock(&self.limits)
    }

    /// A fresh limiter if the limits changed since `seen` (which is moved on).
    pub fn changed(&self, seen: &mut u64) -> Option<RateLimiter> {
        let generation = self.generation.load(Ordering::Acquire);
        if generation == *seen {
            return None;
        }
        *seen = generation;
        Some(RateLimiter::new(self.limits()))
    }
}

/// A device thread's side of its limits: the limiter in use, the slot updates come
/// through, and until when the queue waits. The thread asks [`Throttle::admit`] before each
/// request, sleeps no longer than [`Throttle::timeout_ms`], and looks at its queue again
/// once [`Throttle::expired`].
pub struct Throttle {
    slot: Arc<LimiterSlot>,
    seen: u64,
    limiter: RateLimiter,
    until: Option<Instant>,
}

impl Default for Throttle {
    /// No limits, and no slot anyone can change them through.
    fn default() -> Self {
        Throttle::new(Arc::default())
    }
}

impl Throttle {
    pub fn new(slot: Arc<LimiterSlot>) -> Self {
        let seen = slot.generation.load(Ordering::Acquire);
        Throttle { limiter: RateLimiter::new(slot.limits()), slot, seen, until: None }
    }

    /// Whether `ops` operations of `bytes()` bytes may go now (`bytes` is only asked for
    /// when there are limits); if not, the device waits until their tokens are back, and
    /// `throttled` counts one wait.
    pub fn admit(&mut self, ops: u64, bytes: impl FnOnce() -> u64, throttled: &AtomicU64) -> bool {
        self.gate(|limiter| limiter.consume(ops, bytes()), throttled)
    }

    /// Whether one more operation may start now (a token of each kind in the buckets);
    /// takes nothing: [`Throttle::charge`] takes what it cost once that is known.
    pub fn ready(&mut self, throttled: &AtomicU64) -> bool {
        self.gate(
            |limiter| match limiter.wait(1, 1, Instant::now()) {
                wait if wait.is_zero() => Ok(()),
                wait => Err(wait),
            },
            throttled,
        )
    }

    /// Fresh limits taken, then `try_now` asked unless a wait is still running; a refusal
    /// starts a wait and is counted in `throttled`.
    fn gate(&mut self, try_now: impl FnOnce(&mut RateLimiter) -> Result<(), Duration>, throttled: &AtomicU64) -> bool {
        if let Some(fresh) = self.slot.changed(&mut self.seen) {
            self.limiter = fresh;
            self.until = None;
        }
        if !self.limiter.limits() {
            return true;
        }
        if self.until.is_some_and(|t| Instant::now() < t) {
            return false;
        }
        match try_now(&mut self.limiter) {
            Ok(()) => true,
            Err(wait) => {
                throttled.fetch_add(1, Ordering::Relaxed);
                self.until = Some(Instant::now() + wait);
                false
            }
        }
    }

    /// Takes `ops` and `bytes` after the fact (see [`RateLimiter::charge`]).
    pub fn charge(&mut self, ops: u64, bytes: u64) {
        self.limiter.charge(ops, bytes);
    }

    /// The shorter of two waits (`timeout_ms` values; -1 is forever).
    pub fn sooner(a: i32, b: i32) -> i32 {
        match (a, b) {
            (-1, t) | (t, -1) => t,
            (a, b) => a.min(b),
        }
    }

    /// How long the thread may sleep: until the tokens are back (rounded up to a
    /// millisecond, epoll's unit), or for good (-1).
    pub fn timeout_ms(&self) -> i32 {
        self.until.map_or(-1, |t| {
            let wait = t.saturating_duration_since(Instant::now());
            i32::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
        })
    }

    /// True once, when a wait is over: the queue is to be looked at again.
    pub fn expired(&mut self) -> bool {
        match self.until {
            Some(t) if Instant::now() >= t => {
                self.until = None;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(size: u64, ms: u64) -> Option<Bucket> {
        Some(Bucket { size, one_time_burst: 0, refill_time: Duration::from_millis(ms) })
    }

    #[test]
    fn a_full_bucket_lets_its_size_through_then_refills_at_its_rate() {
        let t0 = Instant::now();
        let mut l = RateLimiter { ops: None, bandwidth: None };
        l.ops = Some(TokenBucket::new(bucket(10, 100).unwrap(), t0));
        for _ in 0..10 {
            assert_eq!(l.consume_at(1, 0, t0), Ok(()));
        }
        // Empty: one token comes back every 10 ms.
        assert_eq!(l.consume_at(1, 0, t0), Err(Duration::from_millis(10)));
        assert_eq!(l.consume_at(1, 0, t0 + Duration::from_millis(9)), Err(Duration::from_millis(1)));
        assert_eq!(l.consume_at(1, 0, t0 + Duration::from_millis(10)), Ok(()));
        // Over a second the rate holds: 100 more operations, not 101.
        let mut done = 0;
        for ms in 11..=1010 {
            while l.consume_at(1, 0, t0 + Duration::from_millis(ms)).is_ok() {
                done += 1;
            }
        }
        assert_eq!(done, 100);
    }

    #[test]
    fn both_buckets_must_have_enough_and_neither_is_taken_from_otherwise() {
        let t0 = Instant::now();
        let mut l = RateLimiter {
            ops: Some(TokenBucket::new(bucket(100, 1000).unwrap(), t0)),
            bandwidth: Some(TokenBucket::new(bucket(4096, 1000).unwrap(), t0)),
        };
        assert_eq!(l.consume_at(1, 4096, t0), Ok(()));
        assert!(l.consume_at(1, 512, t0).is_err());
        assert_eq!(l.ops.as_ref().unwrap().budget, 99, "a refused request takes no op");
    }

    #[test]
    fn a_request_larger_than_the_bucket_passes_when_full_and_leaves_a_debt() {
        let t0 = Instant::now();
        let mut l = RateLimiter { ops: None, bandwidth: Some(TokenBucket::new(bucket(1000, 1000).unwrap(), t0)) };
        assert_eq!(l.consume_at(0, 3000, t0), Ok(()));
        // 2000 tokens of debt plus 1 for the next byte: 2.001 s.
        assert_eq!(l.consume_at(0, 1, t0), Err(Duration::from_millis(2001)));
        assert_eq!(l.consume_at(0, 1, t0 + Duration::from_millis(2001)), Ok(()));
    }

    #[test]
    fn the_one_time_burst_comes_first_and_once() {
        let t0 = Instant::now();
        let config = Bucket { size: 2, one_time_burst: 3, refill_time: Duration::from_secs(1) };
        let mut l = RateLimiter { ops: Some(TokenBucket::new(config, t0)), bandwidth: None };
        for _ in 0..5 {
            assert_eq!(l.consume_at(1, 0, t0), Ok(()));
        }
        assert!(l.consume_at(1, 0, t0).is_err());
    }

    #[test]
    fn buckets_that_limit_nothing_are_dropped_and_updates_are_seen_once() {
        let off = Limits { bandwidth: Some(Bucket::default()), ops: bucket(0, 100) };
        assert!(!off.limits() && !RateLimiter::new(off).limits());
        let slot = LimiterSlot::new(Limits::default());
        let mut seen = 0;
        assert!(slot.changed(&mut seen).is_none());
        slot.set(Limits { ops: bucket(5, 100), bandwidth: None });
        assert!(slot.changed(&mut seen).is_some_and(|l| l.limits()));
        assert!(slot.changed(&mut seen).is_none());
    }

    #[test]
    fn a_throttle_waits_counts_once_and_follows_updates() {
        let slot = Arc::new(LimiterSlot::new(Limits { ops: bucket(2, 1000), bandwidth: None }));
        let mut t = Throttle::new(slot.clone());
        let throttled = AtomicU64::new(0);
        assert!(t.admit(1, || 0, &throttled) && t.admit(1, || 0, &throttled));
        assert!(!t.admit(1, || 0, &throttled) && !t.admit(1, || 0, &throttled));
        assert_eq!(throttled.load(Ordering::Relaxed), 1, "one wait, counted once");
        assert!((1..=500).contains(&t.timeout_ms()), "{}", t.timeout_ms());
        assert!(!t.expired());
        // Limits lifted while it waits: the next look goes through.
        slot.set(Limits::default());
        assert!(t.admit(1, || 1 << 30, &throttled));
        assert_eq!(t.timeout_ms(), -1);
    }
}
