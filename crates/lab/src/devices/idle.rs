//! The idle port: a guest that has nothing to do until an interrupt writes how long it
//! is willing to wait, and the vCPU sleeps here instead of spinning.
//!
//! Halting would be the usual way, but on this host code at CPL3 cannot reach a real CPL0
//! to execute `hlt`. The wait ends at the first interrupt delivered after the same vCPU's
//! previous wait returned (so one that fired in between is not missed), or after the timeout.
//! Each vCPU thread keeps its own place: one vCPU's wait does not use up another's wake-up.

use exitless_vmm::bus::BusDevice;
use exitless_vmm::irq::{Deliveries, GsiRouter};
use exitless_vmm::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

pub const IDLE_LEN: u64 = 4;
/// The longest a guest may make a vCPU sleep per write.
const MAX_WAIT: Duration = Duration::from_millis(10);

pub struct Idle {
    deliveries: Arc<Deliveries>,
    /// Interrupts delivered when the device was made: where a vCPU's first wait starts.
    initial: u64,
    /// Per vCPU thread: the delivery count its last wait returned with.
    seen: Mutex<HashMap<ThreadId, u64>>,
}

impl Idle {
    /// An idle port woken by what `router` delivers (which starts counting deliveries).
    pub fn new(router: &GsiRouter) -> Self {
        let deliveries = router.count_deliveries();
        Idle { initial: deliveries.count(), deliveries, seen: Mutex::new(HashMap::new()) }
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
        self.wait(u32::from_le_bytes([data[0], data[1], data[2], data[3]]));
    }
}

impl Idle {
    /// How long a guest that asks for `us` microseconds may sleep.
    fn timeout(us: u32) -> Duration {
        Duration::from_micros(u64::from(us)).min(MAX_WAIT)
    }

    /// The calling vCPU's wait of `us` microseconds; whether the timeout ended it.
    fn wait(&self, us: u32) -> bool {
        let me = std::thread::current().id();
        let seen = *lock(&self.seen).get(&me).unwrap_or(&self.initial);
        let (now, timed_out) = self.deliveries.wait_beyond(seen, Idle::timeout(us));
        lock(&self.seen).insert(me, now);
        timed_out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exitless_vmm::testing::FakeKvm;
    use std::time::Instant;

    #[test]
    fn a_wait_ends_at_an_interrupt_or_the_timeout() {
        let router = Arc::new(GsiRouter::new(Arc::new(FakeKvm::default())));
        let idle = Idle::new(&router);
        let start = Instant::now();
        assert!(idle.wait(5000), "no interrupt: the timeout ends it");
        assert!(start.elapsed() >= Duration::from_millis(5), "no interrupt: the whole timeout");
        // A guest cannot ask for more than 10 ms; that wait too ends by its timeout.
        assert_eq!(Idle::timeout(u32::MAX), MAX_WAIT);
        assert!(idle.wait(u32::MAX));
        // An interrupt delivered before the wait started still ends it, not the timeout.
        router.delivered();
        assert!(!idle.wait(1_000_000));
        idle.write(0, &[1, 2]); // wrong size: ignored, no wait
    }

    #[test]
    fn one_vcpus_wait_does_not_use_up_anothers_wake_up() {
        let router = Arc::new(GsiRouter::new(Arc::new(FakeKvm::default())));
        let idle = Arc::new(Idle::new(&router));
        router.delivered();
        // vCPU A takes the interrupt...
        assert!(!idle.wait(1_000_000));
        // ...and vCPU B, which has not waited since, still sees it and does not sleep.
        let other = idle.clone();
        let b = std::thread::spawn(move || other.wait(1_000_000));
        assert!(!b.join().unwrap(), "B slept to its timeout");
    }
}
