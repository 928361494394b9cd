//! The release binary's start-up code lies together (crates/cli/build.rs passes
//! resources/link/exitless.order to the linker): the kernel maps text 64 KiB around every
//! page a process touches, so this layout is what keeps a VMM's resident text near the code
//! it runs (1,132 KiB against 2,988 scattered: docs/benchmarks.md). Rust's symbol names
//! carry hashes of the toolchain and the build's features, so a new toolchain leaves the
//! file naming functions that no longer exist; this test says so, and
//! `scripts/link-order.py` makes the file again.

use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
use std::collections::HashMap;
use std::path::Path;

/// The README's first command builds this; CI runs that command before the tests.
const RELEASE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/x86_64-unknown-linux-gnu/release/exitless");
const ORDER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../resources/link/exitless.order");

fn order() -> Vec<String> {
    let text = std::fs::read_to_string(ORDER).expect("resources/link/exitless.order");
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect()
}

#[test]
fn the_release_binarys_start_up_functions_lie_together() {
    if !Path::new(RELEASE).exists() {
        assert!(
            std::env::var_os("EXITLESS_REQUIRE_KVM").is_none(),
            "no release build at {RELEASE}: CI runs the README's first command before the tests"
        );
        eprintln!("SKIPPED the_release_binarys_start_up_functions_lie_together: no release build (`cargo run --release -- run` makes it)");
        return;
    }
    let data = std::fs::read(RELEASE).unwrap();
    let file = object::File::parse(&*data).unwrap();
    // Only `.text` is laid out by the file (glibc's exit-time `__libc_freeres_fn` is not).
    let text = file.section_by_name(".text").expect("a .text section").index();
    let functions: HashMap<&str, (u64, u64)> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0 && s.section_index() == Some(text))
        .filter_map(|s| Some((s.name().ok()?, (s.address(), s.size()))))
        .collect();
    let order = order();
    let found: Vec<(u64, u64)> = order.iter().filter_map(|n| functions.get(n.as_str()).copied()).collect();
    // The file names the functions of two builds (the README's and the workspace's, whose
    // VMM crates' names differ): about three in four of its names are in either binary.
    let share = found.len() as f64 / order.len() as f64;
    assert!(
        share >= 0.5,
        "only {} of the {} functions resources/link/exitless.order names are in {RELEASE}: \
         the toolchain or the build changed their names; run `sudo scripts/link-order.py`",
        found.len(),
        order.len()
    );
    let start = found.iter().map(|f| f.0).min().unwrap();
    let end = found.iter().map(|f| f.0 + f.1).max().unwrap();
    let bytes: u64 = found.iter().map(|f| f.1).sum();
    // Laid out in order, they fill their span but for alignment padding; scattered, they
    // spread over the whole text (3 MiB).
    assert!(
        end - start <= bytes + bytes / 8,
        "the {} start-up functions ({} KiB) are spread over {} KiB: the ordering file did not reach the linker",
        found.len(),
        bytes / 1024,
        (end - start) / 1024
    );
}
