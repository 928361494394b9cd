//! Reconnecting a restarted backend (a vhost-user-blk drive's; see docs/architecture.md
//! for why virtio-fs is not): once the backend hangs up, its device's thread connects to
//! the same socket again, first after [`FIRST_WAIT`], the wait doubling up to
//! [`LONGEST_WAIT`]. Nobody listening is retried for as long as the device is failed
//! (one connect a wait, no log); a backend that answers but comes back broken is tried
//! [`MOST_BROKEN`] times, then the device stays failed for good.

use std::path::PathBuf;
use std::time::Duration;
use vhost::vhost_user::message::VhostUserProtocolFeatures;

pub const FIRST_WAIT: Duration = Duration::from_millis(100);
pub const LONGEST_WAIT: Duration = Duration::from_secs(2);
pub const MOST_BROKEN: u32 = 5;

/// Where a device's backend is reconnected, and the protocol features asked of it again.
#[derive(Clone, Debug)]
pub struct Reconnect {
    pub socket: PathBuf,
    pub protocol: VhostUserProtocolFeatures,
}

/// The retries after one hang-up.
#[derive(Debug)]
pub struct Retries {
    wait: Duration,
    broken: u32,
}

impl Default for Retries {
    fn default() -> Self {
        Retries { wait: FIRST_WAIT, broken: 0 }
    }
}

impl Retries {
    /// How long to wait before the next attempt.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// Nobody listened: the next attempt waits longer.
    pub fn refused(&mut self) {
        self.wait = (self.wait * 2).min(LONGEST_WAIT);
    }

    /// A backend answered but broke the handshake: false once that happened
    /// [`MOST_BROKEN`] times (no more attempts).
    pub fn broken(&mut self) -> bool {
        self.broken += 1;
        self.refused();
        self.broken < MOST_BROKEN
    }

    /// How many backends came back broken.
    pub fn broken_count(&self) -> u32 {
        self.broken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_to_its_cap_and_broken_backends_are_bounded() {
        let mut r = Retries::default();
        let mut waits = vec![r.wait()];
        for _ in 0..6 {
            r.refused();
            waits.push(r.wait());
        }
        let ms: Vec<u128> = waits.iter().map(|w| w.as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 2000, 2000]);
        let tries = (0..10).take_while(|_| r.broken()).count() as u32;
        assert_eq!(tries + 1, MOST_BROKEN);
        assert_eq!(r.broken_count(), MOST_BROKEN);
    }
}
