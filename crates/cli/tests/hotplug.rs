//! Firecracker's `/hotplug/memory` on a payload guest (a Linux guest plugs and unplugs
//! 256 MiB in scripts/linux-memory.sh): Firecracker's rules before the start, the
//! region placed and reported once started, the requested size refused until a driver
//! runs, and a snapshot refused rather than written without the region.

mod common;
use common::*;
use exitless_lab::api_client::expect_ok;
use serde_json::json;

#[test]
fn hotplug_memory_is_configured_reported_and_refused_as_firecracker() {
    if !kvm_or_skip("hotplug_memory_is_configured_reported_and_refused_as_firecracker") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("api.sock");
    let mut child = api_process_with(&sock, std::process::Stdio::null(), &[]);
    expect_ok(&sock, "PUT", "/boot-source", Some(&json!({"kernel_image_path": payloads.join("wait.elf")}))).unwrap();
    let why = fault(&sock, "GET", "/hotplug/memory", json!({}));
    assert!(why.contains("Not started"), "{why}");
    for (body, words) in [
        (json!({"total_size_mib": 1024, "block_size_mib": 1}), "Block size must not be lower than 2 MiB"),
        (json!({"total_size_mib": 1024, "block_size_mib": 3}), "Block size must be a power of 2"),
        (json!({"total_size_mib": 1024, "slot_size_mib": 64}), "Slot size must not be lower than 128 MiB"),
        (
            json!({"total_size_mib": 1024, "block_size_mib": 256}),
            "Slot size must be a multiple of block size (256 MiB)",
        ),
        (json!({"total_size_mib": 64}), "Total size must not be lower than slot size (128 MiB)"),
        (json!({"total_size_mib": 200}), "Total size must be a multiple of slot size (128 MiB)"),
    ] {
        let why = fault(&sock, "PUT", "/hotplug/memory", body.clone());
        assert_eq!(why, format!("Memory hotplug config error: {words}"), "{body}");
    }
    let why = fault(&sock, "PUT", "/hotplug/memory", json!({"total_size_mib": -1}));
    assert!(why.contains("invalid value"), "{why}");
    let why = fault(&sock, "PUT", "/hotplug/memory", json!({"total_size_mib": 256, "bogus": 1}));
    assert!(why.contains("bogus"), "{why}");
    let why = fault(&sock, "PATCH", "/hotplug/memory", json!({"requested_size_mib": 128}));
    assert!(why.contains("Not started"), "{why}");
    expect_ok(&sock, "PUT", "/hotplug/memory", Some(&json!({"total_size_mib": 256}))).unwrap();
    let config = expect_ok(&sock, "GET", "/vm/config", None).unwrap().unwrap();
    let want = json!({"total_size_mib": 256, "block_size_mib": 2, "slot_size_mib": 128});
    assert_eq!(config["memory-hotplug"], want, "{config}");
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();

    let status = expect_ok(&sock, "GET", "/hotplug/memory", None).unwrap().unwrap();
    let want = json!({"block_size_mib": 2, "total_size_mib": 256, "slot_size_mib": 128,
                      "plugged_size_mib": 0, "requested_size_mib": 0});
    assert_eq!(status, want);
    let why = fault(&sock, "PUT", "/hotplug/memory", json!({"total_size_mib": 256}));
    assert!(why.contains("not supported after starting"), "{why}");
    // The payload has no virtio-mem driver: Firecracker's refusal, and nothing changes.
    let why = fault(&sock, "PATCH", "/hotplug/memory", json!({"requested_size_mib": 128}));
    assert_eq!(why, "Memory hotplug update error: Failed to create memory hotplug device: Device is not active");
    let status = expect_ok(&sock, "GET", "/hotplug/memory", None).unwrap().unwrap();
    assert_eq!(status["requested_size_mib"], 0);
    let exits = expect_ok(&sock, "GET", "/exits", None).unwrap().unwrap();
    assert!(exits.to_string().contains("virtio-mem"), "attached: {exits}");
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let (state, mem) = (dir.join("state"), dir.join("mem"));
    let create = json!({"snapshot_path": state, "mem_file_path": mem});
    let why = fault(&sock, "PUT", "/snapshot/create", create);
    assert!(why.contains("hotpluggable memory"), "{why}");
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Resumed"}))).unwrap();
    assert_eq!(expect_ok(&sock, "GET", "/", None).unwrap().unwrap()["state"], "Running");
    let _ = child.kill();
    let _ = child.wait();

    // Too much to place: the start refused in one line, the process still serving.
    let mut child = api_process_with(&sock, std::process::Stdio::null(), &[]);
    expect_ok(&sock, "PUT", "/boot-source", Some(&json!({"kernel_image_path": payloads.join("wait.elf")}))).unwrap();
    expect_ok(&sock, "PUT", "/hotplug/memory", Some(&json!({"total_size_mib": 1u64 << 40}))).unwrap();
    let why = fault(&sock, "PUT", "/actions", json!({"action_type": "InstanceStart"}));
    assert!(why.contains("hotpluggable memory"), "{why}");
    assert_eq!(expect_ok(&sock, "GET", "/", None).unwrap().unwrap()["state"], "Not started");
    let _ = child.kill();
    let _ = child.wait();
}
