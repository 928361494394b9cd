//! virtio-net in real KVM, through a tap in a network namespace of the test's own.

mod common;
use common::*;
use serde_json::Value;
use std::time::Duration;

/// Needs KVM, /dev/net/tun, iproute2 and root; says loudly when it cannot run.
fn net_or_skip(test: &str) -> bool {
    if !kvm_or_skip(test) {
        return false;
    }
    exitless_lab::netns::available()
        || skip_or_fail(test, "needs root, /dev/net/tun and iproute2 for a tap in a network namespace")
}

#[test]
fn frames_arrive_intact_on_both_tx_paths() {
    if !net_or_skip("frames_arrive_intact_on_both_tx_paths") {
        return;
    }
    let dir = tempdir();
    let json_path = dir.join("net.json");
    // 128 bytes is under the copy cut on both paths; 4K and 64K take each path's own way.
    let out = exitless(&[
        "bench",
        "net",
        "--sizes",
        "128,4K,64K",
        "--seconds",
        "0.3",
        "--repeat",
        "1",
        // A 2 us window switches between polling and sleeping all the time: a kick lost
        // at the switch (notifications are off while it polls) stalls the guest's ring,
        // and the run fails or loses frames.
        "--poll",
        "off,adaptive,2",
        "--json",
        json_path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("Gb/s"), "{}", stdout(&out));
    assert!(stdout(&out).contains("no row slower with polling adaptive than off (>= 0.95x)"), "{}", stdout(&out));
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 18, "{json}");
    let polls: std::collections::BTreeSet<_> = rows.iter().map(|r| r["poll"].as_str().unwrap()).collect();
    assert_eq!(polls, ["2", "adaptive", "off"].into(), "{json}");
    for r in rows {
        assert_frames_delivered(r);
        assert!(r["frames"].as_u64().unwrap() > 10, "{r}");
        assert!(r["gbps"].as_f64().unwrap() > 0.0 && r["vmm_cpu_pct"].as_f64().unwrap() > 0.0, "{r}");
        for field in ["size", "path", "gbps", "vmm_cpu_pct", "exits_per_pkt", "irqs_per_pkt", "lost"] {
            assert!(r.get(field).is_some(), "{field} missing in {r}");
        }
        let zerocopy_big = r["path"] == "zerocopy" && r["size"].as_u64().unwrap() >= 2048;
        let copied = r["copy_ns_per_pkt"].as_f64().unwrap();
        assert_eq!(copied == 0.0, zerocopy_big, "only zerocopy of chains >= 2 KiB skips the VMM copy: {r}");
        // How rare EVENT_IDX keeps kicks depends on how the host schedules the device
        // thread (that is the bench's figure); never more than one a frame. Kicks are
        // ioeventfds: the window's only userspace exits are the guest's sleeps on a full
        // ring.
        assert!(r["kicks_per_pkt"].as_f64().unwrap() <= 1.0, "{r}");
        assert_eq!(r["userspace_exits"], r["idle_waits"], "{r}");
    }
}

/// A bench row's frames: the device wrote every frame the guest sent to the tap and
/// dropped none, and what the sink read came whole and once. (How many the sink read
/// depends on the host: its socket drops what it falls behind on.)
fn assert_frames_delivered(r: &Value) {
    assert_eq!(r["tx_frames"], r["frames"], "{r}");
    assert_eq!(
        (r["tx_dropped"].as_u64(), r["corrupt"].as_u64(), r["duplicates"].as_u64()),
        (Some(0), Some(0), Some(0)),
        "{r}"
    );
}

#[test]
fn tso_frames_arrive_whole_with_their_headers_and_plain_tcp_with_good_checksums() {
    if !net_or_skip("tso_frames_arrive_whole_with_their_headers_and_plain_tcp_with_good_checksums") {
        return;
    }
    let dir = tempdir();
    let json_path = dir.join("net.json");
    let args = ["bench", "net", "--frames", "tso,tcp", "--sizes", "1K,64K", "--seconds", "0.3", "--repeat", "1"];
    let out = exitless(&[&args[..], &["--poll", "off", "--json", json_path.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let rows = json["rows"].as_array().unwrap();
    // tso at 1K and 64K, tcp at 1514 only; each on both paths.
    let kinds: Vec<_> = rows.iter().map(|r| (r["frame_kind"].as_str().unwrap(), r["size"].as_u64().unwrap())).collect();
    assert_eq!(rows.len(), 6, "{kinds:?}");
    assert!(kinds.contains(&("tcp+tso", 65535)) && kinds.contains(&("tcp", 1514)), "{kinds:?}");
    for r in rows {
        // The sink counts a frame corrupt unless its bytes, its header (TSO) or checksum
        // (tcp) are right.
        assert_frames_delivered(r);
        assert!(r["frames"].as_u64().unwrap() > 10, "{r}");
    }
    let targets = json["targets"].as_array().unwrap();
    assert!(targets.iter().any(|t| t["target"].as_str().unwrap().starts_with("64K TSO sends >= 3x")), "{json}");
}

#[test]
fn offloaded_frames_leave_segmented_and_checksummed() {
    if !net_or_skip("offloaded_frames_leave_segmented_and_checksummed") {
        return;
    }
    // Routed out of a tap with no offloads, the kernel must do what the guest left to it.
    let tso = exitless_lab::net_wire::offloads_on_the_wire(65535, 4, Duration::from_secs(60)).expect("TSO run");
    let per_frame = (65535u64 - 54).div_ceil(1448);
    assert_eq!((tso.segments, tso.good), (4 * per_frame, 4 * per_frame), "64K TSO4 frames: {tso:?}");
    let csum = exitless_lab::net_wire::offloads_on_the_wire(1000, 4, Duration::from_secs(60)).expect("CSUM run");
    assert_eq!((csum.segments, csum.good), (4, 4), "frames with a partial checksum: {csum:?}");
}

#[test]
fn gso_frames_reach_a_guest_whole() {
    if !net_or_skip("gso_frames_reach_a_guest_whole") {
        return;
    }
    // 64 KiB TCP frames with TSO4 headers from the host; the guest took GUEST_TSO4.
    let (checked, console) = exitless_lab::net_rx::gso_into_guest(8, Duration::from_secs(60)).expect("GSO run");
    assert_eq!(checked, 8, "{console}");
    assert!(!console.contains("differs") && console.contains("checked GSO 8 frames"), "{console}");
}

#[test]
fn two_nics_carry_traffic_at_once_and_nothing_crosses() {
    if !net_or_skip("two_nics_carry_traffic_at_once_and_nothing_crosses") {
        return;
    }
    let reports = exitless_lab::net_pair::two_nics(2000, 1514, Duration::from_secs(60)).expect("two-NIC run");
    for (k, report) in reports.iter().enumerate() {
        let mut seqs = report.seqs.clone();
        seqs.sort_unstable();
        // The NIC's number is in the top byte: a frame of the other NIC's on this tap differs.
        let want: Vec<u64> = (0..2000).map(|s| (k as u64) << 56 | s).collect();
        assert_eq!(seqs, want, "tap {k}: every frame of its own NIC, once, and no other: {report:?}");
        assert_eq!(report.corrupt, 0, "tap {k}: {report:?}");
    }
}

#[test]
fn netecho_round_trips_host_frames_and_takes_interrupts() {
    if !net_or_skip("netecho_round_trips_host_frames_and_takes_interrupts") {
        return;
    }
    let report = exitless_lab::net::echo(40, 300, false, Duration::from_secs(60)).expect("echo run");
    let mut seqs = report.sink.seqs.clone();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..40).collect::<Vec<u64>>(), "every frame back once: {:?}", report.sink);
    assert_eq!(report.sink.corrupt, 0);
    assert!(report.interrupts > 0, "RX asked for interrupts");
    assert!(
        report.console.contains("echoed 40 frames (at most 1 buffers each); rx interrupt delivered"),
        "{}",
        report.console
    );
}

#[test]
fn frames_of_64k_arrive_over_mergeable_buffers_intact() {
    if !net_or_skip("frames_of_64k_arrive_over_mergeable_buffers_intact") {
        return;
    }
    // 65535-byte frames into 4 KiB buffers: 17 each, num_buffers saying so.
    let report = exitless_lab::net::echo(24, 65535, true, Duration::from_secs(60)).expect("echo run");
    let mut seqs = report.sink.seqs.clone();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..24).collect::<Vec<u64>>(), "every frame back once, byte for byte: {:?}", report.sink);
    assert_eq!(report.sink.corrupt, 0);
    assert!(report.console.contains("echoed 24 frames (at most 17 buffers each)"), "{}", report.console);
}

#[test]
fn a_hostile_driver_leaves_the_vmm_running() {
    if !net_or_skip("a_hostile_driver_leaves_the_vmm_running") {
        return;
    }
    let tap = format!("tap=exh{}", std::process::id() % 100_000);
    let (out, json) = run_json(&["--payload", "nethostile", "--net", &tap]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert!(text.contains("nethostile: all checks passed"), "{text}");
    assert!(!text.contains("FAILED"), "{text}");
    assert!(json["devices"]["virtio-net"]["writes"].as_u64().unwrap() > 100, "{json}");
    // Seven bad chains dropped and counted; the good frames (before and after a reset) sent.
    assert!(json["net"]["bad_chains"].as_u64().unwrap() >= 7, "{json}");
    assert!(json["net"]["tx_frames"].as_u64().unwrap() >= 3, "{json}");
    // Six frames with headers the tap must not see: dropped and counted, never written.
    assert_eq!(json["net"]["bad_headers"], 6, "{json}");
}

#[test]
fn bad_net_options_are_one_line_errors() {
    for args in [
        &["run", "--net", "tap="][..],
        &["run", "--net", "tap=x,mac=1"],
        &["run", "--net-tx", "copy"],
        &["bench", "net", "--sizes", "32"],
    ] {
        assert_one_line_error(args);
    }
}

#[test]
fn stale_lab_namespaces_of_dead_runs_are_removed() {
    if !net_or_skip("stale_lab_namespaces_of_dead_runs_are_removed") {
        return;
    }
    // A pid above the kernel's maximum: no such process can exist. Names as earlier
    // versions made them, and as labs make them now (one per call).
    let stale = ["exitless-4194999", "exitless-echo-4194999", "exitless-echo-4194999-3"];
    for name in stale {
        assert_eq!(exitless_lab::netns::owner(name), Some(4_194_999), "{name}");
        assert!(std::process::Command::new("ip").args(["netns", "add", name]).status().unwrap().success());
    }
    // Not a lab's: left alone.
    assert_eq!(exitless_lab::netns::owner("exitless-jail-held-4194999"), None);
    exitless_lab::netns::remove_stale();
    for name in stale {
        assert!(!std::path::Path::new(&format!("/var/run/netns/{name}")).exists(), "{name}");
    }
}

#[test]
fn a_terminated_net_bench_removes_its_namespace() {
    if !net_or_skip("a_terminated_net_bench_removes_its_namespace") {
        return;
    }
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(["bench", "net", "--sizes", "256", "--seconds", "30", "--repeat", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The bench's namespace: the one named for its pid.
    let ns_of = |pid: u32| {
        let entries = std::fs::read_dir("/var/run/netns").ok()?;
        entries
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().and_then(|n| n.to_str()).and_then(exitless_lab::netns::owner) == Some(pid))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while ns_of(child.id()).is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let ns = ns_of(child.id()).unwrap_or_else(|| panic!("the bench (pid {}) never made a namespace", child.id()));
    // SAFETY: signals our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGTERM), "{status:?}");
    assert!(!ns.exists(), "{} left behind", ns.display());
}

/// Runs `exitless ARGS` as user 65534 (no capabilities, no groups) in a mount namespace of
/// its own where /dev/kvm and /dev/net/tun are that user's (nodes made for the test and
/// bound over the real ones, which stay untouched) unless `kvm_access` is false.
fn as_nobody(args: &[&str], kvm_access: bool) -> std::process::Output {
    let dir = tempdir();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let bin = dir.join("exitless");
    std::fs::copy(env!("CARGO_BIN_EXE_exitless"), &bin).unwrap();
    let owner = if kvm_access { "65534" } else { "0" };
    let script = format!(
        "set -e; for n in kvm:10:232 tun:10:200; do IFS=: read name major minor <<EOF\n$n\nEOF\n\
         mknod {d}/$name c $major $minor; chown {owner} {d}/$name; chmod 600 {d}/$name; done; \
         mount --bind {d}/kvm /dev/kvm; mount --bind {d}/tun /dev/net/tun; \
         exec setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all {bin} \"$@\"",
        d = dir.display(),
        bin = bin.display()
    );
    std::process::Command::new("unshare").args(["-m", "bash", "-c", &script, "as_nobody"]).args(args).output().unwrap()
}

#[test]
fn an_unprivileged_user_runs_a_vm_on_an_existing_tap() {
    if !net_or_skip("an_unprivileged_user_runs_a_vm_on_an_existing_tap") {
        return;
    }
    // A tap made by an administrator for user 65534, and brought up.
    let tap = format!("exlnb{}", std::process::id() % 100_000);
    let ip = |args: &[&str]| std::process::Command::new("ip").args(args).status().unwrap().success();
    assert!(ip(&["tuntap", "add", "dev", &tap, "mode", "tap", "user", "65534"]));
    assert!(ip(&["link", "set", "dev", &tap, "up"]));
    let net = format!("tap={tap}");
    let out = as_nobody(&["run", "--payload", "demo", "--net", &net, "--timeout", "20"], true);
    let refused = as_nobody(&["run", "--payload", "demo"], false);
    ip(&["link", "del", "dev", &tap]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("hello from CPL0"), "{}", stdout(&out));
    // Without access to /dev/kvm: one line that says what is missing.
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    let err = stderr(&refused);
    assert!(err.contains("cannot open /dev/kvm: permission denied: user 65534 needs read and write access"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn round_trips_are_measured_with_polling_off_and_adaptive() {
    if !net_or_skip("round_trips_are_measured_with_polling_off_and_adaptive") {
        return;
    }
    let (out, json) = bench_json(&["net", "--rtt", "--rounds", "100", "--repeat", "1"]);
    let rows = json["rows"].as_array().unwrap();
    let polls: Vec<_> = rows.iter().map(|r| r["poll"].as_str().unwrap()).collect();
    assert_eq!(polls, ["off", "adaptive"], "{json}");
    for r in rows {
        // Every round trip came back (or the bench fails); times and CPU are measured.
        assert_eq!(r["rounds"], 100, "{json}");
        assert!(r["rtt_us"].as_f64().unwrap() > 0.0 && r["cpu_us_per_rtt"].as_f64().unwrap() > 0.0, "{json}");
        // Idle for a second, the device thread sleeps: a poller that never stopped would
        // show about 100% (it yields, but yielding is still its CPU time).
        assert!(r["idle_cpu_pct"].as_f64().unwrap() < 50.0, "{json}");
    }
    // Sleeping after every piece of work, a round trip wakes the device thread twice
    // (the frame from the tap, the guest's kick); never less. (More on a loaded host.)
    let off_wakeups = rows[0]["wakeups_per_rtt"].as_f64().unwrap();
    assert!(off_wakeups >= 1.9, "{json}");
    assert!(stdout(&out).contains("round trip >= 1.5x shorter with adaptive polling"), "{}", stdout(&out));
}
