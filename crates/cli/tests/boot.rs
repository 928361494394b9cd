//! Boot protocols, ACPI, SMP and platform exits, checked from inside real guests.

mod common;
use common::*;

/// Writes `bytes` into a fresh file and returns its path.
fn file(name: &str, bytes: &[u8]) -> TempDir {
    let path = temp_path(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A 4 KiB initrd of known bytes, and the sum of those bytes.
fn initrd() -> (TempDir, u64) {
    let bytes: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    (file("initrd.bin", &bytes), bytes.iter().map(|&b| u64::from(b)).sum())
}

fn bootcheck(kernel_args: &[&str], mem: u64, vcpus: u8) {
    let (initrd, sum) = initrd();
    let cmdline = "exitless bootcheck console=ttyS0 x=1";
    let (mem_arg, vcpus_arg) = (format!("{}M", mem >> 20), vcpus.to_string());
    let params = format!("{mem},{vcpus},4096,{sum}");
    let mut args = kernel_args.to_vec();
    args.extend(["--initrd", initrd.as_str(), "--mem", &mem_arg, "--vcpus", &vcpus_arg, "--cmdline", cmdline]);
    args.extend(["--params", &params]);
    let (out, json) = run_json(&args);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert!(text.contains("bootcheck: all checks passed"), "{text}");
    assert!(text.contains(&format!("bootcheck: cmdline [{cmdline}]")), "{text}");
    assert!(text.contains(&format!("APIC({vcpus} cpus)")), "{text}");
    assert_eq!(json["exit_status"], 0);
}

#[test]
fn pvh_guest_sees_its_start_info_e820_initrd_cmdline_and_acpi() {
    if !kvm_or_skip("pvh_guest_sees_its_start_info_e820_initrd_cmdline_and_acpi") {
        return;
    }
    bootcheck(&["--payload", "bootcheck"], 256 << 20, 2);
    assert!(stdout(&exitless(&["run", "--payload", "bootcheck"])).contains("protocol pvh"));
}

#[test]
fn bzimage_guest_sees_its_zero_page_with_ram_above_4g() {
    if !kvm_or_skip("bzimage_guest_sees_its_zero_page_with_ram_above_4g") {
        return;
    }
    let bz = exitless_payloads::find("bootcheck").unwrap().bzimage.expect("bootcheck bzImage");
    let kernel = file("bootcheck.bzImage", bz);
    bootcheck(&["--kernel", kernel.as_str()], 8 << 30, 3);
}

#[test]
fn every_vcpu_is_started_by_the_guest_and_counted() {
    if !kvm_or_skip("every_vcpu_is_started_by_the_guest_and_counted") {
        return;
    }
    let (out, json) = run_json(&["--payload", "smp", "--vcpus", "3"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert!(text.contains("smp: 2 of 2 other cpus checked in"), "{text}");
    let vcpus = json["vcpus"].as_array().expect("per-vCPU exits");
    assert_eq!(vcpus.len(), 3);
    for (id, v) in vcpus.iter().enumerate() {
        let io = v["exits"]["io_out"].as_u64().unwrap_or(0);
        assert!(io > 10, "vCPU {id} printed its check-in: {json}");
    }
}

#[test]
fn reset_and_poweroff_end_the_run_cleanly() {
    if !kvm_or_skip("reset_and_poweroff_end_the_run_cleanly") {
        return;
    }
    for (mode, stop) in [("3", "reset"), ("4", "poweroff"), ("5", "reset")] {
        let (out, json) = run_json(&["--payload", "crash", "--params", mode]);
        assert!(out.status.success(), "mode {mode}: {}", stderr(&out));
        assert_eq!(json["stop"], stop, "mode {mode}: {json}");
        assert!(!stdout(&out).contains("still running"), "mode {mode}");
    }
}

#[test]
fn int3_and_int_n_kvm_cannot_emulate_are_completed_and_counted() {
    if !kvm_or_skip("int3_and_int_n_kvm_cannot_emulate_are_completed_and_counted") {
        return;
    }
    let (out, json) = run_json(&["--payload", "crash", "--params", "6"]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("handler ran 3 times"), "{}", stdout(&out));
    // Where KVM emulates them itself the VMM never sees them; where it cannot, each is counted.
    let int3 = json["completed_instructions"]["int3"].as_u64().unwrap_or(0);
    let int_n = json["completed_instructions"]["int n"].as_u64().unwrap_or(0);
    assert!((int3, int_n) == (0, 0) || (int3, int_n) == (2, 1), "{json}");
}

#[test]
fn a_system_call_the_host_leaves_at_cpl3_is_finished_by_the_vmm() {
    if !kvm_or_skip("a_system_call_the_host_leaves_at_cpl3_is_finished_by_the_vmm") {
        return;
    }
    // Two syscalls from CPL3 into a supervisor-only entry: the first returns by sysretq,
    // the second ends the run with the entry's CS. 8 is CPL0's code segment; 14 would be
    // the page fault a CPL3 fetch of the entry raises, where the switch did not happen.
    let (out, json) = run_json(&["--payload", "crash", "--params", "8"]);
    assert_eq!(out.status.code(), Some(8), "{}\n{}", stdout(&out), stderr(&out));
    // An ordinary page fault before them reached the guest's handler past the VMM's watch.
    assert!(stdout(&out).contains("1 ordinary page fault handled, then read the right bytes"), "{}", stdout(&out));
    // Where the host switches privilege itself the VMM finishes none; here it finishes both.
    let finished = json["completed_instructions"]["syscall-cpl-switch"].as_u64().unwrap_or(0);
    assert!(finished == 0 || finished == 2, "{json}");
    assert_eq!(json["exits"]["wrmsr"].as_u64(), Some(1), "the LSTAR write is trapped once: {json}");
}

#[test]
fn a_vmcall_at_cpl0_is_answered_as_an_unknown_hypercall_on_every_host() {
    if !kvm_or_skip("a_vmcall_at_cpl0_is_answered_as_an_unknown_hypercall_on_every_host") {
        return;
    }
    // A native host's KVM answers it; this nested host's never completes it, and the
    // nested profile answers it instead, within its watch's period.
    // Within the run's timeout (its own error otherwise, and no status 9).
    let (out, json) = run_json(&["--payload", "crash", "--params", "9", "--timeout", "30"]);
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    assert!(stdout(&out).contains("vmcall returned -1000"), "{}", stdout(&out));
    if json["host_profile"].as_str().is_some_and(|p| p.starts_with("nested")) {
        assert_eq!(json["completed_instructions"]["vmcall"], 1, "{json}");
    }
}

#[test]
fn sse_arithmetic_kvm_cannot_emulate_runs_on_the_host_and_is_counted() {
    if !kvm_or_skip("sse_arithmetic_kvm_cannot_emulate_runs_on_the_host_and_is_counted") {
        return;
    }
    let (out, json) = run_json(&["--payload", "crash", "--params", "7"]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("sse at CPL0 gave f0f0f0f0f0f0f08 f0f0f0f0f0f0f0f0"), "{}", stdout(&out));
    // Where KVM runs CPL0 natively the VMM sees none; here paddq, pshufd and pxor run on the host.
    let on_host = json["completed_instructions"]["sse-on-host"].as_u64().unwrap_or(0);
    assert!(on_host == 0 || on_host >= 3, "{json}");
}

#[test]
fn bad_kernels_initrds_and_machine_shapes_are_refused_before_boot() {
    let bz = exitless_payloads::find("bootcheck").unwrap().bzimage.unwrap();
    let truncated = file("truncated.bzImage", &bz[..700]);
    let foreign = file("foreign.bin", &[0x5a; 8192]);
    let mut old = bz.to_vec();
    old[0x206] = 0x04; // boot protocol 2.04
    let old = file("old.bzImage", &old);
    let big = file("big.initrd", &vec![1u8; 5 << 20]);
    let fits_ram_not_beside_kernel = file("tight.initrd", &vec![1u8; 3 << 20]);
    let long = "x".repeat(3000);
    let kernel = file("bootcheck.bzImage", bz);
    for args in [
        &["run", "--kernel", truncated.as_str()][..],
        &["run", "--kernel", foreign.as_str()],
        &["run", "--kernel", old.as_str()],
        &["run", "--kernel", "/dev/zero", "--mem", "16M"],
        &["run", "--kernel", kernel.as_str(), "--initrd", big.as_str(), "--mem", "4M"],
        &["run", "--kernel", kernel.as_str(), "--initrd", fits_ram_not_beside_kernel.as_str(), "--mem", "4M"],
        &["run", "--kernel", kernel.as_str(), "--cmdline", &long],
        &["run", "--vcpus", "0"],
        &["run", "--vcpus", "255"],
        &["run", "--mem", "5000000"],
    ] {
        if !kvm_or_skip("bad_kernels_initrds_and_machine_shapes_are_refused_before_boot") {
            return;
        }
        assert_one_line_error(args);
    }
}
