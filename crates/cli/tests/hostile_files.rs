//! Files that are not what a VMM reads whole (issue 53): a FIFO (opening one to read
//! waits for a writer; reading it, for data), /dev/zero or /dev/urandom (a length of 0 to
//! stat, and no end), and crafted state files whose lists cost more than their size.
//! Each is refused at once with one line (400 and a fault_message on the API), and the
//! VMM serves on. Each request is bounded (the client gives up after 10 s, and each must
//! be answered within 5), so a VMM that waits fails these tests instead of hanging them.

mod common;
use common::*;
use exitless_lab::api_client::{expect_ok, request};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a refusal may take: it reads nothing but the descriptor's type.
const PROMPT: Duration = Duration::from_secs(5);

/// An API VMM, killed when the test ends (a VMM that hung must not outlive it).
struct Vmm(Child);

impl Drop for Vmm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn fifo(path: &Path) -> String {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo only makes the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
    path.to_str().unwrap().to_string()
}

/// The fault_message of a request that must be refused with 400, within [`PROMPT`].
fn prompt_fault(sock: &Path, method: &str, path: &str, body: serde_json::Value) -> String {
    let started = Instant::now();
    let reply = request(sock, method, path, Some(&body));
    let took = started.elapsed();
    let reply = reply.unwrap_or_else(|e| panic!("{method} {path} {body}: no answer in {took:?}: {e}"));
    assert!(took < PROMPT, "{method} {path} {body}: answered after {took:?}");
    assert_eq!(reply.status, 400, "{method} {path} {body}: {:?}", reply.body);
    reply.body.and_then(|b| b["fault_message"].as_str().map(str::to_string)).expect("a fault_message")
}

/// The VMM still answers, and nothing was configured.
fn still_serving(sock: &Path) {
    let info = request(sock, "GET", "/", None).expect("the VMM serves on").body.unwrap();
    assert_eq!(info["state"], "Not started", "{info}");
}

/// A kept state file (1 vCPU, 64 MiB) from the fuzz corpus: valid, checksum and all.
fn corpus_state() -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/snapshot_loader/counter-1vcpu");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// `file` with its checksum made to fit its (edited) contents, as the VMM computes it.
fn resealed(mut file: serde_json::Value) -> String {
    let bytes = serde_json::to_vec(&(&file["machine"], &file["config"])).unwrap();
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    file["checksum"] = format!("fnv1a64:{hash:016x}").into();
    file.to_string()
}

fn load_body(state: &str, mem: &str) -> serde_json::Value {
    json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": mem}})
}

#[test]
fn snapshot_files_that_are_not_regular_files_are_refused_at_once() {
    let dir = tempdir();
    let sock = dir.join("api.sock");
    let _vmm = Vmm(api_process_with(&sock, Stdio::null(), &[]));
    let state = dir.join("state.json");
    std::fs::write(&state, corpus_state().to_string()).unwrap();
    let state = state.to_str().unwrap();
    let regular_mem = dir.join("mem.bin");
    std::fs::write(&regular_mem, b"").unwrap();
    let regular_mem = regular_mem.to_str().unwrap();
    // The FIFOs first: a VMM that waits on one fails here, before it is handed a device
    // it would read until it runs out of memory.
    let state_fifo = fifo(&dir.join("state.fifo"));
    let refused = prompt_fault(&sock, "PUT", "/snapshot/load", load_body(&state_fifo, regular_mem));
    assert!(refused.contains("is a FIFO, not a regular file"), "{refused}");
    still_serving(&sock);
    let mem_fifo = fifo(&dir.join("mem.fifo"));
    let refused = prompt_fault(&sock, "PUT", "/snapshot/load", load_body(state, &mem_fifo));
    assert!(refused.contains("memory file") && refused.contains("is a FIFO, not a regular file"), "{refused}");
    still_serving(&sock);
    for device in ["/dev/zero", "/dev/urandom"] {
        let refused = prompt_fault(&sock, "PUT", "/snapshot/load", load_body(device, regular_mem));
        assert!(refused.contains(&format!("{device} is a character device, not a regular file")), "{refused}");
        let refused = prompt_fault(&sock, "PUT", "/snapshot/load", load_body(state, device));
        assert!(refused.contains("is a character device, not a regular file"), "{refused}");
        still_serving(&sock);
    }
}

/// 100,000 network interfaces (MACs given) and as many MMDS interface names: each
/// interface was looked up in the MMDS list (10^10 comparisons) before the build refused
/// the first. (Without MACs, the 255th one's default MAC overflowed: a panic.)
#[test]
fn a_crafted_state_listing_more_devices_than_a_machine_holds_is_refused_at_once() {
    let dir = tempdir();
    let sock = dir.join("api.sock");
    let _vmm = Vmm(api_process_with(&sock, Stdio::null(), &[]));
    let mut file = corpus_state();
    let nics: Vec<_> = (0..100_000)
        .map(|i| json!({"iface_id": format!("eth{i}"), "host_dev_name": "tap0", "guest_mac": "06:00:00:00:00:01"}))
        .collect();
    file["config"]["network-interfaces"] = nics.into();
    file["config"]["mmds-config"] = json!({"network_interfaces": vec!["other"; 100_000]});
    let state = dir.join("crafted.json");
    std::fs::write(&state, resealed(file)).unwrap();
    let mem = dir.join("mem.bin");
    std::fs::write(&mem, vec![0u8; 4096]).unwrap();
    let body = load_body(state.to_str().unwrap(), mem.to_str().unwrap());
    let refused = prompt_fault(&sock, "PUT", "/snapshot/load", body);
    assert!(refused.contains("100000 network-interfaces, where a microVM holds at most 8"), "{refused}");
    still_serving(&sock);
    // A config file is held to the same counts.
    let drive =
        |i: usize| json!({"drive_id": format!("d{i}"), "path_on_host": "/nonexistent", "is_root_device": false});
    let config =
        json!({"boot-source": {"kernel_image_path": "/nonexistent"}, "drives": (0..33).map(drive).collect::<Vec<_>>()});
    let path = dir.join("vm.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let err = ends_at_once_with_one_line(&["--no-api", "--config-file", path.to_str().unwrap()]);
    assert!(err.contains("33 drives, where a microVM holds at most 32"), "{err}");
}

/// `exitless ARGS`, which must end within [`PROMPT`] with one line on stderr; killed if not.
fn ends_at_once_with_one_line(args: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > PROMPT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?}: still running after {PROMPT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    err
}

#[test]
fn files_named_by_flags_that_are_not_regular_files_end_the_start_at_once() {
    let dir = tempdir();
    let fifo = fifo(&dir.join("flag.fifo"));
    let sock = |n: &str| dir.join(n).to_str().unwrap().to_string();
    let config = dir.join("vm.json");
    let boot = json!({"boot-source": {"kernel_image_path": "/nonexistent"}});
    std::fs::write(&config, boot.to_string()).unwrap();
    let config = config.to_str().unwrap();
    for (args, named) in [
        (vec!["--no-api", "--config-file", &fifo], "is a FIFO, not a regular file"),
        (vec!["--api-sock", &sock("a.sock"), "--config-file", &fifo], "is a FIFO, not a regular file"),
        (vec!["--no-api", "--config-file", config, "--metadata", &fifo], "--metadata"),
        (vec!["--no-api", "--config-file", config, "--metadata", "/dev/zero"], "a character device"),
        (vec!["--describe-snapshot", &fifo], "is a FIFO, not a regular file"),
        (vec!["run", "--kernel", &fifo], "is a FIFO, not a regular file"),
        (vec!["run", "--kernel", "/dev/zero"], "a character device"),
    ] {
        let err = ends_at_once_with_one_line(&args);
        assert!(err.contains(named), "{args:?}: {err}");
    }
}

/// A read-only drive or pmem device on a FIFO: opening one to read waited for a writer,
/// with the API thread, at InstanceStart.
#[test]
fn a_fifo_as_a_read_only_drive_or_pmem_file_is_refused_at_once() {
    if !kvm_or_skip("a_fifo_as_a_read_only_drive_or_pmem_file_is_refused_at_once") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let boot = json!({"kernel_image_path": payloads.join("wait.elf")});
    let fifo: PathBuf = fifo(&dir.join("disk.fifo")).into();
    let devices = [
        ("/drives/ro", json!({"drive_id": "ro", "path_on_host": fifo, "is_root_device": false, "is_read_only": true})),
        ("/pmem/ro", json!({"id": "ro", "path_on_host": fifo, "read_only": true})),
    ];
    for (n, (path, device)) in devices.into_iter().enumerate() {
        let sock = dir.join(format!("api{n}.sock"));
        let _vmm = Vmm(api_process_with(&sock, Stdio::null(), &[]));
        expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
        expect_ok(&sock, "PUT", path, Some(&device)).unwrap();
        let refused = prompt_fault(&sock, "PUT", "/actions", json!({"action_type": "InstanceStart"}));
        assert!(refused.contains("disk.fifo"), "{path}: {refused}");
        let info = request(&sock, "GET", "/", None).expect("the VMM serves on").body.unwrap();
        assert_eq!(info["state"], "Not started", "{path}: {info}");
    }
}
