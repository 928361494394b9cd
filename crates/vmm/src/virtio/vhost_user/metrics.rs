//! A vhost-user device's counters, as Firecracker's `vhost_user_metrics.rs` names them
//! (the API writes them as `vhost_user_block_<drive_id>`): activations and configuration
//! reads that failed, and how long the handshake, the last activation and the last
//! configuration change took.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[derive(Debug, Default)]
pub struct VhostUserMetrics {
    pub activate_fails: AtomicU64,
    pub cfg_fails: AtomicU64,
    pub init_time_us: AtomicU64,
    pub activate_time_us: AtomicU64,
    pub config_change_time_us: AtomicU64,
}

impl VhostUserMetrics {
    /// Firecracker's names and values: counters first, then the three times (gauges).
    pub fn fields(&self) -> [(&'static str, u64); 5] {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("activate_fails", get(&self.activate_fails)),
            ("cfg_fails", get(&self.cfg_fails)),
            ("init_time_us", get(&self.init_time_us)),
            ("activate_time_us", get(&self.activate_time_us)),
            ("config_change_time_us", get(&self.config_change_time_us)),
        ]
    }
}

/// Stores the microseconds since `since` in `gauge`.
pub fn store_since(gauge: &AtomicU64, since: Instant) {
    gauge.store(since.elapsed().as_micros().try_into().unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// Counts one in `counter`.
pub fn count(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}
