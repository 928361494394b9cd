//! virtio-mem beside a vhost-user device (issue 56, item 1): the hotpluggable region is a
//! memfd the backend's memory table covers whole from the start, so a block the guest
//! plugs and writes is read by the backend through its own mapping, on a booted guest and
//! after a snapshot's load; an unplugged block's pages are freed from the file the backend
//! maps, not only from the VMM's view. The backend is the tests' stub (vhost_stub.rs),
//! which maps the files it is given; the guest is `memdma` with a virtio-blk device
//! brought up (its param 3) so that the drive is activated and handed the table.

mod common;
mod snapshot_vmm;
use common::vhost_stub::{stub_recording, Stub, TableRegion, Tables};
use common::*;
use exitless_lab::api_client::expect_ok;
use serde_json::json;
use snapshot_vmm::{load, Vmm};
use std::path::Path;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn wait_for(vmm: &Vmm, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !vmm.lines.lock().unwrap().iter().any(|l| l.contains(what)) {
        assert!(Instant::now() < deadline, "no {what:?}: {:?}", vmm.lines.lock().unwrap());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A booted memdma guest (`params`) with 128 MiB of RAM, 256 MiB hotpluggable, an entropy
/// device and a vhost-user drive on `backend`.
fn boot(sock: &Path, payloads: &Path, backend: &Path, params: &str) -> Vmm {
    let vmm = Vmm::start_with(sock, &[]);
    let boot =
        json!({"kernel_image_path": payloads.join("memdma.elf"), "boot_args": format!("exitless.params={params}")});
    expect_ok(sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(sock, "PUT", "/machine-config", Some(&json!({"vcpu_count": 1, "mem_size_mib": 128}))).unwrap();
    expect_ok(sock, "PUT", "/hotplug/memory", Some(&json!({"total_size_mib": 256}))).unwrap();
    expect_ok(sock, "PUT", "/entropy", Some(&json!({}))).unwrap();
    let drive = json!({"drive_id": "vu", "is_root_device": false, "socket": backend});
    expect_ok(sock, "PUT", "/drives/vu", Some(&drive)).unwrap();
    expect_ok(sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    vmm
}

/// Where the guest found the hotpluggable region ("hotpluggable region at ADDR, ...").
fn region_start(vmm: &Vmm) -> u64 {
    let lines = vmm.lines.lock().unwrap();
    let line = lines.iter().find_map(|l| l.split_once("hotpluggable region at ")).expect("the region's line").1;
    u64::from_str_radix(line.split(',').next().unwrap(), 16).unwrap()
}

/// The hotpluggable region in the last memory table the backend was given (a loaded
/// device's backend gets it from the device's thread, just after the load).
fn hotplug_region(tables: &Tables, start: u64) -> std::sync::MutexGuard<'_, Vec<Vec<TableRegion>>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while tables.lock().unwrap().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let tables = tables.lock().unwrap();
    let last = tables.last().expect("the backend was given no memory table");
    let found = last.iter().any(|r| r.guest_phys_addr == start && r.memory_size == 256 * MIB);
    let seen: Vec<_> = last.iter().map(|r| (r.guest_phys_addr, r.memory_size)).collect();
    assert!(found, "the table does not cover the hotpluggable region at {start:#x}: {seen:#x?}");
    tables
}

fn find(tables: &[Vec<TableRegion>], start: u64) -> &TableRegion {
    tables.last().unwrap().iter().find(|r| r.guest_phys_addr == start).unwrap()
}

fn pattern_ok(page: &[u8]) -> bool {
    (64..4096).all(|i| page[i] == (i * 7 + 3) as u8)
}

/// A block the guest plugs and writes is the backend's to read (its table covers the
/// region from the start); unplugged blocks hold no pages of the file. Snapshotted and
/// loaded into a new VMM with a new backend: the table it gets covers the region again,
/// holding the block as saved, and the restored guest reads its block back and plugs more.
#[test]
fn a_vhost_user_backend_reads_plugged_memory_booted_and_restored() {
    if !kvm_or_skip("a_vhost_user_backend_reads_plugged_memory_booted_and_restored") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let backend = dir.join("vu.sock");
    let tables = Tables::default();
    let stub_a = stub_recording(&backend, Stub::Good, tables.clone());
    let sock = dir.join("a.sock");
    let mut a = boot(&sock, &payloads, &backend, "0,2,0,1");
    wait_for(&a, "driver ready");
    wait_for(&a, "virtio-blk ready");
    expect_ok(&sock, "PATCH", "/hotplug/memory", Some(&json!({"requested_size_mib": 2}))).unwrap();
    wait_for(&a, "pattern written");
    let start = region_start(&a);
    {
        let tables = hotplug_region(&tables, start);
        let region = find(&tables, start);
        assert!(pattern_ok(&region.read(start, 4096)), "the backend reads what the guest wrote in its plugged block");
        assert_eq!(region.read(start + 2 * MIB, 8), [0; 8], "the next (unplugged) block");
        assert!(region.allocated() <= 2 * MIB, "only the plugged block holds pages: {}", region.allocated());
    }
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let (state, mem) = (dir.join("s.json"), dir.join("m.bin"));
    let create = json!({"snapshot_type": "Full", "snapshot_path": state, "mem_file_path": mem});
    expect_ok(&sock, "PUT", "/snapshot/create", Some(&create)).unwrap();
    a.stop_and_drain();
    stub_a.join().unwrap();

    let restored = Tables::default();
    let stub_b = stub_recording(&backend, Stub::Good, restored.clone());
    let sock = dir.join("b.sock");
    let mut b = Vmm::start_with(&sock, &[]);
    load(&sock, &state.display().to_string(), &mem.display().to_string());
    {
        let tables = hotplug_region(&restored, start);
        let region = find(&tables, start);
        assert!(pattern_ok(&region.read(start, 4096)), "the restored block, as the new backend sees it");
        assert!(region.allocated() <= 2 * MIB, "only the plugged block holds pages: {}", region.allocated());
    }
    expect_ok(&sock, "PATCH", "/hotplug/memory", Some(&json!({"requested_size_mib": 4}))).unwrap();
    wait_for(&b, "after the snapshot");
    let done = "memdma: after the snapshot, 2 MiB plugged, the pattern read back, 0 failed";
    assert!(b.lines.lock().unwrap().iter().any(|l| l == done), "{:?}", b.lines.lock().unwrap());
    b.stop_and_drain();
    stub_b.join().unwrap();
}

/// The guest plugs a block, writes it, unplugs it and plugs it back (memdma's plug
/// round): its checks pass with the backend attached, and once it is done the file the
/// backend maps holds none of what it wrote: the unplug freed the pages.
#[test]
fn an_unplug_frees_the_pages_the_backend_maps() {
    if !kvm_or_skip("an_unplug_frees_the_pages_the_backend_maps") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let backend = dir.join("vu.sock");
    let tables = Tables::default();
    let stub = stub_recording(&backend, Stub::Good, tables.clone());
    let sock = dir.join("api.sock");
    let mut vmm = boot(&sock, &payloads, &backend, "0,1,0,1");
    wait_for(&vmm, "driver ready");
    expect_ok(&sock, "PATCH", "/hotplug/memory", Some(&json!({"requested_size_mib": 2}))).unwrap();
    wait_for(&vmm, "plugged, unplugged and plugged back");
    let deadline = Instant::now() + Duration::from_secs(60);
    while vmm.child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    vmm.stop_and_drain();
    stub.join().unwrap();
    let lines = vmm.lines.lock().unwrap().join("\n");
    assert!(lines.contains("plugged, unplugged and plugged back, 0 failed"), "{lines}");
    let start = region_start(&vmm);
    let tables = hotplug_region(&tables, start);
    let region = find(&tables, start);
    // The guest's DMA (64 bytes at the block's start) and CPU write (at +4 KiB) are gone.
    assert_eq!(region.read(start, 64), [0; 64], "{lines}");
    assert_eq!(region.read(start + 4096, 8), [0; 8], "{lines}");
    // What the plugged-back block's reads touched at most: the two pages it checked.
    assert!(region.allocated() <= 2 * 4096, "pages left in the file: {}", region.allocated());
}
