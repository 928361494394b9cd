//! The unmodified firecracker-go-sdk (tests/gosdk, pinned in its go.mod, from the Go
//! module proxy) drives exitless through a microVM's life: `go test` in that module,
//! against the binary this build made. Needs Go, KVM and root (the NIC's tap); skipped
//! loudly without them, and failing instead under EXITLESS_REQUIRE_KVM=1 (CI).

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

#[test]
fn the_go_sdk_starts_pauses_updates_flushes_and_stops_a_microvm() {
    let test = "the_go_sdk_starts_pauses_updates_flushes_and_stops_a_microvm";
    if !kvm_or_skip(test) {
        return;
    }
    let Some(go) = go_or_skip(test) else {
        return;
    };
    if !exitless_lab::netns::available() {
        assert!(!skip_or_fail(test, "needs root and /dev/net/tun for the NIC's tap"));
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    // exitless makes the tap; the test removes it.
    let tap = format!("exsdk{}", std::process::id() % 100_000);
    let _remove = RemoveLinks(vec![tap.clone()]);
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gosdk");
    let jailer = Path::new(env!("CARGO_BIN_EXE_exitless")).with_file_name("exitless-jailer");
    assert!(jailer.exists(), "{} is not built: `cargo test --workspace` builds it", jailer.display());
    let out = Command::new(go)
        .args(["test", "-count=1", "-v", "./..."])
        .current_dir(&module)
        .env("EXITLESS_BIN", env!("CARGO_BIN_EXE_exitless"))
        .env("EXITLESS_PAYLOADS", &payloads)
        .env("EXITLESS_TAP", &tap)
        .env("EXITLESS_JAILER", &jailer)
        // The SDK waits 3 s for the socket by default; the jailer first copies the (debug,
        // 90 MiB) binary into the jail, which on a loaded 2-core host takes longer.
        .env("FIRECRACKER_GO_SDK_INIT_TIMEOUT_SECONDS", "60")
        .output()
        .expect("run go test");
    let text = format!("{}\n{}", stdout(&out), stderr(&out));
    assert!(out.status.success(), "{text}");
    // Every Go test ran (none skipped for a missing variable).
    for name in [
        "TestTheGoSDKDrivesAMicroVMThroughItsLife",
        "TestStopVMMEndsTheVMMAndItsSocket",
        "TestSnapshotsThroughTheSDK",
        "TestTheSDKsBalloonCalls",
        "TestTheSDKsJailerPathRunsExitlessInAJail",
        "TestTheVersionLineParsesAsTheGoSDKParsesIt",
        "TestTheVersionLineParsesAsKataParsesIt",
    ] {
        assert!(text.contains(&format!("--- PASS: {name}")), "{name} did not pass:\n{text}");
    }
}
