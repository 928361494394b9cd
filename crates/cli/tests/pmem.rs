//! Firecracker's `/pmem/{id}` on a payload guest (a Linux guest mounts one with DAX in
//! scripts/linux-memory.sh): the rules before the start, the file opened at the start,
//! the device placed past the 64-bit PCI window in its own memory slot, its limits
//! patched after the start.

mod common;
use common::*;
use exitless_lab::api_client::expect_ok;
use serde_json::json;

#[test]
fn pmem_devices_are_configured_started_and_patched_as_firecracker() {
    if !kvm_or_skip("pmem_devices_are_configured_started_and_patched_as_firecracker") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let (image, drive) = (dir.join("pmem.img"), dir.join("root.img"));
    std::fs::write(&image, vec![7u8; 3 << 20]).unwrap();
    std::fs::write(&drive, vec![0u8; 1 << 16]).unwrap();
    let sock = dir.join("api.sock");
    let boot = json!({"kernel_image_path": payloads.join("wait.elf")});
    let pmem = |id: &str, path: &std::path::Path, root: bool| json!({"id": id, "path_on_host": path, "root_device": root, "read_only": true});

    let mut child = api_process(&sock, std::process::Stdio::null());
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    let why = fault(&sock, "PUT", "/pmem/p0", pmem("p1", &image, false));
    assert_eq!(why, "The id from the path does not match the id from the body!");
    let why = fault(&sock, "PUT", "/pmem/p0", json!({"id": "p0", "path_on_host": image, "bogus": 1}));
    assert!(why.contains("bogus"), "{why}");
    expect_ok(&sock, "PUT", "/pmem/p0", Some(&pmem("p0", &image, true))).unwrap();
    let why = fault(&sock, "PUT", "/pmem/p1", pmem("p1", &image, true));
    assert_eq!(why, "Pmem config error: A root pmem device already exist");
    // The same file twice, shared: one read-only mapping each.
    expect_ok(&sock, "PUT", "/pmem/p1", Some(&pmem("p1", &image, false))).unwrap();
    let config = expect_ok(&sock, "GET", "/vm/config", None).unwrap().unwrap();
    assert_eq!(config["pmem"].as_array().map(Vec::len), Some(2), "{config}");
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    // After the start on PCI, a PUT is a hotplug (crates/cli/tests/pci_hotplug.rs): never a root.
    let why = fault(&sock, "PUT", "/pmem/p2", pmem("p2", &image, true));
    assert!(why.contains("A root pmem device already exist"), "{why}");
    let limiter = json!({"id": "p0", "rate_limiter": {"ops": {"size": 10, "refill_time": 100}}});
    expect_ok(&sock, "PATCH", "/pmem/p0", Some(&limiter)).unwrap();
    let why = fault(&sock, "PATCH", "/pmem/p9", json!({"id": "p9"}));
    assert!(why.contains("Unable to patch the pmem device"), "{why}");
    let exits = expect_ok(&sock, "GET", "/exits", None).unwrap().unwrap();
    assert!(exits.to_string().contains("virtio-pmem1"), "both devices attached: {exits}");
    let _ = child.kill();
    let _ = child.wait();

    // A block root and a pmem root exclude each other; a missing file fails the start.
    let mut child = api_process(&sock, std::process::Stdio::null());
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    let root = json!({"drive_id": "root", "path_on_host": drive, "is_root_device": true, "is_read_only": false});
    expect_ok(&sock, "PUT", "/drives/root", Some(&root)).unwrap();
    let why = fault(&sock, "PUT", "/pmem/p0", pmem("p0", &image, true));
    assert!(why.contains("while the root device defined as a block device"), "{why}");
    expect_ok(&sock, "PUT", "/pmem/gone", Some(&pmem("gone", &dir.join("missing.img"), false))).unwrap();
    let why = fault(&sock, "PUT", "/actions", json!({"action_type": "InstanceStart"}));
    assert!(why.contains("missing.img"), "{why}");
    assert_eq!(expect_ok(&sock, "GET", "/", None).unwrap().unwrap()["state"], "Not started");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_snapshot_puts_pmem_back_where_it_was_or_refuses_a_file_that_changed_size() {
    if !kvm_or_skip("a_snapshot_puts_pmem_back_where_it_was_or_refuses_a_file_that_changed_size") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let image = dir.join("pmem.img");
    std::fs::write(&image, vec![1u8; 2 << 20]).unwrap();
    let sock = dir.join("api.sock");
    let mut child = api_process(&sock, std::process::Stdio::null());
    expect_ok(&sock, "PUT", "/boot-source", Some(&json!({"kernel_image_path": payloads.join("wait.elf")}))).unwrap();
    expect_ok(&sock, "PUT", "/pmem/p0", Some(&json!({"id": "p0", "path_on_host": image}))).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let (state, mem) = (dir.join("state"), dir.join("mem"));
    expect_ok(&sock, "PUT", "/snapshot/create", Some(&json!({"snapshot_path": state, "mem_file_path": mem}))).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let load = json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": mem}, "resume_vm": true});
    let restored = dir.join("restored.sock");
    let mut child = api_process_with(&restored, std::process::Stdio::null(), &[]);
    expect_ok(&restored, "PUT", "/snapshot/load", Some(&load)).unwrap();
    assert_eq!(expect_ok(&restored, "GET", "/", None).unwrap().unwrap()["state"], "Running");
    let _ = child.kill();
    let _ = child.wait();
    // The file grew past its 2 MiB: the device would sit elsewhere than the guest knows.
    std::fs::write(&image, vec![1u8; (2 << 20) + 1]).unwrap();
    let mut child = api_process_with(&restored, std::process::Stdio::null(), &[]);
    let why = fault(&restored, "PUT", "/snapshot/load", load);
    assert!(why.contains("device memory") || why.contains("virtio-pmem/p0"), "{why}");
    let _ = child.kill();
    let _ = child.wait();
}
