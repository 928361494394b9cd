//! Port-I/O and MMIO buses: devices registered on address ranges, looked up on every exit.
//!
//! A [`Bus`] is built before the vCPUs start and is never mutated afterwards: a vCPU holds
//! an `Arc` of a [`BusSet`] snapshot and looks addresses up with a binary search, with no
//! lock and no allocation. When the layout must change (a guest moving a PCI BAR), a new
//! snapshot is published through [`SharedBuses`] and each vCPU picks it up at its next
//! exit by comparing one atomic generation number.

mod address;
mod shared;

pub use address::{BusAddress, MmioAddress, PioAddress};
pub use shared::{BusSet, SharedBuses};

use std::sync::Arc;

/// A device that answers accesses on one or more bus ranges.
///
/// Methods take `&self`: a bus is shared by every vCPU, so a device that has mutable state
/// locks it itself (and only it).
pub trait BusDevice: Send + Sync {
    /// `data.len()` bytes are read at `offset` from the start of the device's range.
    fn read(&self, offset: u64, data: &mut [u8]);
    /// `data.len()` bytes are written at `offset` from the start of the device's range.
    fn write(&self, offset: u64, data: &[u8]);
}

/// A register's value as an access of `data.len()` bytes reads it (little-endian, the
/// bytes past 8 zero).
pub fn read_register(data: &mut [u8], value: u64) {
    let bytes = value.to_le_bytes();
    for (i, b) in data.iter_mut().enumerate() {
        *b = bytes.get(i).copied().unwrap_or(0);
    }
}

/// What an access writes, as a little-endian value (of at most its first 8 bytes).
pub fn written_value(data: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    let n = data.len().min(8);
    bytes[..n].copy_from_slice(&data[..n]);
    u64::from_le_bytes(bytes)
}

/// Index of a device in the machine's device table: names it in statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceId(pub usize);

/// Why a range could not be added to a bus.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    #[error("range {base:#x}+{len:#x} overlaps {other_base:#x}+{other_len:#x}")]
    Overlap { base: u64, len: u64, other_base: u64, other_len: u64 },
    #[error("range {base:#x}+{len:#x} is empty or runs past the end of the address space")]
    BadRange { base: u64, len: u64 },
    #[error("no range starts at {0:#x}")]
    NotFound(u64),
}

/// One registered range.
#[derive(Clone)]
pub struct BusEntry {
    pub base: u64,
    pub len: u64,
    pub id: DeviceId,
    pub device: Arc<dyn BusDevice>,
}

impl std::fmt::Debug for BusEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BusEntry({:#x}+{:#x}, {:?})", self.base, self.len, self.id)
    }
}

/// A sorted table of non-overlapping ranges in one address space.
#[derive(Clone)]
pub struct Bus<A: BusAddress> {
    entries: Vec<BusEntry>,
    _space: std::marker::PhantomData<A>,
}

impl<A: BusAddress> Default for Bus<A> {
    fn default() -> Self {
        Bus { entries: Vec::new(), _space: std::marker::PhantomData }
    }
}

impl<A: BusAddress> Bus<A> {
    /// Adds `device` on `[base, base + len)`; rejects empty, wrapping or overlapping ranges.
    pub fn insert(&mut self, base: A, len: u64, id: DeviceId, device: Arc<dyn BusDevice>) -> Result<(), BusError> {
        let base = base.raw();
        let end = base.checked_add(len).filter(|&end| len > 0 && end - 1 <= A::MAX);
        let Some(end) = end else { return Err(BusError::BadRange { base, len }) };
        let at = self.entries.partition_point(|e| e.base < base);
        let before = at.checked_sub(1).map(|i| &self.entries[i]);
        let after = self.entries.get(at);
        for other in before.into_iter().chain(after) {
            if base < other.base + other.len && other.base < end {
                return Err(BusError::Overlap { base, len, other_base: other.base, other_len: other.len });
            }
        }
        self.entries.insert(at, BusEntry { base, len, id, device });
        Ok(())
    }

    /// Removes the range that starts at `base`, returning it.
    pub fn remove(&mut self, base: A) -> Result<BusEntry, BusError> {
        let base = base.raw();
        let at = self.entries.binary_search_by_key(&base, |e| e.base).map_err(|_| BusError::NotFound(base))?;
        Ok(self.entries.remove(at))
    }

    /// The range holding the whole access `[addr, addr + size)`, and the access's offset in
    /// it. An access that straddles a range's end belongs to no range.
    #[inline]
    pub fn lookup(&self, addr: A, size: usize) -> Option<(&BusEntry, u64)> {
        let addr = addr.raw();
        let at = self.entries.partition_point(|e| e.base <= addr).checked_sub(1)?;
        let entry = &self.entries[at];
        let offset = addr - entry.base;
        (offset.checked_add(size as u64)? <= entry.len).then_some((entry, offset))
    }

    pub fn entries(&self) -> &[BusEntry] {
        &self.entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<(u64, usize, bool)>>);
    impl BusDevice for Recorder {
        fn read(&self, offset: u64, data: &mut [u8]) {
            data.fill(0x5a);
            self.0.lock().unwrap().push((offset, data.len(), false));
        }
        fn write(&self, offset: u64, data: &[u8]) {
            self.0.lock().unwrap().push((offset, data.len(), true));
        }
    }

    fn dev() -> Arc<Recorder> {
        Arc::new(Recorder::default())
    }

    #[test]
    fn overlapping_ranges_are_rejected() {
        let mut bus = Bus::<PioAddress>::default();
        bus.insert(PioAddress(0x10), 8, DeviceId(0), dev()).unwrap();
        for (base, len) in [(0x10, 8), (0x8, 9), (0x17, 1), (0x0, 0x100), (0x14, 2)] {
            let err = bus.insert(PioAddress(base), len, DeviceId(1), dev()).unwrap_err();
            assert!(matches!(err, BusError::Overlap { other_base: 0x10, .. }), "{base:#x}+{len}: {err}");
        }
        // Touching ranges on either side are fine.
        bus.insert(PioAddress(0x8), 8, DeviceId(1), dev()).unwrap();
        bus.insert(PioAddress(0x18), 8, DeviceId(2), dev()).unwrap();
        assert_eq!(bus.entries().len(), 3);
    }

    #[test]
    fn empty_and_wrapping_ranges_are_rejected() {
        let mut bus = Bus::<PioAddress>::default();
        assert!(matches!(bus.insert(PioAddress(0x10), 0, DeviceId(0), dev()), Err(BusError::BadRange { .. })));
        assert!(matches!(bus.insert(PioAddress(0xfff0), 0x11, DeviceId(0), dev()), Err(BusError::BadRange { .. })));
        bus.insert(PioAddress(0xfff0), 0x10, DeviceId(0), dev()).unwrap();
        let mut mmio = Bus::<MmioAddress>::default();
        assert!(matches!(mmio.insert(MmioAddress(u64::MAX), 2, DeviceId(0), dev()), Err(BusError::BadRange { .. })));
    }

    #[test]
    fn access_must_lie_wholly_inside_a_range() {
        let mut bus = Bus::<MmioAddress>::default();
        bus.insert(MmioAddress(0x1000), 0x10, DeviceId(0), dev()).unwrap();
        assert!(bus.lookup(MmioAddress(0xfff), 1).is_none());
        assert!(bus.lookup(MmioAddress(0xfff), 2).is_none(), "straddles the start");
        assert_eq!(bus.lookup(MmioAddress(0x1000), 8).unwrap().1, 0);
        assert_eq!(bus.lookup(MmioAddress(0x1008), 8).unwrap().1, 8);
        assert!(bus.lookup(MmioAddress(0x1009), 8).is_none(), "straddles the end");
        assert!(bus.lookup(MmioAddress(0x100f), 2).is_none());
        assert_eq!(bus.lookup(MmioAddress(0x100f), 1).unwrap().1, 0xf);
        assert!(bus.lookup(MmioAddress(0x1010), 1).is_none());
        assert!(bus.lookup(MmioAddress(u64::MAX), 8).is_none());
    }

    #[test]
    fn dispatch_reaches_the_right_device_and_offset() {
        let mut bus = Bus::<PioAddress>::default();
        let (a, b) = (dev(), dev());
        bus.insert(PioAddress(0x3f8), 8, DeviceId(0), a.clone()).unwrap();
        bus.insert(PioAddress(0xf4), 4, DeviceId(1), b.clone()).unwrap();
        let (entry, offset) = bus.lookup(PioAddress(0x3fd), 1).unwrap();
        assert_eq!((entry.id, offset), (DeviceId(0), 5));
        let mut data = [0u8; 1];
        entry.device.read(offset, &mut data);
        let (entry, offset) = bus.lookup(PioAddress(0xf4), 4).unwrap();
        assert_eq!(entry.id, DeviceId(1));
        entry.device.write(offset, &[1, 2, 3, 4]);
        assert_eq!(*a.0.lock().unwrap(), vec![(5, 1, false)]);
        assert_eq!(*b.0.lock().unwrap(), vec![(0, 4, true)]);
        assert_eq!(data, [0x5a]);
    }

    #[test]
    fn remove_frees_the_range() {
        let mut bus = Bus::<PioAddress>::default();
        bus.insert(PioAddress(0x10), 8, DeviceId(0), dev()).unwrap();
        assert_eq!(bus.remove(PioAddress(0x11)).unwrap_err(), BusError::NotFound(0x11));
        bus.remove(PioAddress(0x10)).unwrap();
        assert!(bus.lookup(PioAddress(0x10), 1).is_none());
        bus.insert(PioAddress(0xc), 8, DeviceId(1), dev()).unwrap();
    }
}
