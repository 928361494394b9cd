//! A network namespace of the lab's own, with the guest's tap moved into it, so frames
//! are sunk (and sent) where nothing else on the machine sees them. No IP addresses are
//! used: the lab's frames are raw Ethernet with a local experimental ethertype.

use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("`ip {args}` failed: {detail}")]
    Ip { args: String, detail: String },
    #[error("cannot enter network namespace {0}: {1}")]
    Enter(String, std::io::Error),
}

fn ip(args: &[&str]) -> Result<(), NetnsError> {
    let out = Command::new("ip").args(args).output();
    let fail = |detail: String| NetnsError::Ip { args: args.join(" "), detail };
    match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(fail(String::from_utf8_lossy(&o.stderr).trim().to_string())),
        Err(e) => Err(fail(format!("{e} (is iproute2 installed?)"))),
    }
}

/// Deleted when dropped, and when the process gets SIGINT, SIGTERM or SIGHUP
/// ([`exitless_vmm::termination`]); a run killed with SIGKILL leaves it behind, and the
/// next run removes it ([`remove_stale`]).
pub struct Netns {
    pub name: String,
    _on_signal: exitless_vmm::termination::Registration,
}

/// A number this process has not put in a name before: labs that run at once in one
/// process (tests run in parallel) never share a namespace or a tap.
fn next_serial() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// `exitless-<kind>-<pid>-<n>`: a namespace name no other call makes, which
/// [`remove_stale`] removes once the process is gone (`kind` is a word of letters).
pub fn unique_name(kind: &str) -> String {
    format!("exitless-{kind}-{}-{}", std::process::id(), next_serial())
}

/// `<prefix><pid>-<n>`: a tap name no other call makes. With a `prefix` of at most 3
/// characters it is at most 14 long, leaving room for one more under IFNAMSIZ (15).
pub fn unique_ifname(prefix: &str) -> String {
    debug_assert!(prefix.len() <= 3, "{prefix}");
    // A pid has at most 7 digits (pid_max is at most 2^22); the serial wraps below 1000.
    format!("{prefix}{}-{}", std::process::id(), next_serial() % 1000)
}

/// The pid in a lab namespace's name: `exitless-[<kind>-]<pid>[-<n>]` (the names
/// [`unique_name`] makes, and those of earlier versions).
pub fn owner(name: &str) -> Option<u32> {
    let mut parts = name.strip_prefix("exitless-")?.split('-').peekable();
    if parts.next_if(|p| p.bytes().all(|b| b.is_ascii_alphabetic())).is_some_and(str::is_empty) {
        return None;
    }
    let pid = parts.next()?.parse().ok()?;
    match (parts.next(), parts.next()) {
        (None, _) => Some(pid),
        (Some(n), None) if n.parse::<u32>().is_ok() => Some(pid),
        _ => None,
    }
}

/// Removes lab namespaces ([`owner`]) whose process is gone (left by a run that was
/// killed with SIGKILL).
pub fn remove_stale() {
    let Ok(entries) = std::fs::read_dir("/var/run/netns") else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = owner(&name) else { continue };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            match ip(&["netns", "del", &name]) {
                Ok(()) => eprintln!("exitless: removed network namespace {name} left by a killed run"),
                Err(e) => eprintln!("exitless: cannot remove stale network namespace {name}: {e}"),
            }
        }
    }
}

/// What `ip netns del` does, without starting a process (the signal thread's filter allows
/// no exec): detach the namespace's bind mount and remove its file.
fn remove_on_signal(name: &str) {
    let Ok(path) = std::ffi::CString::new(format!("/var/run/netns/{name}")) else { return };
    // SAFETY: umount2 and unlink on a NUL-terminated path we own.
    unsafe {
        libc::umount2(path.as_ptr(), libc::MNT_DETACH);
        libc::unlink(path.as_ptr());
    }
}

impl Netns {
    /// A new namespace named by [`unique_name`] for `kind`.
    pub fn create(kind: &str) -> Result<Netns, NetnsError> {
        let name = &unique_name(kind);
        let owned = name.to_string();
        let on_signal = exitless_vmm::termination::on_signal(move |_| remove_on_signal(&owned));
        remove_stale();
        // A name of ours ([`unique_name`]) already there was left by a killed run whose pid
        // this process now has: no live lab of ours holds it.
        let _ = ip(&["netns", "del", name]);
        ip(&["netns", "add", name])?;
        Ok(Netns { name: name.into(), _on_signal: on_signal })
    }

    /// Moves interface `ifname` into the namespace and brings it up with room for 64 KiB frames.
    pub fn adopt(&self, ifname: &str) -> Result<(), NetnsError> {
        ip(&["link", "set", "dev", ifname, "netns", &self.name])?;
        ip(&["-n", &self.name, "link", "set", "dev", ifname, "mtu", "65521", "up"])
    }
}

/// Switches the calling thread (only) into network namespace `name`.
pub fn enter_current_thread(name: &str) -> Result<(), NetnsError> {
    let path = format!("/var/run/netns/{name}");
    let file = std::fs::File::open(&path).map_err(|e| NetnsError::Enter(name.into(), e))?;
    // SAFETY: setns on a namespace fd we just opened; it affects only this thread.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(NetnsError::Enter(name.into(), std::io::Error::last_os_error()));
    }
    Ok(())
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("exitless: could not remove network namespace {}: {e}", self.name);
        }
    }
}

/// Whether this machine lets us make namespaces and taps (tests skip loudly otherwise).
pub fn available() -> bool {
    std::path::Path::new("/dev/net/tun").exists()
        && Command::new("ip").arg("-V").output().is_ok_and(|o| o.status.success())
        // SAFETY: geteuid has no preconditions.
        && unsafe { libc::geteuid() } == 0
}
