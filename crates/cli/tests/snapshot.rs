//! Snapshots through Firecracker's API: a guest counting, writing its disk and echoing
//! frames is paused mid-work, snapshotted, its VMM killed, and resumed by a new VMM, a
//! hundred times over; its count goes on from where it stopped each time, its disk holds
//! every write it finished, frames sent after each restore come back, and its final
//! iteration count is exact. Bad state and memory files, and
//! requests at the wrong time, are refused with a fault_message while the VMM serves on.

mod common;
mod snapshot_vmm;
use common::*;
use exitless_lab::api_client::{expect_ok, request};
use serde_json::json;
use snapshot_vmm::*;
use std::io::BufRead;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

const TICKS: u64 = 2500;

/// A counting guest (`counter` with `params`) on a VMM at `dir/a.sock`, paused after five
/// ticks and snapshotted: the VMM (still running, paused) and the state and memory files.
fn counting_snapshot(dir: &Path, vcpus: u8, params: &str) -> (Vmm, String, String) {
    let payloads = payloads_in(dir);
    let sock = dir.join("a.sock");
    let vmm = Vmm::start(&sock);
    expect_ok(&sock, "PUT", "/machine-config", Some(&json!({"vcpu_count": vcpus, "mem_size_mib": 64}))).unwrap();
    let boot =
        json!({"kernel_image_path": payloads.join("counter.elf"), "boot_args": format!("exitless.params={params}")});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    vmm.wait_for_ticks(5);
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let (state, mem) = snapshot(&sock, dir, 0);
    (vmm, state, mem)
}

/// Snapshot and restore hops in the chain.
const HOPS: u32 = 100;
/// The lab frames echoed across the hops.
const FRAME: usize = 128;

/// How many sectors from 1 on carry the pattern stamped with their own number (snapwork's
/// write of tick N).
fn sectors_written(disk: &Path) -> u64 {
    let bytes = std::fs::read(disk).unwrap();
    let word = |s: &[u8], k: usize| u64::from_le_bytes(s[8 * k..8 * k + 8].try_into().unwrap());
    bytes.chunks(512).skip(1).take_while(|s| word(s, 0) == word(s, 1) && word(s, 0) != 0).count() as u64
}

/// A snapwork guest's host side: a tap that outlives each VMM, a sink reading it, a disk.
struct SnapworkHost {
    dir: TempDir,
    payloads: std::path::PathBuf,
    tap: String,
    sink: exitless_lab::sink::Sink,
    disk: std::path::PathBuf,
    _remove: RemoveLinks,
}

impl SnapworkHost {
    fn new(tap_prefix: &str) -> SnapworkHost {
        let dir = tempdir();
        let payloads = payloads_in(&dir);
        let tap = format!("{tap_prefix}{}", std::process::id() % 100_000);
        let ip = |args: &[&str]| std::process::Command::new("ip").args(args).status().unwrap().success();
        assert!(ip(&["tuntap", "add", "dev", &tap, "mode", "tap"]) && ip(&["link", "set", "dev", &tap, "up"]));
        let remove = RemoveLinks(vec![tap.clone()]);
        let sink = exitless_lab::sink::Sink::on_host(&tap, FRAME).unwrap();
        let disk = dir.join("disk.img");
        std::fs::write(&disk, vec![0u8; 2 << 20]).unwrap();
        SnapworkHost { dir, payloads, tap, sink, disk, _remove: remove }
    }

    /// A VMM on `sock` started with `flags`, snapwork configured with the disk, a NIC on
    /// the tap and `extra` requests, and InstanceStart.
    fn boot(&self, sock: &Path, flags: &[&str], extra: &[(&str, serde_json::Value)]) -> Vmm {
        let vmm = Vmm::start_with(sock, flags);
        expect_ok(sock, "PUT", "/machine-config", Some(&json!({"vcpu_count": 1, "mem_size_mib": 64}))).unwrap();
        let boot = json!({"kernel_image_path": self.payloads.join("snapwork.elf"),
                          "boot_args": format!("exitless.params={TICKS}")});
        expect_ok(sock, "PUT", "/boot-source", Some(&boot)).unwrap();
        let drive =
            json!({"drive_id": "work", "path_on_host": self.disk, "is_root_device": false, "is_read_only": false});
        expect_ok(sock, "PUT", "/drives/work", Some(&drive)).unwrap();
        let nic = json!({"iface_id": "eth0", "host_dev_name": self.tap, "guest_mac": "06:00:ac:10:00:02"});
        expect_ok(sock, "PUT", "/network-interfaces/eth0", Some(&nic)).unwrap();
        for (path, body) in extra {
            expect_ok(sock, "PUT", path, Some(body)).unwrap();
        }
        expect_ok(sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
        vmm
    }
}

#[test]
fn a_working_guest_goes_on_through_a_hundred_restores() {
    let test = "a_working_guest_goes_on_through_a_hundred_restores";
    if !kvm_or_skip(test) {
        return;
    }
    if !exitless_lab::netns::available() && !skip_or_fail(test, "needs root and /dev/net/tun for its tap") {
        return;
    }
    let host = SnapworkHost::new("exsnap");
    let (dir, sink, disk) = (&host.dir, &host.sink, &host.disk);
    let sock = dir.join("a.sock");
    let first = host.boot(&sock, &["--enable-pci"], &[]);
    first.wait_for_ticks(20);
    let early = json!({"snapshot_path": dir.join("x.json"), "mem_file_path": dir.join("x.bin")});
    assert!(fault(&sock, "PUT", "/snapshot/create", early).contains("paused"));
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    // Without track_dirty_pages a Diff holds every resident page (Firecracker's mincore
    // fallback, vstate/vm.rs): RAM's length, the pages the guest touched among them.
    let diff =
        json!({"snapshot_type": "Diff", "snapshot_path": dir.join("x.json"), "mem_file_path": dir.join("x.bin")});
    expect_ok(&sock, "PUT", "/snapshot/create", Some(&diff)).unwrap();
    let x = std::fs::metadata(dir.join("x.bin")).unwrap();
    assert_eq!(x.len(), 64 << 20);
    assert!(std::os::unix::fs::MetadataExt::blocks(&x) > 0, "a Diff of a running guest holds no page");
    let (mut state, mut mem) = snapshot(&sock, dir, 0);
    let mut vmm = first;
    let mut slowest = Duration::ZERO;
    let sender = sink.sender();
    for hop in 1..=HOPS {
        vmm.stop_and_drain();
        // Every tick said before the snapshot had its sector written first (the ticks
        // read may lag what the guest said: the snapshot's own count does not).
        let (said, reached) = (vmm.ticks().last().copied().unwrap_or(0), saved_tick(&mem));
        let written = sectors_written(disk);
        assert!(written >= said.max(reached), "hop {hop}: tick {said} said, {reached} reached, {written} written");
        let sock = dir.join(format!("v{hop}.sock"));
        vmm = Vmm::start(&sock);
        // How fast a load is is the snapshot bench's to measure; here, that it ends.
        let took = load(&sock, &state, &mem);
        slowest = slowest.max(took);
        assert!(took < Duration::from_secs(30), "hop {hop}: {took:?}");
        // The NIC goes on: a frame sent now comes back.
        sender.send(&exitless_lab::sink::frame([2, 0, 0, 0, 0, 1], FRAME, u64::from(hop))).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while sink.frames() < u64::from(hop) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(sink.frames(), u64::from(hop), "hop {hop}: the frame sent after the restore did not come back");
        if hop == HOPS {
            break;
        }
        let seen = vmm.ticks().len();
        vmm.wait_for_ticks(seen + 3);
        expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
        // The count went on from the tick the snapshot had reached.
        assert_goes_on(&mem, &vmm.ticks(), &format!("hop {hop}"));
        (state, mem) = snapshot(&sock, dir, hop);
    }
    eprintln!("{HOPS} restores, the slowest PUT /snapshot/load answered in {slowest:?}");
    let status = vmm.child.wait().unwrap();
    let lines = vmm.lines.lock().unwrap().clone();
    assert!(status.success(), "{status}: {lines:?}");
    // Every iteration counted exactly once across a hundred and one VMMs, every frame
    // echoed once, every sector written.
    let done =
        format!("snapwork: done at tick {TICKS} ({} iterations), {HOPS} frames echoed, 0 writes failed", TICKS << 20);
    assert!(lines.iter().any(|l| l == &done), "{lines:?}");
    assert_eq!(sectors_written(disk), TICKS);
    let report = host.sink.finish(u64::from(HOPS), Duration::from_millis(100));
    assert_eq!((report.frames, report.duplicates, report.corrupt), (u64::from(HOPS), 0, 0));
}

#[test]
fn bad_snapshots_and_bad_timing_are_refused_and_the_vmm_serves_on() {
    if !kvm_or_skip("bad_snapshots_and_bad_timing_are_refused_and_the_vmm_serves_on") {
        return;
    }
    let dir = tempdir();
    // A good snapshot to spoil.
    let (mut a, state, mem) = counting_snapshot(&dir, 2, "100000");
    let _ = a.child.kill();
    let payloads = dir.join("payloads");
    let boot = json!({"kernel_image_path": payloads.join("counter.elf"), "boot_args": "exitless.params=100000"});
    let described = exitless(&["--describe-snapshot", &state]);
    assert_eq!(
        stdout(&described).trim(),
        format!("v{}.0.0", exitless_vmm::snapshot::FORMAT_VERSION),
        "{}",
        stderr(&described)
    );
    let text = std::fs::read_to_string(&state).unwrap();
    let spoiled = |name: &str, content: String| {
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        path.display().to_string()
    };
    let truncated = spoiled("truncated.json", text[..text.len() / 2].to_string());
    let format = format!("\"format\":{}", exitless_vmm::snapshot::FORMAT_VERSION);
    let later = spoiled("later.json", text.replacen(&format, "\"format\":99", 1));
    let err = assert_one_line_error(&["--describe-snapshot", &later]);
    assert!(stderr(&err).contains("format 99"), "{}", stderr(&err));
    // Edited by hand: the checksum refuses it; sealed again, the count check does.
    let edited = text.replacen("\"vcpu_count\":2", "\"vcpu_count\":3", 1);
    let damaged = spoiled("damaged.json", edited.clone());
    let no_vcpus = spoiled("vcpus.json", resealed(&edited));
    let short_mem = dir.join("short.bin");
    std::fs::write(&short_mem, vec![0u8; 4096]).unwrap();
    let short_mem = short_mem.display().to_string();

    let sock = dir.join("b.sock");
    let mut b = Vmm::start(&sock);
    let try_load = |state: &str, mem: &str| {
        let body = json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": mem}});
        fault(&sock, "PUT", "/snapshot/load", body)
    };
    assert!(try_load(&truncated, &mem).contains("not an exitless snapshot"));
    assert!(try_load(&later, &mem).contains("format 99"));
    assert!(try_load(&damaged, &mem).contains("it was damaged"));
    assert!(try_load(&no_vcpus, &mem).contains("vCPU states for 3 vCPUs"));
    assert!(try_load(&state, &short_mem).contains("holds 4096 bytes"));
    assert!(try_load("/nonexistent/s.json", &mem).contains("cannot read"));
    let nobody = dir.join("nobody.sock");
    let uffd = json!({"snapshot_path": state, "mem_backend": {"backend_type": "Uffd", "backend_path": nobody}});
    assert!(fault(&sock, "PUT", "/snapshot/load", uffd).contains("cannot connect to the handler"));
    // Each refusal left the VMM unconfigured and serving: the good snapshot loads, paused.
    let body = json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": mem}});
    expect_ok(&sock, "PUT", "/snapshot/load", Some(&body)).unwrap();
    let info = request(&sock, "GET", "/", None).unwrap().body.unwrap();
    assert_eq!(info["state"], "Paused", "{info}");
    assert!(fault(&sock, "PUT", "/snapshot/load", body.clone()).contains("not supported after starting"));
    let _ = b.child.kill();

    // A microVM with a virtio device snapshots; a state file whose devices contradict its
    // configuration is refused, naming both.
    let sock = dir.join("c.sock");
    let mut c = Vmm::start(&sock);
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/entropy", Some(&json!({}))).unwrap();
    let configured = json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": mem}});
    assert!(fault(&sock, "PUT", "/snapshot/load", configured).contains("before anything is configured"));
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    c.wait_for_ticks(1);
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let (c_state, c_mem) = (dir.join("c.json"), dir.join("c.bin"));
    let body = json!({"snapshot_path": c_state, "mem_file_path": c_mem});
    expect_ok(&sock, "PUT", "/snapshot/create", Some(&body)).unwrap();
    let _ = c.child.kill();
    let text = std::fs::read_to_string(&c_state).unwrap();
    let mut edited: serde_json::Value = serde_json::from_str(&text).unwrap();
    edited["config"]["entropy"] = serde_json::Value::Null;
    let no_rng = spoiled("no-rng.json", resealed(&edited.to_string()));
    let sock = dir.join("d.sock");
    let mut d = Vmm::start(&sock);
    let body = json!({"snapshot_path": no_rng, "mem_backend": {"backend_type": "File", "backend_path": c_mem}});
    let refused = fault(&sock, "PUT", "/snapshot/load", body);
    assert!(
        refused.contains("the snapshot has devices [")
            && refused.contains("virtio-rng, vmclock, vmgenid], this machine ["),
        "{refused}"
    );
    // A device's state of another version, or with a damaged field: one line naming both.
    for (id, field, value, said) in [
        ("virtio-rng", "version", json!(9), "virtio-rng: its state is version 9; this exitless reads version 1"),
        ("serial", "lcr", json!("x"), "serial: its state's field `lcr` does not parse: invalid type"),
    ] {
        let mut edited: serde_json::Value = serde_json::from_str(&text).unwrap();
        let state = &mut edited["machine"]["devices"]["devices"][id]["state"];
        *if field == "version" { &mut state[field] } else { &mut state["state"][field] } = value;
        let spoilt = spoiled("device.json", resealed(&edited.to_string()));
        let body = json!({"snapshot_path": spoilt, "mem_backend": {"backend_type": "File", "backend_path": c_mem}});
        let refused = fault(&sock, "PUT", "/snapshot/load", body);
        assert!(refused.contains(said) && !refused.contains('\n'), "{refused}");
    }
    let _ = d.child.kill();
}

#[test]
fn the_snapshot_lab_measures_create_and_load() {
    if !kvm_or_skip("the_snapshot_lab_measures_create_and_load") {
        return;
    }
    let (_, json) =
        bench_json(&["snapshot", "--mem", "128", "--written", "0,0.25", "--runs", "1", "--types", "Full,Diff"]);
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{json}");
    for row in rows {
        assert!(row["load_ms"].as_f64().unwrap() > 0.0 && row["load_to_running_ms"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["create_ms"].as_f64().unwrap() > 0.0 && row["state_kib"].as_u64().unwrap() > 0, "{row}");
    }
    let written = |kind: &str, share: f64| {
        let row = rows.iter().find(|r| r["snapshot_type"] == kind && r["dirty_fraction"] == share).unwrap();
        row["memory_written_kib"].as_u64().unwrap()
    };
    // The memory file holds what the guest wrote, and little else: zero pages are holes.
    assert!(written("Full", 0.0) < 4096 && written("Full", 0.25) >= 32 * 1024, "{json}");
    // A Diff holds what the guest wrote after the base (three ticks of counting), not the
    // 32 MiB it wrote before it; and the base with it laid over resumes (the lab checks
    // the tick that follows).
    assert!(written("Diff", 0.25) < 4096, "{json}");
}

#[test]
fn diff_snapshots_laid_over_their_base_equal_a_full_one() {
    if !kvm_or_skip("diff_snapshots_laid_over_their_base_equal_a_full_one") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("a.sock");
    let mut a = Vmm::start(&sock);
    let mc = json!({"vcpu_count": 1, "mem_size_mib": 64, "track_dirty_pages": true});
    expect_ok(&sock, "PUT", "/machine-config", Some(&mc)).unwrap();
    let boot = json!({"kernel_image_path": payloads.join("counter.elf"), "boot_args": "exitless.params=100000,8"});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    let state = |running: bool| {
        expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": if running { "Resumed" } else { "Paused" }}))).unwrap()
    };
    let take = |kind: &str, n: u32| {
        let (s, m) = (dir.join(format!("s{n}.json")), dir.join(format!("m{n}.bin")));
        let body = json!({"snapshot_type": kind, "snapshot_path": s, "mem_file_path": m});
        expect_ok(&sock, "PUT", "/snapshot/create", Some(&body)).unwrap();
        (s.display().to_string(), m.display().to_string())
    };
    a.wait_for_ticks(10);
    state(false);
    let (_, base) = take("Full", 0);
    let mut diffs = Vec::new();
    for n in 1..=2 {
        state(true);
        let seen = a.ticks().len();
        a.wait_for_ticks(seen + 10);
        state(false);
        diffs.push(take("Diff", n));
    }
    // At the same pause as the last Diff: the memory the Diffs must add up to.
    let (_, full) = take("Full", 3);
    a.stop_and_drain();
    let merged = dir.join("merged.bin");
    std::fs::copy(&base, &merged).unwrap();
    for (_, diff) in &diffs {
        let out = exitless(&["rebase-snap", "--base-file", merged.to_str().unwrap(), "--diff-file", diff]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let (merged_bytes, full_bytes) = (std::fs::read(&merged).unwrap(), std::fs::read(&full).unwrap());
    assert!(merged_bytes == full_bytes, "the base with both Diffs laid over it differs from the Full snapshot");
    // A Diff holds only what was written since the snapshot before it: far less than RAM.
    let allocated = |p: &str| std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(p).unwrap()) * 512;
    assert!(allocated(&diffs[1].1) < 16 << 20, "{}", allocated(&diffs[1].1));
    // And the last Diff's state with the merged memory resumes counting where it stopped.
    let sock = dir.join("b.sock");
    let b = Vmm::start(&sock);
    load(&sock, &diffs[1].0, merged.to_str().unwrap());
    b.wait_for_ticks(3);
    assert_goes_on(merged.to_str().unwrap(), &b.ticks(), "the merged Diffs");
}

/// A host connection through the vsock socket to the guest's `port`, and `n` bytes echoed.
fn vsock_echo(uds: &Path, port: u32, n: usize) -> std::os::unix::net::UnixStream {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(uds).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    stream.write_all(format!("CONNECT {port}\n").as_bytes()).unwrap();
    let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
    let mut ok = String::new();
    reader.read_line(&mut ok).unwrap();
    assert!(ok.starts_with("OK "), "{ok:?}");
    let sent: Vec<u8> = (0..n).map(|i| (i * 13 + 5) as u8).collect();
    stream.write_all(&sent).unwrap();
    let mut back = vec![0u8; n];
    reader.read_exact(&mut back).unwrap();
    assert!(back == sent, "the echo differs");
    stream
}

#[test]
fn a_restored_guests_vsock_streams_are_reset_and_new_ones_work() {
    if !kvm_or_skip("a_restored_guests_vsock_streams_are_reset_and_new_ones_work") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let uds = dir.join("v.sock");
    let sock = dir.join("a.sock");
    let a = Vmm::start(&sock);
    // An echo server on port 1234 that ends after two streams closed.
    let boot = json!({"kernel_image_path": payloads.join("vsockecho.elf"), "boot_args": "exitless.params=1234,2"});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/vsock", Some(&json!({"guest_cid": 3, "uds_path": uds}))).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !a.lines.lock().unwrap().iter().any(|l| l.contains("listening on port 1234")) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    // A stream open when the snapshot is taken.
    let open = vsock_echo(&uds, 1234, 10_000);
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let (state, mem) = snapshot(&sock, &dir, 0);
    // The snapshotted VMM goes on with its stream after the snapshot.
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Resumed"}))).unwrap();
    let mut a = a;
    let mut again = open.try_clone().unwrap();
    {
        use std::io::{Read, Write};
        again.write_all(b"still here").unwrap();
        let mut back = [0u8; 10];
        again.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"still here");
    }
    let _ = a.child.kill();
    let _ = a.child.wait();
    drop(open);

    // The restored guest learns of the reset from its event queue; its socket is bound
    // anew (the killed VMM's was left behind), and a new stream is echoed.
    let sock = dir.join("b.sock");
    let mut b = Vmm::start(&sock);
    load(&sock, &state, &mem);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !b.lines.lock().unwrap().iter().any(|l| l.contains("transport reset")) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let lines = b.lines.lock().unwrap().clone();
    assert!(lines.iter().any(|l| l == "vsockecho: transport reset, 1 streams dropped, CID 3"), "{lines:?}");
    let stream = vsock_echo(&uds, 1234, 100_000);
    stream.shutdown(std::net::Shutdown::Both).unwrap();
    let status = b.child.wait().unwrap();
    let lines = b.lines.lock().unwrap().clone();
    assert!(status.success(), "{status}: {lines:?}");
    let end = lines.iter().find(|l| l.starts_with("vsockecho: ") && l.contains("bytes echoed"));
    assert!(end.is_some_and(|l| l.ends_with("0 client bytes checked, 0 errors")), "{lines:?}");
}

#[test]
fn a_snapshot_loads_through_a_page_fault_handler() {
    if !kvm_or_skip("a_snapshot_loads_through_a_page_fault_handler") {
        return;
    }
    let dir = tempdir();
    let (mut a, state, mem) = counting_snapshot(&dir, 1, "60,4");
    let _ = a.child.kill();

    // The handler, as a user runs Firecracker's: it listens, the load connects.
    let handler_sock = dir.join("uffd.sock");
    let handler = std::process::Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(["uffd-handler", "--socket", handler_sock.to_str().unwrap(), "--mem-file", &mem])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !handler_sock.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let sock = dir.join("b.sock");
    let mut b = Vmm::start(&sock);
    let body = json!({"snapshot_path": state, "mem_backend": {"backend_type": "Uffd", "backend_path": handler_sock}, "resume_vm": true});
    expect_ok(&sock, "PUT", "/snapshot/load", Some(&body)).unwrap();
    let status = b.child.wait().unwrap();
    b.stop_and_drain();
    let ticks = b.ticks();
    assert!(status.success(), "{status}: {ticks:?}");
    assert_goes_on(&mem, &ticks, "through the handler");
    // To its own last tick: the guest counted every one.
    assert_eq!(*ticks.last().unwrap(), 60, "{ticks:?}");
    let done = format!("counter: done at tick 60 ({} iterations)", 60u64 << 20);
    assert!(b.lines.lock().unwrap().iter().any(|l| l == &done), "{ticks:?}");
    // The guest's memory came from the handler: the pages it touched, the 4 MiB it wrote
    // before the snapshot among them (the counter reads nothing back, but the image and
    // stack are touched at once).
    let out = handler.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    let pages: u64 = said.split(' ').nth(3).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(out.status.success() && pages > 0, "{said}{}", String::from_utf8_lossy(&out.stderr));
    let _ = b.child.kill();
}

/// A restore puts every device where the snapshot had it, whatever the new VMM's flags:
/// flintlock passes `--boot-timer` on every start, and Firecracker attaches no boot timer
/// on restore (its page may be where a device is). A guest booted with the timer is
/// restored without it, then with it again; after each hop its NIC echoes and its disk
/// takes writes. Before this, a NIC was left off the bus and the load answered 204. The
/// restoring VMMs are not given `--enable-pci`: the transport is the snapshot's.
#[test]
fn a_restore_puts_every_device_back_whatever_the_boot_timer_flag() {
    let test = "a_restore_puts_every_device_back_whatever_the_boot_timer_flag";
    if !kvm_or_skip(test) {
        return;
    }
    if !exitless_lab::netns::available() && !skip_or_fail(test, "needs root and /dev/net/tun for its tap") {
        return;
    }
    // On PCI (BARs the guest placed) and on MMIO (Firecracker's default: windows and lines).
    restore_hops(&["--enable-pci", "--boot-timer"]);
    restore_hops(&["--boot-timer"]);
}

fn restore_hops(first: &[&str]) {
    let host = SnapworkHost::new("exbt");
    let (dir, sink, disk) = (&host.dir, &host.sink, &host.disk);
    let sender = sink.sender();
    let sock = dir.join("a.sock");
    // A second NIC, attached after eth0 (the guest's) and sorted before it, on a tap of its
    // own; each restore moves it to another tap by iface_id, eth0 staying on the sink's.
    let aux: Vec<String> = (0..2).map(|n| format!("exbx{n}{}", std::process::id() % 100_000)).collect();
    let _remove = RemoveLinks(aux.clone());
    let ip = |args: &[&str]| std::process::Command::new("ip").args(args).status().unwrap().success();
    assert!(aux.iter().all(|t| ip(&["tuntap", "add", "dev", t, "mode", "tap"]) && ip(&["link", "set", t, "up"])));
    let nic = json!({"iface_id": "aux", "host_dev_name": aux[0], "guest_mac": "06:00:ac:10:00:09"});
    let mut vmm = host.boot(&sock, first, &[("/entropy", json!({})), ("/network-interfaces/aux", nic)]);
    vmm.wait_for_ticks(5);
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let (mut state, mut mem) = snapshot(&sock, dir, 0);
    for (hop, flags) in [(1u32, &[][..]), (2, &["--boot-timer"][..])] {
        let _ = vmm.child.kill();
        let _ = vmm.child.wait();
        let sock = dir.join(format!("v{hop}.sock"));
        vmm = Vmm::start_with(&sock, flags);
        let overrides = json!([{"iface_id": "aux", "host_dev_name": aux[hop as usize % 2]},
                               {"iface_id": "eth0", "host_dev_name": host.tap}]);
        let body = json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": mem},
                          "resume_vm": true, "network_overrides": overrides});
        expect_ok(&sock, "PUT", "/snapshot/load", Some(&body)).unwrap();
        let config = request(&sock, "GET", "/vm/config", None).unwrap().body.unwrap();
        assert_eq!(config["network-interfaces"][1]["host_dev_name"], aux[hop as usize % 2], "{config}");
        sender.send(&exitless_lab::sink::frame([2, 0, 0, 0, 0, 1], FRAME, u64::from(hop))).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while sink.frames() < u64::from(hop) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            sink.frames(),
            u64::from(hop),
            "{first:?}, hop {hop} ({flags:?}): the NIC did not echo after the restore"
        );
        let before = sectors_written(disk);
        let seen = vmm.ticks().len();
        vmm.wait_for_ticks(seen + 3);
        assert!(
            sectors_written(disk) > before,
            "{first:?}, hop {hop} ({flags:?}): the disk took no write after the restore"
        );
        expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
        (state, mem) = snapshot(&sock, dir, hop);
    }
    let _ = vmm.child.kill();
    let _ = vmm.child.wait();
}

/// A state file with its checksum made to fit its (edited) contents, as the VMM computes it:
/// FNV-1a 64 over the compact JSON of `[machine, config]`.
fn resealed(text: &str) -> String {
    let mut file: serde_json::Value = serde_json::from_str(text).unwrap();
    let bytes = serde_json::to_vec(&(&file["machine"], &file["config"])).unwrap();
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    file["checksum"] = format!("fnv1a64:{hash:016x}").into();
    serde_json::to_string(&file).unwrap()
}
