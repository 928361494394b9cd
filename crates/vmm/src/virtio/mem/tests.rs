//! virtio-mem's queue driven as Linux's driver would (and as a hostile one would): slots
//! mapped with the first plugged block and removed with the last, unplugged memory
//! discarded, every bad request answered with an error and counted.

use super::worker::Worker;
use super::*;
use crate::guest_memory::GuestMemoryMmap;
use crate::testing::{activation, DriverQueue, FakeKvm};
use std::sync::atomic::Ordering;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 64 << 10;
/// The region: 2 MiB at 1 MiB, slots of 1 MiB.
const START: u64 = MIB;
const REQ: u64 = 0x8000;
const RESP: u64 = 0x9000;

/// RAM below the region and above it (the requests and responses live in the first).
fn setup(requested: u64) -> (GuestMemoryMmap, Arc<MemShared>, Arc<FakeKvm>) {
    let ram = crate::guest_memory::anonymous(&[(GuestAddress(0), MIB as usize), (GuestAddress(3 * MIB), MIB as usize)]);
    let mem = crate::guest_memory::with_hotplug(&ram.unwrap(), GuestAddress(START), 2 * MIB as usize, BLOCK, MIB);
    let mem = mem.unwrap();
    let kvm = Arc::new(FakeKvm::default());
    let geometry = Geometry { start: START, size: 2 * MIB, block_size: BLOCK, slot_size: MIB };
    assert!(plugs_of(&mem, &geometry).is_some());
    let device = VirtioMem::new(geometry, 40..42, kvm.clone(), mem.clone()).unwrap();
    device.shared.request(requested).unwrap();
    (mem, device.shared.clone(), kvm)
}

/// Posts one request per (type, addr, blocks) and runs the device over them; the
/// responses' (type, state).
fn drive(mem: &GuestMemoryMmap, shared: &Arc<MemShared>, requests: &[(u16, u64, u16)]) -> Vec<(u16, u16)> {
    let mut q = DriverQueue::new(0);
    for (i, &(kind, addr, count)) in requests.iter().enumerate() {
        let (req, resp) = (REQ + 32 * i as u64, RESP + 16 * i as u64);
        let mut bytes = [0u8; 24];
        bytes[..2].copy_from_slice(&kind.to_le_bytes());
        bytes[8..16].copy_from_slice(&addr.to_le_bytes());
        bytes[16..18].copy_from_slice(&count.to_le_bytes());
        mem.write_slice(&bytes, GuestAddress(req)).unwrap();
        mem.write_slice(&[0xee; 10], GuestAddress(resp)).unwrap();
        q.post(mem, &[(req, 24, false), (resp, 10, true)]);
    }
    let kick = Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
    Worker::new(ActiveQueue { queue: q.device_queue(), kick }, activation(mem), shared.clone()).process();
    assert_eq!(usize::from(q.used(mem)), requests.len(), "every request answered");
    (0..requests.len())
        .map(|i| {
            let at = RESP + 16 * i as u64;
            (mem.read_obj(GuestAddress(at)).unwrap(), mem.read_obj(GuestAddress(at + 8)).unwrap())
        })
        .collect()
}

const PLUG: u16 = 0;
const UNPLUG: u16 = 1;
const UNPLUG_ALL: u16 = 2;
const STATE: u16 = 3;
const ACK: u16 = 0;
const NACK: u16 = 1;
const ERROR: u16 = 3;

#[test]
fn plugging_maps_the_slot_and_unplugging_the_last_block_removes_and_discards_it() {
    let (mem, shared, kvm) = setup(2 * BLOCK);
    let answers = drive(&mem, &shared, &[(PLUG, START, 2), (STATE, START, 2)]);
    assert_eq!(answers, [(ACK, 0), (ACK, RangeState::Plugged as u16)]);
    assert_eq!(*kvm.slots.lock().unwrap(), [(40, START, MIB)], "slot 0 mapped, slot 1 not");
    assert_eq!(shared.status().plugged_size_mib, 0, "128 KiB: under a MiB");
    assert_eq!(crate::sync::lock(&shared.blocks).plugged_size, 2 * BLOCK);
    mem.write_slice(&[0xaa; 16], GuestAddress(START)).unwrap();
    let answers = drive(&mem, &shared, &[(UNPLUG, START, 1), (UNPLUG, START + BLOCK, 1)]);
    assert_eq!(answers, [(ACK, 0), (ACK, 0)]);
    assert!(kvm.slots.lock().unwrap().is_empty(), "the last block unplugged: the slot is removed");
    assert!(mem.read_obj::<u8>(GuestAddress(START)).is_err(), "unplugged: not the guest's");
    assert_eq!(shared.stats.plugs.load(Ordering::Relaxed), 1);
    assert_eq!(shared.stats.unplugs.load(Ordering::Relaxed), 2);
    assert_eq!(drive(&mem, &shared, &[(PLUG, START, 1)]), [(ACK, 0)]);
    assert_eq!(mem.read_obj::<u8>(GuestAddress(START)).unwrap(), 0, "plugged again: discarded");
}

/// Issue 53, item 3, at the device: a chain into a block is walked only while the block
/// is plugged; before and after, it is a bad chain (outside guest memory), and so is one
/// that runs from a plugged block into one that is not.
#[test]
fn a_device_reaches_a_block_only_while_the_driver_has_it_plugged() {
    let (mem, shared, _) = setup(2 * BLOCK);
    let walk = |bufs: &[(u64, u32, bool)]| {
        let mut q = DriverQueue::new(1);
        q.post(&mem, bufs);
        let mut queue = q.device_queue();
        let chain = virtio_queue::QueueT::pop_descriptor_chain(&mut queue, &mem).unwrap();
        crate::virtio::chain::walk(chain, &mem, usize::MAX, &mut Vec::new())
    };
    let into_block = [(START + BLOCK, 4096, true)];
    assert!(matches!(walk(&into_block), Err(crate::virtio::chain::ChainError::OutsideMemory(..))));
    assert_eq!(drive(&mem, &shared, &[(PLUG, START + BLOCK, 1)]), [(ACK, 0)]);
    assert_eq!(walk(&into_block), Ok(4096));
    assert!(walk(&[(START + 2 * BLOCK - 64, 128, true)]).is_err(), "into the next block, not plugged");
    assert!(walk(&[(0x30000, 64, true), (START, 64, true)]).is_err(), "RAM, then a block not plugged");
    assert_eq!(drive(&mem, &shared, &[(UNPLUG, START + BLOCK, 1)]), [(ACK, 0)]);
    assert!(walk(&into_block).is_err());
}

/// UNPLUG_ALL closes every block, across slots, to every device.
#[test]
fn unplug_all_closes_the_whole_region() {
    let (mem, shared, kvm) = setup(2 * MIB);
    assert_eq!(drive(&mem, &shared, &[(PLUG, START, 4), (PLUG, START + MIB, 1)]), [(ACK, 0), (ACK, 0)]);
    assert_eq!(kvm.slots.lock().unwrap().len(), 2);
    assert_eq!(drive(&mem, &shared, &[(UNPLUG_ALL, 0, 0)]), [(ACK, 0)]);
    for at in [START, START + 3 * BLOCK, START + MIB] {
        assert!(mem.read_obj::<u8>(GuestAddress(at)).is_err(), "{at:#x}");
    }
    assert_eq!(shared.stats.discard_failures.load(Ordering::Relaxed), 0);
}

#[test]
fn a_hostile_driver_is_answered_with_errors_and_nothing_changes() {
    let (mem, shared, kvm) = setup(2 * BLOCK);
    let answers = drive(
        &mem,
        &shared,
        &[
            (PLUG, START - BLOCK, 1),      // below the region
            (PLUG, START + 1, 1),          // unaligned
            (PLUG, START + MIB, 1),        // past the usable region (1 MiB: one slot)
            (PLUG, START, 3),              // past the requested size: not now
            (UNPLUG, START, 1),            // never plugged
            (PLUG, START, 0),              // no blocks
            (9, START, 1),                 // no such request
            (STATE, u64::MAX - 10, 0xfff), // overflowing
        ],
    );
    assert_eq!(
        answers.iter().map(|a| a.0).collect::<Vec<_>>(),
        [ERROR, ERROR, ERROR, NACK, ERROR, ERROR, ERROR, ERROR]
    );
    assert_eq!(shared.stats.refused.load(Ordering::Relaxed), 8);
    assert!(kvm.slots.lock().unwrap().is_empty());
    assert_eq!(crate::sync::lock(&shared.blocks).plugged_size, 0);
}

#[test]
fn unplug_all_removes_every_slot_and_a_bad_chain_is_refused_and_used() {
    let (mem, shared, kvm) = setup(2 * MIB);
    let answers = drive(&mem, &shared, &[(PLUG, START + MIB - BLOCK, 2), (UNPLUG_ALL, 0, 0)]);
    assert_eq!(answers, [(ACK, 0), (ACK, 0)]);
    assert!(kvm.slots.lock().unwrap().is_empty());
    // A response the driver made read-only, and a request too short.
    let mut q = DriverQueue::new(0);
    q.post(&mem, &[(REQ, 24, false), (RESP, 10, false)]);
    q.post(&mem, &[(REQ, 8, false), (RESP, 10, true)]);
    let kick = Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
    Worker::new(ActiveQueue { queue: q.device_queue(), kick }, activation(&mem), shared.clone()).process();
    assert_eq!(q.used(&mem), 2);
    assert_eq!(shared.stats.bad_chains.load(Ordering::Relaxed), 2);
}

#[test]
fn the_requested_size_is_checked_and_grows_the_usable_region_in_slots() {
    let (_mem, shared, _) = setup(0);
    assert_eq!(shared.request(BLOCK + 1), Err(MemError::InvalidSize(BLOCK + 1)));
    assert_eq!(shared.request(4 * MIB), Err(MemError::InvalidSize(4 * MIB)));
    shared.request(3 * BLOCK).unwrap();
    let config = shared.config_bytes();
    let field = |at: usize| u64::from_le_bytes(config[at..at + 8].try_into().unwrap());
    assert_eq!(
        [field(0), field(16), field(24), field(32), field(40), field(48)],
        [BLOCK, START, 2 * MIB, MIB, 0, 3 * BLOCK]
    );
}

/// A snapshot's virtio-mem: the plug record saved, and put back on a region mapped from
/// the memory file: the plugged blocks hold the file's bytes and each slot with one is
/// mapped; an unplugged block stays refused and shows none of the file's bytes there. A
/// damaged record is refused naming its field, with nothing plugged.
#[test]
fn a_saved_plug_record_opens_the_plugged_blocks_over_the_file_and_a_damaged_one_is_named() {
    use crate::persist::state::tests::line;
    use std::os::unix::fs::FileExt;
    let (mem, shared, _) = setup(2 * MIB);
    assert_eq!(drive(&mem, &shared, &[(PLUG, START, 1), (PLUG, START + MIB, 2)]), [(ACK, 0), (ACK, 0)]);
    let saved = Saved::encode(&MemState::of(&crate::sync::lock(&shared.blocks))).unwrap();
    assert_eq!(saved.state["plugged"], serde_json::json!([1 | 3 << 16]), "blocks 0, 16 and 17");
    // The memory file's region: the plugged blocks' bytes, and older bytes in block 1.
    let file = vmm_sys_util::tempfile::TempFile::new().unwrap().into_file();
    file.set_len(2 * MIB).unwrap();
    for (at, byte) in [(0, 0xaa), (BLOCK, 0xbb), (MIB, 0xcc)] {
        file.write_all_at(&[byte; 16], at).unwrap();
    }
    let ram = crate::guest_memory::anonymous(&[(GuestAddress(0), MIB as usize)]).unwrap();
    let from = vm_memory::FileOffset::new(file, 0);
    let region = (GuestAddress(START), 2 * MIB as usize, BLOCK, MIB);
    let restored = crate::guest_memory::with_hotplug_from(&ram, region.0, region.1, region.2, region.3, Some(from));
    let restored = restored.unwrap();
    let kvm = Arc::new(FakeKvm::default());
    let geometry = Geometry { start: START, size: 2 * MIB, block_size: BLOCK, slot_size: MIB };
    let mut device = VirtioMem::new(geometry, 40..42, kvm.clone(), restored.clone()).unwrap();
    let damages = [
        ("plugged_size", serde_json::json!(BLOCK), "`plugged_size` does not fit this device: 0x10000, and 3 blocks"),
        ("block_size", serde_json::json!(2 * BLOCK), "`block_size` does not fit this device"),
        ("plugged", serde_json::json!([1, 0]), "`plugged` does not fit this device: 2 words for 32 blocks"),
        ("plugged", serde_json::json!("all"), "`plugged` does not parse"),
    ];
    for (field, value, words) in damages {
        let mut damaged = saved.clone();
        damaged.state[field] = value;
        let e = line(&device.restore_state(Some(&damaged)).unwrap_err().of("virtio-mem"));
        assert!(e.starts_with(&format!("virtio-mem: its state's field {words}")), "{e}");
        assert!(!e.contains('\n'));
    }
    assert!(kvm.slots.lock().unwrap().is_empty() && restored.read_obj::<u8>(GuestAddress(START)).is_err());
    assert!(matches!(device.restore_state(None), Err(StateFault::Missing)));
    device.restore_state(Some(&saved)).unwrap();
    assert_eq!(*kvm.slots.lock().unwrap(), [(40, START, MIB), (41, START + MIB, MIB)]);
    assert_eq!(restored.read_obj::<u8>(GuestAddress(START)).unwrap(), 0xaa);
    assert_eq!(restored.read_obj::<u8>(GuestAddress(START + MIB + 15)).unwrap(), 0xcc);
    assert!(restored.read_obj::<u8>(GuestAddress(START + BLOCK)).is_err(), "block 1 is not plugged");
    let plugs = plugs_of(&restored, &geometry).unwrap();
    let host = plugs.host_of(START + BLOCK).unwrap() as *const u8;
    // SAFETY: block 1 of the region's mapping, which `restored` keeps; an unplugged block
    // of a mapped slot is readable (zeros), as the guest's vCPUs see it.
    assert_eq!(unsafe { host.read_volatile() }, 0, "the file's older bytes are not the guest's");
    let b = crate::sync::lock(&device.shared.blocks);
    assert_eq!((b.plugged_size, b.requested_size, b.usable_region_size), (3 * BLOCK, 2 * MIB, 2 * MIB));
}
