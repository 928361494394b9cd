//! Snapshots through Firecracker's API: a counting guest is paused mid-count, snapshotted,
//! its VMM killed, and resumed by a new VMM, a hundred times over; its count goes on from
//! where it stopped each time and its final iteration count is exact. Bad state and memory files, and
//! requests at the wrong time, are refused with a fault_message while the VMM serves on.

mod common;
use common::*;
use exitless_lab::api_client::{expect_ok, request};
use serde_json::json;
use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TICKS: u64 = 2500;

/// A VMM whose stdout lines are collected as they come.
struct Vmm {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Vmm {
    fn start(sock: &Path) -> Vmm {
        let mut child = api_process(sock, Stdio::piped());
        let out = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Vmm { child, lines }
    }

    /// The ticks printed whole so far.
    fn ticks(&self) -> Vec<u64> {
        let lines = self.lines.lock().unwrap();
        lines.iter().filter_map(|l| l.strip_prefix("counter: tick ")?.parse().ok()).collect()
    }

    fn wait_for_ticks(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.ticks().len() < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(self.ticks().len() >= n, "{:?}", self.lines.lock().unwrap());
    }
}

fn snapshot(sock: &Path, dir: &Path, n: u32) -> (String, String) {
    let (state, mem) = (dir.join(format!("s{n}.json")), dir.join(format!("m{n}.bin")));
    let body = json!({"snapshot_type": "Full", "snapshot_path": state, "mem_file_path": mem});
    expect_ok(sock, "PUT", "/snapshot/create", Some(&body)).unwrap();
    (state.display().to_string(), mem.display().to_string())
}

fn load(sock: &Path, state: &str, mem: &str) -> Duration {
    let body = json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": mem}, "resume_vm": true});
    let started = Instant::now();
    expect_ok(sock, "PUT", "/snapshot/load", Some(&body)).unwrap();
    started.elapsed()
}

/// Snapshot and restore hops in the chain.
const HOPS: u32 = 100;

#[test]
fn a_counting_guest_goes_on_through_a_hundred_restores() {
    if !kvm_or_skip("a_counting_guest_goes_on_through_a_hundred_restores") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("a.sock");
    let first = Vmm::start(&sock);
    expect_ok(&sock, "PUT", "/machine-config", Some(&json!({"vcpu_count": 1, "mem_size_mib": 64}))).unwrap();
    let boot =
        json!({"kernel_image_path": payloads.join("counter.elf"), "boot_args": format!("exitless.params={TICKS}")});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    first.wait_for_ticks(20);
    let early = json!({"snapshot_path": dir.join("x.json"), "mem_file_path": dir.join("x.bin")});
    assert!(fault(&sock, "PUT", "/snapshot/create", early).contains("paused"));
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let diff =
        json!({"snapshot_type": "Diff", "snapshot_path": dir.join("x.json"), "mem_file_path": dir.join("x.bin")});
    assert!(fault(&sock, "PUT", "/snapshot/create", diff).contains("Diff"));
    let (mut state, mut mem) = snapshot(&sock, &dir, 0);
    let mut vmm = first;
    let mut last = *vmm.ticks().last().unwrap();
    let mut slowest = Duration::ZERO;
    for hop in 1..=HOPS {
        let _ = vmm.child.kill();
        let _ = vmm.child.wait();
        let sock = dir.join(format!("v{hop}.sock"));
        vmm = Vmm::start(&sock);
        let took = load(&sock, &state, &mem);
        slowest = slowest.max(took);
        assert!(took < Duration::from_secs(2), "hop {hop}: {took:?}");
        if hop == HOPS {
            break;
        }
        let seen = vmm.ticks().len();
        vmm.wait_for_ticks(seen + 3);
        expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
        (state, mem) = snapshot(&sock, &dir, hop);
        let ticks = vmm.ticks();
        // The count went on from the tick it had reached: the next whole tick follows it
        // (the line cut by the kill may be the one after `last`).
        assert!(ticks[0] == last + 1 || ticks[0] == last + 2, "hop {hop}: {last} then {ticks:?}");
        assert!(ticks.windows(2).all(|w| w[1] == w[0] + 1), "hop {hop}: {ticks:?}");
        last = *ticks.last().unwrap();
    }
    eprintln!("{HOPS} restores, the slowest PUT /snapshot/load answered in {slowest:?}");
    let status = vmm.child.wait().unwrap();
    let lines = vmm.lines.lock().unwrap().clone();
    assert!(status.success(), "{status}: {lines:?}");
    // Every iteration counted exactly once across four VMMs.
    let done = format!("counter: done at tick {TICKS} ({} iterations)", TICKS << 20);
    assert!(lines.iter().any(|l| l == &done), "{lines:?}");
}

#[test]
fn bad_snapshots_and_bad_timing_are_refused_and_the_vmm_serves_on() {
    if !kvm_or_skip("bad_snapshots_and_bad_timing_are_refused_and_the_vmm_serves_on") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    // A good snapshot to spoil.
    let sock = dir.join("a.sock");
    let mut a = Vmm::start(&sock);
    expect_ok(&sock, "PUT", "/machine-config", Some(&json!({"vcpu_count": 2, "mem_size_mib": 64}))).unwrap();
    let boot = json!({"kernel_image_path": payloads.join("counter.elf"), "boot_args": "exitless.params=100000"});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    a.wait_for_ticks(5);
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let (state, mem) = snapshot(&sock, &dir, 0);
    let _ = a.child.kill();
    let described = exitless(&["--describe-snapshot", &state]);
    assert_eq!(stdout(&described).trim(), "v1.0.0", "{}", stderr(&described));
    let text = std::fs::read_to_string(&state).unwrap();
    let spoiled = |name: &str, content: String| {
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        path.display().to_string()
    };
    let truncated = spoiled("truncated.json", text[..text.len() / 2].to_string());
    let later = spoiled("later.json", text.replacen("\"format\":1", "\"format\":99", 1));
    let err = assert_one_line_error(&["--describe-snapshot", &later]);
    assert!(stderr(&err).contains("format 99"), "{}", stderr(&err));
    let no_vcpus = spoiled("vcpus.json", text.replacen("\"vcpu_count\":2", "\"vcpu_count\":3", 1));
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
    assert!(try_load(&no_vcpus, &mem).contains("vCPU states for 3 vCPUs"));
    assert!(try_load(&state, &short_mem).contains("holds 4096 bytes"));
    assert!(try_load("/nonexistent/s.json", &mem).contains("cannot read"));
    let uffd = json!({"snapshot_path": state, "mem_backend": {"backend_type": "Uffd", "backend_path": "/tmp/u"}});
    assert!(fault(&sock, "PUT", "/snapshot/load", uffd).contains("Uffd"));
    // Each refusal left the VMM unconfigured and serving: the good snapshot loads, paused.
    let body = json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": mem}});
    expect_ok(&sock, "PUT", "/snapshot/load", Some(&body)).unwrap();
    let info = request(&sock, "GET", "/", None).unwrap().body.unwrap();
    assert_eq!(info["state"], "Paused", "{info}");
    assert!(fault(&sock, "PUT", "/snapshot/load", body.clone()).contains("not supported after starting"));
    let _ = b.child.kill();

    // A microVM with a device whose state is not saved yet is refused by name.
    let sock = dir.join("c.sock");
    let mut c = Vmm::start(&sock);
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/entropy", Some(&json!({}))).unwrap();
    let configured = json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": mem}});
    assert!(fault(&sock, "PUT", "/snapshot/load", configured).contains("before anything is configured"));
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    c.wait_for_ticks(1);
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let body = json!({"snapshot_path": dir.join("c.json"), "mem_file_path": dir.join("c.bin")});
    assert!(fault(&sock, "PUT", "/snapshot/create", body).contains("virtio-rng"));
    let _ = c.child.kill();
}

#[test]
fn the_snapshot_lab_measures_create_and_load() {
    if !kvm_or_skip("the_snapshot_lab_measures_create_and_load") {
        return;
    }
    let (_, json) = bench_json(&["snapshot", "--mem", "128", "--written", "0,0.25", "--runs", "1"]);
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{json}");
    for row in rows {
        assert!(row["load_ms"].as_f64().unwrap() > 0.0 && row["load_to_running_ms"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["create_ms"].as_f64().unwrap() > 0.0 && row["state_kib"].as_u64().unwrap() > 0, "{row}");
    }
    // The memory file holds what the guest wrote, and little else: zero pages are holes.
    let written = |i: usize| rows[i]["memory_written_kib"].as_u64().unwrap();
    assert!(written(0) < 4096 && written(1) >= 32 * 1024, "{json}");
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
    let _ = a.child.kill();
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
    let last = *a.ticks().last().unwrap();
    load(&sock, &diffs[1].0, merged.to_str().unwrap());
    b.wait_for_ticks(3);
    let ticks = b.ticks();
    assert!(ticks[0] == last + 1 || ticks[0] == last + 2, "{last} then {ticks:?}");
}
