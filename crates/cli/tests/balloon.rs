//! Firecracker's balloon API on a payload guest (which has no balloon driver: what the
//! driver does is scripts/linux-memory.sh's, and the device model's is its unit tests'):
//! what is allowed before and after the start, and each refusal in Firecracker's words.

mod common;
use common::*;
use exitless_lab::api_client::{expect_ok, request};
use serde_json::json;

#[test]
fn the_balloon_api_allows_and_refuses_as_firecracker() {
    if !kvm_or_skip("the_balloon_api_allows_and_refuses_as_firecracker") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("api.sock");
    let mut child = api_process(&sock, std::process::Stdio::null());
    let machine = json!({"vcpu_count": 1, "mem_size_mib": 64});
    expect_ok(&sock, "PUT", "/machine-config", Some(&machine)).unwrap();
    // Before the start.
    let no_device = request(&sock, "GET", "/balloon", None).unwrap();
    assert_eq!(no_device.status, 400);
    assert_eq!(no_device.body.unwrap()["fault_message"], "Balloon config error: No balloon device found.");
    let why = fault(&sock, "PUT", "/balloon", json!({"amount_mib": 65, "deflate_on_oom": false}));
    assert_eq!(why, "Balloon config error: Amount of pages requested is too large.");
    let why = fault(&sock, "PUT", "/balloon", json!({"amount_mib": 1, "deflate_on_oom": false, "bogus": 1}));
    assert!(why.contains("bogus"), "{why}");
    let why = fault(&sock, "PUT", "/balloon", json!({"amount_mib": 1}));
    assert!(why.contains("deflate_on_oom"), "a required field: {why}");
    let balloon = json!({"amount_mib": 16, "deflate_on_oom": true, "stats_polling_interval_s": 0,
                         "free_page_hinting": true, "free_page_reporting": true});
    expect_ok(&sock, "PUT", "/balloon", Some(&balloon)).unwrap();
    assert_eq!(expect_ok(&sock, "GET", "/balloon", None).unwrap().unwrap(), balloon);
    let why = fault(&sock, "PUT", "/machine-config", json!({"vcpu_count": 1, "mem_size_mib": 8}));
    assert!(why.contains("smaller than the previously set balloon device target size"), "{why}");
    let why = fault(&sock, "PATCH", "/balloon", json!({"amount_mib": 4}));
    assert!(why.contains("running"), "{why}");
    // After it: the target moves, the refusals are Firecracker's.
    let boot = json!({"kernel_image_path": payloads.join("wait.elf")});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    let why = fault(&sock, "PUT", "/balloon", balloon.clone());
    assert!(why.contains("not supported after starting"), "{why}");
    expect_ok(&sock, "PATCH", "/balloon", Some(&json!({"amount_mib": 48}))).unwrap();
    assert_eq!(expect_ok(&sock, "GET", "/balloon", None).unwrap().unwrap()["amount_mib"], 48);
    let why = fault(&sock, "PATCH", "/balloon", json!({"amount_mib": 100}));
    assert_eq!(why, "Balloon update error: Balloon: Requested memory should be less than 100MiB");
    let stats = request(&sock, "GET", "/balloon/statistics", None).unwrap();
    assert_eq!(stats.status, 400);
    assert_eq!(
        stats.body.unwrap()["fault_message"],
        "Internal VMM error: Balloon: Received stats query when stats are disabled."
    );
    let why = fault(&sock, "PATCH", "/balloon/statistics", json!({"stats_polling_interval_s": 1}));
    assert_eq!(why, "Balloon update error: Balloon: Statistics cannot be enabled/disabled after activation.");
    // Hinting needs the guest's driver, which this guest lacks.
    let why = fault(&sock, "PATCH", "/balloon/hinting/start", json!({"acknowledge_on_stop": false}));
    assert_eq!(why, "Balloon update error: Balloon: Device not activated yet.");
    let status = request(&sock, "GET", "/balloon/hinting/status", None).unwrap();
    assert_eq!(status.status, 400, "{:?}", status.body);
    // And the VMM keeps serving.
    assert_eq!(expect_ok(&sock, "GET", "/", None).unwrap().unwrap()["state"], "Running");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn hinting_and_statistics_refused_on_a_balloon_without_them() {
    if !kvm_or_skip("hinting_and_statistics_refused_on_a_balloon_without_them") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let config = dir.join("vm.json");
    let sock = dir.join("api.sock");
    std::fs::write(
        &config,
        json!({
            "boot-source": {"kernel_image_path": payloads.join("wait.elf")},
            "machine-config": {"vcpu_count": 1, "mem_size_mib": 64},
            "balloon": {"amount_mib": 0, "deflate_on_oom": false, "stats_polling_interval_s": 2},
        })
        .to_string(),
    )
    .unwrap();
    let mut child = api_process_with(&sock, std::process::Stdio::null(), &["--config-file", config.to_str().unwrap()]);
    let stats = expect_ok(&sock, "GET", "/balloon/statistics", None).unwrap().unwrap();
    assert_eq!((stats["target_pages"].as_u64(), stats["actual_mib"].as_u64()), (Some(0), Some(0)), "{stats}");
    expect_ok(&sock, "PATCH", "/balloon/statistics", Some(&json!({"stats_polling_interval_s": 5}))).unwrap();
    assert_eq!(expect_ok(&sock, "GET", "/balloon", None).unwrap().unwrap()["stats_polling_interval_s"], 5);
    let why = fault(&sock, "PATCH", "/balloon/statistics", json!({"stats_polling_interval_s": 0}));
    assert!(why.contains("cannot be enabled/disabled"), "{why}");
    let why = fault(&sock, "PATCH", "/balloon/hinting/stop", json!({}));
    assert_eq!(why, "Balloon update error: Balloon: Attempting to use hinting when not enabled");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_snapshot_keeps_the_balloons_target_and_settings() {
    if !kvm_or_skip("a_snapshot_keeps_the_balloons_target_and_settings") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("api.sock");
    let mut child = api_process(&sock, std::process::Stdio::null());
    expect_ok(&sock, "PUT", "/machine-config", Some(&json!({"vcpu_count": 1, "mem_size_mib": 64}))).unwrap();
    let balloon = json!({"amount_mib": 8, "deflate_on_oom": false, "stats_polling_interval_s": 3});
    expect_ok(&sock, "PUT", "/balloon", Some(&balloon)).unwrap();
    let boot = json!({"kernel_image_path": payloads.join("wait.elf")});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    expect_ok(&sock, "PATCH", "/balloon", Some(&json!({"amount_mib": 40}))).unwrap();
    expect_ok(&sock, "PATCH", "/balloon/statistics", Some(&json!({"stats_polling_interval_s": 7}))).unwrap();
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let (state, mem) = (dir.join("state"), dir.join("mem"));
    let create = json!({"snapshot_path": state, "mem_file_path": mem});
    expect_ok(&sock, "PUT", "/snapshot/create", Some(&create)).unwrap();
    let _ = child.kill();
    let _ = child.wait();

    let sock = dir.join("restored.sock");
    let mut child = api_process_with(&sock, std::process::Stdio::null(), &[]);
    let load = json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": mem}, "resume_vm": true});
    expect_ok(&sock, "PUT", "/snapshot/load", Some(&load)).unwrap();
    let config = expect_ok(&sock, "GET", "/balloon", None).unwrap().unwrap();
    assert_eq!(
        (config["amount_mib"].as_u64(), config["stats_polling_interval_s"].as_u64()),
        (Some(40), Some(7)),
        "{config}"
    );
    let stats = expect_ok(&sock, "GET", "/balloon/statistics", None).unwrap().unwrap();
    assert_eq!(stats["target_pages"].as_u64(), Some(40 * 256), "{stats}");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_few_sandboxes_restored_from_one_snapshot_each_answer() {
    if !kvm_or_skip("a_few_sandboxes_restored_from_one_snapshot_each_answer") {
        return;
    }
    let (out, json) = bench_json(&["density", "--vms", "3", "--mem", "64", "--written", "0.5"]);
    let row = &json["rows"][0];
    assert_eq!((row["vmm"].as_str(), row["vms"].as_u64()), (Some("exitless"), Some(3)), "{json}");
    // Every one answered (or the bench fails); the memory figures are each process's own.
    let (rss, pss) = (row["rss_kib_per_guest"].as_f64().unwrap(), row["pss_kib_per_guest"].as_f64().unwrap());
    assert!(rss > 500.0 && pss > 100.0 && pss <= rss, "{json}");
    assert!(row["snapshot_memory_kib"].as_u64().unwrap() >= 32 << 10, "the guest's writes are in the file: {json}");
    assert!(json["targets"].as_array().is_some_and(Vec::is_empty), "no Firecracker, no targets: {json}");
    assert!(stdout(&out).contains("density lab"), "{}", stdout(&out));
}
