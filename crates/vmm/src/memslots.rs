//! KVM memory slot numbers. Guest memory owns them: its RAM regions take theirs first, and
//! the device manager is handed the same numbering for the memory devices map into the
//! guest (the ECAM shadow's pages, virtio-mmio register pages), so a slot is never given
//! twice, whichever side asks later (RAM added while the guest runs does).

use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Clone, Copy, Debug, thiserror::Error)]
#[error("no KVM memory slots left for {wanted} more (KVM offers {limit})")]
pub struct NoMemslots {
    pub wanted: u32,
    pub limit: u32,
}

/// Hands out consecutive slot numbers below KVM's limit (KVM_CAP_NR_MEMSLOTS).
#[derive(Debug)]
pub struct Memslots {
    next: AtomicU32,
    limit: u32,
}

impl Memslots {
    pub fn new(limit: u32) -> Self {
        Memslots { next: AtomicU32::new(0), limit }
    }

    /// `count` consecutive slots, or none if fewer are left.
    pub fn take(&self, count: u32) -> Result<Range<u32>, NoMemslots> {
        let refused = NoMemslots { wanted: count, limit: self.limit };
        let mut start = self.next.load(Ordering::Relaxed);
        loop {
            let end = start.checked_add(count).filter(|&end| end <= self.limit).ok_or(refused)?;
            match self.next.compare_exchange_weak(start, end, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Ok(start..end),
                Err(now) => start = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_consecutive_never_twice_and_bounded() {
        let slots = Memslots::new(32);
        assert_eq!(slots.take(2).unwrap(), 0..2);
        assert_eq!(slots.take(30).unwrap(), 2..32);
        let refused = slots.take(1).unwrap_err();
        assert_eq!((refused.wanted, refused.limit), (1, 32));
        assert_eq!(slots.take(0).unwrap(), 32..32);
        assert!(Memslots::new(4).take(u32::MAX).is_err(), "no overflow");
    }

    #[test]
    fn two_threads_never_get_the_same_slot() {
        let slots = std::sync::Arc::new(Memslots::new(20_000));
        let takers: Vec<_> = (0..2)
            .map(|_| {
                let slots = slots.clone();
                std::thread::spawn(move || (0..5000).map(|_| slots.take(2).unwrap().start).collect::<Vec<_>>())
            })
            .collect();
        let mut all: Vec<u32> = takers.into_iter().flat_map(|t| t.join().unwrap()).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 10_000);
    }
}
