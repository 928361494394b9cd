//! The jail's layout under attack (issue 53): the jail root belongs to the jailed user, so a
//! compromised VMM can leave a link, a FIFO or anything else in it for the next jailer run
//! with the same id; and the jailer's own flags carry cgroup values into kernel files.
//! Each test is root's (skipped loudly otherwise) and runs the jailer binary with /bin/true
//! as the VMM (the issue's reproduction: no KVM needed).

mod common;
use common::*;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The jailer with `args`, its exit and output; None if it had not ended after `limit`
/// (then it is killed).
fn jailer(args: &[&str], limit: Duration) -> Option<Output> {
    let mut child = Command::new(JAILER)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(child.wait_with_output().unwrap())
}

/// The jailer's usual flags for jail `id` of /bin/true under `base`, as `uid`.
fn flags<'a>(id: &'a str, base: &'a Path, uid: &'a str) -> Vec<&'a str> {
    vec![
        "--id",
        id,
        "--exec-file",
        "/bin/true",
        "--uid",
        uid,
        "--gid",
        uid,
        "--chroot-base-dir",
        base.to_str().unwrap(),
    ]
}

/// `<base>/true/<id>/root` made as a jail left by an earlier run: the jailed user's, 0700.
fn old_jail(base: &Path, id: &str, uid: u32) -> PathBuf {
    let root = base.join("true").join(id).join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::os::unix::fs::chown(&root, Some(uid), Some(uid)).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
    root
}

/// Runs `program args` as `uid` (the jailed user at work in its jail).
fn as_user(uid: u32, program: &str, args: &[&Path]) {
    let status = Command::new(program).args(args).uid(uid).gid(uid).status().unwrap();
    assert!(status.success(), "{program} {args:?} as {uid}");
}

/// The exit, and stderr checked to be one line with `words`.
fn refused(out: &Output, words: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("exitless-jailer: ") && stderr.contains(words), "{words:?} in {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
}

/// Item 1: a link the jailed user put where the jailer makes `dev`, `dev/net` or `run`
/// is refused, and what it points at (a host directory) keeps its owner, its mode and its
/// emptiness: the jailer used to chown it to the jailed user, chmod it 0700 and mknod
/// /dev/kvm and the rest in it.
#[test]
fn a_link_the_jailed_user_planted_is_refused_not_followed() {
    if !root_or_skip("a_link_the_jailed_user_planted_is_refused_not_followed") {
        return;
    }
    const UID: u32 = 12345;
    let dir = tempdir("planted");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let base = dir.join("base");
    let victim = dir.join("victim");
    std::fs::create_dir_all(&victim).unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o755)).unwrap();
    let uid = UID.to_string();
    for (id, link) in [("vm1", "dev"), ("vm2", "run"), ("vm3", "dev/net")] {
        let root = old_jail(&base, id, UID);
        if link == "dev/net" {
            as_user(UID, "mkdir", &[&root.join("dev")]);
        }
        as_user(UID, "ln", &[Path::new("-s"), &victim, &root.join(link)]);
        let out = jailer(&flags(id, &base, &uid), Duration::from_secs(20)).expect("the jailer ended");
        let meta = std::fs::metadata(&victim).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777),
            (0, 0, 0o755),
            "{link}: the victim's owner and mode"
        );
        let inside: Vec<_> = std::fs::read_dir(&victim).unwrap().flatten().map(|e| e.path()).collect();
        assert!(inside.is_empty(), "{link}: nothing made in the victim: {inside:?}");
        refused(&out, &format!("{} is a symlink: refused", root.join(link).display()));
        // The link is left as the jailed user made it; the binary copied in before the
        // refusal is removed.
        assert!(std::fs::symlink_metadata(root.join(link)).unwrap().file_type().is_symlink());
        assert!(!root.join("true").exists(), "{link}: the copied binary removed");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Item 6: a FIFO the jailed user put where the jailer copies the binary is refused at
/// once (the jailer's open for writing used to wait for a reader forever).
#[test]
fn a_fifo_in_place_of_the_jails_binary_is_refused_at_once() {
    if !root_or_skip("a_fifo_in_place_of_the_jails_binary_is_refused_at_once") {
        return;
    }
    const UID: u32 = 12346;
    let dir = tempdir("fifo");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let base = dir.join("base");
    let root = old_jail(&base, "vm1", UID);
    as_user(UID, "mkfifo", &[&root.join("true")]);
    let uid = UID.to_string();
    let out = jailer(&flags("vm1", &base, &uid), Duration::from_secs(10)).expect("the jailer waited on the FIFO");
    refused(&out, &format!("Failed to open {}: not a regular file: refused", root.join("true").display()));
    assert!(std::fs::symlink_metadata(root.join("true")).unwrap().file_type().is_fifo());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The same for --netns: a FIFO given as the namespace is refused at once, not opened.
#[test]
fn a_fifo_as_the_network_namespace_is_refused_at_once() {
    if !root_or_skip("a_fifo_as_the_network_namespace_is_refused_at_once") {
        return;
    }
    let dir = tempdir("netns-fifo");
    let base = dir.join("base");
    std::fs::create_dir(&base).unwrap();
    let fifo = dir.join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let mut args = flags("vm1", &base, "12347");
    args.extend(["--netns", fifo.to_str().unwrap()]);
    let out = jailer(&args, Duration::from_secs(10)).expect("the jailer waited on the FIFO");
    refused(&out, &format!("--netns: {} is not a network namespace", fifo.display()));
    assert_eq!(std::fs::read_dir(&base).unwrap().count(), 0, "nothing made");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Item 7: a jail whose exec fails (after pivot_root: a binary that is no program) is
/// removed whole, `<base>/<exec name>` included; the jailer used to leave
/// `<base>/<exec name>/<id>/root` (`cannot undo /: Resource busy`). With --new-pid-ns the
/// child that fails removes it, pid file included, after the jailer has ended.
#[test]
fn a_jail_that_fails_after_the_pivot_is_removed_whole() {
    if !root_or_skip("a_jail_that_fails_after_the_pivot_is_removed_whole") {
        return;
    }
    let dir = tempdir("after-pivot");
    let base = dir.join("base");
    std::fs::create_dir(&base).unwrap();
    let program = dir.join("noprogram");
    std::fs::write(&program, b"neither ELF nor #!").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    for (id, mode) in [("plain", None), ("pidns", Some("--new-pid-ns"))] {
        let mut args = flags(id, &base, "12348");
        args[3] = program.to_str().unwrap();
        args.extend(mode);
        let out = jailer(&args, Duration::from_secs(20)).expect("the jailer ended");
        let stderr = String::from_utf8_lossy(&out.stderr);
        // The --new-pid-ns child may still be removing it as the jailer's output ends.
        let start = Instant::now();
        while base.join("noprogram").exists() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let left: Vec<_> = walk(&base);
        assert!(left.is_empty(), "{id}: left on the host: {left:?}\n{stderr}");
        assert!(stderr.contains("Failed to exec into /noprogram"), "{id}: {stderr}");
        assert!(!stderr.contains("cannot undo"), "{id}: {stderr}");
        assert_eq!(out.status.code(), Some(if mode.is_some() { 0 } else { 1 }), "{id}: {stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Everything under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        found.push(entry.path());
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            found.extend(walk(&entry.path()));
        }
    }
    found
}

/// Item 12: a cgroup value or file name that is not one line of a cgroup's own (the kernel
/// file gets what is written as it is; a '/' would reach another file), or a parent cgroup
/// with a newline, is refused by the flag's check: one line, nothing made. The jailer used
/// to write them as given.
#[test]
fn a_cgroup_value_or_name_that_is_not_one_line_is_refused() {
    if !root_or_skip("a_cgroup_value_or_name_that_is_not_one_line_is_refused") {
        return;
    }
    let dir = tempdir("cgroup-lines");
    let base = dir.join("base");
    std::fs::create_dir(&base).unwrap();
    let cases: [(&[&str], &str); 6] = [
        (&["--cgroup", "pids.max=64\n"], "--cgroup: Cgroup invalid value: pids.max=64\\n: "),
        (&["--cgroup", "pids.max=64\nmax"], "--cgroup: Cgroup invalid value: pids.max=64\\nmax: "),
        (&["--cgroup-version", "2", "--cgroup", "pids.max=64\r"], "--cgroup: Cgroup invalid value: "),
        (&["--cgroup", "pids.max\n=64"], "--cgroup: Cgroup invalid file: pids.max\\n=64: "),
        (&["--cgroup", "pids/pids.max=64"], "--cgroup: Cgroup invalid file: pids/pids.max=64: "),
        (
            &["--parent-cgroup", "exitless\nx", "--cgroup", "pids.max=64"],
            "--parent-cgroup: Parent cgroup path is invalid",
        ),
    ];
    for (extra, words) in cases {
        let mut args = flags("lines", &base, "12349");
        args.extend(extra);
        let out = jailer(&args, Duration::from_secs(20)).expect("the jailer ended");
        refused(&out, words);
        assert!(walk(&base).is_empty(), "{extra:?}: left {:?}", walk(&base));
        for parent in ["true", "exitless\nx"] {
            for hierarchy in ["pids", "unified"] {
                let cgroup = Path::new("/sys/fs/cgroup").join(hierarchy).join(parent);
                assert!(!cgroup.join("lines").exists(), "{extra:?} left {}", cgroup.display());
            }
        }
    }
    remove_cgroups("true", "lines");
    remove_cgroups("exitless\nx", "lines");
    std::fs::remove_dir_all(&dir).unwrap();
}
