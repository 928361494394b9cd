//! Multiboot guests (kvm-unit-tests' format) and QEMU's test devices, from inside a guest.

mod common;
use common::*;

#[test]
fn a_multiboot_guest_sees_its_info_initrd_and_the_test_devices() {
    if !kvm_or_skip("a_multiboot_guest_sees_its_info_initrd_and_the_test_devices") {
        return;
    }
    let bytes: Vec<u8> = (0..5000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let sum: u64 = bytes.iter().map(|&b| u64::from(b)).sum();
    let initrd = temp_path("env");
    std::fs::write(&initrd, &bytes).unwrap();
    let params = format!("{},2,5000,{sum}", 300u64 << 20);
    let args = ["--payload", "mbcheck", "--testdevs", "--mem", "300M", "--vcpus", "2", "--params", &params];
    let mut all = args.to_vec();
    all.extend(["--initrd", initrd.to_str().unwrap(), "--cmdline", "mbcheck.flat -v x"]);
    let (out, json) = run_json(&all);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert!(text.contains("mbcheck: all checks passed"), "{text}");
    assert!(text.contains("mbcheck: cmdline [mbcheck.flat -v x]"), "{text}");
    assert_eq!(json["devices"]["pci-testdev-io"]["writes"].as_u64(), Some(2), "select + one counted write: {json}");
    assert!(!text.contains("edu behind"), "no edu without --testdev-iommu: {text}");

    // QEMU's edu behind the VT-d model: its DMA goes through the guest's page tables.
    all.push("--testdev-iommu");
    let (out, json) = run_json(&all);
    let text = stdout(&out);
    assert!(
        text.contains("mbcheck: ok   edu behind the IOMMU"),
        "{text}
{}",
        stderr(&out)
    );
    assert!(text.contains("mbcheck: all checks passed"), "{text}");
    assert!(json["devices"]["edu"]["writes"].as_u64() > Some(10), "{json}");
}

/// QEMU's `-kernel F -append A` hands a multiboot image `F A`, and kvm-unit-tests reads its
/// test names from argv[1] on: `exitless run --kernel F --cmdline A` must do the same.
#[test]
fn a_multiboot_kernels_command_line_starts_with_its_path() {
    if !kvm_or_skip("a_multiboot_kernels_command_line_starts_with_its_path") {
        return;
    }
    let dir = tempdir();
    let kernel = payloads_in(&dir).join("mbcheck.elf");
    let kernel = kernel.to_str().unwrap();
    let params = format!("{},1,0,0", 64u64 << 20);
    let out = exitless(&[
        "run",
        "--kernel",
        kernel,
        "--testdevs",
        "--mem",
        "64M",
        "--params",
        &params,
        "--cmdline",
        "cpuid -v",
    ]);
    let text = stdout(&out);
    assert!(text.contains(&format!("mbcheck: cmdline [{kernel} cpuid -v]")), "{text}\n{}", stderr(&out));
}

#[test]
fn without_testdevs_the_test_devices_are_absent() {
    if !kvm_or_skip("without_testdevs_the_test_devices_are_absent") {
        return;
    }
    let (out, json) = run_json(&["--payload", "mbcheck", "--params", &format!("{},1", 128u64 << 20)]);
    assert!(!out.status.success());
    assert!(stdout(&out).contains("mbcheck: FAIL fw_cfg signature QEMU"), "{}", stdout(&out));
    assert!(json["devices"].get("fw-cfg").is_none(), "{json}");
}

#[test]
fn foreign_or_broken_multiboot_images_are_refused() {
    let mut elf = exitless_payloads::find("mbcheck").unwrap().elf.to_vec();
    // Cut right after the multiboot header: the header is valid, the segments are not there.
    let magic = 0x1bad_b002u32.to_le_bytes();
    let header = elf.windows(4).position(|w| w == magic).unwrap();
    elf.truncate(header + 12);
    let path = temp_path("cut.flat");
    std::fs::write(&path, &elf).unwrap();
    let out = assert_one_line_error(&["run", "--kernel", path.to_str().unwrap()]);
    assert!(stderr(&out).contains("segment"), "{}", stderr(&out));
}

#[test]
fn s3_sleeps_until_the_rtc_alarm_and_resumes_at_the_waking_vector() {
    if !kvm_or_skip("s3_sleeps_until_the_rtc_alarm_and_resumes_at_the_waking_vector") {
        return;
    }
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let before = now();
    let (out, json) = run_json(&["--payload", "s3wake", "--testdevs", "--timeout", "60"]);
    let after = now();
    let text = stdout(&out);
    assert!(text.contains("s3wake: entering S3"), "{text}\n{}", stderr(&out));
    // The stub at the waking vector ran in real mode and found why the machine woke.
    assert_eq!(json["exit_status"], 0x8400, "WAK_STS | RTC_STS: {text}\n{}", stderr(&out));
    // The alarm matches every second: asleep for about one, not until a minute's match
    // (what a loaded host adds is far less than the half minute allowed here).
    assert!(json["elapsed_ms"].as_f64().unwrap_or(f64::MAX) < 30_000.0, "{json}");
    // The RTC tells the host's time of day (UTC).
    let line = text.lines().find_map(|l| l.strip_prefix("s3wake: rtc ")).expect("an rtc line");
    let n: Vec<i64> = line.split(['-', ' ', ':']).map(|f| f.parse().unwrap()).collect();
    let (y, mo, d) = (n[0] - i64::from(n[1] <= 2), n[1], n[2]);
    // Days from civil (Howard Hinnant), to compare with the host's clock.
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let doy = (153 * ((mo + 9) % 12) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let rtc = days * 86_400 + n[3] * 3600 + n[4] * 60 + n[5];
    // Read while the guest ran: between the host's clock before and after the run (to
    // the RTC's whole second).
    assert!((before - 1..=after + 1).contains(&rtc), "RTC {line} ({rtc}) is not within [{before}, {after}]");

    // Without --testdevs there is no S3 (and no RTC): the write is ignored.
    let (out, json) = run_json(&["--payload", "s3wake", "--timeout", "30"]);
    assert_eq!(json["exit_status"], 1, "{}", stdout(&out));
    assert!(stdout(&out).contains("S3 not entered"), "{}", stdout(&out));
}
