//! The exit profile printed after a run, and its JSON form.

use exitless_vmm::stats::Completed;
use exitless_vmm::stats::{DeviceCounts, ExitKind, ExitStats};
use exitless_vmm::vcpu::samples::{GuestSamples, Symbols};
use exitless_vmm::RunReport;
use serde_json::{json, Map, Value};
use std::fmt::Write;

fn devices(report: &RunReport) -> Vec<(String, DeviceCounts)> {
    let mut rows: Vec<_> = report.devices.iter().cloned().zip(report.stats.devices.iter().copied()).collect();
    rows.push(("unclaimed-pio".into(), report.stats.unclaimed_pio));
    rows.push(("unclaimed-mmio".into(), report.stats.unclaimed_mmio));
    rows
}

fn median_ns(report: &RunReport, kind: ExitKind) -> Option<f64> {
    report.stats.median_cycles(&[kind]).map(|c| c * 1e9 / report.tsc_hz)
}

/// A short human table: exits by reason with the VMM's median time, then devices.
pub fn profile(report: &RunReport) -> String {
    let mut s = String::new();
    let how = report.stop.map_or("guest stopped".into(), |stop| stop.describe());
    let _ = writeln!(s, "\nexitless: exit profile: {how} after {:.1} ms", report.elapsed.as_secs_f64() * 1e3);
    let _ = writeln!(s, "  host profile: {}", report.host_profile);
    let _ = writeln!(s, "  {:<16} {:>10} {:>16}", "exit", "count", "vmm ns (median)");
    for kind in ExitKind::ALL {
        let count = report.stats.exits(kind);
        if count > 0 {
            let ns = median_ns(report, kind).map_or("-".into(), |n| format!("{n:.0}"));
            let _ = writeln!(s, "  {:<16} {:>10} {:>16}", kind.name(), count, ns);
        }
    }
    if report.vcpus.len() > 1 {
        for (id, v) in report.vcpus.iter().enumerate() {
            let _ = writeln!(s, "  {:<16} {:>10}", format!("vcpu{id} exits"), v.total_exits());
        }
    }
    for (kind, count) in Completed::ALL.iter().zip(report.stats.completed) {
        if count > 0 {
            let _ =
                writeln!(s, "  {:<16} {:>10}   (KVM could not emulate it; exitless completed it)", kind.name(), count);
        }
    }
    let _ = writeln!(s, "  {:<16} {:>10} {:>16}", "device", "reads", "writes");
    for (name, c) in devices(report) {
        let _ = writeln!(s, "  {:<16} {:>10} {:>16}", name, c.reads, c.writes);
    }
    for (tap, n) in &report.nets {
        let _ = writeln!(
            s,
            "  virtio-net ({tap}): tx {} frames ({} copied, {} dropped), rx {} ({} dropped), {} bad chains, {} kicks, {} irqs, throttled tx {} rx {}",
            n.tx_frames, n.tx_copied, n.tx_dropped, n.rx_frames, n.rx_dropped, n.bad_chains, n.kicks, n.irqs,
            n.tx_throttled, n.rx_throttled
        );
        poll_line(&mut s, "virtio-net", &n.poll);
    }
    for (name, _, d) in &report.drives {
        let _ = writeln!(
            s,
            "  {name} ({}): {} reads ({} KiB), {} writes ({} KiB), {} flushes, {} discards, {} errors, {} malformed, {} kicks, {} irqs, {} throttled",
            d.engine,
            d.reads,
            d.read_bytes >> 10,
            d.writes,
            d.write_bytes >> 10,
            d.flushes,
            d.discards,
            d.errors,
            d.bad_requests,
            d.kicks,
            d.irqs,
            d.throttled
        );
        poll_line(&mut s, name, &d.poll);
    }
    if let Some(m) = report.vmm_memory {
        let _ =
            writeln!(s, "  vmm memory beyond guest RAM: {} KiB resident, {} KiB proportional", m.rss_kib, m.pss_kib);
    }
    s
}

/// How many of the top places the sample table shows, per vCPU.
const TOP_SAMPLES: usize = 12;

fn sample_rows(samples: &GuestSamples, symbols: &Symbols) -> Vec<(String, u64)> {
    let mut rows = samples.top(|rip| if symbols.is_empty() { format!("{rip:#x}") } else { symbols.name(rip) });
    rows.truncate(TOP_SAMPLES);
    rows
}

/// Where each vCPU was when sampled (`--sample-guest`), busiest first.
pub fn samples(report: &RunReport, symbols: &Symbols) -> String {
    let mut s = String::new();
    for (id, v) in report.samples.iter().enumerate() {
        let _ = writeln!(s, "exitless: vcpu{id}: {} guest samples", v.total);
        for (place, n) in sample_rows(v, symbols) {
            let _ = writeln!(s, "  {:>6.1}%  {place}", n as f64 * 100.0 / v.total.max(1) as f64);
        }
    }
    s
}

pub fn samples_json(report: &RunReport, symbols: &Symbols) -> Value {
    report
        .samples
        .iter()
        .map(|v| {
            let top: Vec<Value> =
                sample_rows(v, symbols).into_iter().map(|(p, n)| json!({"at": p, "samples": n})).collect();
            json!({"total": v.total, "top": top})
        })
        .collect()
}

/// A NIC's counters (MMDS's too, on a NIC that answers it).
fn net_json(n: &exitless_vmm::virtio::net::NetCounters) -> Value {
    json!({
        "tx_frames": n.tx_frames, "tx_bytes": n.tx_bytes, "tx_copied": n.tx_copied, "tx_dropped": n.tx_dropped,
        "rx_frames": n.rx_frames, "rx_dropped": n.rx_dropped, "bad_chains": n.bad_chains, "bad_headers": n.bad_headers,
        "mmds": {"frames_in": n.mmds.frames_in, "frames_out": n.mmds.frames_out, "requests": n.mmds.requests, "dropped": n.mmds.dropped},
        "kicks": n.kicks, "irqs": n.irqs, "tx_throttled": n.tx_throttled, "rx_throttled": n.rx_throttled,
        "poll": poll_json(&n.poll),
    })
}

/// Exit counts by reason, for the total or one vCPU.
fn exit_counts(stats: &ExitStats) -> Map<String, Value> {
    ExitKind::ALL.iter().filter(|&&k| stats.exits(k) > 0).map(|&k| (k.name().into(), json!(stats.exits(k)))).collect()
}

pub fn json(report: &RunReport) -> Value {
    let exits = exit_counts(&report.stats);
    let vmm_ns: Map<String, Value> = exits
        .keys()
        .filter_map(|k| ExitKind::ALL.iter().find(|e| e.name() == k))
        .map(|&k| (k.name().into(), json!(median_ns(report, k))))
        .collect();
    let vcpus: Vec<Value> = report.vcpus.iter().map(|v| json!({"exits": exit_counts(v)})).collect();
    let completed: Map<String, Value> = Completed::ALL
        .iter()
        .zip(report.stats.completed)
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| (k.name().into(), json!(n)))
        .collect();
    let devices: Map<String, Value> =
        devices(report).into_iter().map(|(n, c)| (n, json!({"reads": c.reads, "writes": c.writes}))).collect();
    json!({
        "exit_status": report.exit_status,
        "stop": report.stop.map(|s| match s {
            exitless_vmm::run_control::GuestStop::Exit(_) => "exit",
            exitless_vmm::run_control::GuestStop::PowerOff => "poweroff",
            exitless_vmm::run_control::GuestStop::Reset => "reset",
        }),
        "host_profile": report.host_profile,
        "exits": exits,
        "vcpus": vcpus,
        "completed_instructions": completed,
        "devices": devices,
        "vmm_ns_per_exit_median": vmm_ns,
        "elapsed_ms": report.elapsed.as_secs_f64() * 1e3,
        "vmm_rss_kib": report.vmm_memory.map(|m| m.rss_kib),
        "vmm_pss_kib": report.vmm_memory.map(|m| m.pss_kib),
        // The first NIC (what the labs read), then every NIC by tap name.
        "net": report.nets.first().map(|(_, n)| net_json(n)),
        "nets": report.nets.iter().map(|(tap, n)| (tap.clone(), net_json(n))).collect::<Map<String, Value>>(),
        "drives": report.drives.iter().map(|(name, _, d)| (name.clone(), json!({
            "reads": d.reads, "writes": d.writes, "read_bytes": d.read_bytes, "write_bytes": d.write_bytes,
            "flushes": d.flushes, "discards": d.discards, "errors": d.errors, "bad_requests": d.bad_requests,
            "kicks": d.kicks, "irqs": d.irqs, "throttled": d.throttled, "engine": d.engine,
            "poll": poll_json(&d.poll),
        }))).collect::<Map<String, Value>>(),
    })
}

/// A device thread's polling (crate::poll), one line of the exit profile.
fn poll_line(s: &mut String, device: &str, p: &exitless_vmm::poll::PollCounts) {
    let _ = writeln!(
        s,
        "  {device} thread: {} polls found work, {} sleeps, {} wake-ups, {} us polling in vain",
        p.polls_found_work, p.sleeps, p.wakeups, p.idle_poll_us
    );
}

fn poll_json(p: &exitless_vmm::poll::PollCounts) -> Value {
    json!({"polls_found_work": p.polls_found_work, "sleeps": p.sleeps, "wakeups": p.wakeups,
           "idle_poll_us": p.idle_poll_us})
}
