//! virtio-blk from inside a guest: what it writes lands in the file, read-only drives
//! refuse writes, a FLUSH survives SIGKILL, and a hostile driver changes nothing it should not.

mod common;
use common::*;
use exitless_lab::blk::pattern;
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};

const DISK: usize = 4 << 20;

/// A 4 MiB disk file holding the lab's pattern under `stamp`.
fn disk(stamp: u64) -> TempDir {
    let path = temp_path("disk.img");
    let mut bytes = vec![0u8; DISK];
    pattern::fill(&mut bytes, 0, stamp);
    std::fs::write(&path, &bytes).unwrap();
    path
}

fn drive_arg(path: &std::path::Path, extra: &str) -> String {
    format!("path={}{extra}", path.display())
}

/// blkbench parameters: workload, block bytes, qd, requests, time limit, TSC kHz, stamp, seed, flush.
fn blkbench(path: &std::path::Path, extra: &str, params: &str) -> (std::process::Output, serde_json::Value) {
    let drive = drive_arg(path, extra);
    run_json(&["--payload", "blkbench", "--lab", "--drive", &drive, "--params", params])
}

#[test]
fn what_the_guest_writes_is_in_the_file_byte_for_byte() {
    if !kvm_or_skip("what_the_guest_writes_is_in_the_file_byte_for_byte") {
        return;
    }
    // Both engines: io_uring, and the thread pool that stands in where it is missing.
    for (extra, engine) in [(",direct=on", "io_uring"), (",direct=on,engine=pool", "thread pool")] {
        let path = disk(0);
        // Sequential 64K writes at qd 4 over the whole disk (64 of them), stamp 5, then FLUSH.
        let (out, json) = blkbench(&path, extra, "3,65536,4,64,0,0,5,1,1");
        assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
        assert!(stdout(&out).contains("blkbench: flushed, status 0"), "{}", stdout(&out));
        let mut expected = vec![0u8; DISK];
        pattern::fill(&mut expected, 0, 5);
        let file = std::fs::read(&path).unwrap();
        assert!(file == expected, "{engine}: the file differs from what the guest wrote");
        let d = &json["drives"]["virtio-blk0"];
        assert_eq!(d["engine"].as_str(), Some(engine), "{json}");
        assert_eq!(d["writes"].as_u64(), Some(64), "{json}");
        assert_eq!(d["write_bytes"].as_u64(), Some(DISK as u64), "{json}");
        assert_eq!(d["flushes"].as_u64(), Some(1), "{json}");
        assert_eq!(d["errors"].as_u64(), Some(0), "{json}");
    }
}

#[test]
fn reads_at_depth_see_exactly_what_the_file_holds() {
    if !kvm_or_skip("reads_at_depth_see_exactly_what_the_file_holds") {
        return;
    }
    let path = disk(3);
    for extra in ["", ",engine=pool"] {
        let (out, json) = blkbench(&path, extra, "0,4096,32,500");
        assert!(out.status.success(), "{extra}: {}\n{}", stdout(&out), stderr(&out));
        assert!(stdout(&out).contains("500 requests"), "{}", stdout(&out));
        assert_eq!(json["drives"]["virtio-blk0"]["reads"].as_u64(), Some(500), "{json}");
    }
    // One damaged sector in a file the guest reads end to end must be found.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[DISK / 2 + 100] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let (out, _) = blkbench(&path, "", "2,65536,8,64");
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("1 bad sectors"), "{}", stdout(&out));
}

#[test]
fn a_rate_limited_drive_holds_its_guest_to_the_limit() {
    if !kvm_or_skip("a_rate_limited_drive_holds_its_guest_to_the_limit") {
        return;
    }
    let path = disk(9);
    // 60 random reads at depth 32 under 50 a second (5 of them a first full bucket): the
    // guest, which would take milliseconds unlimited, queues 32 at once and must wait.
    let (out, json) = blkbench(&path, ",iops=50", "0,4096,32,60");
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    // By the guest's own clock (its TSC, the host's rate), from its first request to its
    // last completion: at least the 55 requests beyond the bucket at 50 a second, 1.1 s.
    let text = stdout(&out);
    let cycles: u64 = text
        .split(" cycles")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no cycle count: {text}"));
    let khz = exitless_lab::control::guest_tsc_khz().expect("the TSC rate");
    let seconds = cycles as f64 / (f64::from(khz) * 1e3);
    assert!(seconds >= 1.0, "60 requests in {seconds:.3} s under 50/s: {text}");
    let drive = json["drives"].as_object().and_then(|d| d.values().next()).expect("one drive");
    assert_eq!(drive["reads"], 60, "{json}");
    assert!(drive["throttled"].as_u64().unwrap() > 0, "{json}");
    assert_eq!(drive["errors"], 0, "throttled, never failed: {json}");
    assert!(stderr(&out).contains("throttled"), "the exit profile counts them: {}", stderr(&out));
}

#[test]
fn a_read_only_drive_refuses_writes() {
    if !kvm_or_skip("a_read_only_drive_refuses_writes") {
        return;
    }
    let path = disk(2);
    let before = std::fs::read(&path).unwrap();
    let (out, json) = blkbench(&path, ",readonly=on", "1,4096,4,40");
    assert_eq!(out.status.code(), Some(1), "every write fails: {}", stdout(&out));
    assert!(stdout(&out).contains("40 failed"), "{}", stdout(&out));
    let d = &json["drives"]["virtio-blk0"];
    assert_eq!((d["writes"].as_u64(), d["errors"].as_u64()), (Some(0), Some(40)), "{json}");
    assert!(std::fs::read(&path).unwrap() == before, "a read-only drive's file changed");
}

#[test]
fn after_a_flush_the_data_survives_the_vmm_being_killed() {
    if !kvm_or_skip("after_a_flush_the_data_survives_the_vmm_being_killed") {
        return;
    }
    let path = disk(0);
    let drive = drive_arg(&path, ",direct=on");
    // Random 4K writes under stamp 9, FLUSH, then the guest waits to be killed.
    let mut child = Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(["run", "--payload", "blkbench", "--lab", "--timeout", "60", "--drive", &drive])
        .args(["--params", "1,4096,8,300,0,0,9,7,2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut flushed = false;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.contains("blkbench: flushed") {
            assert!(line.contains("status 0"), "{line}");
            flushed = true;
            break;
        }
    }
    assert!(flushed, "the guest never reported its FLUSH");
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let status = child.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
    let (bad, stamped) = pattern::scan(std::fs::File::open(&path).unwrap(), 9).unwrap();
    assert_eq!(bad, 0, "sectors without their pattern");
    assert!((8..=300 * 8).contains(&stamped), "{stamped} sectors carry the guest's stamp");
}

#[test]
fn the_hostile_driver_is_refused_and_counted_and_the_disk_keeps_working() {
    if !kvm_or_skip("the_hostile_driver_is_refused_and_counted_and_the_disk_keeps_working") {
        return;
    }
    for extra in [",id=hostile-disk", ",readonly=on"] {
        let path = disk(1);
        let drive = drive_arg(&path, extra);
        let (out, json) = run_json(&["--payload", "blkhostile", "--drive", &drive]);
        let text = stdout(&out);
        assert!(out.status.success(), "{extra}: {text}\n{}", stderr(&out));
        assert!(text.contains("0 checks failed"), "{text}");
        let d = &json["drives"]["virtio-blk0"];
        assert!(d["bad_requests"].as_u64().unwrap() >= 9, "{json}");
        assert!(d["errors"].as_u64().unwrap() >= 8, "{json}");
        if extra.contains("readonly") {
            assert!(text.contains("a write to a read-only drive: IOERR: ok"), "{text}");
            assert!(!text.contains("WRITE_ZEROES"), "a read-only drive offers no WRITE_ZEROES: {text}");
        } else {
            assert!(text.contains("blkhostile: id [hostile-disk]"), "{text}");
            assert!(text.contains("WRITE_ZEROES zeroes a sector: ok"), "{text}");
        }
        // Nothing but the sectors WRITE_ZEROES and DISCARD were sent to (8 and 16) changed.
        let bytes = std::fs::read(&path).unwrap();
        for (lba, sector) in bytes.chunks(512).enumerate() {
            let zeroed = !extra.contains("readonly") && (lba == 8 || lba == 16);
            let ok =
                if zeroed { sector.iter().all(|&b| b == 0) } else { pattern::stamp_of(sector, lba as u64) == Some(1) };
            assert!(ok, "{extra}: sector {lba} changed");
        }
    }
}

#[test]
fn bad_drives_are_refused_in_one_line() {
    let missing = assert_one_line_error(&["run", "--drive", "path=/nonexistent/disk.img"]);
    assert!(stderr(&missing).contains("cannot open drive /nonexistent/disk.img"), "{}", stderr(&missing));
    let bad = assert_one_line_error(&["run", "--drive", "file=x"]);
    assert!(stderr(&bad).contains("path=FILE"), "{}", stderr(&bad));
    assert_one_line_error(&["run", "--drive", "path=x,id=abcdefghijklmnopqrstuvwxyz"]);
    if !kvm_or_skip("bad_drives_are_refused_in_one_line (locked)") {
        return;
    }
    // A file of size 0 is a drive of no sectors (Kata's spare drives), not an error.
    let empty = temp_path("empty.img");
    std::fs::write(&empty, b"").unwrap();
    let (out, json) = run_json(&["--drive", &drive_arg(&empty, "")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(json["drives"].as_object().is_some_and(|d| d.len() == 1), "{json}");
    // A drive another process writes to is refused, not shared.
    let path = disk(0);
    let file = std::fs::File::open(&path).unwrap();
    // SAFETY: flock on a descriptor we own.
    assert_eq!(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) }, 0);
    let out = assert_one_line_error(&["run", "--drive", &drive_arg(&path, "")]);
    assert!(stderr(&out).contains("in use by another process"), "{}", stderr(&out));
}

#[test]
fn no_request_waits_on_a_kick_lost_between_polling_and_sleeping() {
    if !kvm_or_skip("no_request_waits_on_a_kick_lost_between_polling_and_sleeping") {
        return;
    }
    let path = disk(4);
    let drive = drive_arg(&path, "");
    // While the device thread polls, the driver is told not to kick; a 2 us window
    // switches between polling and sleeping on nearly every request, and at depth 1 a
    // request whose kick was lost at the switch would never complete (the run times out).
    for poll in ["off", "2", "adaptive"] {
        for qd in ["1", "8"] {
            let params = format!("0,4096,{qd},1500");
            let (out, json) = run_json(&[
                "--payload",
                "blkbench",
                "--lab",
                "--drive",
                &drive,
                "--poll-us",
                poll,
                "--params",
                &params,
            ]);
            assert!(out.status.success(), "poll {poll} qd {qd}: {}\n{}", stdout(&out), stderr(&out));
            let d = &json["drives"]["virtio-blk0"];
            assert_eq!(d["reads"].as_u64(), Some(1500), "poll {poll} qd {qd}: {json}");
            let (found, kicks) = (d["poll"]["polls_found_work"].as_u64().unwrap(), d["kicks"].as_u64().unwrap());
            if poll == "off" {
                // As before polling existed: nothing polled, a kick for every wait at depth 1.
                assert_eq!(found, 0, "{json}");
                assert!(qd != "1" || kicks >= 1500, "poll off qd 1: {kicks} kicks for 1500 requests: {json}");
            }
        }
    }
}
