//! The vhost-user-block rows: blkbench (4 KiB random reads at queue depth 32, every block
//! verified) on one pattern-filled image, through exitless's own virtio-blk, exitless's
//! vhost-user-blk and Firecracker's vhost-user-blk, the two vhost-user ones on the same
//! backend (a qemu-storage-daemon of their own, O_DIRECT and io_uring as exitless's
//! virtio-blk reads the file). Firecracker cannot boot Linux on this host, so the guest is
//! the blkbench payload under every VMM. The userspace exits a request costs are read from
//! each VMM's own metrics (Firecracker's `vcpu` group, which exitless writes too), flushed
//! twice inside the run: those between the two flushes are the steady state's.

use crate::peers::io::{counts, params, payload, QD};
use crate::peers::launch::{launch, Guest};
use crate::peers::{Transport, Vmm};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Which of a VMM's block devices a row runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// The VMM's own virtio-blk on the image (`path_on_host`, read-only).
    VirtioBlk,
    /// vhost-user-blk on qemu-storage-daemon's export of the image (`socket`).
    VhostUser,
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Device::VirtioBlk => "virtio-blk",
            Device::VhostUser => "vhost-user-blk",
        }
    }
}

/// One blkbench run.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub iops: f64,
    pub requests: u64,
    /// Exits between the two flushes, and the requests the run's rate says were made
    /// between them.
    pub window_exits: u64,
    pub window_requests: f64,
    /// Exits over the whole run (boot and setup included) as published when it printed its
    /// result: exitless's can miss the last ones (see WINDOW_START).
    pub run_exits: u64,
    /// CPU seconds of the VMM's threads that do not run the guest.
    pub vmm_cpu_s: f64,
}

impl Sample {
    pub fn steady_exits_per_request(&self) -> f64 {
        self.window_exits as f64 / self.window_requests.max(1.0)
    }
}

/// What every row shares.
pub struct Setup<'a> {
    pub dir: &'a Path,
    pub image: &'a Path,
    pub qsd: &'a Path,
    pub backend_cpu: Option<usize>,
    pub io_seconds: f64,
    pub mem_mib: u32,
    pub tsc_khz: u64,
    pub timeout: Duration,
}

/// A qemu-storage-daemon exporting the image read-only as vhost-user-blk; killed when
/// dropped. One per run: a backend serves the one frontend that connects.
struct Qsd {
    child: Child,
    socket: PathBuf,
}

impl Qsd {
    fn start(exe: &Path, image: &Path, socket: &Path, cpu: Option<usize>) -> Result<Qsd, String> {
        let _ = std::fs::remove_file(socket);
        let (image, sock) = (image.display(), socket.display());
        let mut command = Command::new(exe);
        if let Some(cpu) = cpu {
            use std::os::unix::process::CommandExt;
            // SAFETY: between fork and exec only sched_setaffinity (async-signal-safe) on
            // a mask on this stack.
            unsafe {
                command.pre_exec(move || {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut set);
                    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                })
            };
        }
        let child = command
            .arg("--blockdev")
            .arg(format!("driver=file,node-name=file0,filename={image},cache.direct=on,aio=io_uring,read-only=on"))
            .arg("--blockdev")
            .arg("driver=raw,node-name=disk0,file=file0,read-only=on")
            .arg("--export")
            .arg(format!("type=vhost-user-blk,id=exp0,node-name=disk0,addr.type=unix,addr.path={sock},writable=off"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
        let mut qsd = Qsd { child, socket: socket.to_path_buf() };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if let Ok(Some(status)) = qsd.child.try_wait() {
                return Err(format!("qemu-storage-daemon exited ({status}) before it listened"));
            }
            if Instant::now() > deadline {
                return Err("qemu-storage-daemon did not listen within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(qsd)
    }
}

/// The CPUs this process may run on (so may a backend it pins there).
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t, filled by the kernel for this process.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        set
    };
    // SAFETY: each index below CPU_SETSIZE, in the set read above.
    (0..libc::CPU_SETSIZE as usize).filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) }).collect()
}

/// Whether this process may run on `cpu`.
pub fn may_run_on(cpu: usize) -> bool {
    allowed_cpus().contains(&cpu)
}

/// Where a backend goes by default: the last CPU this process may run on, where it may
/// run on two or more (on one, pinning would change nothing).
pub fn last_cpu() -> Option<usize> {
    let cpus = allowed_cpus();
    cpus.last().copied().filter(|_| cpus.len() >= 2)
}

impl Drop for Qsd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// The earliest start of the steady window after the VM's start.
const WINDOW_START: Duration = Duration::from_millis(500);

/// The steady window of a run of `seconds`: from 30% (at least WINDOW_START) to 80%, if
/// that leaves a fifth of a second.
pub fn window(seconds: f64) -> Option<(Duration, Duration)> {
    let from = Duration::from_secs_f64(seconds * 0.3).max(WINDOW_START);
    let to = Duration::from_secs_f64(seconds * 0.8);
    (to >= from + Duration::from_millis(200)).then_some((from, to))
}

/// One blkbench run of `vmm` on `device` over `transport`.
pub fn run(vmm: Vmm, exe: &Path, device: Device, transport: Transport, s: &Setup) -> Result<Sample, String> {
    let name = format!("{}-{}-{}", vmm.name(), device.name(), transport.name());
    let socket = s.dir.join(format!("{name}.vhost.sock"));
    let _backend = match device {
        Device::VhostUser => Some(Qsd::start(s.qsd, s.image, &socket, s.backend_cpu)?),
        Device::VirtioBlk => None,
    };
    let ms = (s.io_seconds * 1e3) as u64;
    let metrics = s.dir.join(format!("{name}.metrics"));
    // As `bench peers`: randread, 4 KiB, QD32, no request limit, the time limit, TSC kHz,
    // stamp 1, seed 42, a FLUSH after the result line and then stay up, and a poll time
    // longer than the run (the guest never sleeps, so no interrupt is asked for).
    let cmdline = params(&[0, 4096, QD, u64::MAX >> 1, ms, s.tsc_khz, 1, 42, 2, 10_000_000]);
    let guest = Guest {
        kernel: payload(s.dir, "blkbench")?,
        cmdline: Some(cmdline),
        disk: (device == Device::VirtioBlk).then(|| s.image.to_path_buf()),
        disk_socket: (device == Device::VhostUser).then(|| socket.clone()),
        tap: None,
        mem_mib: s.mem_mib,
        transport,
        metrics: Some(metrics.clone()),
    };
    let mut vm = launch(vmm, exe, &s.dir.join(format!("{name}.sock")), &guest, s.timeout)?;
    let booted = Instant::now();
    // The window: from 30% of the run's time after the start (at least WINDOW_START: exitless
    // publishes a vCPU's counters at most every 10^8 TSC cycles, at its next exit, so the
    // setup's last exits can show late) to 80%, inside the run (the payload starts its I/O
    // within milliseconds of the start).
    let (from, to) = window(s.io_seconds).ok_or("the run is too short for a steady window (at least 1 s)")?;
    std::thread::sleep((booted + from).saturating_duration_since(Instant::now()));
    let (before, from) = (vm.userspace_exits(&metrics)?, Instant::now());
    std::thread::sleep((booted + to).saturating_duration_since(Instant::now()));
    let (after, to) = (vm.userspace_exits(&metrics)?, Instant::now());
    let line = vm.wait_for("blkbench: randread", s.timeout + Duration::from_secs_f64(s.io_seconds))?;
    let cpu = vm.cpu_outside_vcpus();
    let (requests, cycles) = counts(&line, "requests").ok_or_else(|| format!("unexpected line {line:?}"))?;
    if !line.contains(" 0 failed, 0 bad sectors") {
        return Err(format!("the guest saw errors: {}", line.trim()));
    }
    let run_exits = vm.userspace_exits(&metrics)?;
    let seconds = cycles as f64 / (s.tsc_khz as f64 * 1e3);
    let iops = requests as f64 / seconds.max(1e-9);
    Ok(Sample {
        iops,
        requests,
        window_exits: after.saturating_sub(before),
        window_requests: iops * (to - from).as_secs_f64(),
        run_exits,
        vmm_cpu_s: cpu.as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_may_be_pinned_only_where_this_process_runs() {
        // SAFETY: no arguments; the CPU this thread runs on now.
        let here = unsafe { libc::sched_getcpu() };
        assert!(may_run_on(usize::try_from(here).unwrap()), "CPU {here}");
        assert!(!may_run_on(libc::CPU_SETSIZE as usize));
        assert!(!may_run_on(usize::MAX));
        assert!(last_cpu().is_none_or(may_run_on));
    }

    #[test]
    fn the_steady_window_lies_inside_the_run() {
        assert_eq!(window(2.0), Some((Duration::from_millis(600), Duration::from_millis(1600))));
        assert_eq!(window(1.0), Some((Duration::from_millis(500), Duration::from_millis(800))));
        assert_eq!(window(0.5), None);
    }
}
