//! The idle port: a guest that has nothing to do until an interrupt writes how long it
//! is willing to wait, and the vCPU sleeps here instead of spinning.
//!
//! Halting would be the usual way, but on this host code at CPL3 cannot reach a real CPL0
//! to execute `hlt`. The wait ends at the first interrupt delivered after the previous
//! wait returned (so one that fired in between is not missed), or after the timeout.

use crate::bus::BusDevice;
use crate::irq::GsiRouter;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub const IDLE_LEN: u64 = 4;
/// The longest a guest may make a vCPU sleep per write.
const MAX_WAIT: Duration = Duration::from_millis(10);

pub struct Idle {
    router: Arc<GsiRouter>,
    seen: AtomicU64,
}

impl Idle {
    pub fn new(router: Arc<GsiRouter>) -> Self {
        Idle { seen: AtomicU64::new(router.delivered_count()), router }
    }
}

impl BusDevice for Idle {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&self, offset: u64, data: &[u8]) {
        if offset != 0 || data.len() != 4 {
            return;
        }
        let us = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        let timeout = Duration::from_micros(u64::from(us)).min(MAX_WAIT);
        let now = self.router.wait_beyond(self.seen.load(Ordering::Acquire), timeout);
        self.seen.store(now, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeKvm;
    use std::time::Instant;

    #[test]
    fn a_wait_ends_at_an_interrupt_or_the_timeout() {
        let router = Arc::new(GsiRouter::new(Arc::new(FakeKvm::default())));
        let idle = Idle::new(router.clone());
        let start = Instant::now();
        idle.write(0, &5000u32.to_le_bytes());
        assert!(start.elapsed() >= Duration::from_millis(5), "no interrupt: the whole timeout");
        let huge = Instant::now();
        idle.write(0, &u32::MAX.to_le_bytes());
        assert!(huge.elapsed() < Duration::from_secs(1), "a guest cannot ask for more than 10 ms");
        // An interrupt delivered before the wait started still ends it at once.
        router.delivered();
        let quick = Instant::now();
        idle.write(0, &1_000_000u32.to_le_bytes());
        assert!(quick.elapsed() < MAX_WAIT);
        idle.write(0, &[1, 2]); // wrong size: ignored, no wait
    }
}
