//! Landlock in the VMM: once a microVM starts, its threads reach only the files it was
//! given; a request naming another is refused in one line and the VMM serves on, and
//! `--landlock-rule` allows a path first.

mod common;
use common::*;
use exitless_lab::api_client::expect_ok;
use serde_json::json;

#[test]
fn a_started_vmm_reaches_only_its_files_and_refuses_others_in_one_line() {
    if !kvm_or_skip("a_started_vmm_reaches_only_its_files_and_refuses_others_in_one_line") {
        return;
    }
    if exitless_vmm::landlock::kernel_abi() < 1 {
        skip_or_fail("a_started_vmm_reaches_only_its_files_and_refuses_others_in_one_line", "no Landlock here");
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

    let why = fault(&sock, "PATCH", "/drives/root", json!({"drive_id": "root", "path_on_host": outside}));
    assert!(why.starts_with("Landlock: ") && why.contains("outside.img") && !why.contains('\n'), "{why}");
    // The same file by another spelling is still outside.
    let sneaky = allowed.join("../outside.img");
    let why = fault(&sock, "PATCH", "/drives/root", json!({"drive_id": "root", "path_on_host": sneaky}));
    assert!(why.starts_with("Landlock: "), "{why}");
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let create = json!({"snapshot_path": dir.join("state"), "mem_file_path": dir.join("mem")});
    let why = fault(&sock, "PUT", "/snapshot/create", create);
    assert!(why.starts_with("Landlock: "), "{why}");
    assert!(!dir.join("mem").exists(), "nothing written outside");
    // Beside the socket, and in a directory allowed first: a snapshot, and a drive.
    let beside = json!({"snapshot_path": dir.join("api/state"), "mem_file_path": dir.join("api/mem")});
    expect_ok(&sock, "PUT", "/snapshot/create", Some(&beside)).unwrap();
    let create = json!({"snapshot_path": allowed.join("state"), "mem_file_path": allowed.join("mem")});
    expect_ok(&sock, "PUT", "/snapshot/create", Some(&create)).unwrap();
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
