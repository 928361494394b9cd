//! Firecracker's `/hotplug/memory` on a payload guest (a Linux guest plugs and unplugs
//! 256 MiB in scripts/linux-memory.sh): Firecracker's rules before the start, the
//! region placed and reported once started, the requested size refused until a driver
//! runs; a snapshot holds the plugged blocks, which a guest restored in a new VMM reads.

mod common;
mod snapshot_vmm;
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
    expect_ok(&sock, "PUT", "/snapshot/create", Some(&create)).unwrap();
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

/// Issue 53, item 3: a hostile guest that plugs nothing posts virtio-rng buffers across
/// all 1 GiB of the hotpluggable region (the `memdma` payload). Every chain must be
/// refused (used with length 0, the device going on), no write of its own CPU there may
/// stick (no memory slot), and the VMM's peak resident memory must stay within the
/// guest's RAM, what it plugged (nothing) and the VMM's own.
#[test]
fn dma_into_unplugged_memory_is_refused_and_commits_no_host_memory() {
    if !kvm_or_skip("dma_into_unplugged_memory_is_refused_and_commits_no_host_memory") {
        return;
    }
    const RAM_MIB: u64 = 128;
    const REGION_MIB: u64 = 1024;
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let config = dir.join("vm.json");
    let vm = json!({
        "boot-source": {"kernel_image_path": payloads.join("memdma.elf")},
        "machine-config": {"vcpu_count": 1, "mem_size_mib": RAM_MIB},
        "memory-hotplug": {"total_size_mib": REGION_MIB},
        "entropy": {},
    });
    std::fs::write(&config, vm.to_string()).unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(["--no-api", "--config-file", config.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (out, peak_kib) = wait_with_peak_rss(child);
    let text = stdout(&out);
    println!("{text}peak resident memory: {peak_kib} KiB");
    assert!(text.contains(&format!("{} buffers posted into the region", REGION_MIB * 16)), "{text}");
    assert!(text.contains("0 bytes written there, 512 CPU writes probed, 0 failed"), "{text}\n{}", stderr(&out));
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    // Guest RAM (the payload touches a few MiB of it), nothing plugged, and the VMM's own
    // (a debug build here): far below the 1 GiB the old code committed.
    let vmm_own_kib = 64 << 10;
    assert!(peak_kib < (RAM_MIB << 10) + vmm_own_kib, "peak RSS {peak_kib} KiB: unplugged memory was committed");
}

/// Waits for `child` (its output piped) and returns its output and its peak resident set
/// (wait4's ru_maxrss, in KiB).
fn wait_with_peak_rss(mut child: std::process::Child) -> (std::process::Output, u64) {
    use std::io::Read;
    fn drain(mut from: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = from.read_to_end(&mut bytes);
            bytes
        })
    }
    let (out, err) = (drain(child.stdout.take().unwrap()), drain(child.stderr.take().unwrap()));
    let (mut status, mut usage) = (0i32, std::mem::MaybeUninit::<libc::rusage>::zeroed());
    // SAFETY: wait4 on our own child, writing its status and usage into these locals.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, usage.as_mut_ptr()) };
    assert_eq!(pid, child.id() as i32, "wait4: {}", std::io::Error::last_os_error());
    // SAFETY: wait4 succeeded and filled the rusage.
    let peak = unsafe { usage.assume_init() }.ru_maxrss as u64;
    let (stdout, stderr) = (out.join().unwrap(), err.join().unwrap());
    let status = std::os::unix::process::ExitStatusExt::from_raw(status);
    (std::process::Output { status, stdout, stderr }, peak)
}

/// Plug and unplug flip every layer, seen from a guest that drives virtio-mem itself
/// (`memdma` with its plug round): once the host asks for 2 MiB, the block it plugs takes
/// the device's DMA and its CPU's writes, its unplugged neighbour in the same slot reads
/// zeros; unplugged, the block refuses DMA and keeps no CPU write; plugged back, it is
/// empty. Last the guest writes into that unplugged neighbour: the VMM stops the guest
/// with an error (KVM finds no writable page there), and never commits the page.
#[test]
fn plug_and_unplug_open_and_close_a_block_to_dma_and_to_the_cpu() {
    use std::io::BufRead;
    if !kvm_or_skip("plug_and_unplug_open_and_close_a_block_to_dma_and_to_the_cpu") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("api.sock");
    let _ = std::fs::remove_file(&sock);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(["--api-sock", sock.to_str().unwrap()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let reader = {
        let (out, lines) = (child.stdout.take().unwrap(), lines.clone());
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let boot = json!({"kernel_image_path": payloads.join("memdma.elf"), "boot_args": "exitless.params=0,1,1"});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/machine-config", Some(&json!({"vcpu_count": 1, "mem_size_mib": 128}))).unwrap();
    expect_ok(&sock, "PUT", "/hotplug/memory", Some(&json!({"total_size_mib": 256}))).unwrap();
    expect_ok(&sock, "PUT", "/entropy", Some(&json!({}))).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    let seen = |what: &str| lines.lock().unwrap().iter().any(|l| l.contains(what));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !seen("driver ready") && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    expect_ok(&sock, "PATCH", "/hotplug/memory", Some(&json!({"requested_size_mib": 2}))).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err);
    let text = lines.lock().unwrap().join("\n");
    println!("{text}\n{err}\n{status}");
    assert!(text.contains("plugged, unplugged and plugged back, 0 failed"), "{text}\n{err}");
    assert!(text.contains("writing into an unplugged block of a plugged slot"), "{text}\n{err}");
    assert!(!text.contains("the write went through"), "the guest wrote into unplugged memory: {text}\n{err}");
    assert!(!status.success(), "the guest was stopped: {status}\n{err}");
}

/// Issue 55, item 6: a guest that drives virtio-mem (`memdma`, its snapshot round) plugs a
/// block and writes into it (the device's entropy and its own pattern); the microVM is
/// snapshotted: the memory file holds the pattern after RAM, the state the plugged block.
/// A new VMM loads it: the same sizes reported, and the restored guest reads its block
/// back, then plugs another. A damaged virtio-mem state is refused naming device and field.
#[test]
fn a_snapshot_keeps_the_plugged_blocks_and_the_restored_guest_reads_them() {
    use snapshot_vmm::{load, Vmm};
    if !kvm_or_skip("a_snapshot_keeps_the_plugged_blocks_and_the_restored_guest_reads_them") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let wait_for = |vmm: &Vmm, what: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !vmm.lines.lock().unwrap().iter().any(|l| l.contains(what)) {
            assert!(std::time::Instant::now() < deadline, "no {what:?}: {:?}", vmm.lines.lock().unwrap());
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    let sock = dir.join("a.sock");
    let mut a = Vmm::start_with(&sock, &[]);
    let boot = json!({"kernel_image_path": payloads.join("memdma.elf"), "boot_args": "exitless.params=0,2"});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/machine-config", Some(&json!({"vcpu_count": 1, "mem_size_mib": 128}))).unwrap();
    expect_ok(&sock, "PUT", "/hotplug/memory", Some(&json!({"total_size_mib": 256}))).unwrap();
    expect_ok(&sock, "PUT", "/entropy", Some(&json!({}))).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    wait_for(&a, "driver ready");
    expect_ok(&sock, "PATCH", "/hotplug/memory", Some(&json!({"requested_size_mib": 2}))).unwrap();
    wait_for(&a, "pattern written");
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let (state, mem) = (dir.join("s.json"), dir.join("m.bin"));
    let create = json!({"snapshot_type": "Full", "snapshot_path": state, "mem_file_path": mem});
    expect_ok(&sock, "PUT", "/snapshot/create", Some(&create)).unwrap();
    let before = expect_ok(&sock, "GET", "/hotplug/memory", None).unwrap().unwrap();
    assert_eq!((before["plugged_size_mib"].clone(), before["requested_size_mib"].clone()), (json!(2), json!(2)));
    a.stop_and_drain();

    // The memory file: RAM, then the region whole (sparse), the pattern in its first block.
    let file = std::fs::File::open(&mem).unwrap();
    assert_eq!(file.metadata().unwrap().len(), (128 + 256) << 20);
    let mut page = vec![0u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut page, 128 << 20).unwrap();
    assert!((64..4096).all(|i| page[i] == (i * 7 + 3) as u8), "the pattern is in the memory file");
    // The state: virtio-mem's plugged block.
    let text = std::fs::read_to_string(&state).unwrap();
    let saved: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mem_state = find_state(&saved, "plugged_size").expect("virtio-mem's state");
    assert_eq!((mem_state["plugged_size"].clone(), mem_state["plugged"][0].clone()), (json!(2 << 20), json!(1)));

    // Restored in a new VMM: the same sizes, and the guest reads its block back.
    let sock = dir.join("b.sock");
    let mut b = Vmm::start_with(&sock, &[]);
    load(&sock, &state.display().to_string(), &mem.display().to_string());
    let after = expect_ok(&sock, "GET", "/hotplug/memory", None).unwrap().unwrap();
    assert_eq!(after, before);
    expect_ok(&sock, "PATCH", "/hotplug/memory", Some(&json!({"requested_size_mib": 4}))).unwrap();
    wait_for(&b, "after the snapshot");
    let done = "memdma: after the snapshot, 2 MiB plugged, the pattern read back, 0 failed";
    assert!(b.lines.lock().unwrap().iter().any(|l| l == done), "{:?}", b.lines.lock().unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while b.child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    b.stop_and_drain();
    assert!(b.lines.lock().unwrap().iter().any(|l| l.ends_with(", 0 failed") && l.contains("buffers posted")));

    // A damaged virtio-mem state: refused in one line, naming the device and the field.
    let mut damaged = saved.clone();
    find_state_mut(&mut damaged, "plugged_size").unwrap()["plugged_size"] = json!(4 << 20);
    let damaged_path = dir.join("damaged.json");
    let bytes = serde_json::to_vec(&(&damaged["machine"], &damaged["config"])).unwrap();
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    damaged["checksum"] = format!("fnv1a64:{hash:016x}").into(); // resealed: the state file's own checksum
    std::fs::write(&damaged_path, damaged.to_string()).unwrap();
    let sock = dir.join("c.sock");
    let _c = Vmm::start_with(&sock, &[]);
    let body = json!({"snapshot_path": damaged_path, "mem_backend": {"backend_type": "File", "backend_path": mem}});
    let why = fault(&sock, "PUT", "/snapshot/load", body);
    assert!(why.contains("virtio-mem") && why.contains("field `plugged_size` does not fit"), "{why}");
    assert!(!why.contains('\n'), "{why}");
}

/// The first object in `v` holding `key` (a device's state, wherever the state file nests it).
fn find_state<'a>(v: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
    match v {
        serde_json::Value::Object(m) if m.contains_key(key) => Some(v),
        serde_json::Value::Object(m) => m.values().find_map(|x| find_state(x, key)),
        serde_json::Value::Array(a) => a.iter().find_map(|x| find_state(x, key)),
        _ => None,
    }
}

fn find_state_mut<'a>(v: &'a mut serde_json::Value, key: &str) -> Option<&'a mut serde_json::Value> {
    if v.get(key).is_some() {
        return Some(v);
    }
    match v {
        serde_json::Value::Object(m) => m.values_mut().find_map(|x| find_state_mut(x, key)),
        serde_json::Value::Array(a) => a.iter_mut().find_map(|x| find_state_mut(x, key)),
        _ => None,
    }
}
