//! virtio-mem's part of a snapshot, as Firecracker v1.16.1 keeps it (its
//! `VirtioMemState`): the region's shape, the requested and usable sizes and which blocks
//! the driver plugged (a bitmap); its queue is the transport's. The plugged blocks' bytes
//! are in the memory file after RAM (snapshot/memory.rs); a restore opens those blocks
//! again over them and maps every slot that holds one.

use super::{Blocks, Geometry, MemShared};
use crate::guest_memory::Plugs;
use crate::persist::{DeviceState, StateFault};
use serde::{Deserialize, Serialize};

/// What virtio-mem saves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemState {
    /// The region's shape (must be the configuration's on restore).
    pub start: u64,
    pub size: u64,
    pub block_size: u64,
    pub slot_size: u64,
    pub requested_size: u64,
    pub usable_region_size: u64,
    pub plugged_size: u64,
    /// Bit `i % 64` of word `i / 64`: block `i` plugged.
    pub plugged: Vec<u64>,
}

impl DeviceState for MemState {
    const VERSION: u32 = 1;
}

impl MemState {
    pub fn of(b: &Blocks) -> MemState {
        let g = b.geometry;
        let mut plugged = vec![0u64; g.blocks().div_ceil(64)];
        for block in (0..g.blocks()).filter(|&i| b.is_plugged(i)) {
            plugged[block / 64] |= 1 << (block % 64);
        }
        MemState {
            start: g.start,
            size: g.size,
            block_size: g.block_size,
            slot_size: g.slot_size,
            requested_size: b.requested_size,
            usable_region_size: b.usable_region_size,
            plugged_size: b.plugged_size,
            plugged,
        }
    }

    fn is_plugged(&self, block: usize) -> bool {
        self.plugged.get(block / 64).is_some_and(|w| w & (1 << (block % 64)) != 0)
    }

    /// The device's blocks as saved, if the state fits a device over `g`; the first field
    /// that does not is named.
    pub fn blocks(&self, g: Geometry) -> Result<Blocks, StateFault> {
        let shape = [("start", self.start, g.start), ("size", self.size, g.size)];
        let units = [("block_size", self.block_size, g.block_size), ("slot_size", self.slot_size, g.slot_size)];
        for (field, saved, here) in shape.into_iter().chain(units) {
            if saved != here {
                return Err(StateFault::invalid(field, format!("{saved:#x}, and this device has {here:#x}")));
            }
        }
        if self.plugged.len() != g.blocks().div_ceil(64) {
            let why = format!("{} words for {} blocks", self.plugged.len(), g.blocks());
            return Err(StateFault::invalid("plugged", why));
        }
        if let Some(past) = (g.blocks()..self.plugged.len() * 64).find(|&b| self.is_plugged(b)) {
            return Err(StateFault::invalid("plugged", format!("block {past} is past the region's {}", g.blocks())));
        }
        if !self.requested_size.is_multiple_of(g.block_size) || self.requested_size > g.size {
            let why = format!("{:#x} is not whole blocks of the region", self.requested_size);
            return Err(StateFault::invalid("requested_size", why));
        }
        if !self.usable_region_size.is_multiple_of(g.slot_size) || self.usable_region_size > g.size {
            let why = format!("{:#x} is not whole slots of the region", self.usable_region_size);
            return Err(StateFault::invalid("usable_region_size", why));
        }
        let usable = (self.usable_region_size / g.block_size) as usize;
        if let Some(outside) = (usable..g.blocks()).find(|&b| self.is_plugged(b)) {
            return Err(StateFault::invalid("plugged", format!("block {outside} is outside the usable region")));
        }
        let count = (0..g.blocks()).filter(|&b| self.is_plugged(b)).count() as u64;
        if self.plugged_size != count * g.block_size {
            let why = format!("{:#x}, and {count} blocks are plugged", self.plugged_size);
            return Err(StateFault::invalid("plugged_size", why));
        }
        let mut blocks = Blocks::new(g);
        blocks.request(self.requested_size);
        blocks.usable_region_size = self.usable_region_size;
        blocks.restore_plugged(|b| self.is_plugged(b));
        Ok(blocks)
    }
}

impl MemShared {
    /// `state` put back: the blocks it plugged open again over the memory file's bytes
    /// (`plugs`, the region's record), a KVM memory slot for each slot holding one.
    pub(super) fn restore(&self, plugs: &Plugs, state: &MemState) -> Result<(), StateFault> {
        let mut current = crate::sync::lock(&self.blocks);
        let blocks = state.blocks(current.geometry)?;
        plugs.restore(|b| state.is_plugged(b)).map_err(|e| StateFault::invalid("plugged", e.to_string()))?;
        let g = blocks.geometry;
        for slot in (0..g.slots()).filter(|&s| blocks.is_mapped(s)) {
            let gpa = g.start + slot as u64 * g.slot_size;
            let host = plugs.host_of(gpa).unwrap_or(0);
            let memslot = self.memslots.start + slot as u32;
            self.sink.set_slot(memslot, gpa, g.slot_size, host, false).map_err(|e| {
                StateFault::invalid("plugged", format!("KVM would not map slot {slot} at {gpa:#x}: {e}"))
            })?;
        }
        *current = blocks;
        Ok(())
    }
}
