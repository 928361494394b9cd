//! virtio-mem (type 24), as Firecracker's `/hotplug/memory`: a region of guest physical
//! memory past the 64-bit PCI window that the driver plugs and unplugs in blocks when the
//! host changes the requested size. Only plugged blocks are the guest's, to its vCPUs and
//! to every device: a block is open to translation (guest_memory's `Plugs`) and readable
//! and writable while plugged, refused otherwise. The host's unit for the vCPUs is the
//! slot, a KVM memory slot mapped while any of its blocks is plugged and removed with the
//! last; an unplugged block of a mapped slot is read-only zeros, every block of an
//! unmapped slot PROT_NONE. An unplugged block's memory goes back to the host at once (the
//! fresh mapping over it holds nothing), so the requested size caps what the guest can
//! make the host commit, whatever it points its vCPUs or its devices at.

mod attach;
mod blocks;
mod persist;
mod worker;

pub use attach::{MemHandle, KIND};
pub use blocks::{Blocks, Geometry, RangeState, Refusal};
pub use persist::MemState;
pub use worker::process_once;

use super::thread::{DeviceThread, QueuePosition};
use super::{ActivateError, Activation, ActiveQueue, VirtioDevice, VIRTIO_F_VERSION_1};
use crate::guest_memory::{GuestMemoryMmap, PlugError, Plugs};
use crate::kvm::MemslotSink;
use crate::persist::{Saved, StateFault};
use crate::seccomp::ThreadKind;
use std::ops::Range;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use vm_memory::GuestMemoryBackend;
use worker::Worker;

pub const DEVICE_TYPE: u16 = 24;
/// Firecracker's defaults and least sizes, in MiB.
pub const DEFAULT_BLOCK_SIZE_MIB: u64 = 2;
pub const DEFAULT_SLOT_SIZE_MIB: u64 = 128;
/// Where the region starts: a Linux memory block (128 MiB on x86) is added whole.
pub const ALIGNMENT: u64 = DEFAULT_SLOT_SIZE_MIB << 20;
/// The driver must not touch unplugged memory (virtio 1.2 5.15.3): what lets the host
/// remove the slots it never plugged and protect the blocks it unplugged.
const F_UNPLUGGED_INACCESSIBLE: u64 = 1 << 1;
const QUEUE_SIZE: u16 = 128;
/// block_size, node_id and padding, addr, region_size, usable_region_size, plugged_size,
/// requested_size (virtio 1.2 5.15.4).
const CONFIG_LEN: usize = 56;

/// What the report, the API and the tests read while the device runs.
#[derive(Default)]
pub struct MemStats {
    pub plugs: AtomicU64,
    pub unplugs: AtomicU64,
    pub unplug_alls: AtomicU64,
    pub state_requests: AtomicU64,
    /// Requests refused (a range outside the usable region, or in the wrong state).
    pub refused: AtomicU64,
    /// Chains that are not a request and a response buffer.
    pub bad_chains: AtomicU64,
    /// Memory slots KVM would not add or remove.
    pub slot_failures: AtomicU64,
    /// Plugs whose blocks' memory could not be opened to the guest (answered "not now").
    pub open_failures: AtomicU64,
    /// Unplugs whose blocks' memory could not be discarded (Firecracker's
    /// `unplug_discard_fails`); translation refuses the blocks all the same.
    pub discard_failures: AtomicU64,
    pub kicks: AtomicU64,
    pub irqs: AtomicU64,
}

/// Why the requested size was refused, in Firecracker v1.16.1's words (`VirtioMemError`,
/// `FindDeviceError`), which the API wraps as Firecracker does.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    #[error("Failed perform action on device: Device not found")]
    NoDevice,
    #[error("Device is not active")]
    NotActive,
    #[error("Size {0} is invalid: it must be a multiple of block size and less than the total size")]
    InvalidSize(u64),
}

/// The device's state, shared by the device (its configuration space), its thread (the
/// driver's requests) and the API (the requested size and the status).
pub struct MemShared {
    pub blocks: Mutex<Blocks>,
    pub stats: MemStats,
    /// The region's memory slots, one per slot in order.
    memslots: Range<u32>,
    sink: Arc<dyn MemslotSink>,
}

impl MemShared {
    /// The configuration space as the driver reads it.
    fn config_bytes(&self) -> [u8; CONFIG_LEN] {
        let b = crate::sync::lock(&self.blocks);
        let g = b.geometry;
        let mut c = [0u8; CONFIG_LEN];
        // node_id (8..10) stays 0: no NUMA.
        let fields = [
            (0, g.block_size),
            (16, g.start),
            (24, g.size),
            (32, b.usable_region_size),
            (40, b.plugged_size),
            (48, b.requested_size),
        ];
        for (at, value) in fields {
            c[at..at + 8].copy_from_slice(&value.to_le_bytes());
        }
        c
    }

    /// A new requested size, in bytes: a multiple of the block size, at most the region.
    /// The caller tells the driver (a configuration change).
    pub fn request(&self, bytes: u64) -> Result<(), MemError> {
        let mut b = crate::sync::lock(&self.blocks);
        if !bytes.is_multiple_of(b.geometry.block_size) || bytes > b.geometry.size {
            return Err(MemError::InvalidSize(bytes));
        }
        b.request(bytes);
        Ok(())
    }

    /// Slot `slot` mapped into the guest (`plugged`) or removed. A failure is logged,
    /// counted and remembered: the slot stays as KVM has it.
    fn map_slot(&self, plugs: &Plugs, b: &mut Blocks, slot: usize, plugged: bool) {
        let g = b.geometry;
        let offset = slot as u64 * g.slot_size;
        let size = if plugged { g.slot_size } else { 0 };
        let memslot = self.memslots.start + slot as u32;
        let host = plugs.host_of(g.start + offset).unwrap_or(0);
        if let Err(e) = self.sink.set_slot(memslot, g.start + offset, size, host, false) {
            self.stats.slot_failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!("virtio-mem: KVM would not {} slot {slot}: {e}", if plugged { "add" } else { "remove" });
            b.slot_failed(slot, !plugged);
        }
    }

    /// The blocks of `range` opened to the guest (before the driver hears of it).
    fn open(&self, plugs: &Plugs, range: &Range<u64>) -> Result<(), PlugError> {
        plugs.plug(range.clone())
    }

    /// The blocks of `range` closed to the guest and their memory given back to the host
    /// (guest_memory's one discard routine: a fresh PROT_NONE mapping). A failure is
    /// logged and counted; translation refuses the blocks whatever happens.
    fn close(&self, plugs: &Plugs, range: &Range<u64>) {
        if let Err(e) = plugs.unplug(range.clone()) {
            self.stats.discard_failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!("virtio-mem: {e}");
        }
    }
}

/// The status `GET /hotplug/memory` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemStatus {
    pub block_size_mib: u64,
    pub total_size_mib: u64,
    pub slot_size_mib: u64,
    pub plugged_size_mib: u64,
    pub requested_size_mib: u64,
}

impl MemShared {
    pub fn status(&self) -> MemStatus {
        let b = crate::sync::lock(&self.blocks);
        let mib = |bytes: u64| bytes >> 20;
        MemStatus {
            block_size_mib: mib(b.geometry.block_size),
            total_size_mib: mib(b.geometry.size),
            slot_size_mib: mib(b.geometry.slot_size),
            plugged_size_mib: mib(b.plugged_size),
            requested_size_mib: mib(b.requested_size),
        }
    }
}

pub struct VirtioMem {
    pub shared: Arc<MemShared>,
    thread: DeviceThread<Worker>,
    /// Guest memory, with the region's plug record (what a restore opens again).
    memory: GuestMemoryMmap,
}

impl VirtioMem {
    /// The device over `geometry`, guest memory's hotpluggable region (which its thread
    /// reaches through the memory it is activated with); `memslots` holds one KVM slot
    /// number per slot. Nothing is plugged: no slot is mapped yet. `memory` is guest
    /// memory, holding the region.
    pub fn new(
        geometry: Geometry,
        memslots: Range<u32>,
        sink: Arc<dyn MemslotSink>,
        memory: GuestMemoryMmap,
    ) -> std::io::Result<VirtioMem> {
        let shared =
            MemShared { blocks: Mutex::new(Blocks::new(geometry)), stats: MemStats::default(), memslots, sink };
        let thread = DeviceThread::spawn("virtio-mem", ThreadKind::Mem)?;
        Ok(VirtioMem { shared: Arc::new(shared), thread, memory })
    }
}

/// The plug state of `memory`'s hotpluggable region over `geometry`, if it has one there.
pub fn plugs_of<'a>(memory: &'a GuestMemoryMmap, geometry: &Geometry) -> Option<&'a Plugs> {
    let region = memory.find_region(vm_memory::GuestAddress(geometry.start))?;
    region.plugs().filter(|p| p.range() == (geometry.start..geometry.start + geometry.size))
}

impl VirtioDevice for VirtioMem {
    fn device_type(&self) -> u16 {
        DEVICE_TYPE
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | F_UNPLUGGED_INACCESSIBLE
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        super::copy_config(&self.shared.config_bytes(), offset, data);
    }

    fn activate(&mut self, queues: Vec<ActiveQueue>, a: Activation) -> Result<(), ActivateError> {
        self.thread.stop();
        let Ok([q]) = <[ActiveQueue; 1]>::try_from(queues) else {
            return Err(ActivateError::QueueCount { want: 1, have: 0 });
        };
        self.thread.start(Worker::new(q, a, self.shared.clone()))
    }

    /// What is plugged stays plugged across a reset (virtio 1.2 5.15.5): a new driver
    /// sees plugged_size and unplugs all first.
    fn reset(&mut self) {
        self.thread.stop();
    }

    fn pause(&mut self) -> Option<Vec<QueuePosition>> {
        // A request is answered in one pass: none is in flight.
        self.thread.pause()
    }

    fn resume(&mut self) -> Result<(), ActivateError> {
        self.thread.resume()
    }

    fn save_state(&self) -> Result<Option<Saved>, StateFault> {
        Saved::encode(&MemState::of(&crate::sync::lock(&self.shared.blocks))).map(Some)
    }

    fn restore_state(&mut self, state: Option<&Saved>) -> Result<(), StateFault> {
        let state: MemState = state.ok_or(StateFault::Missing)?.decode()?;
        let geometry = crate::sync::lock(&self.shared.blocks).geometry;
        let plugs = plugs_of(&self.memory, &geometry)
            .ok_or_else(|| StateFault::invalid("start", "guest memory has no hotpluggable region there"))?;
        self.shared.restore(plugs, &state)
    }
}

#[cfg(test)]
mod tests;
