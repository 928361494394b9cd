//! CPU templates seen from inside the guest: the `cpuid` payload prints its CPUID under no
//! template, under Firecracker's static template for this host's vendor (T2 on Intel, T2A
//! on AMD) and under a custom template, from the command line and through the API; the
//! other vendor's template is refused by name; a snapshot carries its template, and a
//! restore whose template this host cannot offer is refused naming the feature.

mod common;
use common::*;
use exitless_lab::api_client::{expect_ok, request};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// 0x8000_0001 ECX: LAHF/SAHF in long mode (bit 0) and PREFETCHW (bit 8), which this
/// host's KVM offers and every static template but C3's keeps or hides (T2 hides PREFETCHW).
const LAHF_LM: u32 = 1 << 0;
const PREFETCHW: u32 = 1 << 8;

/// `cpuid 0x00000001.0: eax=... ebx=... ecx=... edx=...` lines, by "leaf.subleaf".
fn leaves(text: &str) -> BTreeMap<String, [u32; 4]> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter_map(|l| l.strip_prefix("cpuid 0x")) {
        let Some((key, regs)) = line.split_once(": ") else { continue };
        let values: Vec<u32> =
            regs.split(' ').filter_map(|r| u32::from_str_radix(r.split_once('=')?.1, 16).ok()).collect();
        let Some((leaf, subleaf)) = key.split_once('.') else { continue };
        let Ok(leaf) = u32::from_str_radix(leaf, 16) else { continue };
        if let Ok(values) = values.try_into() {
            out.insert(format!("{leaf:x}.{subleaf}"), values);
        }
    }
    out
}

fn run_cpuid(extra: &[&str]) -> (BTreeMap<String, [u32; 4]>, String) {
    let out = exitless(&[&["run", "--payload", "cpuid", "--timeout", "120"], extra].concat());
    assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
    let text = stdout(&out);
    (leaves(&text), text)
}

fn vendor(l: &BTreeMap<String, [u32; 4]>) -> String {
    let v = l["0.0"];
    [v[1], v[3], v[2]].iter().flat_map(|r| r.to_le_bytes()).map(char::from).collect()
}

/// This host's static template and the other vendor's.
fn templates(vendor: &str) -> (&'static str, &'static str, &'static str) {
    match vendor {
        "AuthenticAMD" => ("T2A", "T2", "GenuineIntel"),
        _ => ("T2", "T2A", "AuthenticAMD"),
    }
}

/// A custom template: LAHF_LM hidden, and a try at another vendor (normalization puts the
/// host's back).
fn custom_template() -> Value {
    json!({"cpuid_modifiers": [
        {"leaf": "0x80000001", "subleaf": "0x0", "flags": 0,
         "modifiers": [{"register": "ecx", "bitmap": "0bxxxx_xxxx_xxxx_xxxx_xxxx_xxxx_xxxx_xxx0"}]},
        {"leaf": "0x0", "subleaf": "0x0", "flags": 0,
         "modifiers": [{"register": "ebx", "bitmap": "0b0000_0000_0000_0000_0000_0000_0000_0000"}]}
    ]})
}

#[test]
fn a_static_and_a_custom_template_change_what_the_guest_reads() {
    if !kvm_or_skip("a_static_and_a_custom_template_change_what_the_guest_reads") {
        return;
    }
    let (plain, text) = run_cpuid(&[]);
    let ext = plain["80000001.0"];
    assert_eq!(ext[2] & (LAHF_LM | PREFETCHW), LAHF_LM | PREFETCHW, "this host offers both:\n{text}");
    assert!(text.contains("brand: Intel(R) Xeon(R) Processor") || text.contains("brand: AMD EPYC"), "{text}");
    let (ours, ..) = templates(&vendor(&plain));

    let (t2, text) = run_cpuid(&["--cpu-template", ours]);
    assert_eq!(t2["1.0"][0] & 0x0fff_3fff, 0x0003_06f2, "{ours} claims Haswell-EP's signature:\n{text}");
    assert_eq!(t2["80000001.0"][2] & PREFETCHW, 0, "{ours} hides PREFETCHW:\n{text}");
    assert_ne!(t2["80000001.0"][2] & LAHF_LM, 0, "and keeps LAHF_LM:\n{text}");

    let dir = tempdir();
    let file = Path::new(dir.as_str()).join("custom.json");
    std::fs::write(&file, custom_template().to_string()).unwrap();
    let (custom, text) = run_cpuid(&["--cpu-template", file.to_str().unwrap()]);
    assert_eq!(custom["80000001.0"][2] & (LAHF_LM | PREFETCHW), PREFETCHW, "LAHF_LM gone, only it:\n{text}");
    assert_eq!(vendor(&custom), vendor(&plain), "a template cannot change the vendor");
    assert_eq!(custom["1.0"][0], plain["1.0"][0], "the signature is the host's");

    // A bad file is one line and a failure, before any guest runs.
    std::fs::write(&file, r#"{"cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0x0", "flags": 0, "modifiers": [{"register": "ecx", "bitmap": "0b1z"}]}]}"#).unwrap();
    let out = assert_one_line_error(&["run", "--payload", "cpuid", "--cpu-template", file.to_str().unwrap()]);
    assert!(stderr(&out).contains("unknown character: 'z'"), "{}", stderr(&out));
}

#[test]
fn the_other_vendors_template_is_refused_by_name() {
    if !kvm_or_skip("the_other_vendors_template_is_refused_by_name") {
        return;
    }
    let (plain, _) = run_cpuid(&[]);
    let host = vendor(&plain);
    let (_, theirs, their_vendor) = templates(&host);
    let out = assert_one_line_error(&["run", "--payload", "cpuid", "--cpu-template", theirs]);
    let want = format!("the CPU template {theirs} is for {their_vendor} CPUs; this host's is {host}");
    assert!(stderr(&out).contains(&want), "{}", stderr(&out));

    // Through the API: taken with the machine-config, refused at InstanceStart with a 400,
    // and the VMM serves on.
    let dir = tempdir();
    let payloads = payloads_in(Path::new(dir.as_str()));
    let sock = Path::new(dir.as_str()).join("api.sock");
    let mut vmm = api_process(&sock, Stdio::null());
    let mc = json!({"vcpu_count": 1, "mem_size_mib": 64, "cpu_template": theirs});
    expect_ok(&sock, "PUT", "/machine-config", Some(&mc)).unwrap();
    let got = expect_ok(&sock, "GET", "/machine-config", None).unwrap().unwrap();
    assert_eq!(got["cpu_template"], theirs);
    let boot = json!({"kernel_image_path": payloads.join("cpuid.elf")});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    let e = fault(&sock, "PUT", "/actions", json!({"action_type": "InstanceStart"}));
    assert!(e.contains(&want), "{e}");
    assert!(fault(&sock, "PUT", "/machine-config", json!({"vcpu_count": 1, "mem_size_mib": 64, "cpu_template": "T3"}))
        .contains("unknown variant `T3`"));
    assert_eq!(request(&sock, "GET", "/", None).unwrap().status, 200);
    let _ = vmm.kill();
    let _ = vmm.wait();
}

/// A VMM with its console's lines collected.
struct Console {
    child: std::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Console {
    fn start(sock: &Path) -> Console {
        let mut child = api_process_with(sock, Stdio::piped(), &[]);
        let out = child.stdout.take().unwrap();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Console { child, lines }
    }

    fn wait_for(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let text = self.lines.lock().unwrap().join("\n");
            if text.contains(needle) || Instant::now() > deadline {
                assert!(text.contains(needle), "no {needle:?} in:\n{text}");
                return text;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn cpu_config_through_the_api_and_a_snapshot_that_carries_its_template() {
    if !kvm_or_skip("cpu_config_through_the_api_and_a_snapshot_that_carries_its_template") {
        return;
    }
    let dir = tempdir();
    let dir = Path::new(dir.as_str());
    let payloads = payloads_in(dir);
    let sock = dir.join("a.sock");

    // Bad templates: one clear 400 each.
    let vmm = Console::start(&sock);
    let leaf = |register: &str, bitmap: &str| {
        json!({"cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0x0", "flags": 0,
               "modifiers": [{"register": register, "bitmap": bitmap}]}]})
    };
    let long = format!("0b{}", "0".repeat(33));
    for (body, says) in [
        (leaf("ecx", &long), "string is too long"),
        (leaf("ecx", "0b01q"), "unknown character: 'q'"),
        (leaf("esi", "0b0"), "Invalid CPUID register \"esi\""),
        (
            json!({"cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0x0", "flags": 0, "modifiers": []},
                                    {"leaf": "0x1", "subleaf": "0x0", "flags": 0, "modifiers": []}]}),
            "leaf 0x1 subleaf 0x0 is given twice",
        ),
        (json!({"msr_modifiers": [{"addr": "266", "bitmap": "0b0"}]}), "No supported number system prefix"),
        (json!({"vcpu_features": []}), "unknown field `vcpu_features`"),
    ] {
        let e = fault(&sock, "PUT", "/cpu-config", body.clone());
        assert!(e.contains(says), "{body}: {e}");
    }
    // A good one, kept as the configuration says it; a static template would replace it.
    expect_ok(&sock, "PUT", "/cpu-config", Some(&custom_template())).unwrap();
    let config = expect_ok(&sock, "GET", "/vm/config", None).unwrap().unwrap();
    assert_eq!(config["cpu-config"]["cpuid_modifiers"][0]["leaf"], "0x80000001", "{config}");
    assert!(config["machine-config"].get("cpu_template").is_none(), "{config}");
    expect_ok(&sock, "PUT", "/machine-config", Some(&json!({"vcpu_count": 1, "mem_size_mib": 64}))).unwrap();
    let config = expect_ok(&sock, "GET", "/vm/config", None).unwrap().unwrap();
    assert!(config.get("cpu-config").is_some(), "a machine-config without cpu_template keeps it: {config}");
    // Booted: the guest sees it.
    let boot = json!({"kernel_image_path": payloads.join("cpuid.elf")});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    let text = vmm.wait_for("brand:");
    let seen = leaves(&text);
    assert_eq!(seen["80000001.0"][2] & (LAHF_LM | PREFETCHW), PREFETCHW, "{text}");
    drop(vmm);

    // A snapshot under the static template carries it: the restored VMM builds the guest's
    // CPUID with it.
    let (plain, _) = run_cpuid(&[]);
    let (ours, ..) = templates(&vendor(&plain));
    let vmm = Console::start(&sock);
    let mc = json!({"vcpu_count": 1, "mem_size_mib": 64, "cpu_template": ours});
    expect_ok(&sock, "PUT", "/machine-config", Some(&mc)).unwrap();
    let boot = json!({"kernel_image_path": payloads.join("wait.elf")});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"}))).unwrap();
    vmm.wait_for("wait: running");
    expect_ok(&sock, "PATCH", "/vm", Some(&json!({"state": "Paused"}))).unwrap();
    let (state, mem) = (dir.join("state.json"), dir.join("mem.bin"));
    let body = json!({"snapshot_type": "Full", "snapshot_path": state, "mem_file_path": mem});
    expect_ok(&sock, "PUT", "/snapshot/create", Some(&body)).unwrap();
    drop(vmm);
    let file: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    assert_eq!(file["config"]["machine-config"]["cpu_template"], ours, "the state file names its template");

    let load = json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": mem}});
    let restored = Console::start(&sock);
    expect_ok(&sock, "PUT", "/snapshot/load", Some(&load)).unwrap();
    let config = expect_ok(&sock, "GET", "/vm/config", None).unwrap().unwrap();
    assert_eq!(config["machine-config"]["cpu_template"], ours);
    drop(restored);

    // The same snapshot as a host that offered SVM (0x8000_0001 ECX bit 2, AMD's) would
    // write it with a template keeping SVM: refused here, naming it, nothing started.
    let mut file = file;
    file["config"]["cpu-config"] = json!({"cpuid_modifiers": [{"leaf": "0x80000001", "subleaf": "0x0", "flags": 0,
        "modifiers": [{"register": "ecx", "bitmap": "0b1xx"}]}]});
    file["config"]["machine-config"].as_object_mut().unwrap().remove("cpu_template");
    file["checksum"] = checksum(&file["machine"], &file["config"]).into();
    let other = dir.join("other.json");
    std::fs::write(&other, file.to_string()).unwrap();
    let load = json!({"snapshot_path": other, "mem_backend": {"backend_type": "File", "backend_path": mem}});
    let refused = Console::start(&sock);
    let e = fault(&sock, "PUT", "/snapshot/load", load);
    assert!(
        e.contains("keeps svm (CPUID leaf 0x80000001 subleaf 0x0 ecx bit 2), which this host does not offer"),
        "{e}"
    );
    assert_eq!(request(&sock, "GET", "/", None).unwrap().body.unwrap()["state"], "Not started");
    drop(refused);
}

/// The state file's checksum (crates/vmm/src/snapshot/mod.rs): FNV-1a over the compact
/// JSON of `[machine, config]`.
fn checksum(machine: &Value, config: &Value) -> String {
    let bytes = serde_json::to_vec(&(machine, config)).unwrap();
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    format!("fnv1a64:{hash:016x}")
}
