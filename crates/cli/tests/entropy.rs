//! virtio-rng: the `rngread` guest reads entropy (every buffer full, none alike, a 128 KiB
//! request capped, a read-only buffer refused), through `run --entropy` and through
//! Firecracker's `entropy` section with a rate limiter; absent unless asked for.

mod common;
use common::*;

#[test]
fn the_guest_reads_entropy_and_a_read_only_buffer_is_refused() {
    if !kvm_or_skip("the_guest_reads_entropy_and_a_read_only_buffer_is_refused") {
        return;
    }
    let (out, json) = run_json(&["--payload", "rngread", "--entropy", "--params", "32"]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    // 32 small requests, the big one and the refused one.
    assert!(stdout(&out).contains("rngread: 34 requests"), "{}", stdout(&out));
    assert!(stdout(&out).contains(", 0 failed"), "{}", stdout(&out));
    let device = &json["devices"]["virtio-rng"];
    assert!(device["writes"].as_u64().unwrap_or(0) > 0, "its exits are counted: {}", json["devices"]);
    // No device unless asked for: the guest finds none.
    let (out, _) = run_json(&["--payload", "rngread"]);
    assert_eq!(out.status.code(), Some(3), "{}", stdout(&out));
    assert!(stdout(&out).contains("init failed"), "{}", stdout(&out));
}

#[test]
fn firecrackers_entropy_section_with_a_rate_limiter() {
    if !kvm_or_skip("firecrackers_entropy_section_with_a_rate_limiter") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let config = dir.join("vm.json");
    let vm = |entropy: serde_json::Value| {
        serde_json::json!({
            "boot-source": {"kernel_image_path": payloads.join("rngread.elf"), "boot_args": "exitless.params=8"},
            "machine-config": {"vcpu_count": 1, "mem_size_mib": 64},
            "entropy": entropy,
        })
    };
    // Two requests per 100 ms: ten requests take at least 0.3 s after the first burst.
    let limited = vm(serde_json::json!({"rate_limiter": {"ops": {"size": 2, "refill_time": 100}}}));
    std::fs::write(&config, limited.to_string()).unwrap();
    let started = std::time::Instant::now();
    let out = exitless(&["--no-api", "--config-file", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("rngread: 10 requests") && stdout(&out).contains(", 0 failed"), "{}", stdout(&out));
    assert!(started.elapsed() >= std::time::Duration::from_millis(300), "not held back: {:?}", started.elapsed());
    // A field Firecracker's entropy object does not have is refused in one line.
    std::fs::write(&config, vm(serde_json::json!({"bogus": 1})).to_string()).unwrap();
    let out = assert_one_line_error(&["--no-api", "--config-file", config.to_str().unwrap()]);
    assert!(stderr(&out).contains("bogus"), "{}", stderr(&out));
}

#[test]
fn put_entropy_through_the_api_before_boot_only() {
    use exitless_lab::api_client::{expect_ok, request};
    use std::io::BufRead;
    if !kvm_or_skip("put_entropy_through_the_api_before_boot_only") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("api.sock");
    let mut child = api_process(&sock, std::process::Stdio::piped());
    let fault = |body: serde_json::Value| {
        let reply = request(&sock, "PUT", "/entropy", Some(&body)).unwrap();
        (reply.status, reply.body.map(|b| b["fault_message"].to_string()).unwrap_or_default())
    };
    // Malformed: refused with a fault_message, and the VMM keeps serving.
    let (status, why) = fault(serde_json::json!({"rate_limiter": {"ops": {"size": "many"}}}));
    assert_eq!(status, 400, "{why}");
    assert!(!why.is_empty());
    let limiter = serde_json::json!({"rate_limiter": {"bandwidth": {"size": 4096, "refill_time": 100}}});
    expect_ok(&sock, "PUT", "/entropy", Some(&limiter)).unwrap();
    let config = expect_ok(&sock, "GET", "/vm/config", None).unwrap().unwrap();
    assert_eq!(config["entropy"], limiter, "{config}");
    let boot = serde_json::json!({"kernel_image_path": payloads.join("rngread.elf"), "boot_args": "exitless.params=4"});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&serde_json::json!({"action_type": "InstanceStart"}))).unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let result = lines.find(|l| l.as_ref().is_ok_and(|l| l.starts_with("rngread: "))).unwrap().unwrap();
    assert!(result.contains("6 requests") && result.contains(", 0 failed"), "{result}");
    let _ = child.wait();
    // A second VMM, started: PUT /entropy after boot is refused.
    let mut child = api_process(&sock, std::process::Stdio::null());
    let boot = serde_json::json!({"kernel_image_path": payloads.join("wait.elf")});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&serde_json::json!({"action_type": "InstanceStart"}))).unwrap();
    let (status, why) = fault(serde_json::json!({}));
    assert_eq!(status, 400, "{why}");
    assert!(why.contains("not allowed after") || why.contains("after"), "{why}");
    let _ = child.kill();
    let _ = child.wait();
}
