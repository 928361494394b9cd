//! Every flag wrong in every way: one line naming the flag and why, exit 1, and nothing
//! created outside the jail or left behind (no jail directory, no cgroup).

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

#[test]
fn every_wrong_flag_is_one_line_and_leaves_nothing_behind() {
    if !root_or_skip("every_wrong_flag_is_one_line_and_leaves_nothing_behind") {
        return;
    }
    let exitless = built("exitless");
    let exec = exitless.to_str().unwrap();
    let base = tempdir("flags");
    let not_a_dir = base.join("file");
    std::fs::write(&not_a_dir, b"x").unwrap();
    let link = std::env::temp_dir().join(format!("exitless-jail-link-{}", std::process::id()));
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&base, &link).unwrap();
    let jails = base.join("jails");
    std::fs::create_dir(&jails).unwrap();
    let j = jails.to_str().unwrap();
    let (nd, ln) = (not_a_dir.to_str().unwrap(), link.to_str().unwrap());
    // A cgroup id of this run's own: cgroups are the host's, shared with any other run.
    let id = format!("flags-{}", std::process::id());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--id", "a/b"], "--id: Invalid instance ID: Invalid char (/) at position 1"),
        (vec!["--id", ".."], "--id: Invalid instance ID: Invalid char (.) at position 0"),
        (vec!["--id", ""], "--id: Invalid instance ID: Invalid len (0);  the length must be between 1 and 64"),
        (vec!["--uid", "abc"], "--uid: Invalid uid: abc"),
        (vec!["--gid", "-1"], "--gid: Invalid gid: -1"),
        (
            vec!["--exec-file", "/nonexistent/exitless"],
            "--exec-file: Failed to canonicalize path /nonexistent/exitless: No such file or directory (os error 2)",
        ),
        (vec!["--exec-file", "/tmp"], "--exec-file: /tmp is not a file"),
        (vec!["--chroot-base-dir", nd], "is not a directory"),
        (vec!["--chroot-base-dir", ln], "is a symlink"),
        (vec!["--chroot-base-dir", "/nonexistent"], "--chroot-base-dir: /nonexistent: No such file or directory"),
        (vec!["--netns", nd], "is not a network namespace"),
        (vec!["--netns", "/nonexistent"], "--netns: Failed to open file /nonexistent"),
        (vec!["--cgroup", "cpuset.cpus"], "--cgroup: Invalid format for cgroups: cpuset.cpus"),
        (vec!["--cgroup", "../cpuset.cpus=0"], "--cgroup: Cgroup invalid file: ../cpuset.cpus=0"),
        (vec!["--cgroup", "nosuch.file=1"], "--cgroup: Controller nosuch is unavailable"),
        (vec!["--cgroup", "pids.nosuch=1"], "--cgroup: pids.nosuch=1: the cgroup file pids.nosuch does not exist"),
        // Made, then refused by the kernel (a cpuset with no memory nodes takes no task).
        (vec!["--cgroup", "cpuset.cpus=0"], "Failed to write to"),
        (vec!["--cgroup-version", "3"], "--cgroup-version: 3 is an invalid cgroup version specifier"),
        (vec!["--parent-cgroup", "../x"], "--parent-cgroup: Parent cgroup path is invalid"),
        (vec!["--resource-limit", "fsize"], "--resource-limit: Invalid format for resources limits: fsize"),
        (vec!["--resource-limit", "cpu=1"], "--resource-limit: Invalid resource argument: cpu"),
        (vec!["--resource-limit", "no-file=x"], "--resource-limit: Invalid limit value for resource: x"),
        (vec!["--bogus"], "unexpected argument '--bogus'"),
        (vec!["--id", "x", "--id", "y"], "cannot be used multiple times"),
    ];
    for (wrong, words) in cases {
        let mut args = vec!["--id", &id, "--exec-file", exec, "--uid", "4242", "--gid", "4242", "--chroot-base-dir", j];
        // The wrong flag replaces the right one.
        match args.iter().position(|a| *a == wrong[0]).filter(|_| wrong.len() == 2) {
            Some(i) => args[i + 1] = wrong[1],
            None => args.extend(&wrong),
        }
        let out = Command::new(JAILER).args(&args).args(["--", "--api-sock", "/run/x.sock"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{wrong:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{wrong:?}: one line: {stderr}");
        assert!(stderr.starts_with("exitless-jailer: ") && stderr.contains(words), "{wrong:?}: {stderr}");
        let left: Vec<_> = std::fs::read_dir(&jails).unwrap().flatten().map(|e| e.path()).collect();
        assert!(left.is_empty(), "{wrong:?} left {left:?}");
        for hierarchy in ["cpuset", "pids", "unified"] {
            let cgroup = Path::new("/sys/fs/cgroup").join(hierarchy).join("exitless");
            assert!(!cgroup.join(&id).exists(), "{wrong:?} left {}", cgroup.display());
        }
    }
    // --version and --help win over everything, as Firecracker's parser has it.
    let out = Command::new(JAILER).args(["--id", "a/b", "--version"]).output().unwrap();
    assert_eq!((out.status.code(), String::from_utf8_lossy(&out.stdout).as_ref()), (Some(0), "Jailer v1.16.1\n\n"));
    let out = Command::new(JAILER).arg("--help").output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("--chroot-base-dir"));
    remove_cgroups("exitless", &id);
    std::fs::remove_file(&link).unwrap();
    std::fs::remove_dir_all(&base).unwrap();
}
