//! Firecracker v1.16.1's behaviour where its real clients depend on it, each defect of
//! issue #37 with a test of its own (Firecracker's code cited), then one table that crosses
//! every start mode (API alone; API with `--config-file`, as Kata launches; `--no-api
//! --config-file`; API then `/snapshot/load`), each with and without `--boot-timer`,
//! `--metadata`, and log and metrics FIFOs, with Firecracker's requests in each phase and
//! a termination signal at the end: no crash (no exit 159, no panic), Firecracker's
//! status for every request, the guest still running where it was.

mod common;
use common::*;
use exitless_lab::api_client::{expect_ok, request};
use serde_json::{json, Value};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A VMM process, killed when dropped.
struct Vmm(Child);

impl Drop for Vmm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Vmm {
    fn spawn(args: &[&str], stdout: Stdio) -> Vmm {
        let child = Command::new(env!("CARGO_BIN_EXE_exitless"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Vmm(child)
    }

    /// Waits until the API on `sock` answers GET / (a socket that accepts connections is
    /// not yet a VMM that serves), failing if the process ends first.
    fn serving(mut self, sock: &Path) -> Vmm {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !request(sock, "GET", "/", None).is_ok_and(|r| r.status == 200) {
            if let Ok(Some(status)) = self.0.try_wait() {
                panic!("the VMM ended before serving its API: {status:?}\n{}", self.stderr());
            }
            assert!(Instant::now() < deadline, "no API on {}", sock.display());
            std::thread::sleep(Duration::from_millis(10));
        }
        self
    }

    /// Waits until the guest's first line is on the VMM's stdout (spawned piped), failing
    /// if the process ends first: a VMM without an API is running its guest then.
    fn guest_running(mut self) -> Vmm {
        let out = self.0.stdout.take().expect("stdout piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line);
            let _ = tx.send(line);
        });
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) if !line.is_empty() => self,
            got => panic!("the guest printed no line ({got:?}): {:?}\n{}", self.0.try_wait(), self.stderr()),
        }
    }

    fn alive(&mut self) -> bool {
        self.0.try_wait().unwrap().is_none()
    }

    fn stderr(&mut self) -> String {
        let mut text = String::new();
        if let Some(mut e) = self.0.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut text);
        }
        text
    }

    /// Sends `sig` and waits (at most 30 s) for the process to end.
    fn signal(&mut self, sig: i32) -> ExitStatus {
        // SAFETY: a signal to the child we started and have not reaped.
        unsafe { libc::kill(self.0.id() as i32, sig) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "signal {sig} did not end the VMM");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// How Firecracker ends on `sig`: killed by SIGINT and SIGTERM (it has no handler for
/// them), exit 156 after SIGHUP (its signal_handler.rs, `FcExitCode::SIGHUP`).
fn assert_ended_as_firecracker(status: ExitStatus, sig: i32, what: &str) {
    match sig {
        libc::SIGHUP => assert_eq!(status.code(), Some(156), "{what}: {status:?}"),
        _ => assert_eq!(status.signal(), Some(sig), "{what}: {status:?}"),
    }
}

fn status(sock: &Path, method: &str, path: &str, body: Option<Value>) -> (u16, Option<Value>) {
    let reply = request(sock, method, path, body.as_ref()).unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    if reply.status >= 400 {
        let message = reply.body.as_ref().and_then(|b| b["fault_message"].as_str());
        assert!(message.is_some_and(|m| !m.is_empty()), "{method} {path}: {} without a fault_message", reply.status);
    }
    (reply.status, reply.body)
}

fn config_file(dir: &Path, kernel: &Path, boot_args: &str, extra: Value) -> PathBuf {
    let mut config = json!({
        "boot-source": {"kernel_image_path": kernel, "boot_args": boot_args},
        "machine-config": {"vcpu_count": 1, "mem_size_mib": 64},
    });
    for (k, v) in extra.as_object().unwrap() {
        config[k] = v.clone();
    }
    let path = dir.join(format!("vm-{}.json", std::process::id() ^ rand_u32()));
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

fn rand_u32() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(1);
    N.fetch_add(1, Ordering::Relaxed)
}

/// #37.1: Kata launches every VM with `--api-sock` and `--config-file` together; the API
/// thread was confined before its runtime was made, and the first system call of serving
/// (FIONBIO) killed the VMM with exit 159.
#[test]
fn api_sock_with_config_file_boots_and_serves_as_kata_launches_it() {
    if !kvm_or_skip("api_sock_with_config_file_boots_and_serves_as_kata_launches_it") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("kata.sock");
    let config = config_file(&dir, &payloads.join("wait.elf"), "console=ttyS0", json!({}));
    let args = ["--api-sock", sock.to_str().unwrap(), "--config-file", config.to_str().unwrap()];
    let mut vmm = Vmm::spawn(&args, Stdio::null()).serving(&sock);
    let (code, info) = status(&sock, "GET", "/", None);
    assert_eq!((code, info.unwrap()["state"].as_str().map(str::to_string)), (200, Some("Running".into())));
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Resumed"}))).unwrap();
    assert!(vmm.alive(), "{}", vmm.stderr());
    assert_ended_as_firecracker(vmm.signal(libc::SIGTERM), libc::SIGTERM, "SIGTERM");
    assert!(!sock.exists());
}

/// A config file that cannot run (here a drive file that does not exist) ends the VMM with
/// one line and takes its socket with it: Kata retries on the same path, which `bind`
/// refuses while a stale socket is there.
#[test]
fn a_config_file_that_cannot_run_leaves_no_socket() {
    let dir = tempdir();
    let sock = dir.join("firecracker.socket");
    let missing = dir.join("drive_7");
    let drives =
        json!([{"drive_id": "drive_7", "path_on_host": missing, "is_root_device": false, "is_read_only": false}]);
    let config = config_file(&dir, &dir.join("no-kernel"), "console=ttyS0", json!({"drives": drives}));
    let out = exitless(&["--api-sock", sock.to_str().unwrap(), "--config-file", config.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(config.to_str().unwrap()), "{err}");
    assert!(!sock.exists(), "the socket is left behind: {err}");
}

/// #37.2: Firecracker adds `root=/dev/vda ro|rw` (or `root=PARTUUID=<uuid> ro|rw`) for the
/// drive marked `is_root_device` (builder.rs, `attach_block_devices`), and puts that
/// drive first (vmm_config/drive.rs: `push_front`).
#[test]
fn the_root_drive_is_named_on_the_command_line_and_comes_first() {
    if !kvm_or_skip("the_root_drive_is_named_on_the_command_line_and_comes_first") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let (data, root) = (dir.join("data.img"), dir.join("root.img"));
    std::fs::write(&data, vec![0u8; 1 << 16]).unwrap();
    std::fs::write(&root, vec![0u8; 1 << 16]).unwrap();
    let drive = |id: &str, path: &Path, is_root: bool, ro: bool, partuuid: Value| json!({"drive_id": id, "path_on_host": path, "is_root_device": is_root, "is_read_only": ro, "partuuid": partuuid});
    // Without --enable-pci, Firecracker's `pci=off` comes first, each MMIO device after.
    for (ro, partuuid, want) in [
        (false, Value::Null, "console=ttyS0 pci=off root=/dev/vda rw virtio_mmio.device="),
        (true, json!("0eaa91a0-01"), "console=ttyS0 pci=off root=PARTUUID=0eaa91a0-01 ro virtio_mmio.device="),
    ] {
        // The root drive configured second must still be the first virtio-blk device.
        let drives =
            json!([drive("data", &data, false, false, Value::Null), drive("rootfs", &root, true, ro, partuuid)]);
        let config = config_file(&dir, &payloads.join("bootcheck.elf"), "console=ttyS0", json!({"drives": drives}));
        let out = exitless(&["--no-api", "--config-file", config.to_str().unwrap()]);
        let text = stdout(&out);
        assert!(text.contains(&format!("bootcheck: cmdline [{want}")), "{text}\n{}", stderr(&out));
    }
    // One root drive, as Firecracker (RootBlockDeviceAlreadyAdded).
    let sock = dir.join("order.sock");
    let _vmm = Vmm::spawn(&["--api-sock", sock.to_str().unwrap()], Stdio::null()).serving(&sock);
    let boot = json!({"kernel_image_path": payloads.join("wait.elf")});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/drives/data", Some(&drive("data", &data, false, false, Value::Null))).unwrap();
    expect_ok(&sock, "PUT", "/drives/rootfs", Some(&drive("rootfs", &root, true, false, Value::Null))).unwrap();
    let second_root = drive("other", &data, true, false, Value::Null);
    assert_eq!(status(&sock, "PUT", "/drives/other", Some(second_root)).0, 400);
}

/// #37.3: the version line as the Go SDK's pattern, Kata's parser and
/// firecracker-containerd (which checks none) read it: tests/gosdk/version_test.go runs
/// their code; here the bytes themselves.
#[test]
fn the_version_starts_with_firecrackers_own_line_and_says_exitless() {
    let out = exitless(&["--version"]);
    assert!(out.status.success());
    let text = stdout(&out);
    assert!(text.starts_with("Firecracker v1.16.1\n\n"), "{text:?}");
    assert!(text.lines().nth(2).is_some_and(|l| l.starts_with("exitless v")), "{text:?}");
    // With Firecracker's other flags too, as Kata's `--version` alone or a wrapper's.
    let out = exitless(&["--api-sock", "/nonexistent/x.sock", "--version"]);
    assert!(out.status.success() && stdout(&out) == text, "{}", stderr(&out));
}

/// #37.4, #37.5, #37.9 and #37.10's API differences, on one VMM: a vsock with CID 0
/// (firecracker-containerd's, through the Go SDK), MMDS documents with lists, duplicate
/// keys refused, FlushMetrics and GET /mmds before and after the start.
#[test]
fn firecrackers_answers_to_its_clients_requests() {
    if !kvm_or_skip("firecrackers_answers_to_its_clients_requests") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("api.sock");
    let mut vmm = Vmm::spawn(&["--api-sock", sock.to_str().unwrap()], Stdio::null()).serving(&sock);
    // vmm_config/vsock.rs: VsockDeviceConfig checks no CID.
    let uds = dir.join("v.sock");
    expect_ok(&sock, "PUT", "/vsock", Some(&json!({"guest_cid": 0, "uds_path": uds}))).unwrap();
    // MMDS takes any JSON value (mmds/data_store.rs); lists anywhere.
    let doc = json!({"latest": {"meta-data": {"public-keys": ["ssh-ed25519 AAAA one", "ssh-ed25519 BBBB two"]}}});
    expect_ok(&sock, "PUT", "/mmds", Some(&doc)).unwrap();
    expect_ok(&sock, "PATCH", "/mmds", Some(&json!({"latest": {"tags": [1, 2, {"k": [true]}]}}))).unwrap();
    let (code, got) = status(&sock, "GET", "/mmds", None);
    assert_eq!(code, 200);
    let got = got.unwrap();
    assert_eq!(got["latest"]["meta-data"]["public-keys"][1], "ssh-ed25519 BBBB two", "{got}");
    assert_eq!(got["latest"]["tags"][2]["k"][0], true, "{got}");
    // A field given twice: serde's derived structs refuse it, and so Firecracker does.
    let twice = "{\"vcpu_count\": 1, \"vcpu_count\": 2, \"mem_size_mib\": 64}";
    let reply = raw(
        &sock,
        format!(
            "PUT /machine-config HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{twice}",
            twice.len()
        )
        .as_bytes(),
        true,
    );
    assert!(reply.starts_with("HTTP/1.1 400") && reply.contains("duplicate field"), "{reply}");
    let nested = json!({"kernel_image_path": payloads.join("wait.elf")}).to_string();
    let nested = nested.replacen('{', "{\"boot_args\": \"a\", \"boot_args\": \"b\", ", 1);
    let reply = raw(
        &sock,
        format!("PUT /boot-source HTTP/1.1\r\nContent-Length: {}\r\n\r\n{nested}", nested.len()).as_bytes(),
        true,
    );
    assert!(reply.starts_with("HTTP/1.1 400") && reply.contains("duplicate field"), "{reply}");
    // rpc_interface.rs: FlushMetrics before the start is refused.
    assert_eq!(status(&sock, "PUT", "/actions", Some(json!({"action_type": "FlushMetrics"}))).0, 400);
    expect_ok(&sock, "PUT", "/machine-config", Some(&json!({"vcpu_count": 1, "mem_size_mib": 64}))).unwrap();
    expect_ok(&sock, "PUT", "/boot-source", Some(&json!({"kernel_image_path": payloads.join("wait.elf")}))).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    assert!(uds.exists(), "the vsock with CID 0 did not bind its socket");
    // After the start with no metrics file: 204, nothing to write (METRICS.write()'s
    // Ok(false) is dropped).
    assert_eq!(status(&sock, "PUT", "/actions", Some(json!({"action_type": "FlushMetrics"}))).0, 204);
    // After the start with no MMDS on any NIC: the store is not initialized.
    let (code, body) = status(&sock, "GET", "/mmds", None);
    assert_eq!(code, 400, "{body:?}");
    assert!(body.unwrap()["fault_message"].as_str().unwrap().contains("not initialized"));
    assert!(vmm.alive(), "{}", vmm.stderr());
}

/// #37.8: a whole request followed at once by a half-close, or by the client hanging up,
/// is executed (fire-and-forget clients: socat, `nc -N`). Seen lost before: InstanceStart,
/// PATCH /vm, with "connection closed before message completed" in the log.
#[test]
fn a_whole_request_is_executed_though_the_client_closes_at_once() {
    if !kvm_or_skip("a_whole_request_is_executed_though_the_client_closes_at_once") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let send_and_close = |sock: &Path, method: &str, path: &str, body: Value, half: bool| {
        let body = body.to_string();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
        std::io::Write::write_all(&mut s, format!("{head}{body}").as_bytes()).unwrap();
        if half {
            s.shutdown(std::net::Shutdown::Write).unwrap();
        }
    };
    // The client does not wait for answers: the state is read until the request acted
    // (each one moves it to a state other than the one before), or 30 s pass.
    let state_is = |sock: &Path, want: &str, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        let state = || status(sock, "GET", "/", None).1.map(|i| i["state"].clone());
        while state() != Some(json!(want)) {
            assert!(Instant::now() < deadline, "{what}: still {:?}, want {want}", state());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    for (round, half) in [true, false].into_iter().cycle().take(16).enumerate() {
        let what = format!("round {round} ({})", if half { "half-close" } else { "hang up" });
        let sock = dir.join(format!("close{round}.sock"));
        let _vmm = Vmm::spawn(&["--api-sock", sock.to_str().unwrap()], Stdio::null()).serving(&sock);
        expect_ok(&sock, "PUT", "/boot-source", Some(&json!({"kernel_image_path": payloads.join("wait.elf")})))
            .unwrap();
        send_and_close(&sock, "PUT", "/actions", json!({"action_type": "InstanceStart"}), half);
        state_is(&sock, "Running", &what);
        send_and_close(&sock, "PATCH", "/vm", json!({"state": "Paused"}), half);
        state_is(&sock, "Paused", &what);
        send_and_close(&sock, "PATCH", "/vm", json!({"state": "Resumed"}), half);
        state_is(&sock, "Running", &what);
    }
}

/// #37.10: `--metrics-path` and a config file's `metrics` together: Firecracker refuses
/// ("Reinitialization of metrics not allowed.") and exits 1; SIGHUP writes the metrics
/// once more with `signals.sighup` and exits 156.
#[test]
fn metrics_twice_are_refused_and_sighup_flushes_and_exits_156() {
    if !kvm_or_skip("metrics_twice_are_refused_and_sighup_flushes_and_exits_156") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let (flag, section) = (dir.join("flag.metrics"), dir.join("section.metrics"));
    let config =
        config_file(&dir, &payloads.join("wait.elf"), "console=ttyS0", json!({"metrics": {"metrics_path": section}}));
    let out = assert_one_line_error(&[
        "--no-api",
        "--config-file",
        config.to_str().unwrap(),
        "--metrics-path",
        flag.to_str().unwrap(),
    ]);
    assert!(stderr(&out).contains("Reinitialization of metrics not allowed"), "{}", stderr(&out));

    let sock = dir.join("hup.sock");
    let args = ["--api-sock", sock.to_str().unwrap(), "--metrics-path", flag.to_str().unwrap()];
    let mut vmm = Vmm::spawn(&args, Stdio::null()).serving(&sock);
    let boot = json!({"kernel_image_path": payloads.join("wait.elf")});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    let status = vmm.signal(libc::SIGHUP);
    assert_eq!(status.code(), Some(156), "{status:?}: {}", vmm.stderr());
    let text = std::fs::read_to_string(&flag).unwrap();
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["signals"]["sighup"], 1, "{last}");
    assert!(!sock.exists());
}

/// #37.6: `PUT /snapshot/load` takes Firecracker v1.16.1's fields (vmm_config/snapshot.rs:
/// `network_overrides` as a list, `vsock_override`, `clock_realtime`); each is parsed and
/// applied or refused for what it names, never as an unknown field or a wrong shape.
#[test]
fn snapshot_load_takes_firecrackers_own_fields() {
    if !kvm_or_skip("snapshot_load_takes_firecrackers_own_fields") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("a.sock");
    let vmm = Vmm::spawn(&["--api-sock", sock.to_str().unwrap()], Stdio::null()).serving(&sock);
    let boot = json!({"kernel_image_path": payloads.join("wait.elf")});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    let old_uds = dir.join("old.vsock");
    expect_ok(&sock, "PUT", "/vsock", Some(&json!({"guest_cid": 3, "uds_path": old_uds}))).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let (state, mem) = (dir.join("s.json"), dir.join("m.bin"));
    expect_ok(&sock, "PUT", "/snapshot/create", Some(&json!({"snapshot_path": state, "mem_file_path": mem}))).unwrap();
    drop(vmm);
    let load = |extra: Value| {
        let mut body = json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": mem}});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let sock = dir.join("b.sock");
    let _b = Vmm::spawn(&["--api-sock", sock.to_str().unwrap()], Stdio::null()).serving(&sock);
    // Refused for what they name (persist.rs: "Unknown Network Device"), not their shape.
    let refused = fault(
        &sock,
        "PUT",
        "/snapshot/load",
        load(json!({"network_overrides": [{"iface_id": "eth9", "host_dev_name": "tap9", "extra": 1}]})),
    );
    assert!(refused.contains("eth9"), "{refused}");
    let new_uds = dir.join("new.vsock");
    let body = load(json!({"network_overrides": [], "vsock_override": {"uds_path": new_uds}, "clock_realtime": false,
                           "resume_vm": true}));
    expect_ok(&sock, "PUT", "/snapshot/load", Some(&body)).unwrap();
    assert!(new_uds.exists(), "vsock_override's socket was not bound");
    let (_, info) = status(&sock, "GET", "/", None);
    assert_eq!(info.unwrap()["state"], "Running");
}

/// The start modes of the table: how the VMM is started and brought to a running guest.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    ApiOnly,
    ApiWithConfigFile,
    NoApiConfigFile,
    ApiThenSnapshotLoad,
}

/// The extras a fleet passes, one at a time.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Extra {
    Nothing,
    BootTimer,
    Metadata,
    Fifos,
}

/// Firecracker's requests for a running (then paused) microVM with no NIC, and its
/// status for each (rpc_interface.rs: pre-boot-only requests are refused after the start).
fn running_requests(dir: &Path) -> Vec<(&'static str, &'static str, Option<Value>, u16)> {
    let drive = dir.join("swap.img");
    std::fs::write(&drive, vec![0u8; 1 << 16]).unwrap();
    vec![
        ("GET", "/", None, 200),
        ("GET", "/version", None, 200),
        ("GET", "/vm/config", None, 200),
        ("GET", "/machine-config", None, 200),
        ("PUT", "/machine-config", Some(json!({"vcpu_count": 1, "mem_size_mib": 64})), 400),
        ("PATCH", "/machine-config", Some(json!({"vcpu_count": 1})), 400),
        ("PUT", "/boot-source", Some(json!({"kernel_image_path": "/nonexistent"})), 400),
        ("PUT", "/drives/d2", Some(json!({"drive_id": "d2", "path_on_host": drive, "is_root_device": false})), 400),
        ("PATCH", "/drives/rootfs", Some(json!({"drive_id": "rootfs", "path_on_host": drive})), 204),
        ("PATCH", "/network-interfaces/eth0", Some(json!({"iface_id": "eth0"})), 400),
        ("PUT", "/network-interfaces/eth0", Some(json!({"iface_id": "eth0", "host_dev_name": "tap0"})), 400),
        ("PUT", "/logger", Some(json!({"level": "Info"})), 400),
        ("PUT", "/metrics", Some(json!({"metrics_path": "/nonexistent/m"})), 400),
        ("PUT", "/vsock", Some(json!({"guest_cid": 3, "uds_path": "/nonexistent/v"})), 400),
        ("PUT", "/entropy", Some(json!({})), 400),
        ("PUT", "/mmds/config", Some(json!({"network_interfaces": ["eth0"]})), 400),
        ("PUT", "/mmds", Some(json!({"latest": {"keys": ["a", "b"]}})), 204),
        ("PATCH", "/mmds", Some(json!({"latest": {"more": [1]}})), 204),
        ("GET", "/mmds", None, 400),
        ("PUT", "/actions", Some(json!({"action_type": "InstanceStart"})), 400),
        ("PUT", "/actions", Some(json!({"action_type": "FlushMetrics"})), 204),
        ("PUT", "/snapshot/load", Some(json!({"snapshot_path": "/x", "mem_file_path": "/y"})), 400),
        ("PUT", "/snapshot/create", Some(json!({"snapshot_path": "/x", "mem_file_path": "/y"})), 400),
        ("PUT", "/balloon", Some(json!({"amount_mib": 1, "deflate_on_oom": false})), 400),
        ("GET", "/balloon", None, 400),
        ("PUT", "/cpu-config", Some(json!({})), 400),
        ("PATCH", "/vm", Some(json!({"state": "Paused"})), 204),
        ("GET", "/", None, 200),
        (
            "PUT",
            "/snapshot/create",
            Some(json!({"snapshot_path": dir.join("t.json"), "mem_file_path": dir.join("t.bin")})),
            204,
        ),
        ("PATCH", "/vm", Some(json!({"state": "Resumed"})), 204),
    ]
}

/// A FIFO with a reader draining it, as an orchestrator's log and metrics pipes.
fn drained_fifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a NUL-terminated path we own.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let mut f = std::fs::File::open(path).unwrap();
        let _ = std::io::copy(&mut f, &mut std::io::sink());
    });
}

#[test]
fn every_start_mode_with_every_extra_answers_as_firecracker_and_ends_by_its_signal() {
    if !kvm_or_skip("every_start_mode_with_every_extra_answers_as_firecracker_and_ends_by_its_signal") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let kernel = payloads.join("wait.elf");
    let root = dir.join("root.img");
    std::fs::write(&root, vec![0u8; 1 << 16]).unwrap();
    let rootfs = json!({"drive_id": "rootfs", "path_on_host": root, "is_root_device": true, "is_read_only": false});
    let metadata = dir.join("metadata.json");
    std::fs::write(&metadata, json!({"latest": {"public-keys": ["ssh-ed25519 AAAA"]}}).to_string()).unwrap();
    // The snapshot the load mode restores: a running `wait` guest with its root drive.
    let (state, mem) = (dir.join("base.json"), dir.join("base.bin"));
    {
        let sock = dir.join("base.sock");
        let _vmm = Vmm::spawn(&["--api-sock", sock.to_str().unwrap()], Stdio::null()).serving(&sock);
        expect_ok(&sock, "PUT", "/machine-config", Some(&json!({"vcpu_count": 1, "mem_size_mib": 64}))).unwrap();
        expect_ok(&sock, "PUT", "/boot-source", Some(&json!({"kernel_image_path": kernel}))).unwrap();
        expect_ok(&sock, "PUT", "/drives/rootfs", Some(&rootfs)).unwrap();
        expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
        expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
        let body = json!({"snapshot_path": state, "mem_file_path": mem});
        expect_ok(&sock, "PUT", "/snapshot/create", Some(&body)).unwrap();
    }
    let requests = running_requests(&dir);
    let signals = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];
    let modes = [Mode::ApiOnly, Mode::ApiWithConfigFile, Mode::NoApiConfigFile, Mode::ApiThenSnapshotLoad];
    let extras = [Extra::Nothing, Extra::BootTimer, Extra::Metadata, Extra::Fifos];
    let mut run = 0;
    for mode in modes {
        for extra in extras {
            run += 1;
            let what = format!("{mode:?} with {extra:?}");
            let sock = dir.join(format!("t{run}.sock"));
            let config = config_file(&dir, &kernel, "console=ttyS0", json!({"drives": [rootfs]}));
            let mut args: Vec<String> = match mode {
                Mode::NoApiConfigFile => vec!["--no-api".into()],
                _ => vec!["--api-sock".into(), sock.display().to_string()],
            };
            if matches!(mode, Mode::ApiWithConfigFile | Mode::NoApiConfigFile) {
                args.extend(["--config-file".into(), config.display().to_string()]);
            }
            match extra {
                Extra::Nothing => {}
                Extra::BootTimer => args.push("--boot-timer".into()),
                Extra::Metadata => args.extend(["--metadata".into(), metadata.display().to_string()]),
                Extra::Fifos => {
                    let (log, metrics) = (dir.join(format!("log{run}")), dir.join(format!("metrics{run}")));
                    drained_fifo(&log);
                    drained_fifo(&metrics);
                    args.extend(["--log-path".into(), log.display().to_string()]);
                    args.extend(["--metrics-path".into(), metrics.display().to_string()]);
                }
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let sig = signals[run % signals.len()];
            if mode == Mode::NoApiConfigFile {
                let mut vmm = Vmm::spawn(&args, Stdio::piped()).guest_running();
                assert!(vmm.alive(), "{what}: the VMM ended: {}", vmm.stderr());
                assert_ended_as_firecracker(vmm.signal(sig), sig, &what);
                continue;
            }
            let mut vmm = Vmm::spawn(&args, Stdio::null());
            vmm = vmm.serving(&sock);
            // `--metadata`'s document before the start; a started microVM with no NIC
            // answering MMDS has no store (its GET /mmds is in the requests below).
            if extra == Extra::Metadata && mode != Mode::ApiWithConfigFile {
                let (_, doc) = status(&sock, "GET", "/mmds", None);
                assert_eq!(doc.unwrap()["latest"]["public-keys"][0], "ssh-ed25519 AAAA", "{what}");
            }
            match mode {
                Mode::ApiOnly => {
                    let boot = json!({"kernel_image_path": kernel, "boot_args": "console=ttyS0"});
                    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
                    expect_ok(&sock, "PUT", "/drives/rootfs", Some(&rootfs)).unwrap();
                    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
                }
                Mode::ApiThenSnapshotLoad => {
                    let body = json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": mem},
                                      "resume_vm": true});
                    expect_ok(&sock, "PUT", "/snapshot/load", Some(&body)).unwrap();
                }
                _ => {}
            }
            for (method, path, body, want) in &requests {
                let (got, reply) = status(&sock, method, path, body.clone());
                assert_eq!(got, *want, "{what}: {method} {path}: {reply:?}");
                assert!(vmm.alive(), "{what}: the VMM ended after {method} {path}: {}", vmm.stderr());
            }
            let (_, info) = status(&sock, "GET", "/", None);
            assert_eq!(info.unwrap()["state"], "Running", "{what}");
            let status = vmm.signal(sig);
            assert_ne!(status.code(), Some(159), "{what}: seccomp killed the VMM");
            assert_ended_as_firecracker(status, sig, &what);
            assert!(!sock.exists(), "{what}: the socket is left behind: {}", vmm.stderr());
        }
    }
    // A signal before anything is configured ends the VMM the same way.
    for sig in signals {
        let sock = dir.join(format!("pre{sig}.sock"));
        let mut vmm = Vmm::spawn(&["--api-sock", sock.to_str().unwrap()], Stdio::null()).serving(&sock);
        assert_ended_as_firecracker(vmm.signal(sig), sig, "before the start");
        assert!(!sock.exists());
    }
}

/// `PUT /serial` (Firecracker v1.16): the console goes to the file it names, held to its
/// byte bucket (what is beyond it dropped and counted in the metrics), and the request is
/// refused once the microVM runs.
#[test]
fn put_serial_sends_the_console_to_its_file_under_its_rate_limit() {
    if !kvm_or_skip("put_serial_sends_the_console_to_its_file_under_its_rate_limit") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("serial.sock");
    let (out, metrics) = (dir.join("console.out"), dir.join("metrics.json"));
    let mut vmm = Vmm::spawn(&["--api-sock", sock.to_str().unwrap()], Stdio::piped()).serving(&sock);
    let kernel = payloads.join("demo.elf");
    expect_ok(&sock, "PUT", "/boot-source", Some(&json!({"kernel_image_path": kernel, "boot_args": "console=ttyS0"})))
        .unwrap();
    expect_ok(&sock, "PUT", "/metrics", Some(&json!({"metrics_path": metrics}))).unwrap();
    // An unknown field and an empty path are refused as Firecracker refuses bodies.
    assert_eq!(status(&sock, "PUT", "/serial", Some(json!({"serial_out": "x"}))).0, 400);
    assert_eq!(status(&sock, "PUT", "/serial", Some(json!({"serial_out_path": ""}))).0, 400);
    // 64 bytes at once, never refilled within the run: the demo says more than that.
    let bucket = json!({"size": 64, "refill_time": 3_600_000});
    expect_ok(&sock, "PUT", "/serial", Some(&json!({"serial_out_path": out, "rate_limiter": bucket}))).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    let (code, _) = status(&sock, "PUT", "/serial", Some(json!({"serial_out_path": out})));
    assert_eq!(code, 400, "PUT /serial after the start");
    let deadline = Instant::now() + Duration::from_secs(60);
    while vmm.alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let console = std::fs::read(&out).unwrap();
    assert!(!console.is_empty() && console.len() <= 64, "{} bytes reached the file", console.len());
    let mut stdout = String::new();
    if let Some(mut o) = vmm.0.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut o, &mut stdout);
    }
    assert!(!stdout.contains("hello from CPL0"), "the console still went to stdout: {stdout}");
    let last = std::fs::read_to_string(&metrics).unwrap();
    let line: Value = serde_json::from_str(last.lines().last().unwrap()).unwrap();
    let dropped = line["uart"]["rate_limiter_dropped_bytes"].as_u64().unwrap();
    assert!(dropped > 0, "nothing dropped: {line}");
}
