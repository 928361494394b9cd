//! The jail itself, as Firecracker's jailer makes it (its `env.rs` and `chroot.rs`): the
//! directory `<base>/<exec name>/<id>/root`, the binary copied into it, `/dev`, `/dev/net`
//! and `/run` (0700, the jailed user's), the device nodes the VMM opens (0600, the jailed
//! user's), then a new mount namespace whose root is that directory (pivot_root; the
//! host's root unmounted). Everything up to the pivot is made on host paths and recorded
//! for undoing; after it, the same files are reached from the new root.

use crate::args::Plan;
use crate::error::JailError;
use crate::undo::Undo;
use std::ffi::CString;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The device nodes the VMM opens: (path in the jail, major, minor, required). KVM, taps,
/// the random device MMDS V2 reads where getrandom is missing (Firecracker's best effort),
/// userfaultfd where the host has it (snapshot memory served by a handler).
fn devices() -> Vec<(&'static str, u32, u32, bool)> {
    let mut nodes = vec![("dev/net/tun", 10, 200, true), ("dev/kvm", 10, 232, true), ("dev/urandom", 1, 9, false)];
    if let Some(minor) = userfaultfd_minor() {
        nodes.push(("dev/userfaultfd", 10, minor, true));
    }
    nodes
}

/// The misc minor of /dev/userfaultfd, from the host's /proc/misc.
fn userfaultfd_minor() -> Option<u32> {
    let text = std::fs::read_to_string("/proc/misc").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let minor = f.next()?;
        (f.next()? == "userfaultfd").then(|| minor.parse().ok()).flatten()
    })
}

fn cstr(path: &Path) -> Result<CString, JailError> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| JailError::Step(format!("{}: a path with a NUL byte", path.display())))
}

/// The jail's directory, binary, directories and device nodes, on host paths.
pub fn prepare(plan: &Plan, undo: &mut Undo) -> Result<(), JailError> {
    let root = &plan.chroot_dir;
    let mut missing: Vec<&Path> = root.ancestors().take_while(|d| !d.exists()).collect();
    missing.reverse();
    for d in missing {
        std::fs::create_dir(d).map_err(|e| JailError::io(format!("Failed to create directory {}", d.display()), e))?;
        undo.made_dir(d.to_path_buf());
    }
    copy_exec_file(plan, undo)?;
    for dir in ["", "dev", "dev/net", "run"] {
        let path = root.join(dir);
        if !path.exists() {
            std::fs::create_dir(&path)
                .map_err(|e| JailError::io(format!("Failed to create directory {}", path.display()), e))?;
            undo.made_dir(path.clone());
        }
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(|e| JailError::io(format!("Failed to change permissions on {}", path.display()), e))?;
        chown(&path, plan)?;
    }
    for (node, major, minor, required) in devices() {
        let path = root.join(node);
        let c = cstr(&path)?;
        // SAFETY: mknod on a NUL-terminated path we own; no memory is handed over.
        let made = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(major, minor)) } == 0;
        if !made {
            let e = JailError::os(format!("Failed to create /{node} via mknod inside the jail"));
            if required {
                return Err(e);
            }
            println!("Warning! Could not create /{node} device inside jailer: {e}.");
            continue;
        }
        undo.made_file(path.clone());
        chown(&path, plan)?;
    }
    Ok(())
}

fn chown(path: &Path, plan: &Plan) -> Result<(), JailError> {
    std::os::unix::fs::chown(path, Some(plan.uid), Some(plan.gid))
        .map_err(|e| JailError::io(format!("Failed to change owner for {}", path.display()), e))
}

/// The binary copied (never linked: a hard link would let the jailed user change the
/// host's file) to `<root>/<exec name>`, owned by the jailed user, its mode kept.
fn copy_exec_file(plan: &Plan, undo: &mut Undo) -> Result<(), JailError> {
    let src = &plan.exec_file;
    let dst = plan.chroot_dir.join(&plan.exec_name);
    let mut input =
        std::fs::File::open(src).map_err(|e| JailError::io(format!("Failed to open {}", src.display()), e))?;
    let mode = input
        .metadata()
        .map_err(|e| JailError::io(format!("Cannot get metadata for a file: {}", src.display()), e))?
        .mode();
    let open = |excl: bool| {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .create_new(excl)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .mode(mode)
            .open(&dst)
    };
    // A binary already there (a jail made again) is written over, as Firecracker does.
    let (mut output, new) = match open(true) {
        Ok(f) => (f, true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            (open(false).map_err(|e| JailError::io(format!("Failed to open {}", dst.display()), e))?, false)
        }
        Err(e) => return Err(JailError::io(format!("Failed to open {}", dst.display()), e)),
    };
    if new {
        undo.made_file(dst.clone());
    }
    let links = output
        .metadata()
        .map_err(|e| JailError::io(format!("Cannot get metadata for a file: {}", dst.display()), e))?
        .nlink();
    if links > 1 {
        return Err(JailError::Step(format!("Detected hard link at: {}", dst.display())));
    }
    std::os::unix::fs::fchown(&output, Some(plan.uid), Some(plan.gid))
        .map_err(|e| JailError::io(format!("Failed to change owner for {}", dst.display()), e))?;
    output
        .set_len(0)
        .map_err(|e| JailError::io(format!("Failed to copy {} to {}", src.display(), dst.display()), e))?;
    std::io::copy(&mut input, &mut output)
        .and_then(|_| output.flush())
        .map_err(|e| JailError::io(format!("Failed to copy {} to {}", src.display(), dst.display()), e))?;
    Ok(())
}

/// A new mount namespace whose root is the jail: `/` made a slave of the host's (nothing
/// mounted here reaches it), the jail bound onto itself, pivot_root into it and the host's
/// root unmounted. The working directory is the jail's `/`.
pub fn enter(root: &Path, undo: &mut Undo) -> Result<(), JailError> {
    let call = |r: libc::c_int, what: &str| if r == 0 { Ok(()) } else { Err(JailError::os(what)) };
    let root_c = cstr(root)?;
    // SAFETY: unshare takes flags only.
    call(unsafe { libc::unshare(libc::CLONE_NEWNS) }, "Failed to unshare into new mount namespace")?;
    let (none, slash) = (std::ptr::null(), c"/");
    // SAFETY: mount(2) with NUL-terminated strings we own and no data.
    let r = unsafe { libc::mount(none, slash.as_ptr(), none, libc::MS_SLAVE | libc::MS_REC, std::ptr::null()) };
    call(r, "Failed to change the propagation type to slave")?;
    // SAFETY: as above.
    let r =
        unsafe { libc::mount(root_c.as_ptr(), root_c.as_ptr(), none, libc::MS_BIND | libc::MS_REC, std::ptr::null()) };
    call(r, "Failed to bind mount the jail root directory")?;
    std::env::set_current_dir(root).map_err(|e| JailError::io("Failed to change current directory", e))?;
    std::fs::create_dir("old_root")
        .map_err(|e| JailError::io("Failed to create the jail root directory before pivoting root", e))?;
    let (dot, old) = (c".", c"old_root");
    // SAFETY: pivot_root with two NUL-terminated relative paths.
    let pivoted = unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), old.as_ptr()) } == 0;
    if !pivoted {
        let e = JailError::os("Failed to pivot root");
        let _ = std::fs::remove_dir("old_root");
        return Err(e);
    }
    // From here the jail's files are reached from its own root.
    undo.rebase(root, Path::new("/"));
    std::env::set_current_dir("/").map_err(|e| JailError::io("Failed to chdir into chroot directory", e))?;
    // SAFETY: umount2 of a NUL-terminated relative path.
    call(unsafe { libc::umount2(old.as_ptr(), libc::MNT_DETACH) }, "Failed to unmount the old jail root")?;
    std::fs::remove_dir("old_root").map_err(|e| JailError::io("Failed to remove old jail root directory", e))?;
    Ok(())
}

/// The pid file `/<exec name>.pid` (Firecracker's: created anew, the pid without a newline).
pub fn write_pid_file(exec_name: &str, pid: libc::pid_t) -> Result<PathBuf, JailError> {
    let path = PathBuf::from(format!("/{exec_name}.pid"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| JailError::io(format!("Failed to open file {}", path.display()), e))?;
    file.write_all(pid.to_string().as_bytes())
        .map_err(|e| JailError::io(format!("Failed to write to {}", path.display()), e))?;
    Ok(path)
}
