//! virtio-mmio, Firecracker's transport: the payloads find their devices in its windows
//! and drive them, each queue notification an ioeventfd (no userspace exit); Firecracker's
//! mode puts devices there unless `--enable-pci`, with `pci=off` and each device on the
//! command line, as Firecracker does.

mod common;
use common::*;
use exitless_lab::api_client::expect_ok;
use serde_json::json;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The guest's count of something it printed: `WORD` after `: ` in `line`.
fn count_before(text: &str, word: &str) -> u64 {
    let at = text.find(word).unwrap_or_else(|| panic!("no '{word}' in {text}"));
    text[..at].split_whitespace().last().unwrap().parse().unwrap()
}

#[test]
fn payloads_drive_their_devices_over_mmio_and_kicks_never_exit() {
    if !kvm_or_skip("payloads_drive_their_devices_over_mmio_and_kicks_never_exit") {
        return;
    }
    let (out, json) = run_json(&["--payload", "rngread", "--entropy", "--transport", "mmio"]);
    let text = stdout(&out);
    assert!(out.status.success() && text.contains(", 0 failed"), "{text}\n{}", stderr(&out));
    assert!(json["devices"]["virtio-rng"]["writes"].as_u64().is_some(), "an MMIO device in the profile: {json}");

    // blkbench writes, then reads back and checks every sector; each request kicks.
    let disk = temp_path("disk.img");
    std::fs::write(&disk, vec![0u8; 8 << 20]).unwrap();
    let drive = format!("path={}", disk.display());
    for params in ["1,4096,8,2000", "0,4096,32,2000"] {
        // Without polling the device thread re-arms notifications each time it empties the
        // queue, so the driver kicks at least once per queue's worth of requests (2000 / 32),
        // however the host schedules the two.
        let args = ["--payload", "blkbench", "--lab", "--drive", &drive, "--transport", "mmio"];
        let (out, json) = run_json(&[&args[..], &["--poll-us", "off", "--params", params]].concat());
        let text = stdout(&out);
        assert!(out.status.success(), "{params}: {text}\n{}", stderr(&out));
        assert!(text.contains(" 0 failed, 0 bad sectors"), "{params}: {text}");
        let kicks = count_before(&text, "kicks");
        // The register writes of the driver's setup exit; its kicks do not (had they
        // exited, there would be at least as many writes as kicks).
        let writes = json["devices"]["virtio-blk0"]["writes"].as_u64().unwrap();
        assert!(kicks >= 25 && writes < 25, "{params}: {kicks} kicks, {writes} register writes exited: {json}");
    }
}

#[test]
fn firecrackers_mode_puts_devices_on_mmio_unless_pci_is_enabled() {
    if !kvm_or_skip("firecrackers_mode_puts_devices_on_mmio_unless_pci_is_enabled") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let root = dir.join("root.img");
    std::fs::write(&root, vec![0u8; 1 << 16]).unwrap();
    for (flags, cmdline) in [
        (&[][..], "console=ttyS0 pci=off root=/dev/vda rw virtio_mmio.device=4K@0xc0001000:5 virtio_mmio.device=4K@0xc0002000:6"),
        (&["--enable-pci"][..], "console=ttyS0 root=/dev/vda rw"),
    ] {
        let sock = dir.join("fc.sock");
        let child = api_process_with(&sock, Stdio::piped(), flags);
        let boot = json!({"kernel_image_path": payloads.join("bootcheck.elf"), "boot_args": "console=ttyS0"});
        expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
        let drive = json!({"drive_id": "rootfs", "path_on_host": root, "is_root_device": true, "is_read_only": false});
        expect_ok(&sock, "PUT", "/drives/rootfs", Some(&drive)).unwrap();
        expect_ok(&sock, "PUT", "/entropy", Some(&json!({}))).unwrap();
        let text = stdout(&started_to_the_end(&sock, child));
        assert!(text.contains(&format!("bootcheck: cmdline [{cmdline}]")), "{flags:?}: {text}");
    }
    // And the payloads find them there through the API, as under Firecracker without PCI.
    let sock = dir.join("rng.sock");
    let child = api_process_with(&sock, Stdio::piped(), &[]);
    expect_ok(&sock, "PUT", "/boot-source", Some(&json!({"kernel_image_path": payloads.join("rngread.elf")}))).unwrap();
    expect_ok(&sock, "PUT", "/entropy", Some(&json!({}))).unwrap();
    let out = started_to_the_end(&sock, child);
    assert!(stdout(&out).contains(", 0 failed"), "{}", stdout(&out));
}

/// InstanceStart on the VMM serving `sock`, then its output once the guest ends (or 30 s
/// pass).
fn started_to_the_end(sock: &std::path::Path, mut child: std::process::Child) -> std::process::Output {
    expect_ok(sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait_with_output().unwrap()
}
