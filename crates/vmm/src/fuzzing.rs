//! Entry points for coverage-guided fuzzing (`fuzz/`, cargo-fuzz) and for the stable
//! test that replays the kept corpora (`tests/fuzz_corpus.rs`): each takes arbitrary
//! bytes, drives one parser or device model that guests or users feed, and must neither
//! panic nor loop.

use crate::boot::{self, BootSpec};
use crate::bus::{BusDevice, BusSet, DeviceId, SharedBuses};
use crate::ioeventfd::{IoeventfdLimits, IoeventfdRegistry};
use crate::layout::MemoryMap;
use crate::pci::cf8::Cf8Device;
use crate::pci::ecam::{EcamDevice, EcamShadow};
use crate::pci::{host_bridge, EcamMode, PciRoot};
use crate::testing::FakeKvm;
use crate::virtio::blk::request::{self, Parser};
use std::sync::Arc;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// A fuzz target's entry point.
pub type Target = fn(&[u8]);

/// The targets, by name (the corpus directories are named after them).
pub const TARGETS: &[(&str, Target)] = &[("loader", loader), ("blk_request", blk_request), ("pci_config", pci_config)];

/// A file a user passes as `--kernel`: every image kind's loader, on 16 MiB of RAM.
pub fn loader(data: &[u8]) {
    let Ok(map) = MemoryMap::new(16 << 20) else { return };
    let regions: Vec<_> = map.ram_regions().iter().map(|&(s, n)| (GuestAddress(s), n as usize)).collect();
    let Ok(mem) = GuestMemoryMmap::<()>::from_ranges(&regions) else { return };
    let spec = BootSpec { cmdline: "console=ttyS0", initrd: Some(b"initrd"), rsdp: 0xe0000 };
    let _ = boot::load(&mem, &map, data, &spec);
}

/// Guest memory holding a virtqueue of 16 entries (descriptors at 0, avail ring at
/// 0x800, used ring at 0x1000) and buffers, all from the input: every chain the device
/// would pop is parsed as a virtio-blk request, then returned.
pub fn blk_request(data: &[u8]) {
    let Ok(mem) = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]) else { return };
    let _ = mem.write_slice(&data[..data.len().min(0x10000)], GuestAddress(0));
    let mut queue = match Queue::new(16) {
        Ok(q) => q,
        Err(_) => return,
    };
    queue.set_size(16);
    queue.set_desc_table_address(Some(0), Some(0));
    queue.set_avail_ring_address(Some(0x800), Some(0));
    queue.set_used_ring_address(Some(0x1000), Some(0));
    queue.set_event_idx(true);
    queue.set_ready(true);
    let mut parser = Parser::default();
    for _ in 0..64 {
        let Some(chain) = queue.pop_descriptor_chain(&mem) else { break };
        let head = chain.head_index();
        if let Ok(req) = parser.parse(chain, &mem) {
            let _ = request::byte_range(req.sector, req.data_len as u64, 1 << 30);
            let _ = request::Range::read(&mem, &parser.data);
        }
        let _ = queue.add_used(&mem, head, 1);
    }
    let _ = queue.needs_notification(&mem);
}

/// Config space through 0xCF8/0xCFC and ECAM: the input is a list of 8-byte operations
/// (kind, size, offset, value) against a host bridge and a function with memory and
/// I/O BARs, so BAR sizing, moves and decode toggles all happen.
pub fn pci_config(data: &[u8]) {
    let kvm = Arc::new(FakeKvm::default());
    let buses = Arc::new(SharedBuses::new(BusSet::default()));
    let ioeventfds = Arc::new(IoeventfdRegistry::new(kvm.clone(), IoeventfdLimits::default()));
    let Ok(shadow) = EcamShadow::new(kvm, crate::layout::ECAM_GPA, 1) else { return };
    let Ok(map) = MemoryMap::new(256 << 20) else { return };
    let Ok(root) = PciRoot::new(buses, ioeventfds, shadow, EcamMode::Mapped, map.pci_windows()) else { return };
    let root = Arc::new(root);
    let _ = root.add(0, 0, host_bridge());
    let bell = Arc::new(crate::devices::Doorbell::default());
    let _ =
        root.add(1, 0, crate::devices::doorbell::pci_function(bell, (DeviceId(0), 0xd000_0000), (DeviceId(1), 0x510)));
    let (cf8, ecam) = (Cf8Device::new(root.clone()), EcamDevice::new(root));
    for op in data.chunks_exact(8) {
        let size = [1usize, 2, 4, 4][usize::from(op[1] & 3)];
        let offset = u64::from(u16::from_le_bytes([op[2], op[3]]));
        let device = u64::from(op[1] >> 2 & 3);
        let value = [op[4], op[5], op[6], op[7]];
        let mut buf = [0u8; 4];
        match op[0] & 3 {
            0 => cf8.write(offset & 7, &value[..size]),
            1 => cf8.read(offset & 7, &mut buf[..size]),
            // ECAM: bus 0, devices 0-3, any register of function 0.
            2 => ecam.write(device << 15 | (offset & 0xfff), &value[..size]),
            _ => ecam.read(device << 15 | (offset & 0xfff), &mut buf[..size]),
        }
    }
}
