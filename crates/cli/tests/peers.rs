//! `bench peers` with exitless alone (the peers are not built in CI): the table's rows and
//! the JSON's fields and targets, with Firecracker's targets skipped, not passed.

mod common;
use common::*;

#[test]
fn peers_measures_exitless_and_skips_missing_peers() {
    if !kvm_or_skip("peers_measures_exitless_and_skips_missing_peers") {
        return;
    }
    let path = tempdir().join("peers.json");
    let out = exitless(&["bench", "peers", "--runs", "2", "--json", path.to_str().unwrap()]);
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
    assert!(json["vmms"].get("firecracker").is_none(), "{json}");
    let targets = json["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 3, "{json}");
    assert!(targets[0]["met"].is_null(), "no Firecracker: skipped, not met: {json}");
    let out = exitless(&["bench", "peers", "--firecracker", "/nonexistent/firecracker"]);
    assert!(!out.status.success());
    assert_eq!(stderr(&out).trim().lines().count(), 1, "one line: {}", stderr(&out));
}
