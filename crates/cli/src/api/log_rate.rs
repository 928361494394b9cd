//! Per-callsite log rate limits, as Firecracker v1.16 has them: each place in the code that
//! logs may write 10 lines at once and then one every 500 ms (10 per 5 s); what it says
//! beyond that is dropped and counted (`logger.rate_limited_log_count`), and its next line
//! that gets through is preceded by a warning with the count. A guest that makes one
//! device complain a million times a second thus costs the log ten lines per 5 s, and no
//! other callsite loses a line for it.
//!
//! A tracing layer rather than a macro at every call: every event of the VMM's crates
//! passes through one filter keyed by its callsite. The API server's and the command
//! line's own lines (this crate's, target `exitless::`) are the host's: one per request a
//! client made, which its client reads (the Go SDK waits for `PUT /actions -> 204`), so
//! they pass unlimited, as Firecracker's host-only paths use its `*_unrestricted` macros.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tracing::callsite::Identifier;
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// Lines dropped by the limits, for the metrics.
pub static RATE_LIMITED: AtomicU64 = AtomicU64::new(0);

/// Lines a callsite may write back to back.
pub const BURST: u32 = 10;
/// The time in which a callsite earns its burst back.
pub const REFILL: Duration = Duration::from_secs(5);

/// The target prefix of this crate's events: the API server's and the command line's.
const HOST_TARGET: &str = "exitless::";

/// One callsite's bucket: whole tokens and when the last one was earned.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: u32,
    since: Instant,
    suppressed: u64,
}

impl Bucket {
    fn new(now: Instant) -> Self {
        Bucket { tokens: BURST, since: now, suppressed: 0 }
    }

    /// Whether a line may go out now, and how many were dropped before it if so.
    fn take(&mut self, now: Instant) -> Result<u64, ()> {
        let per_token = REFILL / BURST;
        if self.tokens == BURST {
            // A full bucket earns nothing: its clock starts with the first token spent.
            self.since = now;
        } else {
            let earned = now.saturating_duration_since(self.since).as_nanos() / per_token.as_nanos();
            let earned = u32::try_from(earned).unwrap_or(u32::MAX);
            if earned > 0 {
                self.tokens = self.tokens.saturating_add(earned).min(BURST);
                // Whole periods only: the rest of the current one counts toward the next.
                self.since = if self.tokens == BURST { now } else { self.since + per_token * earned };
            }
        }
        if self.tokens == 0 {
            self.suppressed += 1;
            return Err(());
        }
        self.tokens -= 1;
        Ok(std::mem::take(&mut self.suppressed))
    }
}

/// The filter: a bucket per callsite (as many as the code has places that log).
#[derive(Default)]
pub struct PerCallsite {
    buckets: Mutex<HashMap<Identifier, Bucket>>,
}

impl<S: Subscriber> Layer<S> for PerCallsite {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        if event.metadata().target().starts_with(HOST_TARGET) {
            return true;
        }
        let now = Instant::now();
        let taken = {
            let mut buckets = exitless_vmm::sync::lock(&self.buckets);
            buckets.entry(event.metadata().callsite()).or_insert_with(|| Bucket::new(now)).take(now)
        };
        match taken {
            Ok(0) => true,
            Ok(dropped) => {
                // Its own callsite, so this warning is limited like any other line.
                tracing::warn!("{dropped} messages were suppressed due to rate limiting");
                true
            }
            Err(()) => {
                RATE_LIMITED.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callsite_gets_its_burst_then_one_line_per_period() {
        let start = Instant::now();
        let mut bucket = Bucket::new(start);
        let allowed = (0..100).filter(|_| bucket.take(start).is_ok()).count();
        assert_eq!(allowed, 10);
        // 499 ms later no token yet; at 500 ms one, and it reports the 91 dropped.
        assert!(bucket.take(start + Duration::from_millis(499)).is_err());
        assert_eq!(bucket.take(start + Duration::from_millis(500)), Ok(91));
        assert!(bucket.take(start + Duration::from_millis(600)).is_err());
        // A quiet minute earns the whole burst back, no more.
        let later = start + Duration::from_secs(60);
        assert_eq!((0..100).filter(|_| bucket.take(later).is_ok()).count(), 10);
    }

    #[test]
    fn one_flooding_callsite_leaves_the_others_alone() {
        use std::io::Write;
        use tracing_subscriber::prelude::*;
        #[derive(Clone, Default)]
        struct Lines(std::sync::Arc<Mutex<Vec<u8>>>);
        impl Write for Lines {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                exitless_vmm::sync::lock(&self.0).extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let fmt = tracing_subscriber::fmt::layer().with_writer(move || writer.clone()).with_ansi(false);
        let subscriber = tracing_subscriber::registry().with(PerCallsite::default()).with(fmt);
        let before = RATE_LIMITED.load(Ordering::Relaxed);
        tracing::subscriber::with_default(subscriber, || {
            for i in 0..1000 {
                tracing::error!(target: "exitless_vmm::virtio", "flood {i}");
            }
            tracing::error!(target: "exitless_vmm::virtio", "another place");
            for i in 0..100 {
                tracing::info!(target: "exitless::api", "request {i}");
            }
        });
        let text = String::from_utf8(exitless_vmm::sync::lock(&lines.0).clone()).unwrap();
        assert_eq!(text.matches("flood").count(), 10, "{text}");
        assert!(text.contains("another place"), "{text}");
        assert_eq!(text.matches("request").count(), 100, "the API's own lines are limited: {text}");
        assert!(RATE_LIMITED.load(Ordering::Relaxed) - before >= 990);
    }
}
