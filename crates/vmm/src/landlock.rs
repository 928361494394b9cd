//! Landlock (where the host kernel has it): once a microVM is configured, the VMM's
//! threads reach only the files it was given. The policy (which paths, how) is the
//! caller's; this module holds it for the process and applies it to each thread as the
//! thread takes its seccomp filter (crate::seccomp::confine), so every thread the machine
//! starts afterwards is held by both, except the API threads (crate::seccomp says why).
//! No TCP at all (the VMM has no use for it), and no signal to a process outside the
//! VMM's domain.

use landlock::{
    Access, AccessFs, AccessNet, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
    ABI,
};
use std::path::PathBuf;
use std::sync::OnceLock;

/// The newest Landlock ABI this code knows; older kernels get what they have (best effort).
const ABI_KNOWN: ABI = ABI::V6;

/// What may be done beneath a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Read files and list directories.
    Read,
    /// Everything Landlock controls: read, write, create, remove, truncate.
    Write,
    /// Remove the entries of a directory and make sockets in it (a vsock device's
    /// directory: it binds its socket there, and removes it when dropped).
    Entries,
}

/// The paths a microVM's VMM may reach, and how.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    pub rules: Vec<(PathBuf, Reach)>,
}

#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error("landlock: cannot allow {0}: {1}")]
    Path(String, String),
    #[error("landlock: {0}")]
    Ruleset(String),
}

/// The process's policy once set ([`install`]); threads confined before it are not held.
static POLICY: OnceLock<Policy> = OnceLock::new();

impl Reach {
    fn access(self) -> landlock::BitFlags<AccessFs> {
        match self {
            Reach::Read => AccessFs::from_read(ABI_KNOWN),
            Reach::Write => AccessFs::from_all(ABI_KNOWN),
            Reach::Entries => AccessFs::RemoveFile | AccessFs::MakeSock,
        }
    }
}

/// The highest Landlock ABI the running kernel offers (0: none).
pub fn kernel_abi() -> i32 {
    // SAFETY: LANDLOCK_CREATE_RULESET_VERSION with a null attribute only asks the version.
    let v = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, 1u32) };
    i32::try_from(v).unwrap_or(0).max(0)
}

/// Sets the process's policy; later threads are held by it as they are confined. A path
/// that does not exist is left out (said once): nothing there can be reached (/proc in a
/// jail that has none).
pub fn install(mut policy: Policy) -> Result<(), LandlockError> {
    policy.rules.retain(|(path, _)| {
        let exists = path.exists();
        if !exists {
            tracing::info!("landlock: {} does not exist: left out", path.display());
        }
        exists
    });
    // A policy that cannot be applied is refused now, not in each thread.
    std::thread::scope(|s| s.spawn(|| restrict(&policy)).join())
        .map_err(|_| LandlockError::Ruleset("the check panicked".into()))??;
    POLICY.set(policy).map_err(|_| LandlockError::Ruleset("a policy is already set for this process".into()))
}

/// The process's policy, if one is set.
pub fn policy() -> Option<&'static Policy> {
    POLICY.get()
}

/// Holds the calling thread to `policy`: what the kernel enforced (fully, partly on an
/// older ABI, or not at all without Landlock).
pub fn restrict(policy: &Policy) -> Result<RulesetStatus, LandlockError> {
    let failed = |e: landlock::RulesetError| LandlockError::Ruleset(e.to_string());
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(ABI_KNOWN))
        .and_then(|r| r.handle_access(AccessNet::from_all(ABI_KNOWN)))
        .and_then(|r| r.scope(Scope::Signal))
        .and_then(|r| r.create())
        .map_err(failed)?;
    for (path, reach) in &policy.rules {
        let fd = PathFd::new(path).map_err(|e| LandlockError::Path(path.display().to_string(), e.to_string()))?;
        // A file takes only the rights that apply to files.
        let access = if path.is_dir() { reach.access() } else { reach.access() & AccessFs::from_file(ABI_KNOWN) };
        ruleset = ruleset.add_rule(PathBeneath::new(fd, access)).map_err(failed)?;
    }
    Ok(ruleset.restrict_self().map_err(failed)?.ruleset)
}

/// Holds the calling thread to the process's policy, if one is set (crate::seccomp calls
/// it before each thread's filter, which would refuse Landlock's own calls).
pub fn restrict_current_thread() -> Result<(), LandlockError> {
    match POLICY.get() {
        Some(policy) => restrict(policy).map(drop),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_reaches_only_what_its_policy_names() {
        if kernel_abi() < 1 {
            eprintln!("SKIPPED: the host kernel has no Landlock");
            return;
        }
        let dir = std::env::temp_dir().join(format!("exitless-landlock-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("given")).unwrap();
        std::fs::write(dir.join("given/disk"), b"disk").unwrap();
        std::fs::write(dir.join("other"), b"other").unwrap();
        let policy = Policy { rules: vec![(dir.join("given"), Reach::Write)] };
        let d = dir.clone();
        let seen = std::thread::spawn(move || {
            restrict(&policy).unwrap();
            let given = std::fs::read(d.join("given/disk")).is_ok();
            let created = std::fs::write(d.join("given/new"), b"n").is_ok();
            let other = std::fs::read(d.join("other")).is_ok();
            let root = std::fs::read_dir("/").is_ok();
            let tcp = std::net::TcpListener::bind("127.0.0.1:0").is_ok();
            (given, created, other, root, tcp)
        })
        .join()
        .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let tcp_held = kernel_abi() < 4 || !seen.4;
        assert_eq!((seen.0, seen.1, seen.2, seen.3, tcp_held), (true, true, false, false, true), "{seen:?}");
        // This thread was never restricted.
        assert!(std::fs::read_dir("/").is_ok());
    }
}
