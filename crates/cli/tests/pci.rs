//! PCI in real KVM: both config mechanisms, the mapped ECAM window, hostile config traffic.

mod common;
use common::*;
use serde_json::Value;

#[test]
fn the_pci_lab_sees_identical_bytes_and_the_expected_exits() {
    if !kvm_or_skip("the_pci_lab_sees_identical_bytes_and_the_expected_exits") {
        return;
    }
    let dir = tempdir();
    let (json_path, svg_path) = (dir.join("pci.json"), dir.join("pci.svg"));
    let out = exitless(&[
        "bench",
        "pci",
        "--reads",
        "400",
        "--json",
        json_path.to_str().unwrap(),
        "--svg",
        svg_path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("us/read"));
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(json["bench"], "pci");
    let rows = json["rows"].as_array().unwrap();
    let methods: Vec<_> = rows.iter().map(|r| r["method"].as_str().unwrap()).collect();
    assert_eq!(methods, ["pio", "ecam", "ecam-mapped"]);
    for (row, exits) in rows.iter().zip([2.0, 1.0, 0.0]) {
        assert_eq!(row["identical"], true, "{row}");
        assert_eq!(row["reads"], 400);
        assert_eq!(row["exits_per_read"], exits, "{row}");
        for field in ["seconds", "us_per_read", "scan_us"] {
            assert!(row[field].as_f64().unwrap() > 0.0, "{field}: {row}");
        }
    }
    // How much faster fewer exits make a read is the bench's to measure (a loaded host
    // times anything); the exits per read above are what makes it so.
    assert!(std::fs::read_to_string(&svg_path).unwrap().contains("ecam-mapped"));
}

#[test]
fn pciscan_agrees_with_itself_in_both_ecam_modes() {
    if !kvm_or_skip("pciscan_agrees_with_itself_in_both_ecam_modes") {
        return;
    }
    for mode in ["trap", "mapped"] {
        let (out, json) = run_json(&["--payload", "pciscan", "--lab", "--ecam", mode, "--params", "200"]);
        let text = stdout(&out);
        assert!(out.status.success(), "{mode}: {text}\n{}", stderr(&out));
        assert_eq!(text.matches("identical").count(), 2, "{mode}: {text}");
        assert!(text.contains("00:00.0 e1e5:0001 class 060000"), "{mode}: {text}");
        assert!(text.contains("00:01.0 e1e5:0d00 class ff0000 bars 1000 10 0 0 0 0"), "{mode}: {text}");
        let ecam_reads = json["devices"]["pci-ecam"]["reads"].as_u64().unwrap();
        if mode == "mapped" {
            assert_eq!(ecam_reads, 0, "mapped reads never exit: {json}");
        } else {
            assert!(ecam_reads > 200, "{json}");
        }
        // BAR sizing writes exit in both modes.
        assert!(json["devices"]["pci-ecam"]["writes"].as_u64().unwrap() > 0, "{json}");
    }
}

#[test]
fn hostile_config_traffic_leaves_identity_and_enumeration_intact() {
    if !kvm_or_skip("hostile_config_traffic_leaves_identity_and_enumeration_intact") {
        return;
    }
    for mode in ["trap", "mapped"] {
        let (out, json) = run_json(&["--payload", "pcihostile", "--ecam", mode]);
        let text = stdout(&out);
        assert!(out.status.success(), "{mode}: {text}\n{}", stderr(&out));
        assert!(text.contains("identity intact, host bridge enumerates"), "{mode}: {text}");
        assert!(json["devices"]["pci-cf8"]["writes"].as_u64().unwrap() > 1000, "{json}");
        assert!(json["devices"]["pci-ecam"]["writes"].as_u64().unwrap() > 10_000, "{json}");
    }
}

#[test]
fn a_bad_ecam_mode_is_a_one_line_error() {
    assert_one_line_error(&["run", "--ecam", "sideways"]);
}

#[test]
fn pci_config_io_off_removes_the_cf8_mechanism() {
    if !kvm_or_skip("pci_config_io_off_removes_the_cf8_mechanism") {
        return;
    }
    let (out, json) = run_json(&["--payload", "pciscan", "--params", "10", "--pci-config-io", "off"]);
    assert!(json["devices"].get("pci-cf8").is_none(), "{json}");
    // The guest's 0xCF8 probe reads all-ones and finds nothing; ECAM still finds the bridge.
    assert!(stdout(&out).contains("step 1 (ecam): 1 functions"), "{}", stdout(&out));
    let (_, json) = run_json(&["--payload", "pciscan", "--params", "10", "--pci-config-io", "on"]);
    assert!(json["devices"].get("pci-cf8").is_some(), "{json}");
    assert_one_line_error(&["run", "--pci-config-io", "maybe"]);
}

#[test]
fn an_exit_after_another_vcpu_moved_a_bar_meets_the_new_layout() {
    if !kvm_or_skip("an_exit_after_another_vcpu_moved_a_bar_meets_the_new_layout") {
        return;
    }
    // One vCPU moves the doorbell's BAR0 a thousand times; the other reads it wherever it
    // is, each read made after a wait inside the guest, so moves land between its entry and
    // its exit. A read dispatched on the layout of its entry hits no device (all-ones).
    // (Reads that raced a move may meet no device; the guest discards those by its count.)
    // The guest reads until it has checked 1000 and moves until it has moved 1000 times, so
    // neither count depends on how a loaded host schedules the two vCPUs.
    let (out, json) = run_json(&["--payload", "barmove", "--lab", "--vcpus", "2"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert!(text.contains(" 0 saw no device"), "{text}");
    let checked: u64 = text
        .split(" reads checked")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of checked reads: {text}"));
    assert!(checked >= 1000, "{text}");
    // Every checked read met the doorbell.
    assert!(json["devices"]["doorbell-mmio"]["reads"].as_u64() >= Some(checked), "{json}");
}
