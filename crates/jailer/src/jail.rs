//! The jail itself, as Firecracker's jailer makes it (its `env.rs` and `chroot.rs`): the
//! directory `<base>/<exec name>/<id>/root`, the binary copied into it, `/dev`, `/dev/net`
//! and `/run` (0700, the jailed user's), the device nodes the VMM opens (0600, the jailed
//! user's), then a new mount namespace whose root is that directory (pivot_root; the
//! host's root unmounted). Everything is made through open directories (fsat.rs) and
//! recorded for undoing by descriptor, so a jail that fails after the pivot is still
//! removed whole from the host.

use crate::args::Plan;
use crate::error::JailError;
use crate::fsat::{self, Dir};
use crate::undo::Undo;
use std::ffi::CString;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;

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
    let text = fsat::read_kernel_file(std::path::Path::new("/proc/misc"), 1 << 20).ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let minor = f.next()?;
        (f.next()? == "userfaultfd").then(|| minor.parse().ok()).flatten()
    })
}

/// The jail's directories, open: `<base>/<exec name>/<id>` and its `root`.
pub struct Jail {
    id_dir: Dir,
    root: Dir,
}

/// A new mount namespace, then the jail's directory, binary, directories and device
/// nodes. Every step is taken on a descriptor walked to without following a link (the jail
/// root is the jailed user's, who may have put one anywhere in it); a link or a
/// non-directory where a directory should be is refused.
pub fn prepare(plan: &Plan, undo: &mut Undo) -> Result<Jail, JailError> {
    // The namespace first: the descriptors opened below reach the jail through its
    // mounts, so the jail's bind mount (made in it by `enter`) is found from them.
    // SAFETY: unshare takes flags only.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(JailError::os("Failed to unshare into new mount namespace"));
    }
    let none = std::ptr::null();
    // SAFETY: mount(2) with a NUL-terminated literal and no data.
    let r = unsafe { libc::mount(none, c"/".as_ptr(), none, libc::MS_SLAVE | libc::MS_REC, std::ptr::null()) };
    if r != 0 {
        return Err(JailError::os("Failed to change the propagation type to slave"));
    }
    let base = Dir::walk(&plan.chroot_base)?;
    let id_dir = base.make_dir(&plan.exec_name, 0o777, undo)?.make_dir(&plan.id, 0o777, undo)?;
    let root = id_dir.make_dir("root", 0o777, undo)?;
    root.set_mode_owner(0o700, plan.uid, plan.gid)?;
    copy_exec_file(plan, &root, undo)?;
    let dev = root.make_dir("dev", 0o777, undo)?;
    dev.set_mode_owner(0o700, plan.uid, plan.gid)?;
    let net = dev.make_dir("net", 0o777, undo)?;
    net.set_mode_owner(0o700, plan.uid, plan.gid)?;
    root.make_dir("run", 0o777, undo)?.set_mode_owner(0o700, plan.uid, plan.gid)?;
    for (node, major, minor, required) in devices() {
        let (dir, name) = match node.strip_prefix("dev/net/") {
            Some(name) => (&net, name),
            None => (&dev, node.trim_start_matches("dev/")),
        };
        let name = CString::new(name).expect("a literal name");
        if let Err(e) = dir.mknod(&name, major, minor) {
            let e = JailError::io(format!("Failed to create /{node} via mknod inside the jail"), e);
            if required {
                return Err(e);
            }
            println!("Warning! Could not create /{node} device inside jailer: {e}.");
            continue;
        }
        undo.made(dir, name.clone(), false);
        dir.own_node(&name, major, minor, plan.uid, plan.gid)?;
    }
    Ok(Jail { id_dir, root })
}

/// The binary copied (never linked: a hard link would let the jailed user change the
/// host's file) to `<root>/<exec name>`, owned by the jailed user, its mode kept. The
/// source is checked to be a regular file on the descriptor it is read from, and read to
/// the size checked; the destination (the jailed user's to replace) is made new, or else
/// must be a regular file with one link: a link, a FIFO (whose open would wait for a
/// reader) or a device there is refused without being opened.
fn copy_exec_file(plan: &Plan, root: &Dir, undo: &mut Undo) -> Result<(), JailError> {
    let src = &plan.exec_file;
    let dst = root.path_of(&plan.exec_name);
    let input = fsat::open_regular_path(src, false, libc::O_RDONLY)
        .map_err(|e| JailError::io(format!("Failed to open {}", src.display()), e))?;
    let meta =
        input.metadata().map_err(|e| JailError::io(format!("Cannot get metadata for a file: {}", src.display()), e))?;
    let name =
        CString::new(plan.exec_name.as_str()).map_err(|_| JailError::Step(format!("{}: a NUL byte", dst.display())))?;
    // A binary already there (a jail made again) is written over, as Firecracker does.
    let output = match root.create_file(&name, libc::O_WRONLY, meta.mode()) {
        Ok(f) => {
            undo.made(root, name, false);
            f
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => root
            .open_regular(&name, libc::O_WRONLY)
            .map_err(|e| JailError::io(format!("Failed to open {}", dst.display()), e))?,
        Err(e) => return Err(JailError::io(format!("Failed to open {}", dst.display()), e)),
    };
    let links = output
        .metadata()
        .map_err(|e| JailError::io(format!("Cannot get metadata for a file: {}", dst.display()), e))?
        .nlink();
    if links > 1 {
        return Err(JailError::Step(format!("Detected hard link at: {}", dst.display())));
    }
    std::os::unix::fs::fchown(&output, Some(plan.uid), Some(plan.gid))
        .map_err(|e| JailError::io(format!("Failed to change owner for {}", dst.display()), e))?;
    let failed = |e| JailError::io(format!("Failed to copy {} to {}", src.display(), dst.display()), e);
    output.set_len(0).map_err(failed)?;
    let mut output = std::io::BufWriter::new(output);
    let copied = std::io::copy(&mut input.take(meta.len()), &mut output).map_err(failed)?;
    output.flush().map_err(failed)?;
    if copied != meta.len() {
        return Err(JailError::Step(format!("Failed to copy {}: it changed while copied", src.display())));
    }
    Ok(())
}

/// The jail made the root of this process's mount namespace: the jail bound onto itself
/// (nothing mounted here reaches the host: `/` was made a slave in `prepare`), pivot_root
/// into it and the host's root unmounted. Done on the jail's descriptors: no path is looked
/// up, and no directory is made in the jail for the old root (pivot_root(".", "."): the old
/// root is stacked on the new one, then unmounted).
pub fn enter(jail: &Jail) -> Result<(), JailError> {
    let call = |r: libc::c_int, what: &str| if r == 0 { Ok(()) } else { Err(JailError::os(what)) };
    let root = CString::new(format!("/proc/self/fd/{}", jail.root.fd())).expect("no NUL in a number");
    let none = std::ptr::null();
    // SAFETY: mount(2) with NUL-terminated strings we own and no data.
    let r = unsafe { libc::mount(root.as_ptr(), root.as_ptr(), none, libc::MS_BIND | libc::MS_REC, std::ptr::null()) };
    call(r, "Failed to bind mount the jail root directory")?;
    // Looked up again from its parent: the lookup crosses into the bind mount just made,
    // which pivot_root needs (the descriptor held is the directory under it).
    let top = jail.id_dir.open_dir("root")?;
    // SAFETY: fchdir on a descriptor we own.
    call(unsafe { libc::fchdir(top.fd()) }, "Failed to change current directory")?;
    let dot = c".";
    // SAFETY: pivot_root with two NUL-terminated literals.
    let pivoted = unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) } == 0;
    call(if pivoted { 0 } else { -1 }, "Failed to pivot root")?;
    // SAFETY: umount2 of a NUL-terminated literal: the old root, stacked on the jail.
    call(unsafe { libc::umount2(dot.as_ptr(), libc::MNT_DETACH) }, "Failed to unmount the old jail root")?;
    // SAFETY: chdir to a NUL-terminated literal.
    call(unsafe { libc::chdir(c"/".as_ptr()) }, "Failed to chdir into chroot directory")
}

/// The pid file another process wrote, recorded in `undo` (--new-pid-ns: the parent
/// writes it, the child removes it if its exec fails).
pub fn pid_file_made(jail: &Jail, exec_name: &str, undo: &mut Undo) -> Result<(), JailError> {
    let name = CString::new(format!("{exec_name}.pid")).map_err(|_| JailError::Step("a NUL byte".into()))?;
    undo.made(&jail.root, name, false);
    Ok(())
}

/// The pid file `/<exec name>.pid` in the jail (Firecracker's: created anew, the pid
/// without a newline), recorded in `undo`.
pub fn write_pid_file(jail: &Jail, exec_name: &str, pid: libc::pid_t, undo: &mut Undo) -> Result<(), JailError> {
    let name = format!("{exec_name}.pid");
    let path = jail.root.path_of(&name);
    let name = CString::new(name).map_err(|_| JailError::Step(format!("{}: a NUL byte", path.display())))?;
    let mut file = jail
        .root
        .create_file(&name, libc::O_WRONLY, 0o666)
        .map_err(|e| JailError::io(format!("Failed to open file {}", path.display()), e))?;
    undo.made(&jail.root, name, false);
    file.write_all(pid.to_string().as_bytes())
        .map_err(|e| JailError::io(format!("Failed to write to {}", path.display()), e))
}
