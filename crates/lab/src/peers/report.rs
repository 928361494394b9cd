//! The peers table, its targets, its JSON and its chart.

use super::{Column, FleetSample, IoSample, Report, Sample, Transport, Vmm};
use crate::stats::median;
use serde_json::{json, Value};
use std::fmt::Write;

/// A row: its label, its JSON field, its decimals and how to read it from a column.
struct Row {
    label: String,
    field: String,
    digits: usize,
    value: Box<dyn Fn(&Column) -> f64>,
}

fn start_row(label: &str, field: &'static str, digits: usize, f: fn(&Sample) -> f64) -> Row {
    Row { label: label.into(), field: field.into(), digits, value: Box::new(move |c| med(c.starts.iter().map(f))) }
}

fn fleet_row(label: String, field: &'static str, f: fn(&FleetSample) -> f64) -> Row {
    Row { label, field: field.into(), digits: 0, value: Box::new(move |c| med(c.fleets.iter().map(f))) }
}

/// The median of `f` over a column's blkbench (`blk`) or nettx runs over transport `t`.
fn io_median(c: &Column, blk: bool, t: Transport, f: &dyn Fn(&IoSample) -> Option<f64>) -> f64 {
    med(if blk { &c.blk } else { &c.net }.iter().filter(|s| s.transport == t).filter_map(f))
}

/// An I/O row over transport `t`: its label and field name carry the transport.
fn io_row(t: Transport, label: &str, field: &str, digits: usize, blk: bool, f: fn(&IoSample) -> Option<f64>) -> Row {
    let label = format!("{label} [{}]", t.name());
    let value = move |c: &Column| io_median(c, blk, t, &f);
    Row { label, field: format!("{field}_{}", t.name()), digits, value: Box::new(value) }
}

fn med(values: impl Iterator<Item = f64>) -> f64 {
    median(&values.collect::<Vec<_>>())
}

impl Report {
    fn rows(&self) -> Vec<Row> {
        let mut rows = vec![
            start_row("spawn to API ready (ms)", "api_ready_ms", 1, |s| s.api_ready_ms),
            start_row("spawn to the guest's first line (ms)", "first_line_ms", 1, |s| s.first_line_ms),
            start_row("resident beyond guest RAM (KiB)", "rss_kib", 0, |s| s.rss_kib as f64),
            start_row("proportional beyond guest RAM (KiB)", "pss_kib", 0, |s| s.pss_kib as f64),
            start_row("anonymous beyond guest RAM (KiB)", "anon_kib", 0, |s| s.anon_kib as f64),
        ];
        if self.fleet > 0 {
            let n = self.fleet;
            rows.extend([
                fleet_row(format!("{n} at once: until all run (ms)"), "fleet_all_running_ms", |f| f.all_running_ms),
                fleet_row(format!("{n} at once: resident per VM (KiB)"), "fleet_rss_kib", |f| f.rss_kib),
                fleet_row(format!("{n} at once: proportional per VM (KiB)"), "fleet_pss_kib", |f| f.pss_kib),
                fleet_row(format!("{n} at once: anonymous per VM (KiB)"), "fleet_anon_kib", |f| f.anon_kib),
            ]);
        }
        if self.io_seconds > 0.0 {
            for &t in &self.transports {
                rows.extend([
                    io_row(t, "blkbench randread 4K qd32 (IOPS)", "blk_randread_4k_qd32_iops", 0, true, |s| {
                        Some(s.per_second)
                    }),
                    io_row(
                        t,
                        "blkbench userspace exits per request",
                        "blk_userspace_exits_per_request",
                        5,
                        true,
                        |s| s.exits_per_request,
                    ),
                    io_row(t, "nettx 64K (Gb/s)", "nettx_64k_gbps", 2, false, |s| Some(s.bytes_per_second * 8.0 / 1e9)),
                    io_row(t, "nettx 64K Gb/s per VMM CPU-second", "nettx_64k_gbps_per_cpu_s", 1, false, |s| {
                        Some(s.gbps_per_cpu_second())
                    }),
                    io_row(t, "nettx 64K VMM CPU (%)", "nettx_64k_vmm_cpu_pct", 0, false, |s| {
                        Some(s.vmm_cpu_s / s.seconds.max(1e-9) * 100.0)
                    }),
                    io_row(t, "nettx userspace exits per frame", "nettx_userspace_exits_per_request", 5, false, |s| {
                        s.exits_per_request
                    }),
                ]);
            }
        }
        rows
    }

    fn column(&self, vmm: Vmm) -> Option<&Column> {
        self.columns.iter().find(|c| c.vmm == vmm)
    }

    /// The targets: start and resident memory at most Firecracker's, anonymous
    /// memory at most 300 KiB, I/O at least the better peer's over PCI, and on each
    /// transport Firecracker ran, fewer userspace exits per request than Firecracker's and
    /// throughput at least its.
    pub fn targets(&self) -> Vec<(String, String, Option<bool>)> {
        let me = self.column(Vmm::Exitless);
        let of = |c: Option<&Column>, f: &dyn Fn(&Column) -> f64| c.map(f).filter(|v| !v.is_nan());
        let fc = self.column(Vmm::Firecracker);
        let vs_fc = |name: &str, f: &dyn Fn(&Column) -> f64, unit: &str| {
            let what = format!("{name} <= Firecracker's");
            match (of(me, f), of(fc, f)) {
                (Some(mine), Some(theirs)) => (what, format!("{mine:.1} vs {theirs:.1} {unit}"), Some(mine <= theirs)),
                _ => (what, "no Firecracker given".into(), None),
            }
        };
        let first = |c: &Column| med(c.starts.iter().map(|s| s.first_line_ms));
        let rss = |c: &Column| med(c.starts.iter().map(|s| s.rss_kib as f64));
        let anon = of(me, &|c: &Column| med(c.starts.iter().map(|s| s.anon_kib as f64)));
        // Start: at or below the fastest peer measured (issue #39), not only Firecracker.
        let peers = [Vmm::Firecracker, Vmm::CloudHypervisor].map(|v| (v, of(self.column(v), &first)));
        let fastest = peers.iter().filter_map(|&(v, t)| t.map(|t| (v, t))).min_by(|a, b| a.1.total_cmp(&b.1));
        let spawn = match (of(me, &first), fastest) {
            (Some(mine), Some((v, theirs))) => (
                format!("spawn to first line <= the fastest peer's ({})", v.name()),
                format!("{mine:.1} vs {theirs:.1} ms"),
                Some(mine <= theirs),
            ),
            _ => ("spawn to first line <= the fastest peer's".into(), "no peer given".into(), None),
        };
        let mut targets = vec![
            spawn,
            vs_fc("resident beyond guest RAM", &rss, "KiB"),
            (
                "anonymous beyond guest RAM <= 300 KiB".into(),
                anon.map_or("-".into(), |a| format!("{a:.0} KiB")),
                anon.map(|a| a <= 300.0),
            ),
        ];
        if self.io_seconds > 0.0 {
            for &t in &self.transports {
                let name = t.name();
                for blk in [true, false] {
                    let what = if blk { "blkbench" } else { "nettx" };
                    let exits = move |c: &Column| io_median(c, blk, t, &|s| s.exits_per_request);
                    let throughput = move |c: &Column| io_median(c, blk, t, &|s| Some(s.bytes_per_second * 8.0 / 1e9));
                    let fewer = format!("{what} userspace exits per request over {name} < Firecracker's");
                    targets.push(match (of(me, &exits), of(fc, &exits)) {
                        (Some(mine), Some(theirs)) => (fewer, format!("{mine:.5} vs {theirs:.5}"), Some(mine < theirs)),
                        _ => (fewer, "not run by both".into(), None),
                    });
                    let more = format!("{what} Gb/s over {name} >= Firecracker's");
                    targets.push(match (of(me, &throughput), of(fc, &throughput)) {
                        (Some(mine), Some(theirs)) => {
                            (more, format!("{mine:.2} vs {theirs:.2} Gb/s"), Some(mine >= theirs))
                        }
                        _ => (more, "not run by both".into(), None),
                    });
                }
            }
            let peers: Vec<&Column> = self.columns.iter().filter(|c| c.vmm != Vmm::Exitless).collect();
            let vs_best = |name: &str, f: &dyn Fn(&Column) -> f64, unit: &str| {
                let what = format!("{name} >= the better peer's");
                let best =
                    peers.iter().filter_map(|c| of(Some(c), f).map(|v| (v, c.vmm))).max_by(|a, b| a.0.total_cmp(&b.0));
                match (of(me, f), best) {
                    (Some(mine), Some((theirs, who))) => {
                        (what, format!("{mine:.1} vs {theirs:.1} {unit} ({})", who.name()), Some(mine >= theirs))
                    }
                    _ => (what, "no peer ran it".into(), None),
                }
            };
            let pci = Transport::Pci;
            if self.transports.contains(&pci) {
                targets.push(vs_best(
                    "blkbench randread 4K qd32 IOPS over pci",
                    &|c| io_median(c, true, pci, &|s| Some(s.per_second)),
                    "IOPS",
                ));
                targets.push(vs_best(
                    "nettx 64K Gb/s per VMM CPU-second over pci",
                    &|c| io_median(c, false, pci, &|s| Some(s.gbps_per_cpu_second())),
                    "",
                ));
            }
        }
        targets
    }

    pub fn table(&self, runs: u32) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "peers lab: 1 vCPU, {} MiB, {runs} runs interleaved (medians)", self.mem_mib);
        let _ = write!(s, "  {:<42}", "");
        for c in &self.columns {
            let _ = write!(s, " {:>16}", c.vmm.name());
        }
        s.push('\n');
        for row in self.rows() {
            let _ = write!(s, "  {:<42}", row.label);
            for c in &self.columns {
                let v = (row.value)(c);
                let cell = if v.is_nan() { "-".to_string() } else { format!("{v:.*}", row.digits) };
                let _ = write!(s, " {cell:>16}");
            }
            s.push('\n');
        }
        for c in &self.columns {
            let _ = writeln!(s, "  {}: {}", c.vmm.name(), c.version);
            for why in &c.io_skipped {
                let _ = writeln!(s, "    I/O row skipped: {why}");
            }
            for why in &c.fleet_failed {
                let _ = writeln!(s, "    fleet round left out: {why}");
            }
        }
        let _ = writeln!(s, "targets:");
        for (target, measured, met) in self.targets() {
            let verdict = match met {
                Some(true) => "met",
                Some(false) => "NOT met",
                None => "skipped",
            };
            let _ = writeln!(s, "  {target:<46} {measured:>34}  {verdict}");
        }
        s
    }

    /// Grouped bars, one colour per VMM: a panel for start times, one for memory, one per
    /// I/O measure (each with its own unit).
    pub fn svg(&self) -> String {
        use crate::chart::Panel;
        let rows = self.rows();
        let triples = |pick: &dyn Fn(&Row) -> bool| -> Vec<(String, String, f64)> {
            rows.iter()
                .filter(|r| pick(r))
                .flat_map(|r| {
                    self.columns.iter().map(move |c| (r.label.clone(), c.vmm.name().to_string(), (r.value)(c)))
                })
                .collect()
        };
        let mut panels = vec![
            Panel::grouped("Start (shorter is better)", "ms", false, triples(&|r| r.field.ends_with("_ms"))),
            Panel::grouped(
                "Memory beyond guest RAM (less is better)",
                "KiB",
                false,
                triples(&|r| r.field.ends_with("_kib")),
            ),
        ];
        if self.io_seconds > 0.0 {
            panels.push(Panel::grouped(
                "virtio-blk (more is better)",
                "IOPS",
                false,
                triples(&|r| r.field.ends_with("_iops")),
            ));
            panels.push(Panel::grouped(
                "virtio-net TX (more is better)",
                "Gb/s per VMM CPU-second",
                false,
                triples(&|r| r.field.ends_with("per_cpu_s")),
            ));
        }
        crate::chart::draw(&panels)
    }

    pub fn json(&self) -> Value {
        let rows = self.rows();
        let vmms: serde_json::Map<String, Value> = self
            .columns
            .iter()
            .map(|c| {
                let mut fields = serde_json::Map::new();
                fields.insert("version".into(), json!(c.version));
                for row in &rows {
                    let v = (row.value)(c);
                    fields.insert(row.field.clone(), if v.is_nan() { Value::Null } else { json!(v) });
                }
                if !c.io_skipped.is_empty() {
                    fields.insert("io_skipped".into(), json!(c.io_skipped));
                }
                if !c.fleet_failed.is_empty() {
                    fields.insert("fleet_failed".into(), json!(c.fleet_failed));
                }
                (c.vmm.name().to_string(), Value::Object(fields))
            })
            .collect();
        let targets: Vec<Value> = self
            .targets()
            .into_iter()
            .map(|(target, measured, met)| json!({"target": target, "measured": measured, "met": met}))
            .collect();
        json!({
            "mem_mib": self.mem_mib,
            "fleet": self.fleet,
            "io_seconds": self.io_seconds,
            "vmms": vmms,
            "io_rows": self.io_rows(),
            "targets": targets,
        })
    }

    /// One row per VMM, transport and workload that ran: medians of its runs.
    fn io_rows(&self) -> Vec<Value> {
        let mut rows = Vec::new();
        for c in &self.columns {
            for &t in &self.transports {
                for (workload, blk) in [("blkbench", true), ("nettx", false)] {
                    let runs = if blk { &c.blk } else { &c.net }.iter().filter(|s| s.transport == t).count();
                    if runs == 0 {
                        continue;
                    }
                    let value = |f: &dyn Fn(&IoSample) -> Option<f64>| {
                        let v = io_median(c, blk, t, f);
                        if v.is_nan() {
                            Value::Null
                        } else {
                            json!(v)
                        }
                    };
                    rows.push(json!({
                        "vmm": c.vmm.name(),
                        "transport": t.name(),
                        "workload": workload,
                        "runs": runs,
                        "per_second": value(&|s| Some(s.per_second)),
                        "gbps": value(&|s| Some(s.bytes_per_second * 8.0 / 1e9)),
                        "userspace_exits_per_request": value(&|s| s.exits_per_request),
                        "userspace_exits": value(&|s| s.userspace_exits.map(|e| e as f64)),
                    }));
                }
            }
        }
        rows
    }
}
