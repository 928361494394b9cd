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

/// Whether starting a queue again at its used index hands a new backend exactly the
/// requests the dead one never completed. Without INFLIGHT_SHMFD the frontend knows only
/// the rings: that is so where, over the last `avail.len()` entries before the used index
/// (`used` the same positions of the used ring), the heads completed are the heads made
/// available, in any order. A backend that completed a later request before an earlier
/// one (qemu-storage-daemon at depth > 1 can) usually leaves them different: a replay
/// would run a completed request again on a slot the driver reused, and never the one
/// left behind. (Not always: a head whose request was made available just before the
/// window, completed inside it and made available again and left in hand, balances; the
/// rings cannot tell that apart.)
pub fn replay_is_exact(avail: &[u16], used: &[u32]) -> bool {
    let mut made: Vec<u32> = avail.iter().map(|&h| u32::from(h)).collect();
    let mut done = used.to_vec();
    made.sort_unstable();
    done.sort_unstable();
    made == done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_is_exact_only_where_what_completed_was_what_came_first() {
        // In order, or reordered within the window: exact.
        assert!(replay_is_exact(&[3, 4, 5, 6], &[3, 4, 5, 6]));
        assert!(replay_is_exact(&[3, 4, 5, 6], &[4, 3, 6, 5]));
        // Head 3 (the first) still in hand, 7 (after the used index) already done.
        assert!(!replay_is_exact(&[3, 4, 5, 6], &[4, 5, 6, 7]));
    }

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
