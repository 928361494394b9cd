//! `bench fs`'s table, JSON and targets.

use super::{BlkRow, Device, FsPart, Report, Timing};
use crate::peers::{Transport, Vmm};
use crate::report::{targets_json, targets_text, Target};
use crate::stats::median;
use serde_json::{json, Value};

/// One virtio-fs row: what it is, its JSON name, its unit and each side's rates.
struct FsRow {
    what: String,
    key: &'static str,
    unit: &'static str,
    host: Vec<f64>,
    guest: Vec<f64>,
}

impl FsRow {
    fn ratio(&self) -> f64 {
        median(&self.guest) / median(&self.host)
    }
}

fn fs_rows(fs: &FsPart) -> Vec<FsRow> {
    let p = &fs.params;
    let rates = |t: &[Timing], unit: f64| t.iter().map(|t| t.rate(unit)).collect::<Vec<f64>>();
    let row = |what: String, key, unit, pick: fn(&super::Passes) -> &[Timing], per: f64| FsRow {
        what,
        key,
        unit,
        host: rates(pick(&fs.host), per),
        guest: rates(pick(&fs.guest), per),
    };
    let (mib, n, bytes) = (p.file_mib, p.files, p.file_bytes);
    vec![
        row(format!("sequential read {mib} MiB, host cache dropped"), "seq_read_cold", "MB/s", |p| &p.seq_cold, 1e6),
        row(format!("sequential read {mib} MiB, host cache warm"), "seq_read_warm", "MB/s", |p| &p.seq_warm, 1e6),
        row(format!("create {n} files of {bytes} bytes"), "create", "files/s", |p| &p.create, 1.0),
        row(format!("stat {n} files"), "stat", "stats/s", |p| &p.stat, 1.0),
        row(format!("remove {n} files"), "remove", "files/s", |p| &p.remove, 1.0),
    ]
}

fn blk_median(row: &BlkRow) -> f64 {
    median(&row.samples.iter().map(|s| s.iops).collect::<Vec<_>>())
}

/// The worst run's steady-state exits per request, with the exits and requests behind it.
fn worst_steady(row: &BlkRow) -> Option<&super::Sample> {
    row.samples.iter().max_by(|a, b| a.steady_exits_per_request().total_cmp(&b.steady_exits_per_request()))
}

fn find(rows: &[BlkRow], vmm: Vmm, device: Device, t: Transport) -> Option<&BlkRow> {
    rows.iter().find(|r| r.vmm == vmm && r.device == device && r.transport == t)
}

impl Report {
    pub fn text(&self) -> String {
        let mut s = String::new();
        if let Some(fs) = &self.fs {
            s += &format!(
                "virtio-fs ({}, --cache={}, {}) against the host's own filesystem, the same files; runs: {} (medians)\n",
                fs.virtiofsd,
                super::guest::CACHE,
                fs.transport.name(),
                fs.params.runs
            );
            if let Some(why) = &fs.sizes {
                s += &format!("  sizes: {why}\n");
            }
            s += &format!("  {:<44} {:>12} {:>12} {:>10}\n", "", "host", "guest", "guest/host");
            for r in fs_rows(fs) {
                let (h, g) = (median(&r.host), median(&r.guest));
                let x = format!("{}x", sig3(r.ratio()));
                s += &format!("  {:<44} {:>12} {:>12} {:>10}\n", r.what, rate(h, r.unit), rate(g, r.unit), x);
            }
        }
        if !self.blk.is_empty() {
            s += &format!(
                "blkbench 4K random reads at QD{}, {} MiB image, {} s runs; vhost-user on qemu-storage-daemon \
                 (cache.direct=on, aio=io_uring{})\n",
                crate::peers::io::QD,
                self.image_mib,
                self.io_seconds,
                self.backend_cpu.map_or(String::new(), |cpu| format!(", pinned to CPU {cpu}"))
            );
            s += &format!(
                "  {:<12} {:<15} {:<5} {:>10} {:>26}\n",
                "vmm", "device", "via", "IOPS", "exits/request, steady"
            );
            for r in &self.blk {
                let Some(worst) = worst_steady(r) else {
                    let why = r.skipped.as_deref().unwrap_or("no runs");
                    s += &format!(
                        "  {:<12} {:<15} {:<5} skipped: {why}\n",
                        r.vmm.name(),
                        r.device.name(),
                        r.transport.name()
                    );
                    continue;
                };
                let steady = format!(
                    "{:.5} ({} in {:.0})",
                    worst.steady_exits_per_request(),
                    worst.window_exits,
                    worst.window_requests
                );
                s += &format!(
                    "  {:<12} {:<15} {:<5} {:>10.0} {:>26}\n",
                    r.vmm.name(),
                    r.device.name(),
                    r.transport.name(),
                    blk_median(r),
                    steady
                );
            }
        }
        s + &targets_text(&self.targets())
    }

    pub fn targets(&self) -> Vec<Target> {
        let mut targets = Vec::new();
        let transports: Vec<Transport> = self.blk.iter().fold(Vec::new(), |mut v, r| {
            if !v.contains(&r.transport) {
                v.push(r.transport);
            }
            v
        });
        for &t in &transports {
            for device in [Device::VhostUser, Device::VirtioBlk] {
                let what = format!(
                    "exitless {} over {}: userspace exits per request, steady state = 0",
                    device.name(),
                    t.name()
                );
                targets.push(
                    match find(&self.blk, Vmm::Exitless, device, t).and_then(|r| worst_steady(r).map(|w| (r, w))) {
                        Some((r, w)) => {
                            let exits: u64 = r.samples.iter().map(|s| s.window_exits).sum();
                            let measured = format!(
                                "{:.5} (worst of {}; {exits} exits in all)",
                                w.steady_exits_per_request(),
                                r.samples.len()
                            );
                            Target::new(what, measured, exits == 0)
                        }
                        None => Target::new(what, not_run(&self.blk, Vmm::Exitless, device, t), false),
                    },
                );
            }
            let what = format!("exitless vhost-user-blk IOPS >= Firecracker's, same backend, over {}", t.name());
            let ours = find(&self.blk, Vmm::Exitless, Device::VhostUser, t).filter(|r| !r.samples.is_empty());
            let theirs = find(&self.blk, Vmm::Firecracker, Device::VhostUser, t).filter(|r| !r.samples.is_empty());
            targets.push(match (ours, theirs) {
                (Some(a), Some(b)) => {
                    let (x, y) = (blk_median(a), blk_median(b));
                    Target::new(what, format!("{:.2}x ({x:.0} vs {y:.0})", x / y), x >= y)
                }
                (None, _) => Target::new(what, not_run(&self.blk, Vmm::Exitless, Device::VhostUser, t), false),
                (_, None) => Target::new(what, not_run(&self.blk, Vmm::Firecracker, Device::VhostUser, t), false),
            });
        }
        if let Some(fs) = &self.fs {
            // No bar for virtio-fs: the ratios are reported, each met when both sides
            // made it with the same data (checksum, sizes: checked before a report exists).
            for r in fs_rows(fs) {
                let what = format!("virtio-fs {}: guest/host reported", r.key.replace('_', " "));
                let x = r.ratio();
                targets.push(Target::new(what, format!("{}x", sig3(x)), x.is_finite()));
            }
        }
        targets
    }

    pub fn json(&self) -> Value {
        let fs = self.fs.as_ref().map(|fs| {
            let rows: Vec<Value> = fs_rows(fs)
                .iter()
                .map(|r| {
                    json!({"pass": r.key, "what": r.what, "unit": r.unit, "host": median(&r.host), "guest": median(&r.guest),
                           "ratio": r.ratio(), "host_runs": r.host, "guest_runs": r.guest})
                })
                .collect();
            json!({
                "virtiofsd": fs.virtiofsd, "cache": super::guest::CACHE, "transport": fs.transport.name(),
                "file_mib": fs.params.file_mib, "files": fs.params.files, "file_bytes": fs.params.file_bytes,
                "runs": fs.params.runs, "sizes_note": fs.sizes, "checksum": fs.host.checksum.map(|c| format!("{c:016x}")), "rows": rows,
            })
        });
        let blk: Vec<Value> = self
            .blk
            .iter()
            .map(|r| {
                let runs: Vec<Value> = r
                    .samples
                    .iter()
                    .map(|s| {
                        json!({"iops": s.iops, "requests": s.requests, "window_exits": s.window_exits,
                               "window_requests": s.window_requests, "run_exits_published": s.run_exits, "vmm_cpu_s": s.vmm_cpu_s})
                    })
                    .collect();
                json!({"vmm": r.vmm.name(), "device": r.device.name(), "transport": r.transport.name(),
                       "iops": blk_median(r), "exits_per_request_steady": worst_steady(r).map(|w| w.steady_exits_per_request()),
                       "runs": runs, "skipped": r.skipped})
            })
            .collect();
        json!({
            "lab": "fs",
            "fs": fs,
            "blk": {"qd": crate::peers::io::QD, "block_bytes": 4096, "image_mib": self.image_mib,
                    "io_seconds": self.io_seconds, "backend_cpu": self.backend_cpu, "rows": blk},
            "targets": targets_json(&self.targets()),
        })
    }
}

fn not_run(rows: &[BlkRow], vmm: Vmm, device: Device, t: Transport) -> String {
    match find(rows, vmm, device, t).and_then(|r| r.skipped.as_deref()) {
        Some(why) => format!("not run: {}", why.chars().take(60).collect::<String>()),
        None => "not run".into(),
    }
}

fn rate(v: f64, unit: &str) -> String {
    if unit == "MB/s" {
        format!("{} {unit}", sig3(v))
    } else {
        format!("{}/s", sig3(v))
    }
}

/// `v` with three significant digits (no fewer than none after the point): a nested
/// host's guest rates are thousands of times below the host's.
fn sig3(v: f64) -> String {
    if !v.is_finite() || v == 0.0 {
        return format!("{v}");
    }
    let decimals = (2 - v.abs().log10().floor() as i32).clamp(0, 12) as usize;
    format!("{v:.decimals$}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn three_significant_digits() {
        assert_eq!(super::sig3(9290.4), "9290");
        assert_eq!(super::sig3(12.345), "12.3");
        assert_eq!(super::sig3(0.000_171_6), "0.000172");
        assert_eq!(super::sig3(0.0), "0");
    }
}
