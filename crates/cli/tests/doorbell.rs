//! The doorbell lab end to end, in real KVM: every wiring delivers every ring, and KVM's
//! ioeventfd matching rules hold (wrong size or value exits to userspace, 64-bit datamatch
//! does not).

mod common;
use common::*;
use serde_json::Value;

fn bench(args: &[&str]) -> Value {
    let path = temp_path("doorbell.json");
    let svg = path.with_extension("svg");
    let mut all = vec!["bench", "doorbell", "--json", path.to_str().unwrap(), "--svg", svg.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = exitless(&all);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("exits/ring"), "{}", stdout(&out));
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn row<'a>(json: &'a Value, path: &str) -> &'a Value {
    json["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["path"] == path)
        .unwrap_or_else(|| panic!("no row {path}: {json}"))
}

#[test]
fn every_path_delivers_every_ring() {
    if !kvm_or_skip("every_path_delivers_every_ring") {
        return;
    }
    let json = bench(&["--iters", "300", "--repeat", "2"]);
    assert_eq!(json["bench"], "doorbell");
    let rows = json["rows"].as_array().unwrap();
    assert!(rows.len() >= 9, "coalesced rows may be skipped, the rest must be there: {json}");
    for r in rows {
        assert_eq!(r["count_ok"], true, "{r}");
        assert_eq!(r["rings"], 300);
        assert!(r["iops"].as_f64().unwrap() > 0.0 && r["rtt_us"].as_f64().unwrap() > 0.0, "{r}");
        for field in ["path", "iops", "rtt_us", "exits_per_op", "vmm_ns_per_exit", "rings", "count_ok"] {
            assert!(r.get(field).is_some(), "{field} missing in {r}");
        }
    }
    for exits_one in ["raw-floor-pio", "userspace-pio", "userspace-mmio"] {
        assert_eq!(row(&json, exits_one)["exits_per_op"], 1.0, "{exits_one}");
    }
    for no_exit in ["ioeventfd-pio", "ioeventfd-pio-datamatch", "ioeventfd-mmio", "ioeventfd-mmio-fast", "polled"] {
        assert_eq!(row(&json, no_exit)["exits_per_op"], 0.0, "{no_exit}");
    }
    assert!(row(&json, "userspace-pio")["vmm_ns_per_exit"].as_f64().unwrap() > 0.0);
    // The userspace-mmio row is the baseline of the speedup column.
    assert_eq!(row(&json, "userspace-mmio")["speedup_vs_userspace_mmio"], 1.0);
}

#[test]
fn kvm_matching_rules_hold_for_ioeventfds() {
    if !kvm_or_skip("kvm_matching_rules_hold_for_ioeventfds") {
        return;
    }
    let checks = "check-pio-wrong-size,check-mmio-wrong-size,check-pio-datamatch-miss,check-mmio-datamatch64";
    let json = bench(&["--iters", "200", "--repeat", "1", "--paths", checks]);
    for (path, exits) in [
        ("check-pio-wrong-size", 1.0),
        ("check-mmio-wrong-size", 1.0),
        ("check-pio-datamatch-miss", 1.0),
        ("check-mmio-datamatch64", 0.0),
    ] {
        let r = row(&json, path);
        assert_eq!(r["exits_per_op"], exits, "{r}");
        assert_eq!(r["count_ok"], true, "a ring that exits still reaches the device: {r}");
    }
}

#[test]
fn the_doorbell_payload_alone_says_it_needs_the_lab() {
    if !kvm_or_skip("the_doorbell_payload_alone_says_it_needs_the_lab") {
        return;
    }
    let (out, json) = run_json(&["--payload", "doorbell"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("no lab answered"), "{}", stdout(&out));
    assert_eq!(json["exit_status"], 0);
}

#[test]
fn bad_doorbell_arguments_are_one_line_errors() {
    for args in [&["--paths", "nope"][..], &["--cpl", "1"], &["--iters", "0"], &["--repeat", "x"]] {
        let mut all = vec!["bench", "doorbell"];
        all.extend_from_slice(args);
        assert_one_line_error(&all);
    }
}
