//! Compiles `bench fs`'s workload (src/fs/fsbench.c), a static Linux program the lab runs on
//! the host and puts in its guest's initramfs as /init. A host without a static C library
//! still builds the labs: the program is left empty and `bench fs` says why it cannot run.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("fsbench");
    let source = "src/fs/fsbench.c";
    println!("cargo:rerun-if-changed={source}");
    println!("cargo:rerun-if-env-changed=CC");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc)
        .args(["-static", "-O2", "-Wall", "-Wextra", "-o"])
        .arg(&out)
        .arg(source)
        .status()
        .is_ok_and(|s| s.success());
    if !built {
        println!("cargo:warning=cannot build {source} with `{cc} -static`: `bench fs` will say so");
        std::fs::write(&out, b"").expect("write an empty fsbench");
    }
}
