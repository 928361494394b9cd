//! `bench peers` with exitless alone (the peers are not built in CI): the table's rows, the
//! fleet and I/O rows, the JSON's fields and targets (the peers' skipped, not passed) and
//! the chart.

mod common;
use common::*;

#[test]
fn peers_measures_exitless_and_skips_missing_peers() {
    if !kvm_or_skip("peers_measures_exitless_and_skips_missing_peers") {
        return;
    }
    let dir = tempdir();
    let path = dir.join("peers.json");
    let svg = dir.join("peers.svg");
    let args = ["--runs", "2", "--fleet", "3", "--io-seconds", "0.3", "--svg", svg.to_str().unwrap()];
    let out = exitless(&[&["bench", "peers", "--json", path.to_str().unwrap()][..], &args].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    for row in ["spawn to API ready", "spawn to the guest's first line", "resident beyond guest RAM", "anonymous"] {
        assert!(table.contains(row), "{row}: {table}");
    }
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let me = &json["vmms"]["exitless"];
    let first = me["first_line_ms"].as_f64().unwrap();
    let ready = me["api_ready_ms"].as_f64().unwrap();
    assert!(ready > 0.0 && first > ready, "the API is ready before the guest runs: {me}");
    assert!(me["rss_kib"].as_f64().unwrap() > 0.0, "{me}");
    // Three at once are timed (how much longer they take than one is the bench's to say:
    // other runs measured it, under other load), and share their binary's pages.
    assert!(me["fleet_all_running_ms"].as_f64().unwrap() > 0.0, "{me}");
    assert!(me["fleet_pss_kib"].as_f64().unwrap() < me["fleet_rss_kib"].as_f64().unwrap(), "{me}");
    // The payloads ran on exitless's own devices over both transports, every block
    // verified, and each request's userspace exits counted from Firecracker's metrics.
    for t in ["mmio", "pci"] {
        assert!(me[format!("blk_randread_4k_qd32_iops_{t}")].as_f64().unwrap() > 0.0, "{me}");
        assert!(me[format!("nettx_64k_gbps_{t}")].as_f64().unwrap() > 0.0, "{me}");
        assert!(me[format!("nettx_64k_gbps_per_cpu_s_{t}")].as_f64().unwrap() > 0.0, "{me}");
    }
    let rows = json["io_rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "blkbench and nettx on each transport: {json}");
    for row in rows {
        // Kicks are ioeventfds on both transports: what exits is the driver's setup and the
        // console's characters, a fixed budget (about 20 to 230 here) however many
        // requests the run's time let the guest make.
        assert!(row["userspace_exits_per_request"].as_f64().is_some(), "{row}");
        assert!(row["userspace_exits"].as_f64().unwrap() <= 400.0, "{row}");
        assert!(row["transport"] == "mmio" || row["transport"] == "pci", "{row}");
    }
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg") && chart.contains("\nexitless\n"), "{chart}");
    assert!(json["vmms"].get("firecracker").is_none(), "{json}");
    let targets = json["targets"].as_array().unwrap();
    let target = |name: &str| targets.iter().find(|t| t["target"].as_str().unwrap().starts_with(name)).unwrap();
    assert!(target("spawn to first line")["met"].is_null(), "no Firecracker: skipped, not met: {json}");
    for t in ["mmio", "pci"] {
        let fewer = target(&format!("blkbench userspace exits per request over {t}"));
        assert!(fewer["met"].is_null(), "no Firecracker: skipped, not met: {json}");
    }
    assert!(target("nettx 64K Gb/s per VMM CPU-second over pci")["met"].is_null(), "no peer: {json}");
    let out = exitless(&["bench", "peers", "--firecracker", "/nonexistent/firecracker"]);
    assert!(!out.status.success());
    assert_eq!(stderr(&out).trim().lines().count(), 1, "one line: {}", stderr(&out));
}
