//! Publishing a new bus layout to running vCPUs without a lock on their exit path.

use super::{Bus, MmioAddress, PioAddress};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Both buses of a machine, as one immutable snapshot.
#[derive(Clone, Default)]
pub struct BusSet {
    pub pio: Bus<PioAddress>,
    pub mmio: Bus<MmioAddress>,
}

/// The current [`BusSet`] and a generation number bumped on every change.
///
/// vCPUs keep their own `Arc<BusSet>` and compare generations on each exit (one atomic
/// load); only when it moved do they take the mutex to fetch the new snapshot.
pub struct SharedBuses {
    current: Mutex<Arc<BusSet>>,
    generation: AtomicU64,
}

impl SharedBuses {
    pub fn new(buses: BusSet) -> Self {
        SharedBuses { current: Mutex::new(Arc::new(buses)), generation: AtomicU64::new(0) }
    }

    /// The current snapshot and its generation.
    pub fn snapshot(&self) -> (Arc<BusSet>, u64) {
        let current = crate::sync::lock(&self.current);
        (current.clone(), self.generation.load(Ordering::Acquire))
    }

    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Applies `change` to a copy of the current layout and publishes it if it succeeds.
    pub fn update<E>(&self, change: impl FnOnce(&mut BusSet) -> Result<(), E>) -> Result<(), E> {
        let mut current = crate::sync::lock(&self.current);
        let mut next = BusSet::clone(&current);
        change(&mut next)?;
        *current = Arc::new(next);
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }
}
