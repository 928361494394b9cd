//! Firecracker's boot-timer device (`--boot-timer`): a guest that writes the byte 123 at
//! offset 0 gets a log line with the time since the machine was built (at InstanceStart),
//! wall clock and the VMM's CPU time, in Firecracker's words, so the scripts that grep
//! Firecracker's log for "Guest-boot-time" work unchanged.

use crate::bus::BusDevice;
use std::time::Instant;

/// Where Firecracker puts it on x86: the first page of the 32-bit MMIO window.
pub const BOOT_TIMER_GPA: u64 = 0xc000_0000;
pub const BOOT_TIMER_LEN: u64 = 0x1000;
/// What a guest writes when it has booted.
const BOOTED: u8 = 123;

pub struct BootTimer {
    started: Instant,
    started_cpu_us: u64,
}

impl BootTimer {
    pub fn new(started: Instant) -> Self {
        BootTimer { started, started_cpu_us: process_cpu_us() }
    }
}

fn process_cpu_us() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0) / 1000
}

/// Firecracker's line, word for word.
pub fn boot_time_line(wall_us: u64, cpu_us: u64) -> String {
    format!("Guest-boot-time = {wall_us:>6} us {} ms, {cpu_us:>6} CPU us {} CPU ms", wall_us / 1000, cpu_us / 1000)
}

impl BusDevice for BootTimer {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&self, offset: u64, data: &[u8]) {
        if offset != 0 || data != [BOOTED] {
            return;
        }
        let wall_us = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let cpu_us = process_cpu_us().saturating_sub(self.started_cpu_us);
        tracing::info!("{}", boot_time_line(wall_us, cpu_us));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_is_firecrackers() {
        assert_eq!(boot_time_line(1_234_567, 8_900), "Guest-boot-time = 1234567 us 1234 ms,   8900 CPU us 8 CPU ms");
    }
}
