//! Landlock in the VMM: once a microVM starts, the threads a guest reaches (vCPUs,
//! devices) are held to the files it was given (the unit test in exitless_vmm::landlock and
//! crates/jailer/examples/jail_escape.rs show a held thread refused); the API thread is not,
//! so a client names any file in PATCH /drives or a snapshot, as under Firecracker
//! (firecracker-containerd swaps each container's snapshot file in; Kata, loop devices).

mod common;
use common::*;
use exitless_lab::api_client::expect_ok;
use serde_json::json;

#[test]
fn a_landlocked_vmm_serves_files_its_client_names() {
    if !kvm_or_skip("a_landlocked_vmm_serves_files_its_client_names") {
        return;
    }
    if exitless_vmm::landlock::kernel_abi() < 1 {
        skip_or_fail("a_landlocked_vmm_serves_files_its_client_names", "no Landlock here");
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let (disk, outside, allowed) = (dir.join("disk.img"), dir.join("outside.img"), dir.join("allowed"));
    std::fs::write(&disk, vec![0u8; 4096]).unwrap();
    std::fs::write(&outside, vec![0u8; 8192]).unwrap();
    std::fs::create_dir(&allowed).unwrap();
    std::fs::write(allowed.join("next.img"), vec![0u8; 8192]).unwrap();
    // The socket's directory is the VMM's own: the files outside it are in `dir`.
    std::fs::create_dir(dir.join("api")).unwrap();
    let sock = dir.join("api/api.sock");
    let rule = format!("{}:rw", allowed.display());
    let mut child = api_process_with(&sock, std::process::Stdio::null(), &["--landlock-rule", &rule]);
    let boot = json!({"kernel_image_path": payloads.join("wait.elf")});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    let root = json!({"drive_id": "root", "path_on_host": disk, "is_root_device": true, "is_read_only": false});
    expect_ok(&sock, "PUT", "/drives/root", Some(&root)).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();

    // A file the VMM was not given, named by its client: served (the API thread opens it
    // and hands it to the device thread, which could not have).
    expect_ok(&sock, "PATCH", "/drives/root", Some(&json!({"drive_id": "root", "path_on_host": outside}))).unwrap();
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let create = json!({"snapshot_path": dir.join("state"), "mem_file_path": dir.join("mem")});
    expect_ok(&sock, "PUT", "/snapshot/create", Some(&create)).unwrap();
    assert!(dir.join("mem").exists() && dir.join("state").exists());
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Resumed"}))).unwrap();
    let next = json!({"drive_id": "root", "path_on_host": allowed.join("next.img")});
    expect_ok(&sock, "PATCH", "/drives/root", Some(&next)).unwrap();
    assert_eq!(expect_ok(&sock, "GET", "/", None).unwrap().unwrap()["state"], "Running");
    let _ = child.kill();
    let _ = child.wait();

    // --no-landlock: the same request is served.
    let mut child = api_process_with(&sock, std::process::Stdio::null(), &["--no-landlock"]);
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/drives/root", Some(&root)).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    expect_ok(&sock, "PATCH", "/drives/root", Some(&json!({"drive_id": "root", "path_on_host": outside}))).unwrap();
    let _ = child.kill();
    let _ = child.wait();
}

/// The guest stops: the VMM removes its socket and ends with the guest's status, though
/// no thread Landlock holds may remove anything in the socket's directory (issue 53,
/// item 8: they once could write anywhere beneath it, all of /run for the default
/// socket); a thread started before Landlock removes it.
#[test]
fn a_landlocked_vmm_removes_its_socket_when_the_guest_stops() {
    if !kvm_or_skip("a_landlocked_vmm_removes_its_socket_when_the_guest_stops") {
        return;
    }
    if exitless_vmm::landlock::kernel_abi() < 1 {
        skip_or_fail("a_landlocked_vmm_removes_its_socket_when_the_guest_stops", "no Landlock here");
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    std::fs::create_dir(dir.join("run")).unwrap();
    let sock = dir.join("run/firecracker.socket");
    let mut child = api_process_with(&sock, std::process::Stdio::null(), &[]);
    let boot = json!({"kernel_image_path": payloads.join("demo.elf")});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the VMM did not end with its guest");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    assert!(!sock.exists(), "the socket is left behind");
}
