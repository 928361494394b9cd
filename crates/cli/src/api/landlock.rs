//! The Landlock policy of a configured microVM (crate exitless_vmm::landlock applies it):
//! its drives and pmem files, its vsock socket's directory, its log and metrics files, the
//! API socket's directory (the socket is removed from it at the end), a jail's root,
//! /proc/self (the metrics read it), and the paths `--landlock-rule` adds. It holds the
//! threads a guest reaches; the API threads open what the client names
//! (exitless_vmm::seccomp says why).

use super::vm::{Fault, Vm};
use exitless_vmm::landlock::{self, Policy, Reach};
use std::path::{Path, PathBuf};

impl Vm {
    /// The files this microVM was given, and the process's own.
    fn landlock_policy(&self) -> Policy {
        let c = &self.config;
        let mut rules = vec![(PathBuf::from("/proc/self"), Reach::Read)];
        for d in &c.drives {
            let reach = if d.is_read_only == Some(true) { Reach::Read } else { Reach::Write };
            rules.push((PathBuf::from(&d.path_on_host), reach));
        }
        rules.extend(self.device_files());
        if let Some(v) = &c.vsock {
            rules.push((directory_of(Path::new(&v.uds_path)), Reach::Entries));
        }
        rules.extend(self.landlock_rules.iter().cloned());
        Policy { rules }
    }

    /// Holds every thread started from now on to the microVM's files (off with
    /// `--no-landlock`, or where the kernel has no Landlock: said once).
    pub(super) fn install_landlock(&self) -> Result<(), Fault> {
        if !self.landlock || landlock::policy().is_some() {
            return Ok(());
        }
        if landlock::kernel_abi() < 1 {
            tracing::warn!("landlock: the host kernel has none; the VMM's threads reach every file seccomp lets them");
            return Ok(());
        }
        landlock::install(self.landlock_policy()).map_err(|e| Fault(format!("Cannot start the microVM: {e}")))
    }
}

/// A socket's directory (`.` for a bare name).
pub fn directory_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}
