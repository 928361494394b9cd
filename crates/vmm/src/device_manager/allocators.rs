//! Where devices get their resources: PCI slots on bus 0, BAR space in the host bridge's
//! I/O, 32-bit and 64-bit MMIO windows (rust-vmm's vm-allocator), IOAPIC pins for INTx and
//! ISA lines for virtio-mmio. GSIs come from the GSI router, which owns the routing table
//! they index; KVM memory slots from guest memory's numbering (`crate::memslots`). Built
//! from the memory map, so two devices never collide and no device carries an address of
//! its own.

use crate::layout::PciWindows;
use crate::pci::{BarKind, BarSpec};
use crate::persist::{Persist, PersistError};
use serde::{Deserialize, Serialize};
use std::ops::Range;
use vm_allocator::{AddressAllocator, AllocPolicy};

/// PCI device numbers on bus 0 (device 0 is the host bridge).
const SLOTS: u8 = 32;

#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    #[error("no free PCI slot on bus 0")]
    NoSlot,
    #[error("PCI slot 00:{0:02x} is taken or out of range")]
    SlotTaken(u8),
    #[error("no room for a {size:#x}-byte {kind:?} BAR{}", at.map(|a| format!(" at {a:#x}")).unwrap_or_default())]
    Bar {
        kind: BarKind,
        size: u64,
        at: Option<u64>,
        #[source]
        source: vm_allocator::Error,
    },
    #[error("no IOAPIC pin left for PCI INTx")]
    NoIntxPin,
    #[error("the PCI window {0:#x?} is not valid")]
    Window(std::ops::Range<u64>, #[source] vm_allocator::Error),
    #[error("no room for {0:#x} bytes of device memory")]
    DeviceMemory(u64, #[source] vm_allocator::Error),
    #[error("interrupt line {0} is taken or not one for virtio-mmio")]
    LineTaken(u32),
}

pub struct Allocators {
    /// Bit n: device n is taken.
    slots: u32,
    io: AddressAllocator,
    mmio32: AddressAllocator,
    mmio64: AddressAllocator,
    /// Device memory (virtio-pmem), past the 64-bit window.
    device_memory: AddressAllocator,
    device_memory_taken: Vec<std::ops::Range<u64>>,
    /// Every range handed out, per window (I/O, 32-bit, 64-bit): vm-allocator 0.1.4's
    /// exact-address allocation does not check that the range is still free.
    taken: [Vec<std::ops::Range<u64>>; 3],
    /// IOAPIC pins for PCI INTx still free, lowest first.
    intx_pins: Vec<u32>,
    /// ISA lines for virtio-mmio devices still free, in the order they are handed out.
    mmio_irqs: Vec<u32>,
}

/// What the allocators have handed out: a snapshot's record of it, and what a machine
/// restored from it must have handed out too.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatorState {
    /// PCI device numbers taken on bus 0 (bit n: device n).
    pub pci_slots: u32,
    /// The ranges taken in the I/O, 32-bit and 64-bit windows, lowest first (a restore
    /// takes them in the order its devices are attached).
    pub io: Vec<Range<u64>>,
    pub mmio32: Vec<Range<u64>>,
    pub mmio64: Vec<Range<u64>>,
    /// The device memory ranges taken (virtio-pmem), lowest first.
    pub device_memory: Vec<Range<u64>>,
    /// The IOAPIC pins for INTx and the ISA lines for virtio-mmio still free.
    pub free_intx_pins: Vec<u32>,
    pub free_mmio_lines: Vec<u32>,
}

/// A restore builds the same devices, each where the snapshot had it, so its allocators
/// must stand where the snapshot's stood: checked, not applied. A difference means some
/// placement was not reproduced, and the restore fails whole with the first difference.
impl Persist<'_> for Allocators {
    type State = AllocatorState;
    type SaveArgs = ();
    type RestoreArgs = ();

    fn save(&self, (): ()) -> Result<AllocatorState, PersistError> {
        let sorted = |ranges: &[Range<u64>]| {
            let mut ranges = ranges.to_vec();
            ranges.sort_by_key(|r| r.start);
            ranges
        };
        let [io, mmio32, mmio64] = [&self.taken[0], &self.taken[1], &self.taken[2]].map(|t| sorted(t));
        Ok(AllocatorState {
            pci_slots: self.slots,
            io,
            mmio32,
            mmio64,
            device_memory: sorted(&self.device_memory_taken),
            free_intx_pins: self.intx_pins.clone(),
            free_mmio_lines: self.mmio_irqs.clone(),
        })
    }

    fn restore(&self, (): (), saved: &AllocatorState) -> Result<(), PersistError> {
        let here = self.save(())?;
        let differs = |what: &str, there: &dyn std::fmt::Debug, here: &dyn std::fmt::Debug| {
            Err(PersistError::Refused(format!("the snapshot's machine had {what} {there:x?}, this one {here:x?}")))
        };
        match () {
            _ if saved.pci_slots != here.pci_slots => differs("PCI slots", &saved.pci_slots, &here.pci_slots),
            _ if saved.io != here.io => differs("I/O ranges", &saved.io, &here.io),
            _ if saved.mmio32 != here.mmio32 => differs("32-bit MMIO ranges", &saved.mmio32, &here.mmio32),
            _ if saved.mmio64 != here.mmio64 => differs("64-bit MMIO ranges", &saved.mmio64, &here.mmio64),
            _ if saved.device_memory != here.device_memory => {
                differs("device memory ranges", &saved.device_memory, &here.device_memory)
            }
            _ if saved.free_intx_pins != here.free_intx_pins => {
                differs("free INTx pins", &saved.free_intx_pins, &here.free_intx_pins)
            }
            _ if saved.free_mmio_lines != here.free_mmio_lines => {
                differs("free MMIO lines", &saved.free_mmio_lines, &here.free_mmio_lines)
            }
            _ => Ok(()),
        }
    }
}

impl Allocators {
    /// Allocators over `windows`.
    pub fn new(windows: &PciWindows) -> Result<Self, AllocError> {
        let range = |r: std::ops::Range<u64>| {
            AddressAllocator::new(r.start, r.end - r.start).map_err(|e| AllocError::Window(r.clone(), e))
        };
        let mut allocators = Allocators {
            slots: 1, // the host bridge
            io: range(windows.io.clone())?,
            mmio32: range(windows.mmio32.clone())?,
            mmio64: range(windows.mmio64.clone())?,
            device_memory: range(windows.device_memory.clone())?,
            device_memory_taken: Vec::new(),
            taken: Default::default(),
            intx_pins: crate::layout::PCI_INTX_PINS.collect(),
            mmio_irqs: crate::layout::MMIO_IRQS.to_vec(),
        };
        // The 32-bit window's first page is Firecracker's boot timer's, whether or not it
        // is attached (`--boot-timer`): the rest lands alike either way, so a snapshot taken
        // with it restores without it.
        let page = BarSpec { kind: BarKind::Memory32, size: crate::layout::PAGE_SIZE };
        allocators.reserve_bar(page, windows.mmio32.start)?;
        Ok(allocators)
    }

    /// An IOAPIC pin of its own for a PCI function's INTx.
    pub fn intx_pin(&mut self) -> Result<u32, AllocError> {
        match self.intx_pins.is_empty() {
            true => Err(AllocError::NoIntxPin),
            false => Ok(self.intx_pins.remove(0)),
        }
    }

    /// The next page-aligned window of `len` bytes for a virtio-mmio device: from the
    /// second page of the 32-bit window on (the first is the boot timer's), as Firecracker
    /// lays them out.
    pub fn mmio_device_window(&mut self, len: u64) -> Result<u64, AllocError> {
        let start = self.mmio32.base() + crate::layout::PAGE_SIZE;
        let mut at = start;
        loop {
            let spec = BarSpec { kind: BarKind::Memory32, size: len };
            match self.reserve_bar(spec, at) {
                Ok(()) => return Ok(at),
                Err(_) if at + len < self.mmio32.end() => at += len,
                Err(e) => return Err(e),
            }
        }
    }

    /// An interrupt line for a virtio-mmio device: the ISA lines no legacy device uses
    /// first (so a guest without an IOAPIC, `noapic`, reaches them through the PIC), then
    /// the IOAPIC's upper pins.
    pub fn mmio_irq(&mut self) -> Result<u32, AllocError> {
        match self.mmio_irqs.is_empty() {
            false => Ok(self.mmio_irqs.remove(0)),
            true => self.intx_pin(),
        }
    }

    /// Takes line `gsi` for a virtio-mmio device (where a snapshot had it), if it is free
    /// and one [`Allocators::mmio_irq`] hands out.
    pub fn reserve_mmio_irq(&mut self, gsi: u32) -> Result<(), AllocError> {
        for free in [&mut self.mmio_irqs, &mut self.intx_pins] {
            if let Some(at) = free.iter().position(|&l| l == gsi) {
                free.remove(at);
                return Ok(());
            }
        }
        Err(AllocError::LineTaken(gsi))
    }

    /// The lowest free device number on bus 0.
    pub fn slot(&mut self) -> Result<u8, AllocError> {
        let free = (0..SLOTS).find(|&n| self.slots & 1 << n == 0).ok_or(AllocError::NoSlot)?;
        self.slots |= 1 << free;
        Ok(free)
    }

    /// Takes device number `n` (a device whose guest expects it there).
    pub fn reserve_slot(&mut self, n: u8) -> Result<(), AllocError> {
        if n >= SLOTS || self.slots & 1 << n != 0 {
            return Err(AllocError::SlotTaken(n));
        }
        self.slots |= 1 << n;
        Ok(())
    }

    /// Whether a device number is free on bus 0.
    pub fn free_slot(&self) -> bool {
        (0..SLOTS).any(|n| self.slots & 1 << n == 0)
    }

    /// Gives device number `n` back (a device unplugged from a running guest).
    pub fn release_slot(&mut self, n: u8) {
        if n > 0 && n < SLOTS {
            self.slots &= !(1 << n);
        }
    }

    /// Gives back the range at `start` in `kind`'s window (an unplugged device's BAR).
    pub fn release_bar(&mut self, kind: BarKind, start: u64) {
        let (window, taken) = match kind {
            BarKind::Io => (&mut self.io, &mut self.taken[0]),
            BarKind::Memory32 => (&mut self.mmio32, &mut self.taken[1]),
            BarKind::Memory64 => (&mut self.mmio64, &mut self.taken[2]),
        };
        release(window, taken, start);
    }

    /// Gives back the device memory at `start` (an unplugged pmem device's).
    pub fn release_device_memory(&mut self, start: u64) {
        release(&mut self.device_memory, &mut self.device_memory_taken, start);
    }

    /// A naturally aligned place for `bar` in its window.
    pub fn bar(&mut self, bar: BarSpec) -> Result<u64, AllocError> {
        self.take(bar.kind, bar.size, bar.size, AllocPolicy::FirstMatch)
    }

    /// `size` bytes of device memory, `align`ed (a virtio-pmem file's region): at `at` if
    /// given (where a snapshot had it), else the lowest free.
    pub fn device_memory(&mut self, size: u64, align: u64, at: Option<u64>) -> Result<u64, AllocError> {
        let policy = match at {
            Some(at) if self.device_memory_taken.iter().any(|r| r.start < at.saturating_add(size) && at < r.end) => {
                return Err(AllocError::DeviceMemory(size, vm_allocator::Error::ResourceNotAvailable))
            }
            Some(at) => AllocPolicy::ExactMatch(at),
            None => AllocPolicy::FirstMatch,
        };
        let range = self.device_memory.allocate(size, align, policy);
        let start = range.map_err(|e| AllocError::DeviceMemory(size, e))?.start();
        self.device_memory_taken.push(start..start + size);
        Ok(start)
    }

    /// Takes the ports of a legacy device, where they fall in the I/O window.
    pub fn reserve_ports(&mut self, port: u16, len: u64) -> Result<(), AllocError> {
        let (start, end) = (u64::from(port), u64::from(port) + len);
        if end <= self.io.base() || start > self.io.end() {
            return Ok(());
        }
        self.take(BarKind::Io, len, 1, AllocPolicy::ExactMatch(start)).map(drop)
    }

    /// Takes exactly `[at, at + size)` for `bar` (a device at an address its guest knows).
    pub fn reserve_bar(&mut self, bar: BarSpec, at: u64) -> Result<(), AllocError> {
        self.take(bar.kind, bar.size, bar.size, AllocPolicy::ExactMatch(at)).map(drop)
    }

    fn take(&mut self, kind: BarKind, size: u64, align: u64, policy: AllocPolicy) -> Result<u64, AllocError> {
        let (window, taken) = match kind {
            BarKind::Io => (&mut self.io, &mut self.taken[0]),
            BarKind::Memory32 => (&mut self.mmio32, &mut self.taken[1]),
            BarKind::Memory64 => (&mut self.mmio64, &mut self.taken[2]),
        };
        let at = match policy {
            AllocPolicy::ExactMatch(at) => Some(at),
            _ => None,
        };
        let error = |source| AllocError::Bar { kind, size, at, source };
        if let Some(at) = at {
            if taken.iter().any(|r| r.start < at.saturating_add(size) && at < r.end) {
                return Err(error(vm_allocator::Error::ResourceNotAvailable));
            }
        }
        let start = window.allocate(size, align, policy).map_err(error)?.start();
        taken.push(start..start + size);
        Ok(start)
    }
}

/// Frees the range at `start` from `window` and from `taken`, if it was handed out.
fn release(window: &mut AddressAllocator, taken: &mut Vec<Range<u64>>, start: u64) {
    let Some(at) = taken.iter().position(|r| r.start == start) else { return };
    let range = taken.remove(at);
    match vm_allocator::RangeInclusive::new(range.start, range.end - 1) {
        Ok(r) => {
            if let Err(e) = window.free(&r) {
                tracing::warn!("{range:#x?} not given back: {e}");
            }
        }
        Err(e) => tracing::warn!("{range:#x?} not given back: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::MemoryMap;

    #[test]
    fn released_slots_and_bars_are_handed_out_again() {
        let (mut a, _) = allocators();
        let mem32 = BarSpec { kind: BarKind::Memory32, size: 0x4000 };
        let (slot, bar) = (a.slot().unwrap(), a.bar(mem32).unwrap());
        let before = a.save(()).unwrap();
        a.release_slot(slot);
        a.release_bar(BarKind::Memory32, bar);
        assert_eq!(a.slot().unwrap(), slot);
        assert_eq!(a.bar(mem32).unwrap(), bar);
        assert_eq!(a.save(()).unwrap(), before, "as if never given back");
        a.release_slot(0);
        assert!(a.reserve_slot(0).is_err(), "the host bridge's slot stays taken");
        let mem = a.device_memory(2 << 20, 2 << 20, None).unwrap();
        a.release_device_memory(mem);
        assert_eq!(a.device_memory(2 << 20, 2 << 20, None).unwrap(), mem);
    }

    fn allocators() -> (Allocators, PciWindows) {
        let windows = MemoryMap::new(8 << 30).unwrap().pci_windows();
        (Allocators::new(&windows).unwrap(), windows)
    }

    #[test]
    fn slots_are_handed_out_once_and_run_out() {
        let (mut a, _) = allocators();
        a.reserve_slot(1).unwrap();
        assert!(matches!(a.reserve_slot(1), Err(AllocError::SlotTaken(1))));
        assert!(matches!(a.reserve_slot(0), Err(AllocError::SlotTaken(0))), "the host bridge's");
        assert_eq!(a.slot().unwrap(), 2);
        assert_eq!(a.slot().unwrap(), 3);
        for _ in 4..32 {
            a.slot().unwrap();
        }
        assert!(matches!(a.slot(), Err(AllocError::NoSlot)));
        let pins: Vec<u32> = std::iter::from_fn(|| a.intx_pin().ok()).collect();
        assert_eq!(pins, (16..=23).collect::<Vec<_>>(), "INTx pins past the ISA IRQs, once each");
    }

    #[test]
    fn bars_are_aligned_disjoint_and_inside_their_window() {
        let (mut a, w) = allocators();
        let mem32 = BarSpec { kind: BarKind::Memory32, size: 0x8000 };
        let mem64 = BarSpec { kind: BarKind::Memory64, size: 1 << 30 };
        let io = BarSpec { kind: BarKind::Io, size: 0x20 };
        let first_page = BarSpec { kind: BarKind::Memory32, size: 0x1000 };
        assert!(a.reserve_bar(first_page, w.mmio32.start).is_err(), "the boot timer's page is taken from the start");
        let (x, y) = (a.bar(mem32).unwrap(), a.bar(mem32).unwrap());
        assert!(x % 0x8000 == 0 && y % 0x8000 == 0 && x != y, "{x:#x} {y:#x}");
        assert!(w.mmio32.contains(&x) && x > w.mmio32.start, "after the reserved page: {x:#x}");
        let big = a.bar(mem64).unwrap();
        assert!(w.mmio64.contains(&big) && big % (1 << 30) == 0 && big >= 8 << 30);
        a.reserve_ports(0x400, 0x20).unwrap();
        a.reserve_ports(0x3f8, 8).unwrap(); // outside the window: nothing to take
        let port = a.bar(io).unwrap();
        assert!(port > 0x400 && port % 0x20 == 0, "{port:#x}");
        assert!(a.reserve_ports(port as u16 + 4, 4).is_err(), "inside a BAR");
        assert!(a.reserve_bar(mem32, x).is_err(), "taken");
        let huge = BarSpec { kind: BarKind::Memory32, size: 1 << 30 };
        assert!(matches!(a.bar(huge), Err(AllocError::Bar { .. })), "larger than what is left");
    }
}
