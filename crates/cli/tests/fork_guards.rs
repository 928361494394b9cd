//! Issue #57 item 3, the guards fork.rs does not reach: the slow path (the memory file
//! written: a clone snapshotted over the file it and its siblings map, a create whose
//! state file fails, the files removed under clones), a failed create on the fast path
//! (`--ram-dir`: the RAM file linked at a staged name that goes again), and a create
//! killed with SIGKILL in its middle. Each leaves the previous snapshot whole: its files
//! hash as before, and a clone loaded from them runs and checks its memory.

mod common;
mod forkmem;
mod snapshot_vmm;
use common::*;
use exitless_lab::api_client::{expect_ok, request, request_within};
use forkmem::*;
use serde_json::json;
use snapshot_vmm::*;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// The slow path (no `--ram-dir`: the first create writes the memory file): a clone's
/// writes never reach the file, nor a sibling; a clone snapshotted to the very paths it
/// was loaded from writes a new file and renames it, so the file it and its sibling map
/// keeps what it held (written in place, the clone would read its own memory back from
/// a file it is truncating, and its sibling would see it change); a create whose state
/// file fails leaves the memory file at its path; the files can go under the clones.
#[test]
fn a_clone_snapshotted_over_the_file_it_maps_leaves_that_file() {
    if !kvm_or_skip("a_clone_snapshotted_over_the_file_it_maps_leaves_that_file") {
        return;
    }
    let work = tempdir();
    let payloads = payloads_in(&work);
    let sock = work.join("parent.sock");
    let parent = parent(&sock, &payloads, &[], 64, 24);
    let (state, mem) = (work.join("state"), work.join("mem"));
    let written = fork(&parent, &sock, &state, &mem);
    assert!(written >= 24 << 20, "the slow path wrote {written} bytes: not the guest's memory");
    let file = hash(&mem);
    let held = std::fs::File::open(&mem).unwrap();
    let (a_sock, b_sock) = (work.join("a.sock"), work.join("b.sock"));
    let (a, b) = (clone(&a_sock, &state, &mem), clone(&b_sock, &state, &mem));
    for (vmm, what) in [(&a, "clone a"), (&b, "clone b"), (&parent, "the parent after the fork")] {
        goes_on(vmm, 3, what);
    }
    assert_eq!(hash(&mem), file, "a clone's or the parent's writes reached the memory file");

    let again = fork(&a, &a_sock, &state, &mem);
    assert!(again >= 24 << 20, "clone a's create wrote {again} bytes");
    assert_eq!(hash_held(&held), file, "clone a's create changed the file it and clone b map");
    assert_ne!(hash(&mem), file, "clone a's snapshot is not its own memory");
    for (vmm, what) in [(&a, "clone a after its create"), (&b, "clone b after its sibling's create")] {
        goes_on(vmm, 2, what);
    }
    let c = clone(&work.join("c.sock"), &state, &mem);
    checks_more(&c, 0, 2, "a clone of clone a's snapshot");
    // A create whose memory file is whole but whose state file cannot be made (its
    // directory is missing) leaves the memory file at its path as it was: both are
    // renamed into place only once both are written.
    let (c_sock, now) = (work.join("c.sock"), hash(&mem));
    expect_ok(&c_sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let body = json!({"snapshot_path": work.join("gone/state"), "mem_file_path": mem});
    let reply = request(&c_sock, "PUT", "/snapshot/create", Some(&body)).unwrap();
    assert_eq!(reply.status, 400, "{:?}", reply.body);
    assert_eq!(hash(&mem), now, "a create whose state file failed changed the memory file");
    expect_ok(&c_sock, "PATCH", "/vm", Some(&json!({"state": "Resumed"}))).unwrap();
    goes_on(&c, 2, "the clone after its failed create");
    assert_eq!(names(&work).iter().filter(|n| n.contains(".exitless-")).count(), 0, "{:?}", names(&work));

    // The files go under the running clones: they run on, and clone b (whose pages nobody
    // wrote still come from the removed file) is snapshotted whole and cloned again.
    drop(held);
    std::fs::remove_file(&mem).unwrap();
    std::fs::remove_file(&state).unwrap();
    for (vmm, what) in [(&a, "clone a"), (&b, "clone b"), (&c, "clone c")] {
        goes_on(vmm, 2, &format!("{what} with its files removed"));
    }
    let (state3, mem3) = (work.join("state3"), work.join("mem3"));
    fork(&b, &b_sock, &state3, &mem3);
    let d = clone(&work.join("d.sock"), &state3, &mem3);
    checks_more(&d, 0, 2, "a clone of clone b, snapshotted after its files were removed");
}

/// The fast path: a create whose RAM file was linked (at a staged name) but whose state
/// file failed unlinks it again: the previous snapshot at those paths (another parent's)
/// is as it was, no second name of the guest's whole RAM is left on the tmpfs, and the
/// parent, private over its RAM file from then on, runs on and snapshots (by writing).
#[test]
fn a_failed_create_on_the_fast_path_leaves_the_previous_snapshot_and_no_link() {
    if !kvm_or_skip("a_failed_create_on_the_fast_path_leaves_the_previous_snapshot_and_no_link") {
        return;
    }
    let work = tempdir();
    let payloads = payloads_in(&work);
    let shm = ShmDir::new("failfast");
    let ram_dir = shm.0.to_str().unwrap();
    let (a_sock, b_sock) = (work.join("a.sock"), work.join("b.sock"));
    let a = parent(&a_sock, &payloads, &["--ram-dir", ram_dir], 64, 16);
    let (state, mem) = (shm.0.join("state"), shm.0.join("mem"));
    let written = fork(&a, &a_sock, &state, &mem);
    assert!(written < 4 << 20, "the create wrote {written} bytes: the RAM file was not taken");
    let (state_hash, mem_hash) = (hash(&state), hash(&mem));

    let b = parent(&b_sock, &payloads, &["--ram-dir", ram_dir], 64, 16);
    expect_ok(&b_sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let body = json!({"snapshot_path": shm.0.join("gone/state"), "mem_file_path": mem});
    let reply = request(&b_sock, "PUT", "/snapshot/create", Some(&body)).unwrap();
    assert_eq!(reply.status, 400, "{:?}", reply.body);
    assert_eq!((hash(&state), hash(&mem)), (state_hash, mem_hash), "the failed create changed the snapshot");
    assert_eq!(names(&shm.0), ["mem", "state"], "the failed create left a file behind");
    expect_ok(&b_sock, "PATCH", "/vm", Some(&json!({"state": "Resumed"}))).unwrap();
    goes_on(&b, 2, "the parent after its failed create");
    goes_on(&a, 2, "the other parent");

    let (state2, mem2) = (shm.0.join("state2"), shm.0.join("mem2"));
    fork(&b, &b_sock, &state2, &mem2);
    let (c, d) = (clone(&work.join("c.sock"), &state, &mem), clone(&work.join("d.sock"), &state2, &mem2));
    checks_more(&c, 0, 2, "a clone of the previous snapshot");
    checks_more(&d, 0, 2, "a clone of the parent's next snapshot");
    goes_on(&b, 2, "the parent after its next snapshot");
}

/// Each file in `dir` by name: its inode, length and modification time.
fn listing(dir: &Path) -> BTreeMap<String, (u64, u64, i64, i64)> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let m = e.metadata().ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), (m.ino(), m.len(), m.mtime(), m.mtime_nsec())))
        })
        .collect()
}

/// What a request got: its status and body, or why none came.
fn answered(reply: &Result<exitless_lab::api_client::Reply, String>) -> String {
    match reply {
        Ok(r) => format!("{} {:?}", r.status, r.body),
        Err(e) => e.clone(),
    }
}

/// Whether `sig` was sent to `pid`, a child this test started.
fn signal(pid: u32, sig: libc::c_int) -> bool {
    // SAFETY: kill(2) on a child this test started and has not reaped.
    unsafe { libc::kill(pid as libc::pid_t, sig) == 0 }
}

/// A process ended with the test, whatever state it was left in.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        signal(self.0.id(), libc::SIGCONT);
        let _ = self.0.wait();
    }
}

/// A create killed with SIGKILL in its middle, on the slow path, leaves the previous
/// snapshot at its paths whole. The kill lands inside the create by construction: the
/// parent runs from that previous snapshot through a page-fault handler (`exitless
/// uffd-handler`), which is stopped (SIGSTOP) once the guest is paused; the create then
/// waits, for good, on the first page of guest memory it reads that the guest never
/// touched (the guest writes 8 of its 64 MiB). The VMM is killed once the create has
/// begun its files (something in the directory changed) and before it answered.
#[test]
fn a_create_killed_in_its_middle_leaves_the_previous_snapshot_whole() {
    if !kvm_or_skip("a_create_killed_in_its_middle_leaves_the_previous_snapshot_whole") {
        return;
    }
    let work = tempdir();
    let payloads = payloads_in(&work);
    let dir = work.join("snap");
    std::fs::create_dir_all(&dir).unwrap();
    let (state, mem) = (dir.join("state"), dir.join("mem"));
    let first_sock = work.join("first.sock");
    let mut first = parent(&first_sock, &payloads, &[], 64, 8);
    fork(&first, &first_sock, &state, &mem);
    first.stop_and_drain();
    let (state_hash, mem_hash) = (hash(&state), hash(&mem));

    let handler_sock = work.join("uffd.sock");
    let handler = Reaped(
        std::process::Command::new(env!("CARGO_BIN_EXE_exitless"))
            .args(["uffd-handler", "--socket", handler_sock.to_str().unwrap(), "--mem-file", mem.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !handler_sock.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let sock = work.join("b.sock");
    let mut b = Vmm::start_with(&sock, &[]);
    let body = json!({"snapshot_path": state, "mem_backend": {"backend_type": "Uffd", "backend_path": handler_sock},
                      "resume_vm": true});
    expect_ok(&sock, "PUT", "/snapshot/load", Some(&body)).unwrap();
    checks_more(&b, 0, 2, "the guest restored through the handler");
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    assert!(signal(handler.0.id(), libc::SIGSTOP));

    let before = listing(&dir);
    let create = {
        let (sock, body) = (sock.clone(), json!({"snapshot_path": state, "mem_file_path": mem}));
        std::thread::spawn(move || {
            request_within(&sock, "PUT", "/snapshot/create", Some(&body), Duration::from_secs(600))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while listing(&dir) == before {
        assert!(Instant::now() < deadline, "the create never began its files: {before:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!create.is_finished(), "the create answered: {}", answered(&create.join().unwrap()));
    let during = listing(&dir);
    assert!(signal(b.child.id(), libc::SIGKILL));
    b.stop_and_drain();
    let reply = create.join().unwrap();
    assert!(reply.is_err(), "the create answered before the kill: {}", answered(&reply));
    drop(handler);

    assert_eq!(hash(&state), state_hash, "the killed create changed the state file (it had begun: {during:?})");
    assert_eq!(hash(&mem), mem_hash, "the killed create changed the memory file (it had begun: {during:?})");
    let c = clone(&work.join("c.sock"), &state, &mem);
    checks_more(&c, 0, 3, "a clone of the previous snapshot after the killed create");
}
