//! MMDS as Firecracker's users drive it: `PUT /mmds/config` and `PUT`/`PATCH /mmds`
//! through the API (or a config file and `--metadata`), read by the `mmdsget` guest over
//! virtio-net: ARP, TCP, V1 and V2 (token; a wrong one gets 401), a missing key 404,
//! hostile segments first; every byte checked against what was put.

mod common;
use common::*;
use exitless_lab::api_client::expect_ok;
use exitless_lab::mmds::metadata;
use serde_json::json;
use std::io::Read;

/// Needs KVM, root and /dev/net/tun for a tap (its frames to MMDS never reach it).
fn tap_or_skip(test: &str, n: u32) -> Option<RemoveLinks> {
    if !kvm_or_skip(test) {
        return None;
    }
    let tap = format!("exmd{n}{}", std::process::id() % 100_000);
    let made = std::process::Command::new("ip")
        .args(["tuntap", "add", "dev", &tap, "mode", "tap"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !made {
        skip_or_fail(test, "needs root and /dev/net/tun for a tap");
        return None;
    }
    Some(RemoveLinks(vec![tap]))
}

#[test]
fn a_v2_guest_reads_what_the_api_put_and_patched() {
    let Some(tap) = tap_or_skip("a_v2_guest_reads_what_the_api_put_and_patched", 0) else { return };
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let sock = dir.join("api.sock");
    let mut child = api_process(&sock, std::process::Stdio::piped());
    let fault = |method: &str, path: &str, body: serde_json::Value| fault(&sock, method, path, body);
    let boot = json!({"kernel_image_path": payloads.join("mmdsget.elf"), "boot_args": "exitless.params=2,7,100,2,1"});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    let nic = json!({"iface_id": "eth0", "host_dev_name": tap.0[0]});
    expect_ok(&sock, "PUT", "/network-interfaces/eth0", Some(&nic)).unwrap();
    assert!(fault("PUT", "/mmds/config", json!({"network_interfaces": ["eth9"]})).contains("eth9"));
    assert!(fault("PUT", "/mmds/config", json!({"network_interfaces": []})).contains("empty"));
    let off_link = json!({"network_interfaces": ["eth0"], "ipv4_address": "10.0.0.1"});
    assert!(fault("PUT", "/mmds/config", off_link).contains("not link local"));
    assert!(fault("PUT", "/mmds/config", json!({"network_interfaces": ["eth0"], "version": "V3"})).contains("V3"));
    expect_ok(&sock, "PUT", "/mmds/config", Some(&json!({"version": "V2", "network_interfaces": ["eth0"]}))).unwrap();
    assert!(fault("PATCH", "/mmds", json!({"a": 1})).contains("not initialized"));
    // k1 is wrong until the PATCH: the guest's check passes only if the merge happened.
    let want = metadata(7, 100);
    let mut first = want.clone();
    first["latest"]["meta-data"]["k1"] = json!("wrong");
    first["extra"] = json!({"gone": true});
    expect_ok(&sock, "PUT", "/mmds", Some(&first)).unwrap();
    let patch = json!({"latest": {"meta-data": {"k1": want["latest"]["meta-data"]["k1"]}}, "extra": null});
    expect_ok(&sock, "PATCH", "/mmds", Some(&patch)).unwrap();
    assert_eq!(expect_ok(&sock, "GET", "/mmds", None).unwrap(), Some(want));
    let cut = "PUT /mmds HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"latest\": ";
    let reply = raw(&sock, cut.as_bytes(), false);
    assert!(reply.starts_with("HTTP/1.1 400") && reply.contains("fault_message"), "malformed JSON: {reply}");
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    let status = child.wait().unwrap();
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(status.success(), "{status}: {out}");
    assert!(out.contains("mmdsget: hostile: 2 resets"), "{out}");
    // Per session: token, no-token 401, wrong-token 401, three keys, 404; plus the prelude.
    assert!(out.contains("mmdsget: 15 answers checked, 0 failed"), "{out}");
}

#[test]
fn a_v1_guest_reads_metadata_from_the_flag_and_bad_files_are_one_line_errors() {
    let Some(tap) = tap_or_skip("a_v1_guest_reads_metadata_from_the_flag_and_bad_files_are_one_line_errors", 1) else {
        return;
    };
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let (config, md) = (dir.join("vm.json"), dir.join("md.json"));
    let vm = json!({
        "boot-source": {"kernel_image_path": payloads.join("mmdsget.elf"), "boot_args": "exitless.params=1,3,4000,1"},
        "machine-config": {"vcpu_count": 1, "mem_size_mib": 64},
        "network-interfaces": [{"iface_id": "eth0", "host_dev_name": tap.0[0]}],
        "mmds-config": {"network_interfaces": ["eth0"], "ipv4_address": "169.254.169.254"},
    });
    std::fs::write(&config, vm.to_string()).unwrap();
    std::fs::write(&md, metadata(3, 4000).to_string()).unwrap();
    let (config, md) = (config.to_str().unwrap(), md.to_str().unwrap());
    let out = exitless(&["--no-api", "--config-file", config, "--metadata", md]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("mmdsget: 4 answers checked, 0 failed"), "{}", stdout(&out));
    // Three 4000-byte values do not fit in 4096 bytes; a file that is not JSON.
    let err =
        assert_one_line_error(&["--no-api", "--config-file", config, "--metadata", md, "--mmds-size-limit", "4096"]);
    assert!(stderr(&err).contains("limit of 4096"), "{}", stderr(&err));
    std::fs::write(dir.join("bad.json"), "{not json").unwrap();
    let bad = dir.join("bad.json");
    let err = assert_one_line_error(&["--no-api", "--config-file", config, "--metadata", bad.to_str().unwrap()]);
    assert!(stderr(&err).contains("is not JSON"), "{}", stderr(&err));
}

#[test]
fn the_mmds_lab_checks_every_answer() {
    if !kvm_or_skip("the_mmds_lab_checks_every_answer") {
        return;
    }
    if !exitless_lab::netns::available() {
        skip_or_fail("the_mmds_lab_checks_every_answer", "needs root, /dev/net/tun and iproute2");
        return;
    }
    let (_, json) = bench_json(&["mmds", "--sessions", "3", "--versions", "V1,V2", "--poll", "adaptive"]);
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        // V1: 3 keys + 404 per session; V2 adds a token and two 401s.
        let per_session = if row["version"] == "V2" { 7 } else { 4 };
        assert_eq!(row["requests"], 3 * per_session, "{row}");
        assert_eq!(row["answers_wrong"], 0, "{row}");
        assert!(row["get_us"].as_f64().unwrap() > 0.0, "{row}");
    }
    assert_eq!(json["targets"][0]["met"], true, "{json}");
}
