//! exitless under exitless-jailer, checked from outside the process as Firecracker's own
//! jail tests check Firecracker: its root is the jail, its ids the given ones, no
//! capabilities, its cgroups and limits set, in the given network namespace; and the jail
//! holds against a program that tries to get out.

mod common;
use common::*;
use exitless_api_client::expect_ok;
use serde_json::json;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const UID: u32 = 4242;

/// SIGKILL to the jailed VMM when dropped.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: a signal to the VMM this test started.
        unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
    }
}

fn status_field(pid: u32, field: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = text.lines().find(|l| l.starts_with(&format!("{field}:"))).unwrap_or_default();
    line.split_once(':').map_or("", |(_, v)| v).trim().to_string()
}

fn wait_for(path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_jailed_exitless_is_held_as_the_flags_say_and_runs_a_guest() {
    if !root_or_skip("a_jailed_exitless_is_held_as_the_flags_say_and_runs_a_guest") {
        return;
    }
    let exitless = built("exitless");
    let base = tempdir("held");
    // Names of this run's own: the namespace and cgroups are the host's, shared with any
    // other run of these tests.
    let netns = Netns::new(&format!("exitless-jail-held-{}", std::process::id()));
    let ids = ["held-v1", "held-v2"].map(|id| format!("{id}-{}", std::process::id()));
    // cgroups v1 in a new PID namespace; v2 daemonized (Kata's way: the jailer's caller
    // sees it end at once, the VMM goes on in a session of its own, stdio on /dev/null).
    for (version, cgroups, id, mode) in [
        ("1", vec!["cpuset.mems=0", "cpuset.cpus=0", "pids.max=64"], ids[0].as_str(), "--new-pid-ns"),
        ("2", vec!["hugetlb.2MB.max=4194304"], ids[1].as_str(), "--daemonize"),
    ] {
        let mut args = vec!["--id", id, "--exec-file", exitless.to_str().unwrap()];
        let uid = UID.to_string();
        args.extend(["--uid", &uid, "--gid", &uid, "--chroot-base-dir", base.to_str().unwrap()]);
        let ns = netns.path();
        args.extend(["--netns", ns.to_str().unwrap(), mode, "--cgroup-version", version]);
        for c in &cgroups {
            args.extend(["--cgroup", c]);
        }
        args.extend(["--resource-limit", "fsize=1073741824", "--resource-limit", "no-file=1024"]);
        // No --host-profile: the VMM finds this host's through /dev/kvm (no /sys in a jail).
        args.extend(["--", "--api-sock", "/run/firecracker.socket"]);
        // The VMM keeps the jailer's stdio (--new-pid-ns: the jailer ends first): a file, not
        // a pipe that would stay open as long as the VMM runs.
        let log = base.join(format!("{id}.stderr"));
        let stderr = std::fs::File::create(&log).unwrap();
        let status =
            Command::new(JAILER).args(&args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr).status();
        assert!(status.unwrap().success(), "{version}: {}", std::fs::read_to_string(&log).unwrap_or_default());

        let root = base.join("exitless").join(id).join("root");
        let pid_file = root.join("exitless.pid");
        wait_for(&pid_file);
        let pid: u32 = std::fs::read_to_string(&pid_file).unwrap().parse().unwrap();
        // Ended however the test ends (a daemonized VMM outlives a failed assertion).
        let _vmm = KillOnDrop(pid);
        let sock = root.join("run/firecracker.socket");
        wait_for(&sock);
        // Its root is the jail: the same directory, seen through /proc.
        let (seen, jail) =
            (std::fs::metadata(format!("/proc/{pid}/root/.")).unwrap(), std::fs::metadata(&root).unwrap());
        assert_eq!((seen.dev(), seen.ino()), (jail.dev(), jail.ino()), "/proc/{pid}/root is the jail");
        assert!(std::fs::metadata(format!("/proc/{pid}/root/exitless")).is_ok());
        assert!(std::fs::metadata(format!("/proc/{pid}/root/etc")).is_err(), "no host directory in view");
        assert_eq!(status_field(pid, "Uid"), format!("{UID}\t{UID}\t{UID}\t{UID}"));
        assert_eq!(status_field(pid, "Gid"), format!("{UID}\t{UID}\t{UID}\t{UID}"));
        assert_eq!(status_field(pid, "Groups"), "");
        assert_eq!(status_field(pid, "CapEff"), "0000000000000000");
        assert_eq!(status_field(pid, "CapPrm"), "0000000000000000");
        if mode == "--new-pid-ns" {
            // pid 1 of its own PID namespace.
            assert_eq!(status_field(pid, "NSpid").split_whitespace().last(), Some("1"));
        } else {
            // A session of its own, its stdio on /dev/null.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
            // SAFETY: getsid(0) reads this process's session.
            let ours = unsafe { libc::getsid(0) };
            assert_ne!(fields[3], ours.to_string(), "a new session (stat's session field), not the caller's");
            for fd in 0..3 {
                assert_eq!(std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap(), Path::new("/dev/null"));
            }
        }
        let ns_of = |p: &str| std::fs::read_link(p).unwrap();
        let ns_inode = std::fs::metadata(netns.path()).unwrap().ino();
        assert_eq!(ns_of(&format!("/proc/{pid}/ns/net")).to_string_lossy(), format!("net:[{ns_inode}]"));
        assert_ne!(ns_of(&format!("/proc/{pid}/ns/mnt")), ns_of("/proc/self/ns/mnt"));
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        assert!(
            limits.lines().any(|l| l.starts_with("Max file size") && l.contains("1073741824           1073741824")),
            "{limits}"
        );
        assert!(
            limits.lines().any(|l| l.starts_with("Max open files") && l.contains("1024                 1024")),
            "{limits}"
        );
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let want = format!("/exitless/{id}");
        if version == "1" {
            assert!(cgroup.lines().any(|l| l.contains(":pids:") && l.ends_with(&want)), "{cgroup}");
            assert!(cgroup.lines().any(|l| l.contains(":cpuset:") && l.ends_with(&want)), "{cgroup}");
            let max = std::fs::read_to_string(format!("/sys/fs/cgroup/pids/exitless/{id}/pids.max")).unwrap();
            assert_eq!(max.trim(), "64");
            let cpus = std::fs::read_to_string(format!("/sys/fs/cgroup/cpuset/exitless/{id}/cpuset.cpus")).unwrap();
            assert_eq!(cpus.trim(), "0");
        } else {
            assert!(cgroup.lines().any(|l| l == format!("0::{want}")), "{cgroup}");
            let max = std::fs::read_to_string(format!("/sys/fs/cgroup/unified/exitless/{id}/hugetlb.2MB.max")).unwrap();
            assert_eq!(max.trim(), "4194304");
        }

        // A guest from a file given to it in the jail, as Firecracker's clients give them.
        let payloads = base.join(format!("payloads-{id}"));
        assert!(Command::new(&exitless)
            .args(["payloads", "--out", payloads.to_str().unwrap()])
            .status()
            .unwrap()
            .success());
        std::fs::copy(payloads.join("wait.elf"), root.join("wait.elf")).unwrap();
        std::os::unix::fs::chown(root.join("wait.elf"), Some(UID), Some(UID)).unwrap();
        expect_ok(&sock, "PUT", "/boot-source", Some(&json!({"kernel_image_path": "wait.elf"}))).unwrap();
        expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
        let state = expect_ok(&sock, "GET", "/", None).unwrap().unwrap();
        assert_eq!((state["state"].as_str(), state["id"].as_str()), (Some("Running"), Some(id)));
        let exits = expect_ok(&sock, "GET", "/exits", None).unwrap().unwrap();
        let profile = exits["host_profile"].as_str().unwrap_or_default().to_string();
        assert!(profile.starts_with(host_profile()), "the jailed VMM took {profile}, the host is {}", host_profile());
        // Every thread under seccomp, the jail or not (the machine's thread takes its filter
        // once the vCPUs run: a moment after InstanceStart's answer).
        let start = Instant::now();
        let unconfined = || {
            let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
            let status = |t: std::fs::DirEntry| std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            tasks.flatten().map(status).filter(|s| !s.contains("Seccomp:\t2")).collect::<Vec<_>>()
        };
        while !unconfined().is_empty() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(unconfined(), Vec::<String>::new());
        // SAFETY: a signal to the VMM this test started.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        let start = Instant::now();
        while Path::new(&format!("/proc/{pid}")).exists() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        remove_cgroups("exitless", id);
    }
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn the_jail_holds_against_a_program_that_tries_to_get_out() {
    if !root_or_skip("the_jail_holds_against_a_program_that_tries_to_get_out") {
        return;
    }
    let escape = Path::new(JAILER).with_file_name("examples").join("jail_escape");
    assert!(escape.exists(), "{} is not built: cargo test builds examples", escape.display());
    let base = tempdir("escape");
    let netns = Netns::new(&format!("exitless-jail-escape-{}", std::process::id()));
    let id = format!("escape-{}", std::process::id());
    // A process outside the jail to signal and trace.
    let mut outside = Command::new("sleep").arg("60").spawn().unwrap();
    let host_pid = outside.id().to_string();
    let uid = UID.to_string();
    let out = Command::new(JAILER)
        .args(["--id", &id, "--exec-file", escape.to_str().unwrap(), "--uid", &uid, "--gid", &uid])
        .args(["--chroot-base-dir", base.to_str().unwrap(), "--netns", netns.path().to_str().unwrap()])
        .args(["--", "--host-pid", &host_pid])
        .output()
        .unwrap();
    let _ = outside.kill();
    let _ = outside.wait();
    let report = String::from_utf8_lossy(&out.stdout);
    let refused = report.lines().filter(|l| l.starts_with("refused ")).count();
    assert!(!report.contains("ESCAPED"), "{report}");
    assert!(!report.contains("ERROR"), "{report}");
    // 7 attempts under Landlock and the jail alone, 9 under each of three thread filters.
    assert_eq!(refused, 7 + 3 * 9, "{report}");
    assert!(out.status.success(), "{report}\n{}", String::from_utf8_lossy(&out.stderr));
    std::fs::remove_dir_all(&base).unwrap();
}
