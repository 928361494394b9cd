//! Which blocks of the hotpluggable region the driver has plugged, and what a request may
//! change: the rules of virtio 1.2 5.15.6 with nothing outside the region touched. Pure
//! state: the device applies what a change means to the host (pages discarded, memory
//! slots added or removed).

use std::ops::Range;

/// The region's shape, fixed when the VM is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Guest physical address of the region's first byte.
    pub start: u64,
    pub size: u64,
    /// The driver's unit (a power of two, at least 2 MiB).
    pub block_size: u64,
    /// The host's unit: one KVM memory slot each, a multiple of `block_size`.
    pub slot_size: u64,
}

impl Geometry {
    pub fn blocks(&self) -> usize {
        (self.size / self.block_size) as usize
    }

    pub fn slots(&self) -> usize {
        (self.size / self.slot_size) as usize
    }

    fn blocks_per_slot(&self) -> usize {
        (self.slot_size / self.block_size) as usize
    }
}

/// The state virtio-mem reports for a range (VIRTIO_MEM_STATE_*).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeState {
    Plugged = 0,
    Unplugged = 1,
    Mixed = 2,
}

/// Why a request was refused: the driver's error, except `TooBig` and `Host`, the host's
/// "not now" (NACK).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the range {addr:#x}+{blocks} blocks is not aligned or not inside the usable region")]
    Range { addr: u64, blocks: u16 },
    #[error("the range {addr:#x}+{blocks} blocks is {state:?}")]
    State { addr: u64, blocks: u16, state: RangeState },
    #[error("plugging {blocks} blocks would pass the requested size")]
    TooBig { blocks: u16 },
    #[error("request type {0} is not one virtio-mem knows")]
    Unknown(u16),
    #[error("the host could not open {blocks} blocks to the guest")]
    Host { blocks: u16 },
}

/// What a plug or unplug changed: the blocks (as a guest address range) and the slots
/// whose mapping must follow (each with whether any of its blocks is now plugged).
#[derive(Debug, PartialEq, Eq)]
pub struct Change {
    pub range: Range<u64>,
    pub slots: Vec<(usize, bool)>,
}

#[derive(Debug)]
pub struct Blocks {
    pub geometry: Geometry,
    plugged: Vec<bool>,
    /// Slots KVM maps now.
    mapped: Vec<bool>,
    pub plugged_size: u64,
    pub requested_size: u64,
    pub usable_region_size: u64,
}

impl Blocks {
    pub fn new(geometry: Geometry) -> Blocks {
        Blocks {
            geometry,
            plugged: vec![false; geometry.blocks()],
            mapped: vec![false; geometry.slots()],
            plugged_size: 0,
            requested_size: 0,
            usable_region_size: 0,
        }
    }

    /// The host asks for `bytes` plugged: the usable region grows to the slots that hold
    /// it (it shrinks only at the driver's UNPLUG_ALL). `bytes` is checked by the caller.
    pub fn request(&mut self, bytes: u64) {
        self.requested_size = bytes;
        let needed = bytes.next_multiple_of(self.geometry.slot_size);
        self.usable_region_size = self.usable_region_size.max(needed);
    }

    /// The blocks `addr`+`count` name, if aligned and inside the usable region.
    fn blocks_of(&self, addr: u64, count: u16) -> Result<Range<usize>, Refusal> {
        let g = &self.geometry;
        let refused = Refusal::Range { addr, blocks: count };
        let offset = addr.checked_sub(g.start).ok_or(refused)?;
        let len = u64::from(count) * g.block_size;
        let end = offset.checked_add(len).ok_or(refused)?;
        if count == 0 || !offset.is_multiple_of(g.block_size) || end > self.usable_region_size {
            return Err(refused);
        }
        let first = (offset / g.block_size) as usize;
        Ok(first..first + usize::from(count))
    }

    fn state_of(&self, blocks: Range<usize>) -> RangeState {
        let plugged = self.plugged[blocks.clone()].iter().filter(|&&p| p).count();
        match plugged {
            0 => RangeState::Unplugged,
            n if n == blocks.len() => RangeState::Plugged,
            _ => RangeState::Mixed,
        }
    }

    /// VIRTIO_MEM_REQ_STATE.
    pub fn state(&self, addr: u64, count: u16) -> Result<RangeState, Refusal> {
        Ok(self.state_of(self.blocks_of(addr, count)?))
    }

    /// VIRTIO_MEM_REQ_PLUG: only unplugged blocks, and never past the requested size.
    pub fn plug(&mut self, addr: u64, count: u16) -> Result<Change, Refusal> {
        let blocks = self.blocks_of(addr, count)?;
        let state = self.state_of(blocks.clone());
        if state != RangeState::Unplugged {
            return Err(Refusal::State { addr, blocks: count, state });
        }
        if self.plugged_size + u64::from(count) * self.geometry.block_size > self.requested_size {
            return Err(Refusal::TooBig { blocks: count });
        }
        Ok(self.set(blocks, true))
    }

    /// VIRTIO_MEM_REQ_UNPLUG: only what is plugged, all of it.
    pub fn unplug(&mut self, addr: u64, count: u16) -> Result<Change, Refusal> {
        let blocks = self.blocks_of(addr, count)?;
        let state = self.state_of(blocks.clone());
        if state != RangeState::Plugged {
            return Err(Refusal::State { addr, blocks: count, state });
        }
        Ok(self.set(blocks, false))
    }

    /// VIRTIO_MEM_REQ_UNPLUG_ALL: every block, and the usable region back to what the
    /// requested size needs.
    pub fn unplug_all(&mut self) -> Change {
        let change = self.set(0..self.plugged.len(), false);
        self.usable_region_size = self.requested_size.next_multiple_of(self.geometry.slot_size);
        change
    }

    fn set(&mut self, blocks: Range<usize>, plug: bool) -> Change {
        let g = self.geometry;
        let before = self.plugged[blocks.clone()].iter().filter(|&&p| p).count() as u64;
        self.plugged[blocks.clone()].fill(plug);
        let after = if plug { blocks.len() as u64 } else { 0 };
        self.plugged_size = self.plugged_size - before * g.block_size + after * g.block_size;
        let per_slot = g.blocks_per_slot();
        let touched = blocks.start / per_slot..(blocks.end - 1) / per_slot + 1;
        let mut slots = Vec::new();
        for slot in touched {
            let any = self.plugged[slot * per_slot..(slot + 1) * per_slot].contains(&true);
            if any != self.mapped[slot] {
                self.mapped[slot] = any;
                slots.push((slot, any));
            }
        }
        let start = g.start + blocks.start as u64 * g.block_size;
        Change { range: start..start + blocks.len() as u64 * g.block_size, slots }
    }

    pub fn is_plugged(&self, block: usize) -> bool {
        self.plugged.get(block).copied().unwrap_or(false)
    }

    /// Whether KVM maps slot `slot` (a block of it is plugged).
    pub fn is_mapped(&self, slot: usize) -> bool {
        self.mapped.get(slot).copied().unwrap_or(false)
    }

    /// A snapshot's plugged blocks (`plugged(block)`), on blocks with none plugged: the
    /// plugged size and the slots they map follow.
    pub fn restore_plugged(&mut self, plugged: impl Fn(usize) -> bool) {
        for block in (0..self.plugged.len()).filter(|&b| plugged(b)) {
            self.set(block..block + 1, true);
        }
    }

    /// A slot whose mapping could not follow a change: its state as KVM has it.
    pub fn slot_failed(&mut self, slot: usize, mapped: bool) {
        self.mapped[slot] = mapped;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const START: u64 = 1 << 40;

    fn blocks() -> Blocks {
        Blocks::new(Geometry { start: START, size: 256 * MIB, block_size: 2 * MIB, slot_size: 128 * MIB })
    }

    #[test]
    fn plug_within_the_requested_size_maps_the_slot_once() {
        let mut b = blocks();
        assert!(matches!(b.plug(START, 1), Err(Refusal::Range { .. })), "nothing usable before a request");
        b.request(4 * MIB);
        assert_eq!(b.usable_region_size, 128 * MIB);
        let change = b.plug(START, 1).unwrap();
        assert_eq!(change, Change { range: START..START + 2 * MIB, slots: vec![(0, true)] });
        assert_eq!(b.plug(START + 2 * MIB, 1).unwrap().slots, vec![], "slot 0 is mapped already");
        assert_eq!(b.plugged_size, 4 * MIB);
        assert_eq!(b.plug(START + 4 * MIB, 1), Err(Refusal::TooBig { blocks: 1 }));
        assert_eq!(b.state(START, 2), Ok(RangeState::Plugged));
        assert_eq!(b.state(START, 3), Ok(RangeState::Mixed));
    }

    #[test]
    fn unplug_only_what_was_plugged_and_the_last_block_unmaps_its_slot() {
        let mut b = blocks();
        b.request(8 * MIB);
        b.plug(START, 2).unwrap();
        let refused = b.unplug(START, 3).unwrap_err();
        assert_eq!(refused, Refusal::State { addr: START, blocks: 3, state: RangeState::Mixed });
        assert!(matches!(b.unplug(START + 4 * MIB, 1), Err(Refusal::State { state: RangeState::Unplugged, .. })));
        assert_eq!(b.unplug(START, 1).unwrap().slots, vec![]);
        assert_eq!(b.unplug(START + 2 * MIB, 1).unwrap().slots, vec![(0, false)]);
        assert_eq!(b.plugged_size, 0);
        assert!(b.plug(START, 2).is_ok(), "plugged again");
    }

    #[test]
    fn ranges_outside_unaligned_empty_or_overflowing_are_refused() {
        let mut b = blocks();
        b.request(256 * MIB);
        for (addr, count) in [
            (START - 2 * MIB, 1),
            (START + MIB, 1),
            (START, 0),
            (START + 254 * MIB, 2),
            (START + 256 * MIB, 1),
            (u64::MAX - MIB, u16::MAX),
            (0, 1),
        ] {
            assert!(matches!(b.plug(addr, count), Err(Refusal::Range { .. })), "{addr:#x}+{count}");
            assert!(matches!(b.state(addr, count), Err(Refusal::Range { .. })));
        }
        assert_eq!(b.plugged_size, 0);
    }

    #[test]
    fn a_range_across_two_slots_maps_both_and_unplug_all_unmaps_them() {
        let mut b = blocks();
        b.request(256 * MIB);
        let change = b.plug(START + 126 * MIB, 2).unwrap();
        assert_eq!(change.slots, vec![(0, true), (1, true)]);
        let all = b.unplug_all();
        assert_eq!(all.slots, vec![(0, false), (1, false)]);
        assert_eq!(all.range, START..START + 256 * MIB);
        assert_eq!((b.plugged_size, b.usable_region_size), (0, 256 * MIB));
        b.request(0);
        b.unplug_all();
        assert_eq!(b.usable_region_size, 0, "shrinks only at UNPLUG_ALL");
    }
}
