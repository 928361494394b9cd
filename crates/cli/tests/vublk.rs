//! vhost-user-blk drives (`PUT /drives` with `socket`, as Firecracker v1.16.1 takes them):
//! Firecracker's checks and words; a backend that cannot be connected or fails its
//! handshake refuses the PUT, naming why; one that fails at activation leaves its drive
//! failed (GET /drives/{id} and the metrics say so) and the VMM serving; with
//! qemu-storage-daemon, a guest writes and reads a drive byte for byte on both
//! transports, and a guest writing it goes on through a snapshot and a load in another
//! VMM, which connects to the backend again.

mod common;
use common::vhost_stub::{stub, Stub};
use common::*;
use exitless_lab::api_client::{expect_ok, request};
use exitless_lab::blk::pattern;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn drive(id: &str, socket: &Path) -> serde_json::Value {
    json!({"drive_id": id, "is_root_device": false, "socket": socket})
}

#[test]
fn put_drives_checks_a_socket_drive_as_firecracker_does() {
    let dir = tempdir();
    let sock = dir.join("api.sock");
    let mut child = api_process(&sock, Stdio::null());
    let good = dir.join("good.sock");
    let invalid = "Drive config error: Unable to create the virtio block device: Invalid block config.";
    // Fields a vhost-user drive must not have, and a drive with neither file nor socket.
    for extra in [
        json!({"path_on_host": "/dev/null"}),
        json!({"is_read_only": false}),
        json!({"io_engine": "Sync"}),
        json!({"rate_limiter": {"ops": {"size": 1, "refill_time": 1}}}),
    ] {
        let mut d = drive("a", &good);
        d.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        assert_eq!(fault(&sock, "PUT", "/drives/a", d.clone()), invalid, "{d}");
    }
    assert_eq!(fault(&sock, "PUT", "/drives/a", json!({"drive_id": "a", "is_root_device": false})), invalid);
    let absent = fault(&sock, "PUT", "/drives/a", drive("a", &dir.join("absent.sock")));
    assert_eq!(
        absent,
        "Drive config error: Unable to create the virtio block device: Vhost user backend error: Vhost-user \
         error: Failed to connect to UDS Unix stream: No such file or directory (os error 2)"
    );
    // Handshakes that fail: refused at the PUT, saying where.
    let cases = [
        (Stub::Close, "GET_FEATURES"),
        (Stub::NoVersion1, "lacks VIRTIO_F_VERSION_1"),
        (Stub::Malformed, "GET_FEATURES"),
        (Stub::Silent, "did not answer GET_FEATURES"),
        (Stub::ShortConfig, "GET_CONFIG"),
    ];
    for (mode, why) in cases {
        let socket = dir.join(format!("{mode:?}.sock"));
        let backend = stub(&socket, mode);
        let said = fault(&sock, "PUT", "/drives/a", drive("a", &socket));
        assert!(
            said.starts_with("Drive config error: Unable to create the virtio block device: Vhost user backend error")
        );
        assert!(said.contains(why), "{mode:?}: {said}");
        backend.join().unwrap();
    }
    let backend = stub(&good, Stub::Good);
    expect_ok(&sock, "PUT", "/drives/good", Some(&drive("good", &good))).unwrap();
    let config = expect_ok(&sock, "GET", "/vm/config", None).unwrap().unwrap();
    assert_eq!(config["drives"][0]["socket"], json!(good), "{config}");
    assert!(config["drives"][0].get("path_on_host").is_none(), "{config}");
    let state = expect_ok(&sock, "GET", "/drives/good", None).unwrap().unwrap();
    assert_eq!(state["state"], "not started", "{state}");
    // A second root, whatever it is backed by.
    let file_root = json!({"drive_id": "r", "path_on_host": "/dev/null", "is_root_device": true});
    expect_ok(&sock, "PUT", "/drives/r", Some(&file_root)).unwrap();
    let root = json!({"drive_id": "b", "is_root_device": true, "socket": good});
    assert!(fault(&sock, "PUT", "/drives/b", root).contains("A root block device already exists!"));
    let _ = child.kill();
    let _ = child.wait();
    backend.join().unwrap();
}

#[test]
fn a_backend_failing_at_activation_fails_its_drive_and_the_vmm_serves_on() {
    if !kvm_or_skip("a_backend_failing_at_activation_fails_its_drive_and_the_vmm_serves_on") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("api.sock");
    let socket = dir.join("b.sock");
    let backend = stub(&socket, Stub::CloseAtMemTable);
    let mut child = api_process(&sock, Stdio::null());
    let metrics = dir.join("metrics.json");
    expect_ok(&sock, "PUT", "/metrics", Some(&json!({"metrics_path": metrics}))).unwrap();
    expect_ok(&sock, "PUT", "/drives/b", Some(&drive("b", &socket))).unwrap();
    // blkbench drives it: DRIVER_OK starts the backend, which closes at the memory table.
    let boot = json!({"kernel_image_path": payloads.join("blkbench.elf"), "boot_args": "exitless.params=0,4096,1,10"});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let state = loop {
        let state = expect_ok(&sock, "GET", "/drives/b", None).unwrap().unwrap();
        if state["state"] != "running" || std::time::Instant::now() > deadline {
            break state;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(state["state"], "failed", "{state}");
    assert!(state["error"].as_str().unwrap().contains("SET_MEM_TABLE"), "{state}");
    // The VMM serves on: the machine runs, pauses and resumes; the metrics name the drive.
    let vm = expect_ok(&sock, "GET", "/", None).unwrap().unwrap();
    assert_eq!(vm["state"], "Running", "{vm}");
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Resumed"}))).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "FlushMetrics"}))).unwrap();
    let lines = std::fs::read_to_string(&metrics).unwrap();
    let last: serde_json::Value = serde_json::from_str(lines.lines().last().unwrap()).unwrap();
    let group = &last["vhost_user_block_b"];
    assert_eq!(group["activate_fails"], 1, "{group}");
    assert!(group["init_time_us"].as_u64().unwrap() > 0, "{group}");
    // A PATCH of a failed drive is refused, naming why.
    assert!(fault(&sock, "PATCH", "/drives/b", json!({"drive_id": "b"})).contains("backend failed"));
    assert_eq!(request(&sock, "GET", "/drives/none", None).unwrap().status, 400);
    let _ = child.kill();
    let _ = child.wait();
    backend.join().unwrap();
}

/// qemu-storage-daemon exporting `image` on `socket`, if installed (else None, said).
fn storage_daemon(image: &Path, socket: &Path, test: &str) -> Option<Daemon> {
    let binary = Path::new("/usr/bin/qemu-storage-daemon");
    if !binary.exists() {
        skip_or_fail(test, "qemu-storage-daemon is not installed (Debian's qemu-system-common)");
        return None;
    }
    let _ = std::fs::remove_file(socket);
    let child = Command::new(binary)
        .arg("--blockdev")
        .arg(format!("driver=file,node-name=f,filename={}", image.display()))
        .arg("--export")
        .arg(format!("type=vhost-user-blk,id=e,node-name=f,addr.type=unix,addr.path={},writable=on", socket.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start qemu-storage-daemon");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !socket.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(socket.exists(), "qemu-storage-daemon did not listen on {}", socket.display());
    Some(Daemon(child))
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const DISK: usize = 4 << 20;

/// blkbench on a vhost-user drive of qemu-storage-daemon: its output.
fn blkbench(payloads: &Path, socket: &Path, params: &str, pci: bool) -> String {
    let dir = tempdir();
    let config = dir.join("vm.json");
    let vm = json!({
        "boot-source": {"kernel_image_path": payloads.join("blkbench.elf"), "boot_args": format!("exitless.params={params}")},
        "machine-config": {"vcpu_count": 1, "mem_size_mib": 64},
        "drives": [{"drive_id": "vu", "is_root_device": false, "socket": socket, "cache_type": "Writeback"}],
    });
    std::fs::write(&config, vm.to_string()).unwrap();
    let mut args = vec!["--no-api", "--config-file", config.to_str().unwrap()];
    if pci {
        args.push("--enable-pci");
    }
    let out = exitless(&args);
    let all = format!("{}{}", stdout(&out), stderr(&out));
    assert!(out.status.success(), "{all}");
    all
}

#[test]
fn a_guest_writes_and_reads_a_qemu_storage_daemon_drive_byte_for_byte() {
    let test = "a_guest_writes_and_reads_a_qemu_storage_daemon_drive_byte_for_byte";
    if !kvm_or_skip(test) {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    for (pci, stamp) in [(false, 5), (true, 6)] {
        let image: PathBuf = dir.join(format!("disk{stamp}.img"));
        std::fs::write(&image, vec![0u8; DISK]).unwrap();
        let socket = dir.join(format!("qsd{stamp}.sock"));
        let Some(_daemon) = storage_daemon(&image, &socket, test) else { return };
        // Sequential 64K writes at qd 4 over the whole disk, stamped, then FLUSH.
        let wrote = blkbench(&payloads, &socket, &format!("3,65536,4,64,0,0,{stamp},1,1"), pci);
        assert!(wrote.contains("64 requests") && wrote.contains("0 failed"), "{wrote}");
        assert!(wrote.contains("blkbench: flushed, status 0"), "{wrote}");
        let mut expected = vec![0u8; DISK];
        pattern::fill(&mut expected, 0, stamp);
        assert!(std::fs::read(&image).unwrap() == expected, "pci {pci}: the image differs from what the guest wrote");
        // The daemon takes the next VMM: random reads at depth 32 see every sector's pattern.
        let read = blkbench(&payloads, &socket, "0,4096,32,500", pci);
        assert!(read.contains("500 requests") && read.contains("0 failed, 0 bad sectors"), "{read}");
        // No VMM exit served a request: the device's own accesses are the driver's setup.
        assert!(read.contains("vhost-user-blk0"), "{read}");
    }
}
