//! Issue 55 item 3: devices plugged into and out of a running microVM over PCI with
//! Firecracker's API (`PUT` after the start, `DELETE`), the guest told through ACPI PCI
//! hotplug. The `hotplug` payload does what the DSDT's methods do: it sees each device's
//! slot in the controller and its config space, ejects it when asked, or, driving it,
//! refuses the first request (the device is in use: the unplug is refused, nothing
//! removed) and lets go at the second. Each bad request is one 400 that leaves the
//! machine as it was.

mod common;
use common::*;
use exitless_lab::api_client::expect_ok;
use serde_json::json;
use std::io::BufRead;
use std::sync::mpsc::Receiver;
use std::time::Duration;

/// The guest's console, line by line.
fn console(child: &mut std::process::Child) -> Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// The next console line holding `words` (within a minute), or the test fails.
fn expect(rx: &Receiver<String>, words: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains(words) => return line,
            Ok(_) => {}
            Err(e) => panic!("no console line with {words:?}: {e}"),
        }
    }
}

fn file(dir: &std::path::Path, name: &str, len: u64) -> String {
    let path = dir.join(name);
    std::fs::File::create(&path).unwrap().set_len(len).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn devices_hotplugged_are_announced_ejected_and_refused_while_in_use() {
    if !kvm_or_skip("devices_hotplugged_are_announced_ejected_and_refused_while_in_use") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("api.sock");
    let tap = format!("exhp{}", std::process::id() % 100_000);
    let _remove = RemoveLinks(vec![tap.clone()]);
    let mut child = api_process(&sock, std::process::Stdio::piped());
    let rx = console(&mut child);
    let put = |path: &str, body: serde_json::Value| expect_ok(&sock, "PUT", path, Some(&body));
    let boot = json!({"kernel_image_path": payloads.join("hotplug.elf"), "boot_args": "exitless.params=3"});
    put("/boot-source", boot).unwrap();
    put("/actions", json!({"action_type": "InstanceStart"})).unwrap();
    expect(&rx, "hotplug: waiting");

    // Round 0: a drive, found in its slot (virtio-blk's id), ejected when asked.
    let drive = json!({"drive_id": "d0", "path_on_host": file(&dir, "d0", 1 << 20), "is_root_device": false});
    put("/drives/d0", drive.clone()).unwrap();
    let line = expect(&rx, "round 0: slot");
    assert!(line.contains("id 10421af4") && line.contains("class 018000"), "{line}");
    assert!(fault(&sock, "PUT", "/drives/d0", drive.clone()).contains("Device ID in use"), "twice in a row");
    let root = json!({"drive_id": "r", "path_on_host": file(&dir, "r", 1 << 20), "is_root_device": true});
    assert!(fault(&sock, "PUT", "/drives/r", root).contains("root block device"));
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let other = json!({"drive_id": "d1", "path_on_host": file(&dir, "d1", 1 << 20), "is_root_device": false});
    let why = fault(&sock, "PUT", "/drives/d1", other);
    assert!(why.contains("paused"), "during a pause: {why}");
    assert!(fault(&sock, "DELETE", "/drives/d0", json!({})).contains("paused"));
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Resumed"}))).unwrap();
    let config = expect_ok(&sock, "GET", "/vm/config", None).unwrap().unwrap();
    assert_eq!(config["drives"].as_array().unwrap().len(), 1, "nothing half-made: {config}");
    expect_ok(&sock, "DELETE", "/drives/d0", None).unwrap();
    expect(&rx, "round 0: eject asked");
    assert!(expect(&rx, "round 0: slot").ends_with("gone"));
    assert!(fault(&sock, "DELETE", "/drives/d0", json!({})).contains("Device not found"), "unplugged twice");

    // Round 1: a pmem device the guest drives: in use until it lets go.
    let pmem = json!({"id": "p0", "path_on_host": file(&dir, "p0", 2 << 20)});
    put("/pmem/p0", pmem).unwrap();
    assert!(expect(&rx, "round 1: slot").contains("id 105b1af4"));
    expect(&rx, "round 1: driving it, status 3");
    let config = expect_ok(&sock, "GET", "/vm/config", None).unwrap().unwrap();
    assert_eq!(config["pmem"][0]["id"], "p0", "a snapshot's configuration holds it: {config}");
    let why = fault(&sock, "DELETE", "/pmem/p0", json!({}));
    assert!(why.contains("is in use"), "{why}");
    expect(&rx, "round 1: in use, not ejected");
    let exits = expect_ok(&sock, "GET", "/exits", None).unwrap().unwrap().to_string();
    assert!(exits.contains("virtio-pmem"), "still there: {exits}");
    expect_ok(&sock, "DELETE", "/pmem/p0", None).unwrap();
    assert!(expect(&rx, "round 1: slot").ends_with("gone"));

    // Round 2: a NIC (its tap made by the VMM), ejected when asked.
    let nic = json!({"iface_id": "eth0", "host_dev_name": tap});
    put("/network-interfaces/eth0", nic).unwrap();
    assert!(expect(&rx, "round 2: slot").contains("id 10411af4"));
    expect_ok(&sock, "DELETE", "/network-interfaces/eth0", None).unwrap();
    assert!(expect(&rx, "round 2: slot").ends_with("gone"));
    expect(&rx, "hotplug: done");
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn hotplug_is_refused_on_mmio_and_on_a_full_bus() {
    if !kvm_or_skip("hotplug_is_refused_on_mmio_and_on_a_full_bus") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("api.sock");
    for pci in [false, true] {
        let extra: &[&str] = if pci { &["--enable-pci"] } else { &[] };
        let mut child = api_process_with(&sock, std::process::Stdio::null(), extra);
        let put = |path: &str, body: serde_json::Value| expect_ok(&sock, "PUT", path, Some(&body));
        put("/boot-source", json!({"kernel_image_path": payloads.join("wait.elf")})).unwrap();
        put("/actions", json!({"action_type": "InstanceStart"})).unwrap();
        let drive = |n: u32| json!({"drive_id": format!("d{n}"), "path_on_host": file(&dir, &format!("d{n}"), 4096), "is_root_device": false});
        if !pci {
            let why = fault(&sock, "PUT", "/drives/d0", drive(0));
            assert!(why.contains("PCI is not enabled"), "{why}");
            assert!(fault(&sock, "DELETE", "/drives/d0", json!({})).contains("PCI is not enabled"));
        } else {
            // Every free slot taken (31 but the guest's own), then one 400.
            let mut n = 0;
            let why = loop {
                match expect_ok(&sock, "PUT", &format!("/drives/d{n}"), Some(&drive(n))) {
                    Ok(_) => n += 1,
                    Err(_) => break fault(&sock, "PUT", &format!("/drives/d{n}"), drive(n)),
                }
                assert!(n < 32, "more devices than slots");
            };
            assert!(why.contains("no free PCI slot"), "{why}");
            assert!(n >= 25, "only {n} plugged");
            let config = expect_ok(&sock, "GET", "/vm/config", None).unwrap().unwrap();
            assert_eq!(config["drives"].as_array().unwrap().len(), n as usize);
            // An unplug frees a slot the next plug takes (the guest has no driver on it).
            expect_ok(&sock, "DELETE", "/drives/d3", None).unwrap();
            put(&format!("/drives/d{n}"), drive(n)).unwrap();
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[test]
fn hotplugged_devices_are_in_the_next_snapshot_and_come_back_on_restore() {
    if !kvm_or_skip("hotplugged_devices_are_in_the_next_snapshot_and_come_back_on_restore") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("api.sock");
    let mut child = api_process(&sock, std::process::Stdio::null());
    let put = |sock: &std::path::Path, path: &str, body: serde_json::Value| expect_ok(sock, "PUT", path, Some(&body));
    put(&sock, "/boot-source", json!({"kernel_image_path": payloads.join("wait.elf")})).unwrap();
    put(&sock, "/actions", json!({"action_type": "InstanceStart"})).unwrap();
    let drive = json!({"drive_id": "d0", "path_on_host": file(&dir, "d0", 1 << 20), "is_root_device": false});
    put(&sock, "/drives/d0", drive).unwrap();
    put(&sock, "/pmem/p0", json!({"id": "p0", "path_on_host": file(&dir, "p0", 2 << 20)})).unwrap();
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let (state, mem) = (dir.join("state"), dir.join("mem"));
    put(&sock, "/snapshot/create", json!({"snapshot_path": state, "mem_file_path": mem})).unwrap();
    let _ = child.kill();
    let _ = child.wait();

    let sock = dir.join("restored.sock");
    let mut child = api_process_with(&sock, std::process::Stdio::null(), &[]);
    let load = json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": mem}, "resume_vm": true});
    put(&sock, "/snapshot/load", load).unwrap();
    let config = expect_ok(&sock, "GET", "/vm/config", None).unwrap().unwrap();
    assert_eq!((config["drives"][0]["drive_id"].as_str(), config["pmem"][0]["id"].as_str()), (Some("d0"), Some("p0")));
    let exits = expect_ok(&sock, "GET", "/exits", None).unwrap().unwrap().to_string();
    assert!(exits.contains("virtio-blk") && exits.contains("virtio-pmem"), "{exits}");
    // The restored machine takes more, and gives the restored ones back.
    let more = json!({"drive_id": "d1", "path_on_host": file(&dir, "d1", 1 << 20), "is_root_device": false});
    put(&sock, "/drives/d1", more).unwrap();
    expect_ok(&sock, "DELETE", "/drives/d0", None).unwrap();
    expect_ok(&sock, "DELETE", "/pmem/p0", None).unwrap();
    let config = expect_ok(&sock, "GET", "/vm/config", None).unwrap().unwrap();
    assert_eq!(config["drives"].as_array().map(Vec::len), Some(1), "{config}");
    assert_eq!(config["drives"][0]["drive_id"], "d1");
    let _ = child.kill();
    let _ = child.wait();
}
