//! virtio-fs over vhost-user with a backend of the test's own (a stub speaking just enough
//! of the protocol): a backend that closes its socket at the handshake, refuses
//! VIRTIO_F_VERSION_1, answers with a malformed reply or never answers leaves its device
//! failed (said once) and the guest and its other devices running; a socket no one listens
//! on refuses the start; the API checks `PUT /fs`, says which device failed and why, and
//! refuses a snapshot of a machine with virtio-fs.

mod common;
use common::vhost_stub::{stub, Stub};
use common::*;
use std::path::Path;

fn fs(id: &str, socket: &Path) -> serde_json::Value {
    serde_json::json!({"fs_id": id, "tag": id, "socket": socket})
}

#[test]
fn a_misbehaving_backend_fails_its_device_and_the_guest_goes_on() {
    if !kvm_or_skip("a_misbehaving_backend_fails_its_device_and_the_guest_goes_on") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let cases = [
        (Stub::Close, "GET_FEATURES"),
        (Stub::NoVersion1, "lacks VIRTIO_F_VERSION_1"),
        (Stub::Malformed, "GET_FEATURES"),
        (Stub::Silent, "GET_FEATURES"),
    ];
    for (mode, why) in cases {
        let socket = dir.join(format!("{mode:?}.sock"));
        let backend = stub(&socket, mode);
        // The guest reads entropy beside the failed virtio-fs device.
        let config = dir.join("vm.json");
        let vm = serde_json::json!({
            "boot-source": {"kernel_image_path": payloads.join("rngread.elf"), "boot_args": "exitless.params=4"},
            "machine-config": {"vcpu_count": 1, "mem_size_mib": 64},
            "entropy": {},
            "fs": [fs("share", &socket)],
        });
        std::fs::write(&config, vm.to_string()).unwrap();
        let out = exitless(&["--no-api", "--enable-pci", "--config-file", config.to_str().unwrap()]);
        let all = format!("{}{}", stdout(&out), stderr(&out));
        assert!(out.status.success(), "{mode:?}: {all}");
        assert!(all.contains("rngread: 6 requests") && all.contains(", 0 failed"), "{mode:?}: {all}");
        let failed: Vec<_> = all.lines().filter(|l| l.contains("virtio-fs0: the vhost-user backend failed")).collect();
        assert_eq!(failed.len(), 1, "{mode:?}: said once: {all}");
        assert!(failed[0].contains(why), "{mode:?}: {}", failed[0]);
        backend.join().unwrap();
    }
}

#[test]
fn a_socket_no_one_listens_on_refuses_the_start_in_one_line() {
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let config = dir.join("vm.json");
    let write = |fs: serde_json::Value| {
        let vm = serde_json::json!({"boot-source": {"kernel_image_path": payloads.join("wait.elf")}, "fs": [fs]});
        std::fs::write(&config, vm.to_string()).unwrap();
    };
    // A tag too long for the configuration space: refused while the file is read.
    write(serde_json::json!({"fs_id": "share", "tag": "t".repeat(37), "socket": "/x.sock"}));
    let out = assert_one_line_error(&["--no-api", "--config-file", config.to_str().unwrap()]);
    assert!(stderr(&out).contains("at most 36"), "{}", stderr(&out));
    if !kvm_or_skip("a_socket_no_one_listens_on_refuses_the_start_in_one_line") {
        return;
    }
    write(fs("share", &dir.join("absent.sock")));
    let out = assert_one_line_error(&["--no-api", "--config-file", config.to_str().unwrap()]);
    assert!(stderr(&out).contains("cannot connect to the vhost-user socket"), "{}", stderr(&out));
}

#[test]
fn the_api_checks_put_fs_says_which_device_failed_and_refuses_a_snapshot() {
    use exitless_lab::api_client::{expect_ok, request};
    if !kvm_or_skip("the_api_checks_put_fs_says_which_device_failed_and_refuses_a_snapshot") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("api.sock");
    let (good, bad) = (dir.join("good.sock"), dir.join("bad.sock"));
    let backends = [stub(&good, Stub::Good), stub(&bad, Stub::Close)];
    let mut child = api_process(&sock, std::process::Stdio::null());
    // Refused with a fault_message, and the VMM keeps serving.
    let long_tag = serde_json::json!({"fs_id": "a", "tag": "t".repeat(37), "socket": good});
    assert!(fault(&sock, "PUT", "/fs/a", long_tag).contains("at most 36"));
    assert!(fault(&sock, "PUT", "/fs/a", fs("b", &good)).contains("does not match"));
    let no_queues = serde_json::json!({"fs_id": "a", "tag": "a", "socket": good, "num_request_queues": 0});
    assert!(fault(&sock, "PUT", "/fs/a", no_queues).contains("at least 1"));
    let odd_size = serde_json::json!({"fs_id": "a", "tag": "a", "socket": good, "queue_size": 1000});
    assert!(fault(&sock, "PUT", "/fs/a", odd_size).contains("power of two"));
    assert!(!fault(&sock, "PUT", "/fs/a", serde_json::json!({"fs_id": "a", "tag": "a"})).is_empty());
    expect_ok(&sock, "PUT", "/fs/good", Some(&fs("good", &good))).unwrap();
    expect_ok(&sock, "PUT", "/fs/bad", Some(&fs("bad", &bad))).unwrap();
    assert!(fault(&sock, "PUT", "/fs/again", serde_json::json!({"fs_id": "again", "tag": "good", "socket": good}))
        .contains("already has the tag"));
    let config = expect_ok(&sock, "GET", "/vm/config", None).unwrap().unwrap();
    assert_eq!(config["fs"][0]["tag"], "good", "{config}");
    assert_eq!(config["fs"][1]["queue_size"], 1024, "Cloud Hypervisor's default: {config}");
    let boot = serde_json::json!({"kernel_image_path": payloads.join("wait.elf")});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&serde_json::json!({"action_type": "InstanceStart"}))).unwrap();
    let good_state = expect_ok(&sock, "GET", "/fs/good", None).unwrap().unwrap();
    assert_eq!(good_state["state"], "running", "{good_state}");
    let bad_state = expect_ok(&sock, "GET", "/fs/bad", None).unwrap().unwrap();
    assert_eq!(bad_state["state"], "failed", "{bad_state}");
    assert!(bad_state["error"].as_str().unwrap_or("").contains("GET_FEATURES"), "{bad_state}");
    assert_eq!(request(&sock, "GET", "/fs/none", None).unwrap().status, 400);
    // After the start: no new device; and no snapshot (virtiofsd's state is not in it).
    assert!(fault(&sock, "PUT", "/fs/late", fs("late", &good)).contains("after"));
    expect_ok(&sock, "PATCH", "/vm", Some(&serde_json::json!({"state": "Paused"}))).unwrap();
    let snapshot = serde_json::json!({"snapshot_path": dir.join("vm.snap"), "mem_file_path": dir.join("vm.mem")});
    let why = fault(&sock, "PUT", "/snapshot/create", snapshot);
    assert!(why.contains("virtio-fs") && why.contains("not saved"), "{why}");
    let _ = child.kill();
    let _ = child.wait();
    for b in backends {
        b.join().unwrap();
    }
}
