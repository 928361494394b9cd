//! VMGenID and VMClock across snapshots, through Firecracker's API: a guest reading its
//! generation id (the `vmgenid` payload finds the id's address in the DSDT's ADDR package,
//! as Linux's driver does) and its VMClock page is snapshotted, and the snapshot is loaded
//! into two new VMMs; each restored guest sees a new id, the two differ from each other
//! and from the original, VMClock's disruption marker and generation counter moved on by
//! one, and the GED's interrupt lines (where the snapshot's device states say) were
//! raised in each.

mod common;
mod snapshot_vmm;
use common::*;
use exitless_lab::api_client::expect_ok;
use serde_json::json;
use snapshot_vmm::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// What follows `prefix` on the first line `vmm`'s guest printed that starts with it.
fn said(vmm: &Vmm, prefix: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let found = vmm.lines.lock().unwrap().iter().find_map(|l| l.strip_prefix(prefix).map(str::to_string));
        if let Some(rest) = found {
            return rest;
        }
        assert!(Instant::now() < deadline, "no {prefix:?} line: {:?}", vmm.lines.lock().unwrap());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The generation id (32 hex digits) on `vmm`'s first `prefix` line, and the PIC pair's
/// IRR printed beside it.
fn generation(vmm: &Vmm, prefix: &str) -> (String, u32) {
    let rest = said(vmm, prefix);
    let (id, irr) = rest.split_once(" irr ").unwrap_or_else(|| panic!("{rest:?}"));
    assert_eq!(id.len(), 32, "{rest:?}");
    (id.to_string(), u32::from_str_radix(irr, 16).unwrap())
}

/// Device `id`'s record in the snapshot's state file (found by its key wherever the
/// device tree sits).
fn device_record(state: &Path, id: &str) -> serde_json::Value {
    fn find<'a>(v: &'a serde_json::Value, id: &str) -> Option<&'a serde_json::Value> {
        match v {
            serde_json::Value::Object(map) => map.get(id).or_else(|| map.values().find_map(|v| find(v, id))),
            serde_json::Value::Array(items) => items.iter().find_map(|v| find(v, id)),
            _ => None,
        }
    }
    let file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(state).unwrap()).unwrap();
    find(&file, id).unwrap_or_else(|| panic!("no {id} device in {file}")).clone()
}

#[test]
fn every_restored_guest_gets_a_generation_id_of_its_own_and_a_clock_disruption() {
    if !kvm_or_skip("every_restored_guest_gets_a_generation_id_of_its_own_and_a_clock_disruption") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("a.sock");
    // Firecracker's defaults: virtio-mmio, so the GED's line is the allocators' next ISA line.
    let mut first = Vmm::start_with(&sock, &[]);
    expect_ok(&sock, "PUT", "/machine-config", Some(&json!({"vcpu_count": 1, "mem_size_mib": 64}))).unwrap();
    let boot = json!({"kernel_image_path": payloads.join("vmgenid.elf"), "boot_args": "exitless.params=1000"});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    let (original, irr) = generation(&first, "vmgenid: id ");
    assert_eq!(irr, 0, "a line was raised before any restore");
    assert_eq!(said(&first, "vmclock: "), "magic 4b4c4356 seq 0 marker 0 gen 0");
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let (state, mem) = snapshot(&sock, &dir, 0);
    first.stop_and_drain();

    let mut lines = Vec::new();
    for (id, addr) in [("vmgenid", 0xd1000), ("vmclock", 0xd2000)] {
        let record = device_record(Path::new(&state), id);
        assert_eq!(record["kind"], id, "{record}");
        assert_eq!(record["state"]["version"], 1, "{record}");
        let line = record["state"]["state"]["line"].as_u64().unwrap_or_else(|| panic!("{record}"));
        assert!(line < 16, "{id}: line {line}: a guest booted with noapic could not take it");
        assert_eq!(record["state"]["state"]["addr"], addr, "{record}");
        lines.push(line);
    }

    let mut restored = Vec::new();
    for n in 1..=2 {
        let sock = dir.join(format!("r{n}.sock"));
        let vmm = Vmm::start_with(&sock, &[]);
        load(&sock, &state, &mem);
        let (id, irr) = generation(&vmm, "vmgenid: new ");
        for line in &lines {
            assert!(irr & (1 << line) != 0, "restore {n}: line {line} not raised (IRR {irr:#x})");
        }
        // The first clock line after the restore is the one printed with the new id.
        let clock: Vec<String> =
            vmm.lines.lock().unwrap().iter().filter_map(|l| l.strip_prefix("vmclock: ").map(str::to_string)).collect();
        assert_eq!(clock.first().map(String::as_str), Some("magic 4b4c4356 seq 2 marker 1 gen 1"), "restore {n}");
        restored.push(id);
    }
    assert_ne!(restored[0], original, "the first restored guest kept the snapshot's id");
    assert_ne!(restored[1], original, "the second restored guest kept the snapshot's id");
    assert_ne!(restored[0], restored[1], "two guests restored from one snapshot share an id");
}
