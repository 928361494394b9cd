//! Lays out the `exitless` binary's code so that what a VMM runs from its start to a running
//! guest sits together (resources/link/exitless.order, made by scripts/link-order.sh): the
//! kernel maps a binary's text 64 KiB around every page touched, so scattered start-up code
//! costs resident memory in every VMM of a fleet (docs/benchmarks.md, issue #54).

fn main() {
    let order = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../resources/link/exitless.order");
    println!("cargo:rerun-if-changed={}", order.display());
    println!("cargo:rerun-if-env-changed=EXITLESS_LINK_ORDER");
    // Only rust-lld (the default linker of x86_64-unknown-linux-gnu since Rust 1.90) takes
    // an ordering file; `EXITLESS_LINK_ORDER=off` builds without it for another linker.
    let off = std::env::var("EXITLESS_LINK_ORDER").is_ok_and(|v| v == "off");
    let lld_target = std::env::var("TARGET").is_ok_and(|t| t == "x86_64-unknown-linux-gnu");
    if order.exists() && lld_target && !off {
        println!("cargo:rustc-link-arg-bin=exitless=-Wl,--symbol-ordering-file={}", order.display());
        // Names the toolchain no longer makes are skipped, not errors: a stale order costs
        // memory, never a build (tests/link_order.rs says when it has gone stale).
        println!("cargo:rustc-link-arg-bin=exitless=-Wl,--no-warn-symbol-ordering");
    }
}
