//! `machine-config.huge_pages: "2M"`: guest RAM on the host's 2 MiB hugetlbfs pages (seen
//! from outside: the pool's free pages fall by the guest's size while it runs), refused
//! in one fault where the pool is too small, and Firecracker's size rule. Its snapshot
//! loads through a page-fault handler (Firecracker's handshake, 2 MiB pages) and from its
//! file, the guest checking the memory it wrote before; a pool too small or a handler that
//! never answers is one fault, and the same VMM loads it next. Needs root to reserve the
//! pool (/proc/sys/vm/nr_hugepages), which it gives back.

mod common;
mod snapshot_vmm;
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
    /// The pool to this test alone, where KVM, root and hugetlbfs are there; else None, the
    /// test skipped loudly (failing under EXITLESS_REQUIRE_KVM=1).
    fn take_or_skip(test: &str) -> Option<PoolLock> {
        if !kvm_or_skip(test) {
            return None;
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || std::fs::metadata(POOL).is_err() {
            assert!(!skip_or_fail(test, "needs root and hugetlbfs to reserve 2 MiB pages"));
            return None;
        }
        Some(PoolLock::take())
    }

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
    let Some(_alone) = PoolLock::take_or_skip(test) else {
        return;
    };
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
    let _ = child.kill();
    let _ = child.wait();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while available() != before && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(available(), before, "the pages go back to the pool with the VMM");
}

/// Waits (up to 30 s) for the pool's available pages to come back to `want`.
fn pool_back_to(want: u64) -> u64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while available() != want && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    available()
}

/// `pages` 2 MiB huge pages taken from the pool (reserved by a mapping) while it lives.
struct Held(*mut libc::c_void, usize);

impl Held {
    fn take(pages: u64) -> Held {
        let len = (pages as usize) << 21;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | libc::MAP_HUGE_2MB;
        // SAFETY: a new anonymous mapping, unmapped on drop.
        let at = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        assert_ne!(at, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        Held(at, len)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // SAFETY: the mapping made in take.
        unsafe { libc::munmap(self.0, self.1) };
    }
}

/// The counter's line once it has read its pattern back after the restore.
fn checked(vmm: &snapshot_vmm::Vmm) -> Option<String> {
    vmm.lines.lock().unwrap().iter().find(|l| l.starts_with("counter: checked")).cloned()
}

fn wait_checked(vmm: &mut snapshot_vmm::Vmm, what: &str) -> String {
    let status = vmm.child.wait().unwrap();
    vmm.stop_and_drain();
    let line = checked(vmm);
    assert!(status.success(), "{what}: {status}: {:?}", vmm.lines.lock().unwrap());
    line.unwrap_or_else(|| panic!("{what}: no check: {:?}", vmm.lines.lock().unwrap()))
}

#[test]
fn a_huge_page_snapshot_loads_through_a_handler_and_from_its_file() {
    let test = "a_huge_page_snapshot_loads_through_a_handler_and_from_its_file";
    let Some(_alone) = PoolLock::take_or_skip(test) else {
        return;
    };
    let _pool = Pool::reserve(40);
    let before = available();
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    // The guest writes 8 MiB of a pattern, is snapshotted after a few ticks, and once
    // restored counts to 30 and reads the pattern back.
    let sock = dir.join("a.sock");
    let mut a = snapshot_vmm::Vmm::start_with(&sock, &[]);
    let machine = json!({"vcpu_count": 1, "mem_size_mib": 64, "huge_pages": "2M"});
    expect_ok(&sock, "PUT", "/machine-config", Some(&machine)).unwrap();
    let boot = json!({"kernel_image_path": payloads.join("counter.elf"), "boot_args": "exitless.params=30,8"});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    a.wait_for_ticks(3);
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let (state, mem) = snapshot_vmm::snapshot(&sock, &dir, 0);
    a.stop_and_drain();
    assert!(a.lines.lock().unwrap().iter().any(|l| l == "counter: wrote 8 MiB"), "{:?}", a.lines.lock().unwrap());
    assert_eq!(pool_back_to(before), before);

    let sock = dir.join("b.sock");
    let mut b = snapshot_vmm::Vmm::start_with(&sock, &[]);
    let uffd_load = |socket: &std::path::Path| json!({"snapshot_path": state, "mem_backend": {"backend_type": "Uffd", "backend_path": socket}, "resume_vm": true});
    // A handler that takes the connection and never fills a page: one fault, in bounded
    // time, and the pages the load reserved go back.
    let mute_sock = dir.join("mute.sock");
    let mute = std::os::unix::net::UnixListener::bind(&mute_sock).unwrap();
    let holder = std::thread::spawn(move || mute.accept().map(|(stream, _)| stream));
    // (By hand: the API client's 10 s wait is the handler's.)
    let body = uffd_load(&mute_sock).to_string();
    let request = format!(
        "PUT /snapshot/load HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let why = raw(&sock, request.as_bytes(), false);
    assert!(why.starts_with("HTTP/1.1 400"), "{why}");
    assert!(why.contains("did not fill the first page") && why.contains("2048 KiB pages"), "{why}");
    assert_eq!(expect_ok(&sock, "GET", "/", None).unwrap().unwrap()["state"], "Not started");
    drop(holder.join().unwrap());
    assert_eq!(pool_back_to(before), before, "nothing of the refused load is left");
    // A pool too small for the guest: one fault naming the pages, from the handler's load
    // and the file's alike.
    let held = Held::take(available() - 8);
    let why = fault(&sock, "PUT", "/snapshot/load", uffd_load(&dir.join("nobody.sock")));
    assert!(why.contains("needs 32 free 2 MiB huge pages"), "{why}");
    let file_load = json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": mem}, "resume_vm": true});
    let why = fault(&sock, "PUT", "/snapshot/load", file_load.clone());
    assert!(why.contains("needs 32 free 2 MiB huge pages"), "{why}");
    assert_eq!(expect_ok(&sock, "GET", "/", None).unwrap().unwrap()["state"], "Not started");
    drop(held);
    assert_eq!(pool_back_to(before), before);

    // The same VMM loads it through exitless's handler (Firecracker's handshake, the
    // regions' page size 2 MiB): its memory in hugetlbfs pages, filled whole.
    let handler_sock = dir.join("uffd.sock");
    let handler = std::process::Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(["uffd-handler", "--socket", handler_sock.to_str().unwrap(), "--mem-file", &mem])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !handler_sock.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let mut paused = uffd_load(&handler_sock);
    paused["resume_vm"] = json!(false);
    expect_ok(&sock, "PUT", "/snapshot/load", Some(&paused)).unwrap();
    assert_eq!(before - available(), 32, "the restored guest's 64 MiB in 2 MiB pages");
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Resumed"}))).unwrap();
    let line = wait_checked(&mut b, "through the handler");
    assert_eq!(line, "counter: checked 8 MiB, 0 words wrong");
    snapshot_vmm::assert_goes_on(&mem, &b.ticks(), "through the handler");
    let out = handler.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    let pages: u64 = said.split(' ').nth(3).and_then(|n| n.parse().ok()).unwrap_or(0);
    // 8 MiB of pattern alone is 4 huge pages; the guest touched at most its 32.
    assert!(out.status.success() && (4..=32).contains(&pages), "{said}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(pool_back_to(before), before);

    // And from the file: copied into hugetlbfs pages.
    let sock = dir.join("c.sock");
    let mut c = snapshot_vmm::Vmm::start_with(&sock, &[]);
    let mut paused = file_load.clone();
    paused["resume_vm"] = json!(false);
    expect_ok(&sock, "PUT", "/snapshot/load", Some(&paused)).unwrap();
    assert_eq!(before - available(), 32, "the restored guest's 64 MiB in 2 MiB pages");
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Resumed"}))).unwrap();
    let line = wait_checked(&mut c, "from the file");
    assert_eq!(line, "counter: checked 8 MiB, 0 words wrong");
    snapshot_vmm::assert_goes_on(&mem, &c.ticks(), "from the file");
    assert_eq!(pool_back_to(before), before);
}

/// `bench snapshot`'s Uffd2M row: a guest on huge pages loaded through the handler, the
/// lab checking that it goes on counting; the pool it reserved given back.
#[test]
fn the_snapshot_lab_loads_a_huge_page_guest_through_the_handler() {
    let test = "the_snapshot_lab_loads_a_huge_page_guest_through_the_handler";
    let Some(_alone) = PoolLock::take_or_skip(test) else {
        return;
    };
    let was = read(POOL);
    let args = ["snapshot", "--types", "Uffd2M", "--huge-mem", "64", "--written", "0.25", "--runs", "1"];
    let (out, json) = bench_json(&args);
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{json}{}", stderr(&out));
    let row = &rows[0];
    assert_eq!((row["snapshot_type"].as_str(), row["mem_mib"].as_u64()), (Some("Uffd2M"), Some(64)), "{row}");
    assert!(row["load_ms"].as_f64().unwrap() > 0.0 && row["load_to_running_ms"].as_f64().unwrap() > 0.0, "{row}");
    assert!(row["memory_written_kib"].as_u64().unwrap() >= 16 * 1024, "{row}");
    assert_eq!(read(POOL), was, "the pool is given back");
}
