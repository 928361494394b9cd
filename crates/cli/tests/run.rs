//! `exitless run` on the built-in payloads, in real KVM.

mod common;
use common::*;

#[test]
fn demo_boots_prints_and_exits_zero() {
    if !kvm_or_skip("demo_boots_prints_and_exits_zero") {
        return;
    }
    let (out, json) = run_json(&[]);
    let text = stdout(&out);
    assert!(out.status.success(), "status {:?}\n{}", out.status, stderr(&out));
    assert!(text.contains("hello from CPL0"), "{text}");
    assert!(text.contains("now at CPL3 with IOPL 3"), "{text}");
    assert_eq!(json["exit_status"], 0);
    assert!(json["exits"]["io_out"].as_u64().unwrap() >= text.len() as u64, "one exit per serial byte: {json}");
    assert_eq!(json["devices"]["debug-exit"]["writes"], 1);
    assert!(json["devices"]["serial"]["writes"].as_u64().unwrap() >= text.len() as u64);
    assert!(stderr(&out).contains("exit profile") && stderr(&out).contains("io_out"), "{}", stderr(&out));
}

#[test]
fn hostile_guest_leaves_the_vmm_running_and_is_counted() {
    if !kvm_or_skip("hostile_guest_leaves_the_vmm_running_and_is_counted") {
        return;
    }
    let (out, json) = run_json(&["--payload", "hostile", "--params", "7,3000"]);
    assert!(out.status.success(), "status {:?}\n{}", out.status, stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("hostile: survived"), "{text}");
    let pio = &json["devices"]["unclaimed-pio"];
    let mmio = &json["devices"]["unclaimed-mmio"];
    assert!(pio["reads"].as_u64().unwrap() > 100 && pio["writes"].as_u64().unwrap() > 100, "{json}");
    assert!(mmio["reads"].as_u64().unwrap() > 100 && mmio["writes"].as_u64().unwrap() > 100, "{json}");
    // String I/O is split per element, so there are more unclaimed accesses than exits.
    let unclaimed_pio = pio["reads"].as_u64().unwrap() + pio["writes"].as_u64().unwrap();
    let io_exits = json["exits"]["io_in"].as_u64().unwrap() + json["exits"]["io_out"].as_u64().unwrap();
    assert!(unclaimed_pio > io_exits / 2, "{json}");
    // Warned once per address, not once per access.
    let warnings = stderr(&out).matches("unclaimed").count();
    assert!(warnings < 100, "{warnings} warnings");
}

#[test]
fn a_triple_fault_is_reported_with_registers() {
    if !kvm_or_skip("a_triple_fault_is_reported_with_registers") {
        return;
    }
    let out = exitless(&["run", "--payload", "crash", "--timeout", "60"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("triple fault"), "{err}");
    assert!(err.contains("rip=") && err.contains("cr2=0x00007fff00000000"), "{err}");
}

#[test]
fn a_guest_that_never_exits_is_stopped_by_the_timeout() {
    if !kvm_or_skip("a_guest_that_never_exits_is_stopped_by_the_timeout") {
        return;
    }
    let start = std::time::Instant::now();
    // Long enough for a loaded host to boot it to its first line (which the report counts).
    let (out, json) = run_json(&["--payload", "crash", "--params", "2", "--timeout", "5"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("did not finish within"), "{}", stderr(&out));
    assert!(start.elapsed().as_secs() < 60);
    // The report is written all the same, with the error and the exits so far.
    assert!(json["error"].as_str().is_some_and(|e| e.contains("did not finish")), "{json}");
    assert!(json["devices"]["serial"]["writes"].as_u64().unwrap_or(0) > 0, "{json}");
}

#[test]
fn an_unwritable_json_path_is_refused_before_the_run() {
    let out = assert_one_line_error(&["run", "--json", "/nonexistent-dir/report.json"]);
    assert!(stderr(&out).contains("cannot write /nonexistent-dir/report.json"), "{}", stderr(&out));
}

#[test]
fn a_bench_refuses_an_unwritable_output_before_measuring() {
    // Each would measure for a minute or more before writing its outputs.
    for bench in [&["bench", "pci"][..], &["bench", "doorbell"], &["bench", "blk"], &["bench", "boot"]] {
        for flag in ["--json", "--svg"] {
            if bench[1] == "boot" && flag == "--svg" {
                continue;
            }
            let started = std::time::Instant::now();
            let mut args = bench.to_vec();
            args.extend([flag, "/nonexistent-dir/out"]);
            let out = assert_one_line_error(&args);
            assert!(stderr(&out).contains("/nonexistent-dir/out"), "{args:?}: {}", stderr(&out));
            assert!(started.elapsed().as_secs() < 30, "{args:?} measured before refusing");
        }
    }
}

#[test]
fn an_elf_without_a_pvh_note_boots_at_its_64_bit_entry() {
    if !kvm_or_skip("an_elf_without_a_pvh_note_boots_at_its_64_bit_entry") {
        return;
    }
    let mut elf = exitless_payloads::find("demo").unwrap().elf.to_vec();
    let note = [4u8, 0, 0, 0, 8, 0, 0, 0, 18, 0, 0, 0, b'X', b'e', b'n', 0];
    let at = elf.windows(note.len()).position(|w| w == note).expect("PVH note");
    elf[at + 8] = 0; // no longer XEN_ELFNOTE_PHYS32_ENTRY
    let path = temp_path("demo64.elf");
    std::fs::write(&path, &elf).unwrap();
    let out = exitless(&["run", "--timeout", "60", "--kernel", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("now at CPL3"), "{}", stdout(&out));
}

#[test]
fn every_payload_is_listed() {
    let out = exitless(&["payloads"]);
    let text = stdout(&out);
    for p in exitless_payloads::PAYLOADS {
        assert!(text.lines().any(|l| l.starts_with(p.name) && l.contains(p.about)), "{text}");
    }
}

#[test]
fn bad_command_lines_get_one_line_and_a_nonzero_status() {
    for args in [
        &["run", "--payload", "nope"][..],
        &["run", "--mem", "12X"],
        &["run", "--mem", "1M"],
        &["run", "--kernel", "/nonexistent/kernel"],
        &["run", "--payload", "demo", "--kernel", "/bin/true"],
        &["run", "--timeout", "-1"],
        &["frobnicate"],
    ] {
        assert_one_line_error(args);
    }
}

#[test]
fn absurd_timeouts_are_one_line_errors_not_panics() {
    for cmd in
        [&["run", "--timeout", "1e20"][..], &["bench", "doorbell", "--timeout", "1e20"], &["run", "--timeout", "inf"]]
    {
        assert_one_line_error(cmd);
    }
}

#[test]
fn messages_name_the_cause() {
    // bench boot used to say only "the guest printed nothing": the child's reason is kept.
    let out = assert_one_line_error(&["bench", "boot", "--runs", "1", "--mem", "0"]);
    assert!(stderr(&out).contains("out of range: give between 4M"), "{}", stderr(&out));
    let out = assert_one_line_error(&["run", "--mem", "5000001"]);
    assert!(stderr(&out).contains("multiple of"), "{}", stderr(&out));
    if kvm_or_skip("messages_name_the_cause (tap)") {
        let out = assert_one_line_error(&["run", "--net", "tap=a/b"]);
        assert!(stderr(&out).contains("holds '/'"), "{}", stderr(&out));
    }
}

#[test]
fn a_full_stdout_is_an_error_not_a_panic() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("SKIPPED a_full_stdout_is_an_error_not_a_panic: no /dev/full");
        return;
    };
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_exitless")).arg("payloads").stdout(full).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with("exitless: cannot write to standard output") && !err.contains("panicked"), "{err}");
}

#[test]
fn no_command_lists_the_commands() {
    for args in [&[][..], &["bench"]] {
        let out = exitless(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = stderr(&out);
        assert!(err.contains("Commands:") && err.contains("doorbell") == (args.len() == 1), "{args:?}: {err}");
    }
}

#[test]
fn every_thread_of_a_running_vm_is_under_seccomp() {
    if !kvm_or_skip("every_thread_of_a_running_vm_is_under_seccomp") {
        return;
    }
    for (extra, want) in [(None, "2"), (Some("--no-seccomp"), "0")] {
        let mut args = vec!["run", "--payload", "crash", "--params", "2", "--vcpus", "2", "--timeout", "20"];
        args.extend(extra);
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_exitless"))
            .args(&args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // The guest spins forever at CPL3; the child is killed after the check, pass or fail.
        let checked = std::panic::catch_unwind(|| {
            assert_every_thread_confined(
                child.id(),
                2,
                &["exitless", "vcpu0", "vcpu1", "console-out", "serial-in"],
                want,
            )
        });
        let _ = child.kill();
        let _ = child.wait();
        if let Err(e) = checked {
            std::panic::resume_unwind(e);
        }
    }
}

#[test]
fn sampling_names_where_a_busy_guest_spends_its_time() {
    if !kvm_or_skip("sampling_names_where_a_busy_guest_spends_its_time") {
        return;
    }
    let dir = tempdir();
    let map = dir.join("System.map");
    // One function covering all of the payload's code, one data symbol that must be ignored.
    std::fs::write(&map, "0000000000100000 T payload_code\n0000000000000000 D not_code\n").unwrap();
    let (out, json) = run_json(&[
        "--payload",
        "crash",
        "--params",
        "2",
        "--timeout",
        "1",
        "--sample-guest",
        "200",
        "--guest-symbols",
        map.to_str().unwrap(),
    ]);
    assert!(stderr(&out).contains("did not finish within"), "{}", stderr(&out));
    let samples = &json["guest_samples"][0];
    let total = samples["total"].as_u64().unwrap();
    // 200 Hz while the run lasted: some (a loaded host may take few), never more than
    // the run's own time allows.
    let seconds = json["elapsed_ms"].as_f64().unwrap() / 1000.0;
    assert!(total >= 1 && total as f64 <= 200.0 * seconds * 1.1 + 2.0, "{total} samples in {seconds} s: {json}");
    // The guest spins in its own code, above 1 MiB: every sample falls in payload_code.
    assert_eq!(samples["top"][0]["at"], "payload_code", "{json}");
    assert_eq!(samples["top"][0]["samples"].as_u64(), Some(total), "{json}");
    assert!(stderr(&out).contains("100.0%  payload_code"), "{}", stderr(&out));

    // Unsampled runs say nothing about samples; a map that names no function is refused.
    let (_, json) = run_json(&["--payload", "crash", "--params", "2", "--timeout", "0.3"]);
    assert!(json.get("guest_samples").is_none(), "{json}");
    std::fs::write(&map, "garbage\n").unwrap();
    assert_one_line_error(&["run", "--sample-guest", "10", "--guest-symbols", map.to_str().unwrap()]);
}

#[test]
fn a_guest_spinning_in_place_is_stopped_as_stuck_but_an_idle_one_is_not() {
    if !kvm_or_skip("a_guest_spinning_in_place_is_stopped_as_stuck_but_an_idle_one_is_not") {
        return;
    }
    let stuck = ["--sample-guest", "100", "--stuck-after", "0.5", "--timeout", "20"];
    // `jmp .` at CPL3: one register state, forever.
    let (out, json) = run_json(&[&["--payload", "crash", "--params", "2"][..], &stuck].concat());
    assert!(!out.status.success());
    assert!(stderr(&out).contains("this vCPU has looped over the same"), "{}", stderr(&out));
    // Stopped as stuck (the error says so), not by the timeout.
    assert!(json["error"].as_str().unwrap_or("").contains("stuck"), "{json}");
    // Halted with interrupts off: idle, which waits; only the timeout ends it.
    let (out, _) = run_json(&[&["--payload", "wait"][..], &stuck[..4], &["--timeout", "1.5"]].concat());
    assert!(stderr(&out).contains("did not finish within"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("stuck"), "{}", stderr(&out));
    // It judges from the samples: without them it is refused.
    assert_one_line_error(&["run", "--stuck-after", "5"]);
}

#[test]
fn run_with_the_lab_devices_hands_over_to_the_labs_binary() {
    if !kvm_or_skip("run_with_the_lab_devices_hands_over_to_the_labs_binary") {
        return;
    }
    let (out, json) = run_json(&["--payload", "pciscan", "--params", "4", "--lab"]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    // The doorbell and the idle port: devices only the lab plugs in.
    for lab_device in ["doorbell-pio", "doorbell-mmio", "idle"] {
        assert!(json["devices"][lab_device].is_object(), "{lab_device} missing: {json}");
    }
    let bad = exitless(&["run", "--payload", "pciscan", "--lab", "--no-such-flag"]);
    assert!(!bad.status.success() && stderr(&bad).contains("--no-such-flag"), "{}", stderr(&bad));
}
