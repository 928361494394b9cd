//! `exitless bench fs --quick`, the smoke run of issue #56's bench: a Linux guest on
//! virtio-fs against the host on the same files, and the block rows (exitless's virtio-blk
//! and vhost-user-blk on qemu-storage-daemon; Firecracker's where scripts/peers.sh built
//! it). It needs /dev/kvm, a guest kernel with virtio-fs (scripts/guest-kernel.sh, or
//! EXITLESS_KERNEL), virtiofsd (scripts/virtiofsd.sh, or EXITLESS_VIRTIOFSD) and
//! qemu-storage-daemon; without one it says loudly that it did not run. On a nested host
//! the guest's boot alone takes a minute or more.

mod common;
use common::*;
use std::path::PathBuf;

fn home(rest: &str) -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(rest)).filter(|p| p.exists())
}

/// The kernel `bench fs` would take by default: EXITLESS_KERNEL, else the newest cached.
fn kernel() -> Option<PathBuf> {
    if let Some(k) = std::env::var_os("EXITLESS_KERNEL") {
        return Some(k.into());
    }
    let entries = std::fs::read_dir(home(".cache/exitless/guest-kernel")?).ok()?;
    let ours = entries.flatten().filter(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        name.starts_with("vmlinux-6.1-") && !name.contains("firecracker")
    });
    ours.filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path()))).max().map(|(_, p)| p)
}

fn virtiofsd() -> Option<PathBuf> {
    std::env::var_os("EXITLESS_VIRTIOFSD")
        .map(PathBuf::from)
        .or_else(|| home(".cache/exitless/virtiofsd/bin/virtiofsd"))
}

fn runs(program: &str) -> bool {
    std::process::Command::new(program).arg("--version").output().is_ok_and(|o| o.status.success())
}

#[test]
fn bench_fs_quick_measures_virtio_fs_and_the_block_rows() {
    const TEST: &str = "bench_fs_quick_measures_virtio_fs_and_the_block_rows";
    if !kvm_or_skip(TEST) {
        return;
    }
    let (Some(kernel), Some(virtiofsd)) = (kernel(), virtiofsd()) else {
        eprintln!("SKIPPED {TEST}: no guest kernel or no virtiofsd (scripts/guest-kernel.sh, scripts/virtiofsd.sh)");
        return;
    };
    if !runs("qemu-storage-daemon") {
        eprintln!("SKIPPED {TEST}: no qemu-storage-daemon (Debian: qemu-system-common)");
        return;
    }
    let dir = tempdir();
    let args = ["fs", "--quick", "--kernel", kernel.to_str().unwrap(), "--virtiofsd", virtiofsd.to_str().unwrap()];
    let (out, json) = bench_json(&[&args[..], &["--dir", dir.as_str(), "--timeout", "1200"]].concat());
    let table = stdout(&out);
    assert!(table.contains("guest/host") && table.contains("targets:"), "{table}");

    // Both sides ran every pass on the same data (the lab refuses a checksum that differs).
    let fs = &json["fs"];
    assert_eq!(fs["cache"], "auto", "{fs}");
    assert!(fs["checksum"].as_str().is_some_and(|c| c.len() == 16), "{fs}");
    let rows = fs["rows"].as_array().unwrap();
    let passes: Vec<&str> = rows.iter().map(|r| r["pass"].as_str().unwrap()).collect();
    assert_eq!(passes, ["seq_read_cold", "seq_read_warm", "create", "stat", "remove"], "{fs}");
    for r in rows {
        for side in ["host", "guest", "ratio"] {
            assert!(r[side].as_f64().is_some_and(|v| v > 0.0 && v.is_finite()), "{side}: {r}");
        }
    }

    // exitless's own virtio-blk and its vhost-user-blk: requests made, none of them exiting
    // to userspace in the steady window.
    let blk = json["blk"]["rows"].as_array().unwrap();
    for device in ["virtio-blk", "vhost-user-blk"] {
        let row = blk.iter().find(|r| r["vmm"] == "exitless" && r["device"] == device && r["transport"] == "mmio");
        let row = row.unwrap_or_else(|| panic!("no exitless {device} row: {json}"));
        assert!(row["iops"].as_f64().is_some_and(|v| v > 0.0), "{row}");
        assert_eq!(row["exits_per_request_steady"].as_f64(), Some(0.0), "{row}");
    }
    let targets = json["targets"].as_array().unwrap();
    for t in targets {
        assert!(t["target"].is_string() && t["measured"].is_string() && t["met"].is_boolean(), "{t}");
    }
    let exits = targets.iter().filter(|t| t["target"].as_str().unwrap().contains("steady state = 0"));
    assert!(exits.clone().count() == 2 && exits.clone().all(|t| t["met"] == true), "{json}");
}
