//! vhost-user-blk drives (`PUT /drives` with `socket`, as Firecracker v1.16.1 takes them):
//! Firecracker's checks and words; a backend that cannot be connected or fails its
//! handshake refuses the PUT, naming why; one that fails at activation leaves its drive
//! failed (GET /drives/{id} and the metrics say so) and the VMM serving; with
//! qemu-storage-daemon, a guest writes and reads a drive byte for byte on both
//! transports, and a guest writing it goes on through a snapshot and a load in another
//! VMM, which connects to the backend again.

mod common;
mod snapshot_vmm;
use common::qsd::storage_daemon;
use common::vhost_stub::{stub, Stub};
use common::*;
use exitless_lab::api_client::{expect_ok, request};
use exitless_lab::blk::pattern;
use serde_json::json;
use snapshot_vmm::{assert_goes_on, load, snapshot, Vmm};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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

/// How many sectors from 1 on carry the pattern stamped with their own number (snapwork's
/// write of tick N).
fn sectors_written(disk: &Path) -> u64 {
    let bytes = std::fs::read(disk).unwrap();
    let word = |s: &[u8], k: usize| u64::from_le_bytes(s[8 * k..8 * k + 8].try_into().unwrap());
    bytes.chunks(512).skip(1).take_while(|s| word(s, 0) == word(s, 1) && word(s, 0) != 0).count() as u64
}

#[test]
fn a_guest_writing_a_vhost_user_drive_goes_on_through_a_snapshot_and_a_load() {
    let test = "a_guest_writing_a_vhost_user_drive_goes_on_through_a_snapshot_and_a_load";
    if !kvm_or_skip(test) {
        return;
    }
    if !exitless_lab::netns::available() && !skip_or_fail(test, "needs root and /dev/net/tun for snapwork's tap") {
        return;
    }
    const TICKS: u64 = 40;
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let tap = format!("exvub{}", std::process::id() % 100_000);
    let ip = |args: &[&str]| Command::new("ip").args(args).status().unwrap().success();
    assert!(ip(&["tuntap", "add", "dev", &tap, "mode", "tap"]) && ip(&["link", "set", "dev", &tap, "up"]));
    let _remove = RemoveLinks(vec![tap.clone()]);
    for pci in [false, true] {
        let image = dir.join(format!("disk-{pci}.img"));
        std::fs::write(&image, vec![0u8; 2 << 20]).unwrap();
        let socket = dir.join(format!("qsd-{pci}.sock"));
        let Some(_daemon) = storage_daemon(&image, &socket, test) else { return };
        let flags: &[&str] = if pci { &["--enable-pci"] } else { &[] };
        let sock = dir.join(format!("a-{pci}.sock"));
        let mut first = Vmm::start_with(&sock, flags);
        let machine = json!({"vcpu_count": 1, "mem_size_mib": 64, "track_dirty_pages": pci});
        expect_ok(&sock, "PUT", "/machine-config", Some(&machine)).unwrap();
        let boot = json!({"kernel_image_path": payloads.join("snapwork.elf"), "boot_args": format!("exitless.params={TICKS}")});
        expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
        expect_ok(&sock, "PUT", "/drives/work", Some(&drive("work", &socket))).unwrap();
        let nic = json!({"iface_id": "eth0", "host_dev_name": tap, "guest_mac": "06:00:ac:10:00:02"});
        expect_ok(&sock, "PUT", "/network-interfaces/eth0", Some(&nic)).unwrap();
        expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
        first.wait_for_ticks(5);
        expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
        if pci {
            // KVM's dirty log would miss what the daemon wrote: a Diff of it is refused.
            let diff = json!({"snapshot_type": "Diff", "snapshot_path": dir.join("d.json"), "mem_file_path": dir.join("d.bin")});
            assert!(fault(&sock, "PUT", "/snapshot/create", diff).contains("take a Full snapshot"));
        }
        let (state, mem) = snapshot(&sock, &dir, u32::from(pci));
        first.stop_and_drain();
        let said = first.ticks().last().copied().unwrap_or(0);
        assert!(sectors_written(&image) >= said, "pci {pci}: tick {said} said before its sector was written");
        // Another VMM loads it: it connects to the daemon again, which serves it the vring
        // from where the first one stopped.
        let sock = dir.join(format!("b-{pci}.sock"));
        let mut second = Vmm::start_with(&sock, flags);
        load(&sock, &state, &mem);
        let status = second.child.wait().unwrap();
        second.stop_and_drain();
        let lines = second.lines.lock().unwrap().clone();
        assert!(status.success(), "pci {pci}: {status}: {lines:?}");
        assert_goes_on(&mem, &second.ticks(), &format!("pci {pci}"));
        let done =
            format!("snapwork: done at tick {TICKS} ({} iterations), 0 frames echoed, 0 writes failed", TICKS << 20);
        assert!(lines.iter().any(|l| l == &done), "pci {pci}: {lines:?}");
        assert_eq!(sectors_written(&image), TICKS, "pci {pci}");
    }
}

#[test]
fn a_vhost_user_drive_is_hotplugged_over_pci_where_memory_is_shared() {
    if !kvm_or_skip("a_vhost_user_drive_is_hotplugged_over_pci_where_memory_is_shared") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    for shared in [true, false] {
        let sock = dir.join(format!("api-{shared}.sock"));
        let mut child = api_process(&sock, Stdio::null());
        let mut backends = Vec::new();
        if shared {
            // A vhost-user drive at boot: guest RAM is a memfd the backends map.
            let first = dir.join("first.sock");
            backends.push(stub(&first, Stub::Good));
            expect_ok(&sock, "PUT", "/drives/first", Some(&drive("first", &first))).unwrap();
        }
        let boot = json!({"kernel_image_path": payloads.join("wait.elf")});
        expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
        expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
        let hot = dir.join(format!("hot-{shared}.sock"));
        if shared {
            backends.push(stub(&hot, Stub::Good));
            expect_ok(&sock, "PUT", "/drives/hot", Some(&drive("hot", &hot))).unwrap();
            let exits = expect_ok(&sock, "GET", "/exits", None).unwrap().unwrap().to_string();
            assert!(exits.contains("vhost-user-blk1"), "{exits}");
            let state = expect_ok(&sock, "GET", "/drives/hot", None).unwrap().unwrap();
            assert_eq!(state["state"], "running", "{state}");
            // Firecracker's PATCH of a vhost-user drive: its configuration read again
            // (GET_CONFIG, on the worker); refused for a file drive's fields.
            expect_ok(&sock, "PATCH", "/drives/hot", Some(&json!({"drive_id": "hot"}))).unwrap();
            let why = fault(&sock, "PATCH", "/drives/hot", json!({"drive_id": "hot", "path_on_host": "/dev/null"}));
            assert!(why.contains("Running method expected different backend"), "{why}");
            expect_ok(&sock, "DELETE", "/drives/hot", None).unwrap();
            assert_eq!(request(&sock, "GET", "/drives/hot", None).unwrap().status, 400, "unplugged");
        } else {
            // Refused before any connection: the guest's memory is private to the VMM.
            let why = fault(&sock, "PUT", "/drives/hot", drive("hot", &hot));
            assert!(why.contains("guest memory must be shared"), "{why}");
            let config = expect_ok(&sock, "GET", "/vm/config", None).unwrap().unwrap();
            assert!(config["drives"].as_array().is_none_or(|d| d.is_empty()), "nothing half-made: {config}");
        }
        let _ = child.kill();
        let _ = child.wait();
        for b in backends {
            b.join().unwrap();
        }
    }
}
