//! The labs' binary beside the VMM's: the lab code is in one and not the other. (This
//! file also makes `cargo test --workspace` build `exitless-bench` itself, which the
//! `exitless` package's tests of `exitless bench ...` run.)

use std::path::Path;
use std::process::Command;

fn symbols(binary: &Path) -> Option<String> {
    let out = Command::new("nm").arg("--defined-only").arg(binary).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn the_vmm_binary_carries_no_lab_code() {
    let bench = Path::new(env!("CARGO_BIN_EXE_exitless-bench"));
    let vmm = bench.with_file_name("exitless");
    assert!(vmm.is_file(), "{} is not built (cargo test --workspace builds it)", vmm.display());
    let Some(vmm_symbols) = symbols(&vmm) else {
        exitless_vmm::testing::skip_or_fail(
            "the_vmm_binary_carries_no_lab_code",
            "needs nm (binutils) to read the binary's symbols",
        );
        return;
    };
    // `nm` lists the symbols the linker kept: the labs' devices and client must not be
    // among them (`run --lab` hands over to exitless-bench instead).
    assert!(vmm_symbols.lines().count() > 1000, "nm listed too little to judge: {}", vmm_symbols.len());
    let lab: Vec<_> = vmm_symbols.lines().filter(|l| l.contains("exitless_lab")).take(5).collect();
    assert!(lab.is_empty(), "lab code in the VMM binary: {lab:?}");
    let bench_symbols = symbols(bench).unwrap_or_default();
    assert!(bench_symbols.contains("exitless_lab"), "the check would see lab code where there is some");
}

#[test]
fn the_labs_binary_lists_the_labs() {
    let out = Command::new(env!("CARGO_BIN_EXE_exitless-bench")).output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    for lab in ["doorbell", "pci", "net", "blk", "peers", "snapshot", "density", "fs"] {
        assert!(text.contains(lab), "{lab} missing from: {text}");
    }
}
