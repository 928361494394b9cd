//! Firecracker's process interface and API, checked with a client we did not write (the
//! PyPI package firecracker-python 0.0.5, in a virtualenv kept under target/), and
//! `--config-file` with `--no-api`.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A virtualenv with firecracker-python 0.0.5 (made once, kept in target/).
fn client_venv() -> Result<PathBuf, String> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fc-python-venv");
    let python = venv.join("bin/python");
    let installed =
        |p: &Path| Command::new(p).args(["-c", "import firecracker.api"]).output().is_ok_and(|o| o.status.success());
    if python.exists() && installed(&python) {
        return Ok(python);
    }
    let run = |cmd: &mut Command| {
        let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
        match out.status.success() {
            true => Ok(()),
            false => Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr))),
        }
    };
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(&python).args(["-m", "pip", "install", "-q", "firecracker-python==0.0.5"]))?;
    Ok(python)
}

#[test]
fn a_firecracker_client_configures_boots_and_is_refused_as_firecracker_refuses() {
    if !kvm_or_skip("a_firecracker_client_configures_boots_and_is_refused_as_firecracker_refuses") {
        return;
    }
    let python = match client_venv() {
        Ok(p) => p,
        Err(e) => {
            assert!(!skip_or_fail("firecracker-python client", &format!("no virtualenv with it: {e}")));
            return;
        }
    };
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/api/firecracker_client.py");
    let out = Command::new(python)
        .arg(script)
        .args([env!("CARGO_BIN_EXE_exitless"), payloads.to_str().unwrap(), dir.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("all checks passed"), "{text}");
}

#[test]
fn a_config_file_boots_at_once_without_an_api() {
    if !kvm_or_skip("a_config_file_boots_at_once_without_an_api") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let config = dir.join("vm.json");
    let kernel = payloads.join("demo.elf");
    let json = serde_json::json!({
        "boot-source": {"kernel_image_path": kernel, "boot_args": "console=ttyS0"},
        "machine-config": {"vcpu_count": 1, "mem_size_mib": 64},
        "drives": [],
        "network-interfaces": [],
    });
    std::fs::write(&config, json.to_string()).unwrap();
    let out = exitless(&["--no-api", "--config-file", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("hello from CPL0"), "{}", stdout(&out));
    // A field Firecracker does not know is refused in one line, naming the file.
    std::fs::write(&config, r#"{"boot-source": {"kernel_image_path": "x"}, "turbo": true}"#).unwrap();
    let out = assert_one_line_error(&["--no-api", "--config-file", config.to_str().unwrap()]);
    assert!(stderr(&out).contains("unknown field `turbo`"), "{}", stderr(&out));
    // --no-api needs a config file.
    assert_one_line_error(&["--no-api"]);
}

#[test]
fn a_small_fleet_starts_through_the_api_and_stops_leaving_nothing() {
    if !kvm_or_skip("a_small_fleet_starts_through_the_api_and_stops_leaving_nothing") {
        return;
    }
    let (out, json) = bench_json(&["fleet", "--vms", "4"]);
    assert_eq!(json["vms"], 4);
    // Every guest said it runs (or the bench would have failed), every VMM went on SIGTERM
    // with its socket removed, and nothing is left in the fleet's directory.
    assert_eq!(json["stopped_cleanly"], 4, "{json}");
    assert_eq!(json["left_behind"].as_array().map(Vec::len), Some(0), "{json}");
    assert_eq!(json["fleet_to_running_ms"].as_array().map(Vec::len), Some(4), "{json}");
    // Memory comes from each VMM's own live report: present and plausible.
    let (rss, pss) = (json["vmm_rss_kib_max"].as_f64().unwrap(), json["vmm_pss_kib_max"].as_f64().unwrap());
    assert!(rss > 500.0 && rss < 200_000.0 && pss > 100.0 && pss <= rss, "{json}");
    assert!(stdout(&out).contains("stopped cleanly by SIGTERM"), "{}", stdout(&out));
}

#[test]
fn every_thread_of_an_api_started_vm_is_under_seccomp() {
    if !kvm_or_skip("every_thread_of_an_api_started_vm_is_under_seccomp") {
        return;
    }
    use exitless_lab::api_client::expect_ok;
    use serde_json::json;
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    for (extra, want) in [(None, "2"), (Some("--no-seccomp"), "0")] {
        let sock = dir.join("api-sock");
        let mut args = vec!["--api-sock", sock.to_str().unwrap(), "--metrics-path"];
        let metrics = dir.join("metrics");
        args.push(metrics.to_str().unwrap());
        args.extend(extra);
        let (disk, swapped) = (dir.join("disk.img"), dir.join("swapped.img"));
        // The drive's next file, allowed before the start (Landlock).
        let rule = format!("{}:rw", swapped.display());
        args.extend(["--landlock-rule", &rule]);
        let (child, reaper) = spawn_serving(&args, &sock);
        let kernel = payloads.join("wait.elf");
        std::fs::write(&disk, vec![0u8; 4096]).unwrap();
        std::fs::write(&swapped, vec![0u8; 8192]).unwrap();
        let calls = [
            ("PUT", "/machine-config", Some(json!({"vcpu_count": 2, "mem_size_mib": 64}))),
            ("PUT", "/drives/root", Some(json!({"drive_id": "root", "path_on_host": disk, "is_root_device": true}))),
            ("PUT", "/boot-source", Some(json!({"kernel_image_path": kernel, "boot_args": "spin"}))),
            ("PUT", "/actions", Some(json!({"action_type": "InstanceStart"}))),
            // Requests served after the start, under the API thread's filter.
            ("GET", "/", None),
            ("PATCH", "/vm", Some(json!({"state": "Paused"}))),
            ("PATCH", "/vm", Some(json!({"state": "Resumed"}))),
            ("PUT", "/actions", Some(json!({"action_type": "FlushMetrics"}))),
            ("GET", "/vm/config", None),
            // A new backing file: opened, locked and sized by the API thread.
            ("PATCH", "/drives/root", Some(json!({"drive_id": "root", "path_on_host": swapped}))),
        ];
        for (method, path, body) in &calls {
            expect_ok(&sock, method, path, body.as_ref()).unwrap_or_else(|e| panic!("{extra:?}: {e}"));
        }
        let named = ["exitless", "vmm", "vcpu0", "vcpu1", "api-metrics", "signals", "api-socket", "console-out"];
        assert_every_thread_confined(child.id(), 2, &named, want);
        // SIGTERM: the confined signal thread removes the socket, then the process dies
        // by the signal, as Firecracker (no handler for it) does.
        // SAFETY: a signal to the child we started.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let out = child.wait_with_output().unwrap();
        std::mem::forget(reaper);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{:?} {}", out.status, stderr(&out));
        assert!(!sock.exists(), "{extra:?}: the socket is left behind");
        assert!(std::fs::read_to_string(&metrics).unwrap().contains("\"exits\""));
    }
}

/// An orchestrator that lost its VMM (its shim killed) tears the VM down by removing the
/// directory holding the API socket: the VMM, guest running, ends as on SIGTERM.
#[test]
fn a_vmm_whose_api_socket_is_removed_ends() {
    if !kvm_or_skip("a_vmm_whose_api_socket_is_removed_ends") {
        return;
    }
    use exitless_lab::api_client::expect_ok;
    use serde_json::json;
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let shim_dir = dir.join("default#vm1");
    std::fs::create_dir(&shim_dir).unwrap();
    let sock = shim_dir.join("firecracker.sock");
    let (mut child, reaper) = spawn_serving(&["--api-sock", sock.to_str().unwrap()], &sock);
    let kernel = payloads.join("wait.elf");
    expect_ok(&sock, "PUT", "/boot-source", Some(&json!({"kernel_image_path": kernel, "boot_args": "spin"}))).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    // Another file in the directory going first changes nothing.
    std::fs::write(shim_dir.join("fc-logs.fifo"), b"").unwrap();
    std::fs::remove_file(shim_dir.join("fc-logs.fifo")).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    expect_ok(&sock, "GET", "/", None).unwrap();
    let started = std::time::Instant::now();
    std::fs::remove_dir_all(&shim_dir).unwrap();
    // Its guest spins forever: only the removal ends it (the reaper kills it otherwise).
    while child.try_wait().unwrap().is_none() {
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "still running after its socket went");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    std::mem::forget(reaper);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{:?} {}", out.status, stderr(&out));
    assert!(stderr(&out).contains("was removed: ending the microVM"), "{}", stderr(&out));
}

/// A client may signal a VMM as soon as its socket exists, before the API answers: the
/// VMM ends as Firecracker does all the same (SIGHUP: status 156; SIGINT, SIGTERM: by the
/// signal), its socket removed. Its handlers were once registered after the bind: a
/// signal in between killed it by the signal and left the socket.
#[test]
fn a_signal_as_soon_as_the_socket_exists_ends_the_vmm_as_firecrackers_does() {
    if !kvm_or_skip("a_signal_as_soon_as_the_socket_exists_ends_the_vmm_as_firecrackers_does") {
        return;
    }
    use std::os::unix::process::ExitStatusExt;
    let dir = tempdir();
    for (round, &sig) in [libc::SIGHUP, libc::SIGTERM, libc::SIGINT].iter().cycle().take(30).enumerate() {
        let sock = dir.join(format!("s{round}.sock"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_exitless"))
            .args(["--api-sock", sock.to_str().unwrap()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !sock.exists() {
            assert!(child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline, "no socket");
            std::thread::yield_now();
        }
        // SAFETY: a signal to the child we started and have not reaped.
        unsafe { libc::kill(child.id() as i32, sig) };
        let status = child.wait().unwrap();
        match sig {
            libc::SIGHUP => assert_eq!(status.code(), Some(156), "round {round}: {status:?}"),
            _ => assert_eq!(status.signal(), Some(sig), "round {round}: {status:?}"),
        }
        assert!(!sock.exists(), "round {round} (signal {sig}): the socket is left behind");
    }
}

/// exitless started with `args`, once it serves `sock`; the guard kills it if the test
/// fails first (its guest spins).
fn spawn_serving(args: &[&str], sock: &std::path::Path) -> (std::process::Child, KillOnDrop) {
    let child = Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let reaper = KillOnDrop(child.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !exitless_lab::api_client::listening(sock) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    (child, reaper)
}

/// Kills process `pid` when dropped (a test that panics before waiting for its child).
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: a signal to a child this test started and has not reaped.
        unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
    }
}
