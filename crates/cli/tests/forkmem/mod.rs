//! The fork tests' guest and calls: a `forkmem` guest (which checks its own pattern every
//! generation, with a nonce each copy draws for itself: a page that reached one copy from
//! another is a word it did not write, and it says so), forked through Firecracker's
//! calls, its clones loaded, the files hashed.
#![allow(dead_code)]

use crate::snapshot_vmm::*;
use exitless_lab::api_client::expect_ok;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A directory on a tmpfs (/dev/shm, or $EXITLESS_FORK_TMPFS: one mounted `huge=always`
/// tries the same on 2 MiB pages), removed when dropped.
pub struct ShmDir(pub PathBuf);

impl ShmDir {
    pub fn new(name: &str) -> ShmDir {
        let base = std::env::var("EXITLESS_FORK_TMPFS").unwrap_or_else(|_| "/dev/shm".into());
        let dir = PathBuf::from(format!("{base}/exitless-fork-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        ShmDir(dir)
    }
}

impl Drop for ShmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The generations a forkmem guest said were whole, and whether it found a bad word.
pub fn gens(vmm: &Vmm) -> (Vec<u64>, Option<String>) {
    let lines = vmm.lines.lock().unwrap();
    let ok = lines.iter().filter_map(|l| l.strip_prefix("forkmem: gen ")?.strip_suffix(" ok")?.parse().ok()).collect();
    (ok, lines.iter().find(|l| l.contains("BAD")).cloned())
}

/// Waits until `vmm`'s guest has checked `more` generations beyond those it had at
/// `since` (a count of lines), failing on a bad word.
pub fn checks_more(vmm: &Vmm, since: usize, more: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (ok, bad) = gens(vmm);
        assert!(bad.is_none(), "{what}: {}", bad.unwrap());
        if ok.len() >= since + more {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {} generations, wanted {}", ok.len(), since + more);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Checks `more` generations beyond those `vmm`'s guest has checked now.
pub fn goes_on(vmm: &Vmm, more: usize, what: &str) {
    checks_more(vmm, gens(vmm).0.len(), more, what);
}

/// A forkmem guest of `mem` MiB writing `fill` MiB, on a VMM started with `flags`, that
/// has checked two generations.
pub fn parent(sock: &Path, payloads: &Path, flags: &[&str], mem: u64, fill: u64) -> Vmm {
    let vmm = Vmm::start_with(sock, flags);
    expect_ok(sock, "PUT", "/machine-config", Some(&json!({"vcpu_count": 1, "mem_size_mib": mem}))).unwrap();
    let boot =
        json!({"kernel_image_path": payloads.join("forkmem.elf"), "boot_args": format!("exitless.params={fill}")});
    expect_ok(sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    checks_more(&vmm, 0, 2, "the parent before the snapshot");
    vmm
}

/// Paused, snapshotted to `state` and `mem`, resumed: the bytes the VMM wrote meanwhile
/// (its write(2)s, /proc/PID/io).
pub fn fork(vmm: &Vmm, sock: &Path, state: &Path, mem: &Path) -> u64 {
    let wchar = || {
        let io = std::fs::read_to_string(format!("/proc/{}/io", vmm.child.id())).unwrap();
        io.lines().find_map(|l| l.strip_prefix("wchar: ")?.parse::<u64>().ok()).unwrap()
    };
    expect_ok(sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let before = wchar();
    expect_ok(sock, "PUT", "/snapshot/create", Some(&json!({"snapshot_path": state, "mem_file_path": mem}))).unwrap();
    let written = wchar() - before;
    expect_ok(sock, "PATCH", "/vm", Some(&json!({"state": "Resumed"}))).unwrap();
    written
}

/// FNV-1a 64 of `bytes`.
pub fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

pub fn hash(path: &Path) -> u64 {
    fnv(&std::fs::read(path).unwrap())
}

/// What an open file holds now (the file behind a descriptor, whatever its path names).
pub fn hash_held(file: &std::fs::File) -> u64 {
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut &*file, &mut bytes).unwrap();
    std::io::Seek::rewind(&mut &*file).unwrap();
    fnv(&bytes)
}

/// A new VMM that loaded `state` and `mem` and runs.
pub fn clone(sock: &Path, state: &Path, mem: &Path) -> Vmm {
    let vmm = Vmm::start_with(sock, &[]);
    load(sock, state.to_str().unwrap(), mem.to_str().unwrap());
    vmm
}

/// The names in `dir`.
pub fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}
