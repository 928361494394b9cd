//! What the jail tests share: the binaries, root's check, a network namespace, and the
//! removal of what a jail leaves (Firecracker's jailer leaves its jail and cgroups).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub const JAILER: &str = env!("CARGO_BIN_EXE_exitless-jailer");

/// A binary built beside the jailer (`cargo test --workspace` builds them all).
pub fn built(name: &str) -> PathBuf {
    let path = Path::new(JAILER).with_file_name(name);
    assert!(path.exists(), "{} is not built: run `cargo test --workspace` (or build it first)", path.display());
    path
}

/// True as root; otherwise says loudly that the test is skipped (and fails it where
/// EXITLESS_REQUIRE_KVM=1: CI runs as root).
pub fn root_or_skip(test: &str) -> bool {
    // SAFETY: geteuid reads this process's id.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(std::env::var("EXITLESS_REQUIRE_KVM").as_deref() != Ok("1"), "{test}: needs root, and CI runs as root");
    eprintln!("SKIPPED {test}: a jail needs root; this test did not run");
    false
}

/// A fresh directory under the system temp dir, for chroot bases.
pub fn tempdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("exitless-jail-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A named network namespace (`ip netns add`), deleted when dropped.
pub struct Netns(pub String);

impl Netns {
    pub fn new(name: &str) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", name]).status();
        let ok = Command::new("ip").args(["netns", "add", name]).status().is_ok_and(|s| s.success());
        assert!(ok, "ip netns add {name}");
        Netns(name.into())
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/var/run/netns/{}", self.0))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Removes the cgroup directories `<mount>/<parent>/<id>` (then `<parent>` if empty) of
/// every v1 hierarchy and the v2 one.
/// A cgroup its last process just left may stay busy a moment: each removal is retried
/// for up to 5 s.
pub fn remove_cgroups(parent: &str, id: &str) {
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else { return };
    for mount in entries.flatten() {
        let dir = mount.path().join(parent).join(id);
        let start = std::time::Instant::now();
        while dir.exists() && std::fs::remove_dir(&dir).is_err() && start.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = std::fs::remove_dir(mount.path().join(parent));
    }
}

/// The host profile this host's VMM takes (probed here through /sys/module; the jailed VMM
/// must find the same through /dev/kvm).
pub fn host_profile() -> &'static str {
    if Path::new("/sys/module/kvm_pvm").exists() {
        "nested"
    } else {
        "native"
    }
}
