//! Translation refuses unplugged blocks on every path, plugging and unplugging flips them
//! (and their host protection), an unplug waits for a copy under way rather than fault
//! it, and a discard reads back zeros whatever the memory is made of.

use super::*;
use std::os::unix::fs::FileExt;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 64 << 10;
/// The hotpluggable region: 2 MiB at 16 MiB, slots of 1 MiB.
const HP: u64 = 16 * MIB;

fn memory() -> GuestMemoryMmap {
    let ram = anonymous(&[(GuestAddress(0), MIB as usize)]).unwrap();
    with_hotplug(&ram, GuestAddress(HP), 2 * MIB as usize, BLOCK, MIB).unwrap()
}

fn plugs(mem: &GuestMemoryMmap) -> &Plugs {
    mem.find_region(GuestAddress(HP)).unwrap().plugs().unwrap()
}

/// The permissions /proc/self/maps shows for host address `at` ("rw-p", "---p").
fn protection(at: u64) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let (range, rest) = line.split_once(' ').unwrap();
        let (from, to) = range.split_once('-').unwrap();
        let (from, to) = (u64::from_str_radix(from, 16).unwrap(), u64::from_str_radix(to, 16).unwrap());
        if (from..to).contains(&at) {
            return rest[..4].to_string();
        }
    }
    panic!("{at:#x} is not mapped");
}

#[test]
fn every_path_refuses_unplugged_memory() {
    let mem = memory();
    let plugs = plugs(&mem);
    let region = mem.find_region(GuestAddress(HP)).unwrap();
    assert!(mem.get_slice(GuestAddress(HP), 16).is_err());
    assert!(mem.read_obj::<u64>(GuestAddress(HP + 8)).is_err());
    assert!(mem.write_slice(&[1; 16], GuestAddress(HP + MIB)).is_err());
    assert!(mem.get_host_address(GuestAddress(HP)).is_err());
    assert!(!mem.check_range(GuestAddress(HP), 4096));
    assert!(region.write(&[1; 4], MemoryRegionAddress(0)).is_err(), "the region's own Bytes");
    assert!(region.load::<u32>(MemoryRegionAddress(4), std::sync::atomic::Ordering::SeqCst).is_err());
    assert!(region.as_volatile_slice().is_err(), "the whole region: not all of it the guest's");
    assert_eq!(protection(plugs.host_of(HP).unwrap()), "---p", "PROT_NONE under it all");
    // RAM is untouched by any of it.
    mem.write_obj(7u64, GuestAddress(0x1000)).unwrap();
    assert_eq!(mem.read_obj::<u64>(GuestAddress(0x1000)).unwrap(), 7);
}

#[test]
fn plug_opens_whole_blocks_and_unplug_closes_and_empties_them() {
    let mem = memory();
    let plugs = plugs(&mem);
    let second = HP + BLOCK;
    plugs.plug(second..second + BLOCK).unwrap();
    mem.write_slice(&[0xaa; 64], GuestAddress(second + BLOCK - 64)).unwrap();
    assert_eq!(mem.read_obj::<u8>(GuestAddress(second)).unwrap(), 0);
    assert_eq!(protection(plugs.host_of(second).unwrap()), "rw-p");
    assert!(mem.get_host_address(GuestAddress(second + 8)).is_ok());
    // Straddling into a neighbour that is not plugged, either side: refused whole.
    assert!(mem.write_slice(&[1; 128], GuestAddress(second + BLOCK - 64)).is_err());
    assert!(mem.read_slice(&mut [0; 128], GuestAddress(second - 64)).is_err());
    // The rest of its slot (which the vCPUs now map): read-only zeros; the next slot: nothing.
    assert_eq!(protection(plugs.host_of(HP).unwrap()), "r--p");
    assert!(mem.read_obj::<u8>(GuestAddress(HP)).is_err(), "though no device reaches it");
    assert_eq!(protection(plugs.host_of(HP + MIB).unwrap()), "---p");
    // Not whole blocks, or outside the region: refused, nothing changed.
    assert!(plugs.plug(HP + 4096..HP + BLOCK).is_err());
    assert!(plugs.plug(HP - BLOCK..HP).is_err());
    assert!(plugs.unplug(HP + 2 * MIB..HP + 2 * MIB + BLOCK).is_err());
    plugs.plug(HP + 3 * BLOCK..HP + 4 * BLOCK).unwrap();
    plugs.unplug(second..second + BLOCK).unwrap();
    assert!(mem.read_obj::<u8>(GuestAddress(second)).is_err());
    assert_eq!(protection(plugs.host_of(second).unwrap()), "r--p", "its slot still mapped: read-only zeros");
    plugs.unplug(HP + 3 * BLOCK..HP + 4 * BLOCK).unwrap();
    for at in [HP, second, HP + 3 * BLOCK, HP + MIB - 4096] {
        assert_eq!(protection(plugs.host_of(at).unwrap()), "---p", "the slot's last block gone: {at:#x}");
    }
    plugs.plug(second..second + BLOCK).unwrap();
    let mut back = [0xffu8; 64];
    mem.read_slice(&mut back, GuestAddress(second + BLOCK - 64)).unwrap();
    assert_eq!(back, [0; 64], "plugged again: what the guest wrote is gone");
    assert_eq!(plugs.unprotected.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[test]
fn an_unplug_waits_for_a_copy_under_way_instead_of_faulting_it() {
    let mem = memory();
    let plugs = plugs(&mem);
    plugs.plug(HP..HP + BLOCK).unwrap();
    let slice = mem.get_slice(GuestAddress(HP), 4096).unwrap();
    std::thread::scope(|scope| {
        let unplug = scope.spawn(|| plugs.unplug(HP..HP + BLOCK));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!unplug.is_finished(), "the unplug waits for the slice");
        assert!(mem.get_slice(GuestAddress(HP), 16).is_err(), "though new accesses are refused already");
        slice.write_obj(5u32, 0).unwrap();
        drop(slice);
        unplug.join().unwrap().unwrap();
    });
    assert_eq!(protection(plugs.host_of(HP).unwrap()), "---p");
    assert_eq!(plugs.unprotected.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[test]
fn a_copy_that_outlasts_the_wait_leaves_its_block_unprotected_never_faulting() {
    let mem = memory();
    let plugs = plugs(&mem);
    plugs.plug(HP..HP + 2 * BLOCK).unwrap();
    let slice = mem.get_slice(GuestAddress(HP + BLOCK), 4096).unwrap();
    plugs.unplug(HP..HP + 2 * BLOCK).unwrap();
    assert_eq!(plugs.unprotected.load(std::sync::atomic::Ordering::SeqCst), 2);
    slice.write_obj(5u32, 0).unwrap();
    assert_eq!(slice.read_obj::<u32>(0).unwrap(), 5, "the copy under way went on (into fresh pages)");
    drop(slice);
    assert!(mem.read_obj::<u32>(GuestAddress(HP + BLOCK)).is_err(), "refused all the same");
}

#[test]
fn discard_gives_zeros_back_and_refuses_what_is_not_the_guests() {
    let mem = memory();
    let plugs = plugs(&mem);
    mem.write_slice(&[0xaa; 8192], GuestAddress(0x4000)).unwrap();
    discard(&mem, 0x4000, 4096).unwrap();
    assert_eq!(mem.read_obj::<u8>(GuestAddress(0x4000)).unwrap(), 0);
    assert_eq!(mem.read_obj::<u8>(GuestAddress(0x5000)).unwrap(), 0xaa);
    for (addr, len) in [(HP, 4096), (MIB - 4096, 8192), (0x4000, 0), (0x4001, 4096), (u64::MAX - 4095, 4096)] {
        assert!(discard(&mem, addr, len).is_err(), "{addr:#x}+{len:#x}");
    }
    // Plugged hotpluggable memory (a balloon inflated there) is the guest's to give.
    plugs.plug(HP..HP + BLOCK).unwrap();
    mem.write_obj(9u8, GuestAddress(HP)).unwrap();
    discard(&mem, HP, 4096).unwrap();
    assert_eq!(mem.read_obj::<u8>(GuestAddress(HP)).unwrap(), 0);
}

/// Issue 53, item 10: a restored guest's memory is the snapshot's file mapped privately;
/// a page it gives up (the balloon) must read zeros afterwards, not the snapshot's bytes
/// back (what MADV_DONTNEED alone does to a private file mapping).
#[test]
fn a_discarded_page_of_a_snapshot_file_reads_zeros_not_the_file() {
    let path = std::env::temp_dir().join(format!("exitless-discard-{}", std::process::id()));
    let file = std::fs::File::options().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    file.write_all_at(&[0x5a; 4 * 4096], 0).unwrap();
    let mem = crate::snapshot::memory::map_private(&file, &[(GuestAddress(0), 4 * 4096)]).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(mem.read_obj::<u8>(GuestAddress(4096)).unwrap(), 0x5a);
    discard(&mem, 4096, 2 * 4096).unwrap();
    assert_eq!(mem.read_obj::<u8>(GuestAddress(4096)).unwrap(), 0, "the snapshot's byte came back");
    assert_eq!(mem.read_obj::<u8>(GuestAddress(2 * 4096 + 9)).unwrap(), 0);
    assert_eq!(mem.read_obj::<u8>(GuestAddress(0)).unwrap(), 0x5a, "outside the range: the snapshot's");
    assert_eq!(mem.read_obj::<u8>(GuestAddress(3 * 4096)).unwrap(), 0x5a);
    mem.write_obj(3u8, GuestAddress(4096)).unwrap();
    assert_eq!(mem.read_obj::<u8>(GuestAddress(4096)).unwrap(), 3, "and takes the guest's writes");
    discard(&mem, 4096, 4096).unwrap();
    assert_eq!(mem.read_obj::<u8>(GuestAddress(4096)).unwrap(), 0, "a second discard too");
}

/// RAM shared with a vhost-user backend is one memfd: what the guest writes is in the file
/// at the region's offset (what the backend maps), and a discarded page reads zeros in
/// both views, not the file's old page.
#[test]
fn shared_ram_is_the_memfd_and_a_discard_frees_the_files_page() {
    let mem = super::shared(&[(GuestAddress(0), 0x4000), (GuestAddress(0x10000), 0x4000)]).unwrap();
    mem.write_obj(0xabcd_u64, GuestAddress(0x11000)).unwrap();
    let region = mem.iter().nth(1).unwrap();
    let file = region.file_offset().unwrap();
    assert_eq!(file.start(), 0x4000, "the second region follows the first in the file");
    let mut word = [0u8; 8];
    file.file().read_exact_at(&mut word, 0x4000 + 0x1000).unwrap();
    assert_eq!(u64::from_le_bytes(word), 0xabcd, "the backend's view");
    super::discard(&mem, 0x11000, 0x1000).unwrap();
    assert_eq!(mem.read_obj::<u64>(GuestAddress(0x11000)).unwrap(), 0);
    file.file().read_exact_at(&mut word, 0x4000 + 0x1000).unwrap();
    assert_eq!(u64::from_le_bytes(word), 0, "freed in the file too");
}

/// Shared with a vhost-user backend: the hotpluggable region as a memfd and the bytes of
/// it the file holds (allocated), read as a backend reads them: through the file.
fn shared_hotplug() -> GuestMemoryMmap {
    let ram = super::shared(&[(GuestAddress(0), MIB as usize)]).unwrap();
    with_shared_hotplug(&ram, GuestAddress(HP), 2 * MIB as usize, BLOCK, MIB).unwrap()
}

fn backend_view(mem: &GuestMemoryMmap, offset: u64) -> (u64, u64) {
    let file = mem.find_region(GuestAddress(HP)).unwrap().file_offset().unwrap().file();
    let mut word = [0u8; 8];
    file.read_exact_at(&mut word, offset).unwrap();
    let allocated = std::os::unix::fs::MetadataExt::blocks(&file.metadata().unwrap()) * 512;
    (u64::from_le_bytes(word), allocated)
}

/// A plugged block is the memfd's pages (the backend reads what the guest wrote); an
/// unplug frees them from the file (not only from the VMM's mapping) and protects the
/// VMM's view as without a backend; a plug again starts from zeros.
#[test]
fn shared_hotplug_blocks_are_the_memfds_and_an_unplug_frees_them() {
    let mem = shared_hotplug();
    let plugs = plugs(&mem);
    let region = mem.find_region(GuestAddress(HP)).unwrap();
    assert!(region.shared_file() && region.file_offset().unwrap().start() == 0, "a memfd of its own");
    assert_eq!(protection(plugs.host_of(HP).unwrap()), "---s", "PROT_NONE before any plug");
    plugs.plug(HP + BLOCK..HP + 2 * BLOCK).unwrap();
    mem.write_obj(0x5eed_u64, GuestAddress(HP + BLOCK + 8)).unwrap();
    let (seen, allocated) = backend_view(&mem, BLOCK + 8);
    assert_eq!((seen, allocated), (0x5eed, 4096), "the backend sees the guest's write, one page used");
    assert_eq!(protection(plugs.host_of(HP + BLOCK).unwrap()), "rw-s");
    assert_eq!(protection(plugs.host_of(HP).unwrap()), "r--p", "the slot's unplugged block: zeros of our own");
    assert_eq!(mem.read_obj::<u64>(GuestAddress(HP)).ok(), None, "still refused by translation");
    assert_eq!(backend_view(&mem, 0).1, 4096, "a stray read of it allocates nothing");
    plugs.unplug(HP + BLOCK..HP + 2 * BLOCK).unwrap();
    assert_eq!(backend_view(&mem, BLOCK + 8), (0, 0), "freed in the file: zeros for the backend too");
    assert_eq!(protection(plugs.host_of(HP + BLOCK).unwrap()), "---p", "the slot has no plugged block left");
    // What a backend writes into an unplugged block (a guest's stray buffer) is gone at the plug.
    let file = region.file_offset().unwrap().file();
    file.write_all_at(&[9; 8], BLOCK).unwrap();
    plugs.plug(HP + BLOCK..HP + 2 * BLOCK).unwrap();
    assert_eq!(mem.read_obj::<u64>(GuestAddress(HP + BLOCK)).unwrap(), 0);
}

/// A balloon's discard of a plugged block over the memfd frees the file's page: the
/// backend reads zeros, not the guest's old data.
#[test]
fn a_discard_of_shared_hotplug_memory_frees_the_files_page() {
    let mem = shared_hotplug();
    plugs(&mem).plug(HP..HP + BLOCK).unwrap();
    mem.write_obj(0xfeed_u64, GuestAddress(HP + 4096)).unwrap();
    assert_eq!(backend_view(&mem, 4096), (0xfeed, 4096));
    discard(&mem, HP + 4096, 4096).unwrap();
    assert_eq!(backend_view(&mem, 4096), (0, 0));
    assert_eq!(mem.read_obj::<u64>(GuestAddress(HP + 4096)).unwrap(), 0);
}

/// A restore over a memfd holding a snapshot's bytes: plugged blocks map them, the rest
/// are punched out (the backend sees no older bytes there).
#[test]
fn a_restore_over_the_memfd_keeps_plugged_bytes_and_frees_the_rest() {
    let mem = shared_hotplug();
    let file = mem.find_region(GuestAddress(HP)).unwrap().file_offset().unwrap().file();
    file.write_all_at(&[1; 8], 0).unwrap();
    file.write_all_at(&[2; 8], BLOCK).unwrap();
    plugs(&mem).restore(|b| b == 0).unwrap();
    assert_eq!(mem.read_obj::<u64>(GuestAddress(HP)).unwrap(), u64::from_le_bytes([1; 8]));
    assert_eq!(backend_view(&mem, BLOCK), (0, 4096), "block 1 punched out, block 0's page kept");
    assert!(mem.read_obj::<u64>(GuestAddress(HP + BLOCK)).is_err());
}
