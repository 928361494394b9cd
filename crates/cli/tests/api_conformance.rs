//! What orchestrators send that Firecracker accepts: every key of its config file (null
//! meaning absent), the flags fleets pass, PATCH on drives and NICs, rate limiters, drives
//! of size 0, several NICs; and what a hostile client sends or fails to send, answered
//! with a 400 and a fault_message while a running guest keeps running.

mod common;
use common::*;
use exitless_lab::api_client::{expect_ok, listening};
use serde_json::json;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A VMM serving its API on `sock`, killed when dropped.
struct Vmm(Child);

impl Drop for Vmm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_api(sock: &Path, extra: &[&str]) -> Vmm {
    let child = Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(["--api-sock", sock.to_str().unwrap()])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !listening(sock) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    Vmm(child)
}

/// Firecracker's config file, every key present as Firecracker writes it.
fn full_config(kernel: &Path, drive: &Path) -> serde_json::Value {
    json!({
        "boot-source": {"kernel_image_path": kernel, "boot_args": "console=ttyS0", "initrd_path": null},
        "drives": [{"drive_id": "rootfs", "partuuid": null, "is_root_device": true, "cache_type": "Unsafe",
                    "is_read_only": false, "path_on_host": drive, "io_engine": "Sync", "rate_limiter": null,
                    "socket": null}],
        "machine-config": {"vcpu_count": 2, "mem_size_mib": 64, "smt": true, "track_dirty_pages": false,
                           "huge_pages": "None"},
        "cpu-config": null, "balloon": null, "network-interfaces": [], "vsock": null, "logger": null,
        "metrics": null, "mmds-config": null, "entropy": null, "pmem": [], "memory-hotplug": null,
    })
}

#[test]
fn firecrackers_config_keys_parse_and_missing_features_are_named() {
    if !kvm_or_skip("firecrackers_config_keys_parse_and_missing_features_are_named") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let drive = dir.join("root.img");
    std::fs::write(&drive, vec![0u8; 1 << 16]).unwrap();
    let config = dir.join("vm.json");
    let write = |v: &serde_json::Value| std::fs::write(&config, v.to_string()).unwrap();
    write(&full_config(&payloads.join("demo.elf"), &drive));
    let out = exitless(&["--no-api", "--config-file", config.to_str().unwrap(), "--boot-timer", "--enable-pci"]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("hello from CPL0"), "{}", stdout(&out));
    // A device exitless lacks is named, in one line; so is an MMDS on no NIC.
    for (key, value, named) in [
        ("pmem", json!([{"id": "p0", "path_on_host": "/dev/null"}]), "pmem"),
        ("mmds-config", json!({"network_interfaces": ["eth0"]}), "does not correspond to any existing network"),
        ("balloon", json!({"amount_mib": 65, "deflate_on_oom": false}), "Amount of pages requested is too large"),
    ] {
        let mut c = full_config(&payloads.join("demo.elf"), &drive);
        c[key] = value;
        write(&c);
        let out = assert_one_line_error(&["--no-api", "--config-file", config.to_str().unwrap()]);
        assert!(stderr(&out).contains(named), "{key}: {}", stderr(&out));
    }
    // A section given as a list where Firecracker has an object is refused.
    let mut c = full_config(&payloads.join("demo.elf"), &drive);
    c["machine-config"] = json!([1, 64]);
    write(&c);
    let out = assert_one_line_error(&["--no-api", "--config-file", config.to_str().unwrap()]);
    assert!(stderr(&out).contains("machine-config must be an object"), "{}", stderr(&out));
}

#[test]
fn the_boot_timer_logs_firecrackers_line_when_the_guest_writes_to_it() {
    if !kvm_or_skip("the_boot_timer_logs_firecrackers_line_when_the_guest_writes_to_it") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let (sock, log) = (dir.join("api.sock"), dir.join("log"));
    let _vmm = spawn_api(&sock, &["--boot-timer", "--level", "Info", "--log-path", log.to_str().unwrap()]);
    let put = |path: &str, body: serde_json::Value| expect_ok(&sock, "PUT", path, Some(&body)).unwrap();
    put("/boot-source", json!({"kernel_image_path": payloads.join("wait.elf"), "boot_args": "boot-timer"}));
    put("/actions", json!({"action_type": "InstanceStart"}));
    let deadline = Instant::now() + Duration::from_secs(30);
    let line = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.contains("Guest-boot-time = ")) {
            break l.to_string();
        }
        assert!(Instant::now() < deadline, "no boot-time line in the log:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(line.contains(" us ") && line.contains(" CPU ms"), "{line}");
}

#[test]
fn firecracker_flags_are_accepted_or_refused_in_one_line() {
    // The version line itself: tests/conformance.rs and tests/gosdk/version_test.go.
    let version = exitless(&["--snapshot-version"]);
    assert!(
        version.status.success()
            && stdout(&version).trim() == format!("v{}.0.0", exitless_vmm::snapshot::FORMAT_VERSION),
        "{}",
        stdout(&version)
    );
    for (flag, why) in [
        (&["--seccomp-filter", "/tmp/filter.bpf"][..], "--seccomp-filter"),
        (&["--metadata", "/tmp/m.json"], "--metadata"),
        (&["--describe-snapshot", "/nonexistent/s.json"], "cannot read /nonexistent/s.json"),
        (&["--http-api-max-payload-size", "zero"], "http-api-max-payload-size"),
    ] {
        let out = assert_one_line_error(flag);
        assert!(stderr(&out).contains(why), "{flag:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("unexpected argument"), "{flag:?}: {}", stderr(&out));
    }
}

#[test]
fn a_running_guest_survives_every_malformed_request_and_drives_and_limits_change() {
    if !kvm_or_skip("a_running_guest_survives_every_malformed_request_and_drives_and_limits_change") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("api.sock");
    let (empty, swapped) = (dir.join("empty.img"), dir.join("swapped.img"));
    std::fs::write(&empty, b"").unwrap();
    std::fs::write(&swapped, vec![0u8; 1 << 20]).unwrap();
    let _vmm = spawn_api(
        &sock,
        &["--http-api-max-payload-size", "4096", "--show-level", "--show-log-origin", "--module", "exitless"],
    );
    let put = |path: &str, body: serde_json::Value| expect_ok(&sock, "PUT", path, Some(&body)).unwrap();
    put("/machine-config", json!({"vcpu_count": 2, "mem_size_mib": 64, "smt": true}));
    assert!(fault(&sock, "PUT", "/machine-config", json!({"vcpu_count": 3, "mem_size_mib": 64, "smt": true}))
        .contains("even number"));
    put("/boot-source", json!({"kernel_image_path": payloads.join("wait.elf"), "boot_args": "spin"}));
    // Kata's spare drive: size 0, rate limiter `{}`.
    put(
        "/drives/spare",
        json!({"drive_id": "spare", "path_on_host": empty, "is_root_device": false,
                                 "is_read_only": false, "rate_limiter": {}}),
    );
    put("/logger", json!({"show_level": true, "show_log_origin": false, "module": "exitless", "level": "Info"}));
    put("/actions", json!({"action_type": "InstanceStart"}));
    assert_eq!(expect_ok(&sock, "GET", "/", None).unwrap().unwrap()["state"], "Running");

    // Malformed requests: each a 400 with a fault_message.
    assert!(fault(&sock, "PATCH", "/vm", json!([1, 2])).contains("object"));
    assert!(fault(&sock, "PATCH", "/drives/spare", json!({"drive_id": "spare", "extra": 1})).contains("unknown field"));
    assert!(fault(&sock, "PATCH", "/drives/spare", json!({"drive_id": 7})).contains("invalid type"));
    assert!(fault(&sock, "PATCH", "/drives/spare", json!({})).contains("missing field"));
    assert!(fault(&sock, "PATCH", &format!("/drives/{}", "a".repeat(65)), json!({"drive_id": "a"})).contains("ID"));
    assert!(fault(&sock, "PUT", "/metrics", json!({"metrics_path": dir.join("m")})).contains("after starting"));
    assert!(fault(&sock, "PATCH", "/drives/nope", json!({"drive_id": "nope", "path_on_host": swapped}))
        .contains("No drive"));
    for bytes in [
        "GET /é HTTP/1.1\r\nHost: x\r\n\r\n".as_bytes(),
        b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
        b"PUT /vm HTTP/1.1\r\nContent-Length: 99999999997\r\n\r\n{",
        b"PUT /vm HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2000\r\n",
    ] {
        let answer = raw(&sock, bytes, true);
        assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("fault_message"), "{answer}");
    }
    // A client that announces a body and stalls costs only its own connection.
    let mut stalled = UnixStream::connect(&sock).unwrap();
    stalled.write_all(b"PUT /vm HTTP/1.1\r\nContent-Length: 100\r\n\r\n{").unwrap();
    assert_eq!(expect_ok(&sock, "GET", "/version", None).unwrap().unwrap()["firecracker_version"], "1.16.1");
    // Answered while the stalled request still waits for its body (it is answered, and
    // its connection closed, only when the body timeout ends it): not served after it.
    stalled.set_nonblocking(true).unwrap();
    let waiting = std::io::Read::read(&mut stalled, &mut [0u8; 256]);
    assert!(
        waiting.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
        "the GET was served after the stalled client's request ended: {waiting:?}"
    );
    drop(stalled);

    // A new backing file and new limits on the running guest.
    expect_ok(
        &sock,
        "PATCH",
        "/drives/spare",
        Some(&json!({"drive_id": "spare", "path_on_host": swapped,
        "rate_limiter": {"ops": {"size": 100, "refill_time": 1000}}})),
    )
    .unwrap();
    let config = expect_ok(&sock, "GET", "/vm/config", None).unwrap().unwrap();
    assert_eq!(config["drives"][0]["path_on_host"], swapped.to_str().unwrap());
    assert_eq!(config["drives"][0]["rate_limiter"]["ops"]["size"], 100);
    assert_eq!(config["machine-config"]["smt"], true);
    // Still running, after all of it.
    assert_eq!(expect_ok(&sock, "GET", "/", None).unwrap().unwrap()["state"], "Running");
}

#[test]
fn several_nics_with_mtu_and_limits_boot_and_are_patched() {
    let test = "several_nics_with_mtu_and_limits_boot_and_are_patched";
    if !kvm_or_skip(test) {
        return;
    }
    if !exitless_lab::netns::available() {
        assert!(!skip_or_fail(test, "needs root and /dev/net/tun for the taps"));
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("api.sock");
    let taps: Vec<String> = (0..2).map(|i| format!("exnic{}x{i}", std::process::id() % 10_000)).collect();
    let _remove = RemoveLinks(taps.clone());
    let vmm = spawn_api(&sock, &[]);
    let put = |path: &str, body: serde_json::Value| expect_ok(&sock, "PUT", path, Some(&body)).unwrap();
    put("/machine-config", json!({"vcpu_count": 1, "mem_size_mib": 64}));
    put("/boot-source", json!({"kernel_image_path": payloads.join("wait.elf")}));
    let limiter = json!({"bandwidth": {"size": 1_000_000, "one_time_burst": 0, "refill_time": 100}, "ops": {}});
    put(
        "/network-interfaces/eth0",
        json!({"iface_id": "eth0", "host_dev_name": taps[0], "mtu": 1400,
        "rx_rate_limiter": limiter, "tx_rate_limiter": {}}),
    );
    put(
        "/network-interfaces/eth1",
        json!({"iface_id": "eth1", "host_dev_name": taps[1],
        "guest_mac": "06:00:00:00:00:09", "offloads": false}),
    );
    let config = expect_ok(&sock, "GET", "/vm/config", None).unwrap().unwrap();
    assert_eq!(config["network-interfaces"][1]["offloads"], false, "{config}");
    assert!(config["network-interfaces"][0].get("offloads").is_none(), "left out when not given: {config}");
    assert!(fault(&sock, "PUT", "/network-interfaces/eth2", json!({"iface_id": "eth2", "host_dev_name": taps[1]}))
        .contains("already used"));
    put("/actions", json!({"action_type": "InstanceStart"}));
    let exits = expect_ok(&sock, "GET", "/exits", None).unwrap().unwrap();
    let nets = exits["nets"].as_object().expect("every NIC in the profile");
    assert!(nets.contains_key(&taps[0]) && nets.contains_key(&taps[1]), "{exits}");
    expect_ok(
        &sock,
        "PATCH",
        "/network-interfaces/eth1",
        Some(&json!({"iface_id": "eth1",
        "tx_rate_limiter": {"ops": {"size": 10, "refill_time": 100}}})),
    )
    .unwrap();
    assert!(fault(&sock, "PATCH", "/network-interfaces/eth9", json!({"iface_id": "eth9"})).contains("No network"));
    drop(vmm);
}
