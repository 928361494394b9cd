//! `exitless top --api-sock PATH`: a live view of a running microVM's exits, refreshed
//! like `kvm_stat`: per exit reason and per device, the rate over the last interval and
//! the total, from the API's `GET /exits`.

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// One `GET /exits`.
pub fn fetch(sock: &Path) -> Result<Value, String> {
    exitless_api_client::expect_ok(sock, "GET", "/exits", None)?.ok_or_else(|| "the API's /exits is not JSON".into())
}

/// Counters by name: `exit <reason>` and `<device> reads|writes`.
fn counters(v: &Value) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    if let Some(exits) = v["exits"].as_object() {
        for (k, n) in exits {
            out.insert(format!("exit {k}"), n.as_u64().unwrap_or(0));
        }
    }
    if let Some(devices) = v["devices"].as_object() {
        for (name, d) in devices {
            for dir in ["reads", "writes"] {
                out.insert(format!("{name} {dir}"), d[dir].as_u64().unwrap_or(0));
            }
        }
    }
    out
}

/// The screen for one interval: rows with a rate or a total, busiest first.
pub fn screen(before: &Value, now: &Value, seconds: f64) -> String {
    let (a, b) = (counters(before), counters(now));
    let mut rows: Vec<(String, f64, u64)> = b
        .iter()
        .map(|(k, &n)| (k.clone(), n.saturating_sub(a.get(k).copied().unwrap_or(0)) as f64 / seconds, n))
        .filter(|(_, rate, total)| *rate > 0.0 || *total > 0)
        .collect();
    rows.sort_by(|x, y| y.1.total_cmp(&x.1).then(y.2.cmp(&x.2)));
    let mut s = format!(
        "exitless top: {} ({} vCPUs, up {:.1} s)\n{:<32} {:>12} {:>14}\n",
        now["state"].as_str().unwrap_or("?"),
        now["vcpus"].as_array().map_or(0, Vec::len),
        now["uptime_ms"].as_f64().unwrap_or(0.0) / 1e3,
        "event",
        "per second",
        "total"
    );
    for (name, rate, total) in rows {
        s += &format!("{name:<32} {rate:>12.0} {total:>14}\n");
    }
    if let Some(ns) = now["vmm_ns_per_exit_median"].as_object() {
        let medians: Vec<String> = ns.iter().map(|(k, v)| format!("{k} {:.0} ns", v.as_f64().unwrap_or(0.0))).collect();
        s += &format!("VMM time per exit (median): {}\n", medians.join(", "));
    }
    s
}

pub fn run(sock: &Path, interval: Duration, iterations: Option<u64>) -> Result<(), String> {
    let mut before = fetch(sock)?;
    let mut at = Instant::now();
    let mut n = 0;
    loop {
        std::thread::sleep(interval);
        let now = fetch(sock).map_err(|e| format!("the microVM went away: {e}"))?;
        let seconds = at.elapsed().as_secs_f64();
        at = Instant::now();
        let clear = if std::io::IsTerminal::is_terminal(&std::io::stdout()) { "\x1b[H\x1b[2J" } else { "" };
        let mut out = std::io::stdout().lock();
        write!(out, "{clear}{}", screen(&before, &now, seconds)).map_err(|e| format!("cannot write: {e}"))?;
        out.flush().map_err(|e| format!("cannot write: {e}"))?;
        before = now;
        n += 1;
        if iterations.is_some_and(|i| n >= i) {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rates_are_differences_over_the_interval_busiest_first() {
        let a = json!({"exits": {"io_out": 100}, "devices": {"serial": {"reads": 0, "writes": 100}}});
        let b = json!({"state": "Running", "vcpus": [{}], "uptime_ms": 2000.0,
                       "exits": {"io_out": 300, "mmio_write": 50},
                       "devices": {"serial": {"reads": 0, "writes": 300}}});
        let s = screen(&a, &b, 2.0);
        let lines: Vec<&str> = s.lines().collect();
        assert!(lines[0].contains("Running (1 vCPUs"), "{s}");
        assert!(lines[2].starts_with("exit io_out") && lines[2].contains(" 100 ") && lines[2].ends_with(" 300"), "{s}");
        assert!(s.contains("exit mmio_write") && s.contains("serial writes"), "{s}");
        assert!(!s.contains("serial reads"), "a counter at 0 is not shown: {s}");
    }
}
