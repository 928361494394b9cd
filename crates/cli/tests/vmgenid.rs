//! VMGenID across snapshots, through Firecracker's API: a guest reading its generation id
//! (the `vmgenid` payload finds the id's address in the DSDT's ADDR package, as Linux's
//! driver does) is snapshotted, and the snapshot is loaded into two new VMMs; each restored
//! guest sees a new id, the two differ from each other and from the original, and the
//! GED's interrupt line (where the snapshot's device state says) was raised in each.

mod common;
mod snapshot_vmm;
use common::*;
use exitless_lab::api_client::expect_ok;
use serde_json::json;
use snapshot_vmm::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// The first line `vmm`'s guest printed that starts with `prefix`: its id (32 hex digits)
/// and the PIC pair's IRR it printed beside.
fn generation(vmm: &Vmm, prefix: &str) -> (String, u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let found = vmm.lines.lock().unwrap().iter().find_map(|l| l.strip_prefix(prefix).map(str::to_string));
        if let Some(rest) = found {
            let (id, irr) = rest.split_once(" irr ").unwrap_or_else(|| panic!("{rest:?}"));
            assert_eq!(id.len(), 32, "{rest:?}");
            return (id.to_string(), u32::from_str_radix(irr, 16).unwrap());
        }
        assert!(Instant::now() < deadline, "no {prefix:?} line: {:?}", vmm.lines.lock().unwrap());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The VMGenID device's state as the snapshot's state file holds it (found by its key
/// wherever the device tree sits).
fn vmgenid_record(state: &Path) -> serde_json::Value {
    fn find(v: &serde_json::Value) -> Option<&serde_json::Value> {
        match v {
            serde_json::Value::Object(map) => map.get("vmgenid").or_else(|| map.values().find_map(find)),
            serde_json::Value::Array(items) => items.iter().find_map(find),
            _ => None,
        }
    }
    let file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(state).unwrap()).unwrap();
    find(&file).unwrap_or_else(|| panic!("no vmgenid device in {file}")).clone()
}

#[test]
fn every_restored_guest_gets_a_generation_id_of_its_own() {
    if !kvm_or_skip("every_restored_guest_gets_a_generation_id_of_its_own") {
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
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let (state, mem) = snapshot(&sock, &dir, 0);
    first.stop_and_drain();

    let record = vmgenid_record(Path::new(&state));
    assert_eq!(record["kind"], "vmgenid", "{record}");
    assert_eq!(record["state"]["version"], 1, "{record}");
    let line = record["state"]["state"]["line"].as_u64().unwrap_or_else(|| panic!("{record}"));
    assert!(line < 16, "line {line}: a guest booted with noapic could not take it");
    assert_eq!(record["state"]["state"]["addr"], 0xd1000, "{record}");

    let mut restored = Vec::new();
    for n in 1..=2 {
        let sock = dir.join(format!("r{n}.sock"));
        let vmm = Vmm::start_with(&sock, &[]);
        load(&sock, &state, &mem);
        let (id, irr) = generation(&vmm, "vmgenid: new ");
        assert!(irr & (1 << line) != 0, "restore {n}: line {line} not raised (IRR {irr:#x})");
        restored.push(id);
    }
    assert_ne!(restored[0], original, "the first restored guest kept the snapshot's id");
    assert_ne!(restored[1], original, "the second restored guest kept the snapshot's id");
    assert_ne!(restored[0], restored[1], "two guests restored from one snapshot share an id");
}
