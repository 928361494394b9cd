//! Helpers for tests that boot real guests through the `exitless` binary.
#![allow(dead_code)]

use std::process::{Command, Output};

pub mod qsd;
pub mod vhost_stub;

// Each test binary uses some of them (`dead_code` does not cover imports).
#[allow(unused_imports)]
pub use exitless_vmm::testing::{kvm_or_skip, skip_or_fail};

pub fn exitless(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_exitless")).args(args).output().expect("run exitless")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `exitless run ARGS --json FILE` and returns the output and the parsed JSON.
pub fn run_json(args: &[&str]) -> (Output, serde_json::Value) {
    let dir = tempdir();
    let path = dir.join("report.json");
    let mut all = vec!["run", "--json", path.to_str().unwrap()];
    if !args.contains(&"--timeout") {
        all.extend(["--timeout", "60"]);
    }
    all.extend_from_slice(args);
    let out = exitless(&all);
    let json =
        std::fs::read_to_string(&path).map(|t| serde_json::from_str(&t).expect("valid JSON")).unwrap_or_default();
    (out, json)
}

/// `exitless bench ARGS --json FILE`, which must succeed; its output and the JSON.
pub fn bench_json(args: &[&str]) -> (Output, serde_json::Value) {
    let path = temp_path("bench.json");
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    all.extend(["--json", path.to_str().unwrap()]);
    let out = exitless(&all);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let json = serde_json::from_slice(&std::fs::read(&path).unwrap()).expect("valid JSON");
    (out, json)
}

/// A test's own directory under the system temp dir, or a path in one: the directory is
/// removed with everything in it when the test passes (a failed test's is kept to look
/// at). Drop it after the VMMs that use it.
pub struct TempDir {
    root: std::path::PathBuf,
    path: std::path::PathBuf,
}

impl TempDir {
    pub fn as_str(&self) -> &str {
        self.path.to_str().expect("a UTF-8 temp path")
    }
}

impl std::ops::Deref for TempDir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.path
    }
}

impl AsRef<std::path::Path> for TempDir {
    fn as_ref(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// A path named `name` in a fresh directory of its own.
pub fn temp_path(name: &str) -> TempDir {
    let mut dir = tempdir();
    dir.path = dir.root.join(name);
    dir
}

/// A fresh directory under the system temp dir.
pub fn tempdir() -> TempDir {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "exitless-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    TempDir { root: dir.clone(), path: dir }
}

/// `exitless ARGS` fails with exactly one line on stderr, starting `exitless: `.
pub fn assert_one_line_error(args: &[&str]) -> Output {
    let out = exitless(args);
    let err = stderr(&out);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("exitless: "), "{args:?}: {err}");
    out
}

/// `Seccomp:` from each thread's /proc status of process `pid`, by thread name.
fn seccomp_modes(pid: u32) -> Vec<(String, String)> {
    let mut modes = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let field = |k: &str| status.lines().find_map(|l| l.strip_prefix(k)).unwrap_or("").trim().to_string();
        modes.push((field("Name:"), field("Seccomp:")));
    }
    modes
}

/// Checks that every thread of process `pid` runs with seccomp mode `want` and that the
/// threads `named` are there, once `vcpus` vCPU threads run. A new thread carries its
/// parent's name until it names itself, and confines itself first: the threads are read
/// until all of them are there and confined, or 30 s pass.
pub fn assert_every_thread_confined(pid: u32, vcpus: usize, named: &[&str], want: &str) {
    // KVM's own worker (kvm-nx-lpage-recovery) shows up among a VM's tasks; it is a
    // kernel thread, not ours to filter.
    let settled = |modes: &[(String, String)]| {
        modes.iter().filter(|(n, _)| n.starts_with("vcpu")).count() >= vcpus
            && named.iter().all(|name| modes.iter().any(|(n, _)| n == name))
            && modes.iter().filter(|(n, _)| !n.starts_with("kvm-")).all(|(_, m)| m == want)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut modes = seccomp_modes(pid);
    while !settled(&modes) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        modes = seccomp_modes(pid);
    }
    for name in named {
        assert!(modes.iter().any(|(n, _)| n == name), "{name} missing: {modes:?}");
    }
    let ours = modes.iter().filter(|(n, _)| !n.starts_with("kvm-"));
    assert!(ours.clone().all(|(_, m)| m == want), "want {want}: {modes:?}");
    assert!(modes.iter().filter(|(n, _)| n.starts_with("vcpu")).count() >= vcpus, "{vcpus} vCPUs: {modes:?}");
}

/// The built-in payloads written out as files under `dir` (what the API boots).
pub fn payloads_in(dir: &std::path::Path) -> std::path::PathBuf {
    let payloads = dir.join("payloads");
    assert!(exitless(&["payloads", "--out", payloads.to_str().unwrap()]).status.success());
    payloads
}

/// Removes the named network interfaces (taps a test made) when dropped.
pub struct RemoveLinks(pub Vec<String>);

impl Drop for RemoveLinks {
    fn drop(&mut self) {
        for link in &self.0 {
            let _ = Command::new("ip").args(["link", "del", link]).output();
        }
    }
}

/// `exitless --api-sock SOCK --enable-pci`, its stdout as given, once its API answers (or
/// 30 s pass): the payloads' virtio driver finds its devices on PCI.
pub fn api_process(sock: &std::path::Path, stdout: std::process::Stdio) -> std::process::Child {
    api_process_with(sock, stdout, &["--enable-pci"])
}

/// `exitless --api-sock SOCK EXTRA...`, as [`api_process`].
pub fn api_process_with(sock: &std::path::Path, stdout: std::process::Stdio, extra: &[&str]) -> std::process::Child {
    let _ = std::fs::remove_file(sock);
    let child = Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(["--api-sock", sock.to_str().unwrap()])
        .args(extra)
        .stdin(std::process::Stdio::null())
        .stdout(stdout)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run exitless");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(sock).is_err() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child
}

/// Raw bytes on a connection; what comes back: one whole reply (its head and
/// Content-Length bytes), or less if the server closes first or 30 s pass.
pub fn raw(sock: &std::path::Path, bytes: &[u8], then_close: bool) -> String {
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    use std::io::{Read, Write};
    s.write_all(bytes).unwrap();
    if then_close {
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let whole = |out: &[u8]| {
        let Some(at) = out.windows(4).position(|w| w == b"\r\n\r\n") else { return false };
        let head = String::from_utf8_lossy(&out[..at]).to_ascii_lowercase();
        let len = head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok());
        out.len() >= at + 4 + len.unwrap_or(0usize)
    };
    let (mut out, mut chunk) = (Vec::new(), [0u8; 4096]);
    while !whole(&out) {
        match s.read(&mut chunk) {
            Ok(n) if n > 0 => out.extend_from_slice(&chunk[..n]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn fault(sock: &std::path::Path, method: &str, path: &str, body: serde_json::Value) -> String {
    let reply = exitless_lab::api_client::request(sock, method, path, Some(&body)).unwrap();
    assert_eq!(reply.status, 400, "{method} {path} {body}: {:?}", reply.body);
    reply.body.and_then(|b| b["fault_message"].as_str().map(str::to_string)).expect("a fault_message")
}

/// Go, on PATH or where its official tarball installs it (a PATH without it is common);
/// None, with the test skipped loudly (failing under EXITLESS_REQUIRE_KVM=1), without it.
pub fn go_or_skip(test: &str) -> Option<&'static str> {
    let works = |go: &str| Command::new(go).arg("version").output().is_ok_and(|o| o.status.success());
    let go = ["go", "/usr/local/go/bin/go"].into_iter().find(|go| works(go));
    if go.is_none() {
        assert!(!skip_or_fail(test, "Go is not installed"));
    }
    go
}
