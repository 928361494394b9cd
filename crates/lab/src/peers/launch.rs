//! One VMM process with one guest: spawned, configured and booted through its own API the
//! way its users drive it, read from its console, measured, and killed when dropped.

use super::{Transport, Vmm};
use crate::api_client::{expect_ok, listening};
use serde_json::json;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// What the guest gets besides RAM and one vCPU.
#[derive(Clone, Debug, Default)]
pub struct Guest {
    pub kernel: PathBuf,
    /// The kernel command line: how a payload gets its parameters under every VMM.
    pub cmdline: Option<String>,
    /// A virtio-blk disk, read-only.
    pub disk: Option<PathBuf>,
    /// A vhost-user-blk backend's socket: a drive with Firecracker's `socket` field
    /// (`bench fs`'s vhost-user rows).
    pub disk_socket: Option<PathBuf>,
    /// A virtio-net interface on this tap.
    pub tap: Option<String>,
    pub mem_mib: u32,
    /// The devices' transport (Firecracker's and exitless's: PCI only with `--enable-pci`).
    pub transport: Transport,
    /// Where the VMM writes Firecracker's metrics (exitless and Firecracker), if anywhere.
    pub metrics: Option<PathBuf>,
}

/// A VMM process running a guest; killed (and its socket removed) when dropped.
pub struct Running {
    child: Child,
    console: BufReader<ChildStdout>,
    sock: PathBuf,
    pub spawned: Instant,
    pub api_ready: Duration,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.sock);
    }
}

/// Spawns `vmm` with its API on `sock` and boots `guest` through that API.
pub fn launch(vmm: Vmm, exe: &Path, sock: &Path, guest: &Guest, timeout: Duration) -> Result<Running, String> {
    let _ = std::fs::remove_file(sock);
    let mut cmd = Command::new(exe);
    match vmm {
        // Firecracker's virtio devices, and exitless's in Firecracker's mode, are MMIO unless
        // asked for PCI; the payloads find theirs on either.
        Vmm::Exitless | Vmm::Firecracker if guest.transport == Transport::Pci => {
            cmd.arg("--api-sock").arg(sock).arg("--enable-pci")
        }
        Vmm::Exitless | Vmm::Firecracker => cmd.arg("--api-sock").arg(sock),
        Vmm::CloudHypervisor if guest.transport == Transport::Mmio && (guest.disk.is_some() || guest.tap.is_some()) => {
            return Err("Cloud Hypervisor has no virtio-mmio devices on x86_64".into());
        }
        Vmm::CloudHypervisor => cmd.arg("--api-socket").arg(sock),
    };
    let spawned = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut running = Running {
        child,
        console: BufReader::new(stdout),
        sock: sock.to_path_buf(),
        spawned,
        api_ready: Duration::ZERO,
    };
    while !listening(sock) {
        if spawned.elapsed() > timeout {
            return Err(format!("its API socket did not appear within {timeout:?}"));
        }
        if let Ok(Some(status)) = running.child.try_wait() {
            return Err(format!("it exited ({status}) before serving its API"));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    running.api_ready = spawned.elapsed();
    boot(vmm, sock, guest)?;
    Ok(running)
}

fn boot(vmm: Vmm, sock: &Path, guest: &Guest) -> Result<(), String> {
    const MAC: &str = "06:00:ac:10:00:02";
    let mem = u64::from(guest.mem_mib);
    match vmm {
        Vmm::Exitless | Vmm::Firecracker => {
            expect_ok(sock, "PUT", "/machine-config", Some(&json!({"vcpu_count": 1, "mem_size_mib": mem})))?;
            if let Some(path) = &guest.metrics {
                // Firecracker opens the file it is given; it does not create it.
                std::fs::write(path, b"").map_err(|e| format!("cannot create {}: {e}", path.display()))?;
                expect_ok(sock, "PUT", "/metrics", Some(&json!({"metrics_path": path})))?;
            }
            let mut boot = json!({"kernel_image_path": guest.kernel});
            if let Some(cmdline) = &guest.cmdline {
                boot["boot_args"] = json!(cmdline);
            }
            expect_ok(sock, "PUT", "/boot-source", Some(&boot))?;
            if let Some(disk) = &guest.disk {
                let drive =
                    json!({"drive_id": "disk", "path_on_host": disk, "is_root_device": false, "is_read_only": true});
                expect_ok(sock, "PUT", "/drives/disk", Some(&drive))?;
            }
            if let Some(socket) = &guest.disk_socket {
                // Firecracker's vhost-user drive: the backend says what the disk is, so
                // path_on_host, is_read_only, io_engine and rate_limiter must be absent.
                let drive = json!({"drive_id": "disk", "is_root_device": false, "socket": socket});
                expect_ok(sock, "PUT", "/drives/disk", Some(&drive))?;
            }
            if let Some(tap) = &guest.tap {
                let net = json!({"iface_id": "eth0", "host_dev_name": tap, "guest_mac": MAC});
                expect_ok(sock, "PUT", "/network-interfaces/eth0", Some(&net))?;
            }
            expect_ok(sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"})))?;
        }
        Vmm::CloudHypervisor if guest.disk_socket.is_some() => {
            return Err("the lab does not drive Cloud Hypervisor's vhost-user disks".into());
        }
        Vmm::CloudHypervisor => {
            let mut config = json!({
                "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
                "memory": {"size": mem << 20},
                "payload": {"kernel": guest.kernel},
                "serial": {"mode": "Tty"},
                "console": {"mode": "Off"},
            });
            if let Some(cmdline) = &guest.cmdline {
                config["payload"]["cmdline"] = json!(cmdline);
            }
            if let Some(disk) = &guest.disk {
                config["disks"] = json!([{"path": disk, "readonly": true}]);
            }
            if let Some(tap) = &guest.tap {
                config["net"] = json!([{"tap": tap, "mac": MAC}]);
            }
            expect_ok(sock, "PUT", "/api/v1/vm.create", Some(&config))?;
            expect_ok(sock, "PUT", "/api/v1/vm.boot", None)?;
        }
    }
    Ok(())
}

impl Running {
    /// Reads the guest's console up to a line containing `needle`, within `within` (the
    /// VMM is killed when the time is up); returns that line.
    pub fn wait_for(&mut self, needle: &str, within: Duration) -> Result<String, String> {
        crate::api_client::wait_for_line_within(&mut self.console, needle, self.child.id(), within)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The guest's userspace exits so far (port and MMIO, Firecracker's `vcpu` group), from
    /// the metrics file `metrics` after a FlushMetrics: each line holds what the counters
    /// gained since the one before. A VMM whose guest ended (exitless ends with it) wrote
    /// its last line as it exited.
    pub fn userspace_exits(&mut self, metrics: &Path) -> Result<u64, String> {
        if expect_ok(&self.sock, "PUT", "/actions", Some(&json!({"action_type": "FlushMetrics"}))).is_err() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while !matches!(self.child.try_wait(), Ok(Some(_))) {
                if Instant::now() > deadline {
                    return Err("it neither flushed its metrics nor exited".into());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let text = std::fs::read_to_string(metrics).map_err(|e| format!("{}: {e}", metrics.display()))?;
        let mut exits = 0;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let value: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("a metrics line: {e}"))?;
            for field in ["exit_io_in", "exit_io_out", "exit_mmio_read", "exit_mmio_write"] {
                exits += value["vcpu"][field].as_u64().ok_or_else(|| format!("no vcpu.{field} in its metrics"))?;
            }
        }
        Ok(exits)
    }

    /// CPU time of the process's threads that do not run the guest: the VMM's own work
    /// (its device, I/O and API threads). A vCPU thread's time is mostly the guest's.
    pub fn cpu_outside_vcpus(&self) -> Duration {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.pid())) else { return Duration::ZERO };
        let ticks: u64 = tasks
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
            .filter_map(|stat| {
                // "pid (comm) state ...": comm may hold spaces, so split at the last ')'.
                let (head, rest) = stat.rsplit_once(')')?;
                let comm = head.split_once('(')?.1;
                if comm.contains("vcpu") {
                    return None;
                }
                let fields: Vec<&str> = rest.split_whitespace().collect();
                // utime and stime are fields 14 and 15; `rest` starts at field 3.
                Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
            })
            .sum();
        // SAFETY: sysconf only reads a constant.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Duration::from_nanos(ticks * 1_000_000_000 / hz)
    }
}

/// Resident, proportional and anonymous KiB of process `pid`, less every mapping at least
/// as large as guest RAM (`guest_bytes`): what the VMM costs beyond the memory it gives.
pub fn memory_beyond_guest(pid: u32, guest_bytes: u64) -> Option<(u64, u64, u64)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let kib = |v: &str| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok();
    let (mut rss, mut pss, mut anon, mut guest) = (0, 0, 0, false);
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((start, end)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
            let size = u64::from_str_radix(end, 16).ok()?.saturating_sub(u64::from_str_radix(start, 16).ok()?);
            guest = size >= guest_bytes;
        } else if !guest {
            let value = || kib(line.split_once(':').map_or("", |(_, v)| v));
            match first {
                "Rss:" => rss += value()?,
                "Pss:" => pss += value()?,
                "Anonymous:" => anon += value()?,
                _ => {}
            }
        }
    }
    Some((rss, pss, anon))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(script: &str) -> Running {
        let mut child = Command::new("sh").args(["-c", script]).stdout(Stdio::piped()).spawn().unwrap();
        let console = BufReader::new(child.stdout.take().unwrap());
        let sock = std::env::temp_dir().join(format!("exitless-launch-test-{}.sock", std::process::id()));
        Running { child, console, sock, spawned: Instant::now(), api_ready: Duration::ZERO }
    }

    #[test]
    fn a_guest_that_never_prints_is_killed_when_the_wait_is_up() {
        let mut vm = running("exec sleep 60");
        let began = Instant::now();
        let err = vm.wait_for("wait: running", Duration::from_millis(300)).unwrap_err();
        assert!(err.contains("within") && err.contains("killed"), "{err}");
        assert!(began.elapsed() < Duration::from_secs(10), "the wait outlived its time");
        // The console closes as the process exits, a moment before it can be reaped.
        let deadline = Instant::now() + Duration::from_secs(5);
        while vm.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the VMM was left running");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_line_in_pieces_is_read_whole_and_half_a_line_does_not_hold_the_wait() {
        let mut vm = running("printf 'wait: '; sleep 0.2; echo running; exec sleep 60");
        assert_eq!(vm.wait_for("wait: running", Duration::from_secs(30)).unwrap().trim(), "wait: running");
        let mut vm = running("printf 'wait: '; exec sleep 60");
        let err = vm.wait_for("wait: running", Duration::from_millis(300)).unwrap_err();
        assert!(err.contains("killed"), "{err}");
    }

    #[test]
    fn a_line_in_time_is_returned_and_the_vmm_left_running() {
        let mut vm = running("echo booting; echo 'wait: running'; exec sleep 60");
        let line = vm.wait_for("wait: running", Duration::from_secs(30)).unwrap();
        assert_eq!(line.trim(), "wait: running");
        assert!(vm.child.try_wait().unwrap().is_none(), "the watchdog killed a VMM that answered");
    }
}
