//! `machine-config.huge_pages: "2M"`: guest RAM on the host's 2 MiB hugetlbfs pages (seen
//! from outside: the pool's free pages fall by the guest's size while it runs), refused
//! in one fault where the pool is too small, and Firecracker's size rule. Needs root to
//! reserve the pool (/proc/sys/vm/nr_hugepages), which it gives back.

mod common;
use common::*;
use exitless_lab::api_client::expect_ok;
use serde_json::json;

const POOL: &str = "/proc/sys/vm/nr_hugepages";
const HUGE: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

fn read(path: &str) -> u64 {
    std::fs::read_to_string(path).unwrap().trim().parse().unwrap()
}

/// Pages no mapping holds or has reserved.
fn available() -> u64 {
    read(&format!("{HUGE}/free_hugepages")) - read(&format!("{HUGE}/resv_hugepages"))
}

/// Holds the machine's pool for this test alone while it lives: the test counts its free
/// pages and resizes it, and another run of it (another worktree's) would do the same.
struct PoolLock(#[allow(dead_code)] std::fs::File);

impl PoolLock {
    fn take() -> PoolLock {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::create("/tmp/exitless-hugepages-test.lock").unwrap();
        // SAFETY: flock on a descriptor we own; released when the file is closed.
        assert_eq!(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) }, 0);
        PoolLock(file)
    }
}

/// Sets the pool to `pages` until dropped, then back to what it was.
struct Pool(u64);

impl Pool {
    fn reserve(extra: u64) -> Pool {
        let was = read(POOL);
        std::fs::write(POOL, (was + extra).to_string()).unwrap();
        Pool(was)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = std::fs::write(POOL, self.0.to_string());
    }
}

#[test]
fn guest_ram_on_2m_huge_pages_or_a_one_line_refusal() {
    let test = "guest_ram_on_2m_huge_pages_or_a_one_line_refusal";
    if !kvm_or_skip(test) {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || std::fs::metadata(POOL).is_err() {
        assert!(!skip_or_fail(test, "needs root and hugetlbfs to reserve 2 MiB pages"));
        return;
    }
    let _alone = PoolLock::take();
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("api.sock");
    let boot = json!({"kernel_image_path": payloads.join("wait.elf")});
    let start = |mem: u64| {
        let child = api_process(&sock, std::process::Stdio::null());
        let machine = json!({"vcpu_count": 1, "mem_size_mib": mem, "huge_pages": "2M"});
        expect_ok(&sock, "PUT", "/machine-config", Some(&machine)).unwrap();
        expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
        child
    };
    // Firecracker's rule: whole 2 MiB pages.
    let mut child = api_process(&sock, std::process::Stdio::null());
    let why = fault(&sock, "PUT", "/machine-config", json!({"vcpu_count": 1, "mem_size_mib": 63, "huge_pages": "2M"}));
    assert!(why.contains("not a multiple of the configured page size"), "{why}");
    let why = fault(&sock, "PUT", "/machine-config", json!({"vcpu_count": 1, "mem_size_mib": 64, "huge_pages": "1G"}));
    assert!(why.contains("huge_pages"), "{why}");
    let _ = child.kill();
    let _ = child.wait();

    // A pool too small: the start is refused, and the VMM keeps serving.
    let free = available();
    let mut child = start(2 * (free + 4));
    let why = fault(&sock, "PUT", "/actions", json!({"action_type": "InstanceStart"}));
    assert!(why.contains("huge_pages 2M") && why.contains("free 2 MiB huge pages"), "{why}");
    assert_eq!(expect_ok(&sock, "GET", "/", None).unwrap().unwrap()["state"], "Not started");
    let _ = child.kill();
    let _ = child.wait();

    // Enough reserved: the guest's 64 MiB come out of the pool while it runs.
    let _pool = Pool::reserve(40);
    let before = available();
    let mut child = start(64);
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    assert_eq!(expect_ok(&sock, "GET", "/", None).unwrap().unwrap()["state"], "Running");
    assert_eq!(before - available(), 32, "64 MiB of guest RAM in 2 MiB pages, taken at the start");
    // Its snapshot is written; loading it is refused in one fault (its memory would be
    // mapped in 4 KiB pages), and the loading VMM keeps serving.
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let (state, mem) = (dir.join("state"), dir.join("mem"));
    expect_ok(&sock, "PUT", "/snapshot/create", Some(&json!({"snapshot_path": state, "mem_file_path": mem}))).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let mut child = api_process_with(&sock, std::process::Stdio::null(), &[]);
    let load = json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": mem}});
    let why = fault(&sock, "PUT", "/snapshot/load", load);
    assert!(why.contains("huge pages"), "{why}");
    assert_eq!(expect_ok(&sock, "GET", "/", None).unwrap().unwrap()["state"], "Not started");
    let _ = child.kill();
    let _ = child.wait();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while available() != before && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(available(), before, "the pages go back to the pool with the VMM");
}
