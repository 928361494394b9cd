//! Issue #57 item 4, what the other tests do not show: two clones loaded from one snapshot
//! at once, each in its own VMM, each with its own `--id` (its instance info and every
//! line of its log), its own vsock socket (`vsock_override`: a stream through each clone's
//! socket is echoed by that clone's guest and no other), its own MMDS contents and its own
//! tap (`network_overrides`); and the guest's clock right after a load, with and without
//! `clock_realtime`. A new VMGenID generation and VMClock's disruption at each load are
//! vmgenid.rs's; frames through an overridden tap are snapshot.rs's.

mod common;
mod snapshot_vmm;
use common::*;
use exitless_lab::api_client::expect_ok;
use serde_json::json;
use snapshot_vmm::*;
use std::time::{Duration, Instant};

fn wait_line(vmm: &Vmm, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(line) = vmm.lines.lock().unwrap().iter().find(|l| l.contains(what)) {
            return line.clone();
        }
        assert!(Instant::now() < deadline, "no {what:?}: {:?}", vmm.lines.lock().unwrap());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `n` bytes through the vsock socket `uds` to the guest's port 1234, echoed back, and the
/// stream closed.
fn echo(uds: &std::path::Path, n: usize) {
    use std::io::{BufRead, Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(uds).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    stream.write_all(b"CONNECT 1234\n").unwrap();
    let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
    let mut ok = String::new();
    reader.read_line(&mut ok).unwrap();
    assert!(ok.starts_with("OK "), "{ok:?}");
    let sent: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
    stream.write_all(&sent).unwrap();
    let mut back = vec![0u8; n];
    reader.read_exact(&mut back).unwrap();
    assert!(back == sent, "the echo differs");
    stream.shutdown(std::net::Shutdown::Both).unwrap();
}

#[test]
fn clones_of_one_snapshot_each_have_their_own_id_vsock_mmds_and_tap() {
    let test = "clones_of_one_snapshot_each_have_their_own_id_vsock_mmds_and_tap";
    if !kvm_or_skip(test) {
        return;
    }
    if !exitless_lab::netns::available() && !skip_or_fail(test, "needs root and /dev/net/tun for its taps") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let taps: Vec<String> = (0..3).map(|n| format!("exid{n}{}", std::process::id() % 100_000)).collect();
    let _remove = RemoveLinks(taps.clone());
    for tap in &taps {
        let made = std::process::Command::new("ip").args(["tuntap", "add", "dev", tap, "mode", "tap"]).status();
        assert!(made.is_ok_and(|s| s.success()), "ip tuntap add {tap}");
    }

    let sock = dir.join("parent.sock");
    let mut parent = Vmm::start_with(&sock, &["--enable-pci", "--id", "fork-parent"]);
    // An echo server on port 1234 that ends once one stream has closed.
    let boot = json!({"kernel_image_path": payloads.join("vsockecho.elf"), "boot_args": "exitless.params=1234,1"});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/vsock", Some(&json!({"guest_cid": 3, "uds_path": dir.join("parent.vsock")}))).unwrap();
    let nic = json!({"iface_id": "eth0", "host_dev_name": taps[0]});
    expect_ok(&sock, "PUT", "/network-interfaces/eth0", Some(&nic)).unwrap();
    expect_ok(&sock, "PUT", "/mmds/config", Some(&json!({"version": "V2", "network_interfaces": ["eth0"]}))).unwrap();
    expect_ok(&sock, "PUT", "/mmds", Some(&json!({"latest": {"meta-data": {"instance-id": "i-parent"}}}))).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    wait_line(&parent, "listening on port 1234");
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let (state, mem) = snapshot(&sock, &dir, 0);
    parent.stop_and_drain();

    let names = ["a", "b"];
    let mut clones = Vec::new();
    for (n, name) in names.iter().enumerate() {
        let (sock, log) = (dir.join(format!("{name}.sock")), dir.join(format!("{name}.log")));
        std::fs::write(&log, "").unwrap();
        let id = format!("fork-clone-{name}");
        let vmm = Vmm::start_with(&sock, &["--id", &id, "--log-path", log.to_str().unwrap(), "--level", "Info"]);
        let body = json!({
            "snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": mem}, "resume_vm": true,
            "vsock_override": {"uds_path": dir.join(format!("{name}.vsock"))},
            "network_overrides": [{"iface_id": "eth0", "host_dev_name": taps[n + 1]}],
        });
        expect_ok(&sock, "PUT", "/snapshot/load", Some(&body)).unwrap();
        let data = json!({"latest": {"meta-data": {"instance-id": format!("i-{name}")}}});
        expect_ok(&sock, "PUT", "/mmds", Some(&data)).unwrap();
        clones.push((vmm, sock, log, id, data));
    }
    // Both run at once; each is asked only through what is its own.
    for (n, (vmm, sock, _, id, data)) in clones.iter().enumerate() {
        let info = expect_ok(sock, "GET", "/", None).unwrap().unwrap();
        assert_eq!(info["id"], id.as_str(), "{info}");
        assert_eq!(expect_ok(sock, "GET", "/mmds", None).unwrap().as_ref(), Some(data));
        let config = expect_ok(sock, "GET", "/vm/config", None).unwrap().unwrap();
        assert_eq!(config["network-interfaces"][0]["host_dev_name"], taps[n + 1], "{config}");
        let uds = dir.join(format!("{}.vsock", names[n]));
        assert_eq!(config["vsock"]["uds_path"], uds.to_str().unwrap(), "{config}");
        wait_line(vmm, "transport reset");
        echo(&uds, 1000 * (n + 1));
    }
    for (n, (vmm, _, log, id, _)) in clones.iter_mut().enumerate() {
        let status = vmm.child.wait().unwrap();
        vmm.stop_and_drain();
        let end = wait_line(vmm, "bytes echoed");
        assert!(status.success(), "{status}: {end}");
        let want = format!("vsockecho: {} bytes echoed on 1 streams", 1000 * (n + 1));
        assert!(end.starts_with(&want), "clone {}: {end} (a stream reached the wrong guest?)", names[n]);
        let text = std::fs::read_to_string(log).unwrap();
        let lines: Vec<&str> = text.lines().filter(|l| l.contains(" [")).collect();
        assert!(!lines.is_empty(), "{id}: nothing logged");
        let tag = format!(" [{id}:");
        assert!(lines.iter().all(|l| l.contains(&tag)), "{id}: a log line of another instance: {text}");
    }
}

/// The guest's kvmclock (ns) when the snapshot at `state` was taken: KVM_GET_CLOCK's
/// `clock`, the first eight bytes of the VM's saved clock, wherever the state file keeps it.
fn saved_clock(state: &str) -> u64 {
    let file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(state).unwrap()).unwrap();
    let clock = &file["machine"]["vm"]["clock"];
    if let Some(ns) = clock["clock"].as_u64() {
        return ns;
    }
    let bytes: Vec<u8> = clock
        .as_array()
        .unwrap_or_else(|| panic!("no clock: {clock}"))
        .iter()
        .map(|b| b.as_u64().unwrap() as u8)
        .collect();
    u64::from_le_bytes(bytes[..8].try_into().unwrap())
}

/// `clock_realtime` at the load: the guest's clock (kvmclock, KVM_GET_CLOCK) takes in the
/// wall time that passed since the snapshot was taken; without it, it goes on from the
/// snapshot's reading. Each clone is snapshotted again at once, paused, and its clock read
/// from that file: with the flag it moved on by at least the wall time since the parent's
/// create answered; without, by at most the time from its load to its own create.
#[test]
fn clock_realtime_moves_a_clones_clock_by_the_time_passed() {
    if !kvm_or_skip("clock_realtime_moves_a_clones_clock_by_the_time_passed") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("parent.sock");
    let mut parent = Vmm::start_with(&sock, &[]);
    expect_ok(&sock, "PUT", "/boot-source", Some(&json!({"kernel_image_path": payloads.join("wait.elf")}))).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let (state, mem) = snapshot(&sock, &dir, 0);
    let taken = Instant::now();
    parent.stop_and_drain();
    let base = saved_clock(&state);
    // The time the realtime clone must see pass (the only wait here: it is what is checked).
    std::thread::sleep(Duration::from_secs(2));
    for (n, realtime) in [(1u32, true), (2, false)] {
        let sock = dir.join(format!("c{n}.sock"));
        let _clone = Vmm::start_with(&sock, &[]);
        let body = json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": mem},
                          "clock_realtime": realtime});
        let (since_taken, loaded) = (taken.elapsed(), Instant::now());
        expect_ok(&sock, "PUT", "/snapshot/load", Some(&body)).unwrap();
        let (again, _) = snapshot(&sock, &dir, n);
        let alive = loaded.elapsed();
        let moved = Duration::from_nanos(saved_clock(&again).saturating_sub(base));
        if realtime {
            assert!(moved >= since_taken, "clock_realtime: the clock moved {moved:?}, {since_taken:?} passed");
        } else {
            assert!(moved <= alive, "without clock_realtime the clock moved {moved:?} in a clone {alive:?} old");
        }
    }
}

/// The names of the threads of process `pid`, once each has named itself (a thread just
/// started still has the process's name).
fn threads(pid: u32) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
        let names: Vec<String> = tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|c| c.trim().into())
            .collect();
        if names.iter().filter(|n| *n == "exitless").count() == 1 || Instant::now() > deadline {
            return names;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A clone is on its parent's transport even when no virtio device is on it: a clone of a
/// virtio-mmio sandbox can plug nothing and runs no hotplug worker (a thread stack less in
/// every clone of a fleet); one of a PCI machine runs it and can plug.
#[test]
fn a_clone_keeps_its_parents_transport_and_a_hotplug_worker_only_on_pci() {
    if !kvm_or_skip("a_clone_keeps_its_parents_transport_and_a_hotplug_worker_only_on_pci") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    for (n, pci) in [(0u32, false), (1, true)] {
        let sock = dir.join(format!("parent{n}.sock"));
        let flags: &[&str] = if pci { &["--enable-pci"] } else { &[] };
        let mut parent = Vmm::start_with(&sock, flags);
        expect_ok(&sock, "PUT", "/boot-source", Some(&json!({"kernel_image_path": payloads.join("wait.elf")})))
            .unwrap();
        expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
        assert_eq!(threads(parent.child.id()).iter().any(|t| t == "api-hotplug"), pci, "parent, PCI {pci}");
        expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
        let (state, mem) = snapshot(&sock, &dir, n);
        parent.stop_and_drain();
        // The clone is given no flag: its transport is the snapshot's.
        let sock = dir.join(format!("clone{n}.sock"));
        let mut clone = Vmm::start_with(&sock, &[]);
        load(&sock, &state, &mem);
        let names = threads(clone.child.id());
        assert_eq!(names.iter().any(|t| t == "api-hotplug"), pci, "clone of a PCI {pci} parent: {names:?}");
        clone.stop_and_drain();
    }
}
