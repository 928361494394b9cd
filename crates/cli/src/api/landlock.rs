//! The Landlock policy of a configured microVM (crate exitless_vmm::landlock applies it):
//! its drives and pmem files, its log and metrics files, a jail's root, /proc/self (the
//! metrics read it), and the paths `--landlock-rule` adds; nothing in the API or vsock
//! sockets' directories ([`process_rules`] says why). It holds the
//! threads a guest reaches; the API threads open what the client names
//! (exitless_vmm::seccomp says why).

use super::vm::{Fault, Vm};
use crate::args::ApiArgs;
use exitless_vmm::landlock::{self, Policy, Reach};
use std::path::PathBuf;

impl Vm {
    /// The files this microVM was given, and the process's own.
    fn landlock_policy(&self) -> Policy {
        let c = &self.config;
        let mut rules = vec![(PathBuf::from("/proc/self"), Reach::Read)];
        for d in &c.drives {
            let reach = if d.is_read_only == Some(true) { Reach::Read } else { Reach::Write };
            // A vhost-user drive has no file: its socket is connected before the start.
            rules.extend(d.path_on_host.as_ref().map(|p| (PathBuf::from(p), reach)));
        }
        rules.extend(self.device_files());
        // Not the vsock socket's directory either: the socket is bound while the machine
        // is built, by the API thread, and no held thread makes or removes one (the device
        // removes it when dropped, which a running API VMM never is: it exits).
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

/// The process's own files, from its flags: its log and metrics files, exactly; a jail's
/// root (the jailer passes the start time), everything in which was made for this
/// microVM; and what `--landlock-rule` adds. Not the API socket's directory: the socket
/// is removed by a thread Landlock does not hold (socket_watch::Ender), and a right to
/// remove it would be one to remove anything beneath that directory (all of /run for the
/// default socket). What a client names later is opened by the API threads, which
/// Landlock does not hold either.
pub fn process_rules(args: &ApiArgs) -> Vec<(PathBuf, Reach)> {
    let mut rules = Vec::new();
    for path in [&args.log_path, &args.metrics_path].into_iter().flatten() {
        rules.push((path.clone(), Reach::Write));
    }
    if args.start_time_us.is_some() {
        rules.push(("/".into(), Reach::Write));
    }
    rules.extend(args.landlock_rule.iter().cloned());
    rules
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::path::Path;

    /// The default socket is in /run: a right to remove it, or to write beside it, would be
    /// one over all of /run. The threads Landlock holds get only the exact files they
    /// write there (log, metrics), and cannot plant, write or remove anything else.
    #[test]
    fn held_threads_get_no_right_in_the_sockets_directories() {
        let dir = std::env::temp_dir().join(format!("exitless-landlock-rules-{}", std::process::id()));
        let run = dir.join("run");
        std::fs::create_dir_all(&run).unwrap();
        let [sock, log, metrics, uds] = ["firecracker.socket", "fc.log", "fc.metrics", "v.sock"].map(|n| run.join(n));
        for file in [&sock, &log, &metrics, &uds] {
            std::fs::write(file, b"").unwrap();
        }
        let path = |p: &Path| p.to_str().unwrap().to_string();
        let argv =
            ["exitless", "--api-sock", &path(&sock), "--log-path", &path(&log), "--metrics-path", &path(&metrics)];
        let cli = crate::args::Cli::try_parse_from(argv).unwrap();
        let mut vm = Vm::new("landlock".into());
        vm.landlock_rules = process_rules(&cli.api);
        vm.config.vsock = Some(super::super::model::Vsock { guest_cid: 3, uds_path: path(&uds), vsock_id: None });
        let policy = vm.landlock_policy();
        for (rule, _) in &policy.rules {
            assert!(!run.starts_with(rule), "{} covers the sockets' directory: {:?}", rule.display(), policy.rules);
        }
        if landlock::kernel_abi() < 1 {
            eprintln!("SKIPPED (the rules checked): the host kernel has no Landlock");
            std::fs::remove_dir_all(&dir).unwrap();
            return;
        }
        let (planted, held) = (run.join("planted"), (sock.clone(), uds.clone(), log.clone()));
        let seen = std::thread::spawn(move || {
            landlock::restrict(&policy).unwrap();
            let (sock, uds, log) = held;
            let log_written = std::fs::OpenOptions::new().append(true).open(&log).is_ok();
            let planted = std::fs::write(&planted, b"x").is_ok();
            (log_written, planted, std::fs::remove_file(&sock).is_ok(), std::fs::remove_file(&uds).is_ok())
        })
        .join()
        .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(seen, (true, false, false, false), "(log written, file planted, socket removed, vsock removed)");
    }
}
