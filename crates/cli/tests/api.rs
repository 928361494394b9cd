//! Firecracker's process interface and API, checked with a client we did not write (the
//! PyPI package firecracker-python 0.0.5, in a virtualenv kept under target/), and
//! `--config-file` with `--no-api`.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A virtualenv with firecracker-python 0.0.5 (made once, kept in target/).
fn client_venv() -> Result<PathBuf, String> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fc-python-venv");
    let python = venv.join("bin/python");
    let installed =
        |p: &Path| Command::new(p).args(["-c", "import firecracker.api"]).output().is_ok_and(|o| o.status.success());
    if python.exists() && installed(&python) {
        return Ok(python);
    }
    let run = |cmd: &mut Command| {
        let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
        match out.status.success() {
            true => Ok(()),
            false => Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr))),
        }
    };
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(&python).args(["-m", "pip", "install", "-q", "firecracker-python==0.0.5"]))?;
    Ok(python)
}

#[test]
fn a_firecracker_client_configures_boots_and_is_refused_as_firecracker_refuses() {
    if !kvm_or_skip("a_firecracker_client_configures_boots_and_is_refused_as_firecracker_refuses") {
        return;
    }
    let python = match client_venv() {
        Ok(p) => p,
        Err(e) => {
            assert!(!skip_or_fail("firecracker-python client", &format!("no virtualenv with it: {e}")));
            return;
        }
    };
    let dir = tempdir();
    let payloads = dir.join("payloads");
    assert!(exitless(&["payloads", "--out", payloads.to_str().unwrap()]).status.success());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/api/firecracker_client.py");
    let out = Command::new(python)
        .arg(script)
        .args([env!("CARGO_BIN_EXE_exitless"), payloads.to_str().unwrap(), dir.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("all checks passed"), "{text}");
}

#[test]
fn a_config_file_boots_at_once_without_an_api() {
    if !kvm_or_skip("a_config_file_boots_at_once_without_an_api") {
        return;
    }
    let dir = tempdir();
    let payloads = dir.join("payloads");
    assert!(exitless(&["payloads", "--out", payloads.to_str().unwrap()]).status.success());
    let config = dir.join("vm.json");
    let kernel = payloads.join("demo.elf");
    let json = serde_json::json!({
        "boot-source": {"kernel_image_path": kernel, "boot_args": "console=ttyS0"},
        "machine-config": {"vcpu_count": 1, "mem_size_mib": 64},
        "drives": [],
        "network-interfaces": [],
    });
    std::fs::write(&config, json.to_string()).unwrap();
    let out = exitless(&["--no-api", "--config-file", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("hello from CPL0"), "{}", stdout(&out));
    // A field Firecracker does not know is refused in one line, naming the file.
    std::fs::write(&config, r#"{"boot-source": {"kernel_image_path": "x"}, "turbo": true}"#).unwrap();
    let out = assert_one_line_error(&["--no-api", "--config-file", config.to_str().unwrap()]);
    assert!(stderr(&out).contains("unknown field `turbo`"), "{}", stderr(&out));
    // --no-api needs a config file.
    assert_one_line_error(&["--no-api"]);
}

#[test]
fn a_small_fleet_starts_through_the_api_and_stops_leaving_nothing() {
    if !kvm_or_skip("a_small_fleet_starts_through_the_api_and_stops_leaving_nothing") {
        return;
    }
    let dir = tempdir();
    let json_path = dir.join("fleet.json");
    let out = exitless(&["bench", "fleet", "--vms", "4", "--json", json_path.to_str().unwrap()]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    assert_eq!(json["vms"], 4);
    // Every guest said it runs (or the bench would have failed), every VMM went on SIGTERM
    // with its socket removed, and nothing is left in the fleet's directory.
    assert_eq!(json["stopped_cleanly"], 4, "{json}");
    assert_eq!(json["left_behind"].as_array().map(Vec::len), Some(0), "{json}");
    assert_eq!(json["fleet_to_running_ms"].as_array().map(Vec::len), Some(4), "{json}");
    // Memory comes from each VMM's own live report: present and plausible.
    let (rss, pss) = (json["vmm_rss_kib_max"].as_f64().unwrap(), json["vmm_pss_kib_max"].as_f64().unwrap());
    assert!(rss > 500.0 && rss < 200_000.0 && pss > 100.0 && pss <= rss, "{json}");
    assert!(stdout(&out).contains("stopped cleanly by SIGTERM"), "{}", stdout(&out));
}
