//! Forked snapshots (exitless_vmm::snapshot::fork): a guest whose RAM is kept in a file
//! (`--ram-dir` on a tmpfs) is snapshotted without its memory being written, goes on, and
//! clones loaded from the snapshot run beside it. The `forkmem` guest checks its own
//! pattern every generation, with a nonce each copy draws for itself: a page that reached
//! one copy from another is a word it did not write, and it says so. Nothing is lost and
//! nothing shared by accident: neither the parent's later writes nor a clone's reach the
//! file, the parent or a sibling; a second snapshot to the same paths leaves the file the
//! clones map alone; a failed one leaves the previous snapshot whole; the files can go
//! while clones run.

mod common;
mod forkmem;
mod snapshot_vmm;
use common::*;
use exitless_lab::api_client::{expect_ok, request};
use forkmem::*;
use serde_json::json;
use std::path::PathBuf;

/// Everything in item 3 but the failed create: the parent forks without writing its
/// memory, and it, two clones and the file keep apart; a second create to the same paths
/// leaves the clones' file alone; the files go under running clones.
#[test]
fn a_forked_parent_its_clones_and_the_file_keep_apart() {
    if !kvm_or_skip("a_forked_parent_its_clones_and_the_file_keep_apart") {
        return;
    }
    let work = tempdir();
    let payloads = payloads_in(&work);
    let shm = ShmDir::new("apart");
    let ram_dir = shm.0.to_str().unwrap();
    let sock = work.join("parent.sock");
    let mut parent = parent(&sock, &payloads, &["--ram-dir", ram_dir], 64, 32);
    let (state, mem) = (shm.0.join("state"), shm.0.join("mem"));
    let written = fork(&parent, &sock, &state, &mem);
    // The fast path: the RAM file is taken as it is (the state file is all that is written).
    assert!(written < 4 << 20, "the create wrote {written} bytes: the RAM file was not taken");
    assert_eq!(std::fs::metadata(&mem).unwrap().len(), 64 << 20);
    let file = hash(&mem);
    let since = gens(&parent).0.len();
    // Two clones run beside the parent: each checks its own pattern, the snapshot's first.
    let (a, b) = (clone(&work.join("a.sock"), &state, &mem), clone(&work.join("b.sock"), &state, &mem));
    for (vmm, what) in [(&a, "clone a"), (&b, "clone b")] {
        checks_more(vmm, 0, 3, what);
    }
    checks_more(&parent, since, 3, "the parent after the fork");
    assert_eq!(hash(&mem), file, "a clone's or the parent's writes reached the memory file");

    // A second create to the same paths from the parent (now private over the file): its
    // memory is written to a new file, renamed over the path; the clones' file stays.
    let held = std::fs::File::open(&mem).unwrap();
    let second = fork(&parent, &sock, &state, &mem);
    assert!(second >= 16 << 20, "the second create wrote {second} bytes: not the guest's memory");
    let mut old = Vec::new();
    std::io::Read::read_to_end(&mut &held, &mut old).unwrap();
    let old_hash = old.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    assert_eq!(old_hash, file, "the second create changed the file running clones map");
    let (sa, sb) = (gens(&a).0.len(), gens(&b).0.len());
    let c = clone(&work.join("c.sock"), &state, &mem);
    checks_more(&c, 0, 2, "a clone of the second snapshot");
    checks_more(&a, sa, 2, "clone a after the second create");
    checks_more(&b, sb, 2, "clone b after the second create");

    // A clone given --ram-dir keeps its snapshot's file, mapped privately (shared with its
    // siblings): the flag is set aside with a warning, and the clone's own snapshot is
    // written whole to a file of its own.
    let second_file = hash(&mem);
    let (d_sock, d_log) = (work.join("d.sock"), work.join("d.log"));
    std::fs::write(&d_log, "").unwrap();
    let d = snapshot_vmm::Vmm::start_with(&d_sock, &["--ram-dir", ram_dir, "--log-path", d_log.to_str().unwrap()]);
    snapshot_vmm::load(&d_sock, state.to_str().unwrap(), mem.to_str().unwrap());
    checks_more(&d, 0, 2, "a clone given --ram-dir");
    let warning = std::fs::read_to_string(&d_log).unwrap();
    assert!(warning.contains("a restored guest's RAM is its snapshot's memory file"), "{warning}");
    let (d_state, d_mem) = (shm.0.join("d-state"), shm.0.join("d-mem"));
    let third = fork(&d, &d_sock, &d_state, &d_mem);
    assert!(third >= 16 << 20, "the restored clone's create wrote {third} bytes: not its memory");
    assert_eq!(hash(&mem), second_file, "the restored clone's create changed the file it maps");
    goes_on(&d, 2, "the restored clone after its snapshot");
    drop(d);

    // The files go; the clones and the parent run on, whole.
    std::fs::remove_file(&mem).unwrap();
    std::fs::remove_file(&state).unwrap();
    drop(held);
    let (sa, sb, sp) = (gens(&a).0.len(), gens(&b).0.len(), gens(&parent).0.len());
    checks_more(&a, sa, 2, "clone a with its files removed");
    checks_more(&b, sb, 2, "clone b with its files removed");
    checks_more(&parent, sp, 2, "the parent with the files removed");
    parent.stop_and_drain();
    assert!(gens(&parent).1.is_none());
}

/// A create that fails (its filesystem full) leaves the previous snapshot as it was, no
/// staged file behind, and a VMM that serves on: the guest resumes and the previous
/// snapshot loads.
#[test]
fn a_failed_create_leaves_the_previous_snapshot_whole() {
    if !kvm_or_skip("a_failed_create_leaves_the_previous_snapshot_whole") {
        return;
    }
    let work = tempdir();
    let payloads = payloads_in(&work);
    let small = work.join("small");
    std::fs::create_dir_all(&small).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=14m", "tmpfs", small.to_str().unwrap()])
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        skip_or_fail("a_failed_create_leaves_the_previous_snapshot_whole", "cannot mount a tmpfs (not root?)");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(small.clone());
    let sock = work.join("parent.sock");
    let parent = parent(&sock, &payloads, &[], 32, 8);
    let (state, mem) = (small.join("state"), small.join("mem"));
    fork(&parent, &sock, &state, &mem);
    let (state_hash, mem_hash) = (hash(&state), hash(&mem));
    // 8 MiB more of a 14 MiB filesystem holding the first 8: no room for a second copy.
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let body = json!({"snapshot_path": state, "mem_file_path": mem});
    let reply = request(&sock, "PUT", "/snapshot/create", Some(&body)).unwrap();
    let fault = reply.body.as_ref().and_then(|b| b["fault_message"].as_str()).unwrap_or_default().to_string();
    assert_eq!(reply.status, 400, "{fault}");
    assert!(fault.contains("memory file"), "{fault}");
    assert_eq!((hash(&state), hash(&mem)), (state_hash, mem_hash), "the failed create changed the snapshot");
    // The state file cannot be made (its directory is missing): the memory file, which
    // goes first, stays the previous one too.
    let body = json!({"snapshot_path": small.join("gone/state"), "mem_file_path": mem});
    let reply = request(&sock, "PUT", "/snapshot/create", Some(&body)).unwrap();
    assert_eq!(reply.status, 400, "{:?}", reply.body);
    assert_eq!(hash(&mem), mem_hash, "a create whose state file failed changed the memory file");
    let names: Vec<_> = std::fs::read_dir(&small).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 2, "a staged file was left behind: {names:?}");
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Resumed"}))).unwrap();
    let since = gens(&parent).0.len();
    checks_more(&parent, since, 2, "the parent after the failed create");
    let c = clone(&work.join("c.sock"), &state, &mem);
    checks_more(&c, 0, 2, "a clone of the previous snapshot");
}

/// `exitless bench fork` at two small sizes with two clones: a row per size with a pause,
/// the memory the create wrote (the state file only, for exitless: its RAM file is taken),
/// every clone answered, and the pause target judged.
#[test]
fn the_fork_lab_measures_the_pause_and_the_clones() {
    if !kvm_or_skip("the_fork_lab_measures_the_pause_and_the_clones") {
        return;
    }
    let shm = ShmDir::new("lab");
    let (_, json) = bench_json(&["fork", "--mem", "64,128", "--clones", "2", "--dir", shm.0.to_str().unwrap()]);
    let rows: Vec<_> = json["rows"].as_array().unwrap().iter().filter(|r| r["vmm"] == "exitless").collect();
    assert_eq!(rows.len(), 2, "{json}");
    for row in rows {
        assert!(row["pause_ms"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["written_bytes"].as_u64().unwrap() < 4 << 20, "the RAM file was written: {row}");
        assert!(row["all_answered_ms"].as_f64().unwrap() > 0.0 && row["pss_kib_per_clone"].as_f64().unwrap() > 0.0);
    }
    let targets = json["targets"].as_array().unwrap();
    assert!(targets.iter().any(|t| t["target"].as_str().unwrap().starts_with("pause at 128 MiB")), "{json}");
}
