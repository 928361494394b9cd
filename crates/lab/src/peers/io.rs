//! The I/O rows: the same payload on each VMM's own virtio devices, its parameters on the
//! kernel command line. blkbench reads 4 KiB blocks at random at queue depth 32 from a
//! pattern-filled file (every block verified); nettx sends 64 KiB frames through a tap.
//! Both run for a fixed time and report requests or frames and TSC cycles; the guest polls
//! throughout under every VMM (no VMM's idle device is used), so the guest's side is the
//! same and the VMM's is what differs.

use super::launch::{launch, Guest, Running};
use super::{Options, Transport, Vmm};
use crate::blk::pattern;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One I/O run's outcome.
#[derive(Clone, Copy, Debug, Default)]
pub struct IoSample {
    /// Requests (blkbench) or frames (nettx) per second of guest time.
    pub per_second: f64,
    /// Bytes per second of guest time.
    pub bytes_per_second: f64,
    /// CPU seconds of the VMM's threads that do not run the guest.
    pub vmm_cpu_s: f64,
    pub seconds: f64,
    pub transport: Transport,
    /// The guest's userspace exits (port and MMIO) per request or frame, over the whole
    /// run (its setup included), where the VMM writes Firecracker's metrics.
    pub exits_per_request: Option<f64>,
    /// Those exits in all: setup and console only where kicks do not exit, so as many
    /// however many requests the run's time let the guest make.
    pub userspace_exits: Option<u64>,
}

impl IoSample {
    pub fn gbps_per_cpu_second(&self) -> f64 {
        self.bytes_per_second * 8.0 / 1e9 * self.seconds / self.vmm_cpu_s.max(1e-6)
    }
}

pub const BLK_BYTES: u64 = 64 << 20;
pub const NET_FRAME: u64 = 65_536 - 14;
pub const QD: u64 = 32;

/// A pattern-filled file for blkbench, written once for every VMM.
pub fn blk_disk(dir: &Path) -> Result<PathBuf, String> {
    let path = dir.join("blk.img");
    let mut file = std::fs::File::create(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    for at in (0..BLK_BYTES).step_by(buf.len()) {
        pattern::fill(&mut buf, at / pattern::SECTOR as u64, 0);
        file.write_all(&buf).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(path)
}

/// blkbench's "... N requests in C cycles, ..." line: N and C.
pub(crate) fn counts(line: &str, noun: &str) -> Option<(u64, u64)> {
    word_before(line, noun).zip(word_after(line, "in"))
}

pub(crate) fn params(values: &[u64]) -> String {
    let list: Vec<String> = values.iter().map(u64::to_string).collect();
    format!("exitless.params={}", list.join(","))
}

/// Where `vmm` writes its metrics for a `what` run over `transport` (None: Cloud Hypervisor,
/// which has no such file).
fn metrics_path(vmm: Vmm, dir: &Path, what: &str, transport: Transport) -> Option<PathBuf> {
    (vmm != Vmm::CloudHypervisor).then(|| dir.join(format!("{}-{what}-{}.metrics", vmm.name(), transport.name())))
}

/// The run's userspace exits, from its metrics file if it has one.
fn exits_of(vm: &mut Running, metrics: &Option<PathBuf>) -> Result<Option<u64>, String> {
    metrics.as_ref().map(|path| vm.userspace_exits(path)).transpose()
}

/// `sample` with the run's `exits` over its `n` requests or frames.
fn with_exits(sample: IoSample, exits: Option<u64>, n: u64) -> IoSample {
    let exits_per_request = exits.map(|e| e as f64 / n.max(1) as f64);
    IoSample { exits_per_request, userspace_exits: exits, ..sample }
}

/// blkbench randread 4 KiB at depth 32 for `opts.io_seconds`, on `disk`, over `transport`.
pub fn blk(
    vmm: Vmm,
    exe: &Path,
    dir: &Path,
    disk: &Path,
    opts: &Options,
    tsc_khz: u64,
    transport: Transport,
) -> Result<IoSample, String> {
    let ms = (opts.io_seconds * 1e3) as u64;
    // workload 0 (randread), 4096 bytes, depth 32, no request limit, the time limit, TSC
    // kHz, stamp 1, seed 42, a FLUSH after the result line and then stay up (a VMM whose
    // guest stops ends, and its metrics with it), and a poll time longer than the run:
    // never sleep.
    let cmdline = params(&[0, 4096, QD, u64::MAX >> 1, ms, tsc_khz, 1, 42, 2, 10_000_000]);
    let guest = Guest {
        kernel: payload(dir, "blkbench")?,
        cmdline: Some(cmdline),
        disk: Some(disk.to_path_buf()),
        disk_socket: None,
        tap: None,
        mem_mib: opts.mem_mib,
        transport,
        metrics: metrics_path(vmm, dir, "blk", transport),
    };
    let mut vm = launch(vmm, exe, &dir.join(format!("{}-blk.sock", vmm.name())), &guest, opts.timeout)?;
    let line = vm.wait_for("blkbench: randread", opts.timeout + Duration::from_secs_f64(opts.io_seconds))?;
    let cpu = vm.cpu_outside_vcpus();
    let (requests, cycles) = counts(&line, "requests").ok_or_else(|| format!("unexpected line {line:?}"))?;
    if !line.contains(" 0 failed, 0 bad sectors") {
        return Err(format!("the guest saw errors: {}", line.trim()));
    }
    let exits = exits_of(&mut vm, &guest.metrics)?;
    Ok(with_exits(IoSample { transport, ..sample(requests, 4096, cycles, tsc_khz, cpu) }, exits, requests))
}

/// nettx 64 KiB frames for `opts.io_seconds` through `tap`, over `transport`.
pub fn net(
    vmm: Vmm,
    exe: &Path,
    dir: &Path,
    tap: &str,
    opts: &Options,
    tsc_khz: u64,
    transport: Transport,
) -> Result<IoSample, String> {
    let ms = (opts.io_seconds * 1e3) as u64;
    // frame size, no frame limit, the time limit, TSC kHz, poll a full ring, and stay up
    // after the result line (a VMM whose guest stops ends, and its CPU time with it).
    let cmdline = params(&[NET_FRAME, u64::MAX >> 1, ms, tsc_khz, 1, 1]);
    let guest = Guest {
        kernel: payload(dir, "nettx")?,
        cmdline: Some(cmdline),
        disk: None,
        disk_socket: None,
        tap: Some(tap.to_string()),
        mem_mib: opts.mem_mib,
        transport,
        metrics: metrics_path(vmm, dir, "net", transport),
    };
    let mut vm = launch(vmm, exe, &dir.join(format!("{}-net.sock", vmm.name())), &guest, opts.timeout)?;
    let line = vm.wait_for("nettx: ", opts.timeout + Duration::from_secs_f64(opts.io_seconds))?;
    let cpu = vm.cpu_outside_vcpus();
    let (frames, cycles) =
        word_before(&line, "frames").zip(word_after(&line, "in")).ok_or_else(|| format!("unexpected line {line:?}"))?;
    let exits = exits_of(&mut vm, &guest.metrics)?;
    Ok(with_exits(IoSample { transport, ..sample(frames, NET_FRAME, cycles, tsc_khz, cpu) }, exits, frames))
}

/// "nettx: N frames of S bytes in C cycles": the number just before or after `word`.
fn word_before(line: &str, word: &str) -> Option<u64> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == word)?;
    words.get(at.checked_sub(1)?)?.parse().ok()
}

fn word_after(line: &str, word: &str) -> Option<u64> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == word)?;
    words.get(at + 1)?.parse().ok()
}

fn sample(n: u64, bytes: u64, cycles: u64, tsc_khz: u64, cpu: Duration) -> IoSample {
    let seconds = cycles as f64 / (tsc_khz as f64 * 1e3);
    IoSample {
        per_second: n as f64 / seconds,
        bytes_per_second: (n * bytes) as f64 / seconds,
        vmm_cpu_s: cpu.as_secs_f64(),
        seconds,
        transport: Transport::Pci,
        exits_per_request: None,
        userspace_exits: None,
    }
}

/// The payload's ELF in `dir` (written on first use).
pub(crate) fn payload(dir: &Path, name: &str) -> Result<PathBuf, String> {
    let path = dir.join(format!("{name}.elf"));
    if !path.exists() {
        let elf = exitless_payloads::find(name).map(|p| p.elf).ok_or_else(|| format!("no payload {name}"))?;
        std::fs::write(&path, elf).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(path)
}

/// A tap device for nettx, removed when dropped; None without the right to make one.
pub struct Tap(pub String);

impl Tap {
    pub fn create(name: &str) -> Result<Tap, String> {
        let ip = |args: &[&str]| {
            std::process::Command::new("ip")
                .args(args)
                .stderr(std::process::Stdio::null())
                .status()
                .map_err(|e| format!("cannot run ip: {e}"))
                .and_then(|s| if s.success() { Ok(()) } else { Err(format!("ip {} failed", args.join(" "))) })
        };
        let _ = ip(&["link", "del", name]);
        ip(&["tuntap", "add", "dev", name, "mode", "tap", "vnet_hdr"])?;
        ip(&["link", "set", name, "up"])?;
        Ok(Tap(name.to_string()))
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["link", "del", &self.0]).status();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_guests_counts() {
        let blk = "blkbench: randread 4096 bytes qd 32: 1200 requests in 5000000 cycles, 3 kicks, 0 idle waits, 0 failed, 0 bad sectors";
        assert_eq!(counts(blk, "requests"), Some((1200, 5_000_000)));
        let net = "nettx: 77 frames of 65522 bytes in 123456 cycles, 5 kicks, 0 idle waits";
        assert_eq!(counts(net, "frames"), Some((77, 123_456)));
        assert_eq!(counts("garbage", "requests"), None);
        assert_eq!(params(&[1, 22]), "exitless.params=1,22");
    }
}
