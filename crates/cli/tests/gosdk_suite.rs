//! firecracker-go-sdk's OWN test suite (not exitless's Go tests: those are tests/gosdk), at
//! the commit of its main branch pinned in tests/gosdk_suite/go.mod, run against the exitless
//! this build made: the subset that needs neither Firecracker's S3 images nor CNI plugins.
//! scripts/gosdk-suite.sh runs the whole suite beside Firecracker.
//!
//! The suite only starts, pauses, snapshots and stops guests, never looks inside them, so
//! its `vmlinux` here is the `wait` payload and its root drive an empty file. Needs Go, KVM,
//! root (the SDK's root tests, a tap) and the SDK's git repository (cloned into
//! ~/.cache/exitless/gosdk/sdk from $GOSDK_GIT or GitHub when missing); skipped loudly
//! without them, failing instead under EXITLESS_REQUIRE_KVM=1 (CI).

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The SDK's main branch, 2025-12-24 ("Merge pull request #700"); go.mod names the same.
const PINNED: &str = "6fb280e993d4516ee6d5d20238572fe8752bc7ca";

/// The SDK's tests run here, and subtests left out: the SSH one needs an image with sshd.
/// Not TestSignalForwarding: it runs the SDK's sigprint.sh, never the VMM, and sends its
/// signals before the script has set its traps (it failed so once here under load,
/// "signal: interrupt"); scripts/gosdk-suite.sh still runs it.
const TESTS: &[&str] = &[
    "TestStartVMMOnce",
    "TestStartVMM",
    "TestMicroVMExecution",
    "TestMicroVMExecutionWithMmdsV2",
    "TestWaitForSocket",
    "TestLogFiles",
    "TestSocketPathSet",
    "TestPID",
    "TestWait",
    "TestWaitWithInvalidBinary",
    "TestWaitWithNoSocket",
    "TestPauseResume",
    "TestCreateSnapshot",
    "TestLoadSnapshot",
    "TestLoadSnapshot/TestLoadSnapshot",
    "TestLoadSnapshot/TestLoadSnapshotWithMemoryBackend",
];
const SKIP: &str = "^TestLoadSnapshot$/via_ssh";

#[test]
fn the_go_sdks_own_tests_pass_against_exitless() {
    let test = "the_go_sdks_own_tests_pass_against_exitless";
    if !kvm_or_skip(test) {
        return;
    }
    let Some(go) = go_or_skip(test) else {
        return;
    };
    if !exitless_lab::netns::available() {
        assert!(!skip_or_fail(test, "needs root and /dev/net/tun (the SDK's root tests, a tap)"));
        return;
    }
    let dir = tempdir();
    let Some(sdk) = pinned_checkout(&dir.join("sdk")) else {
        assert!(!skip_or_fail(test, "no checkout of firecracker-go-sdk at the pinned commit"));
        return;
    };
    // The pinned module, with `./sdk` (its replace target) beside it.
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gosdk_suite");
    for file in ["go.mod", "go.sum", "suite.go"] {
        std::fs::copy(module.join(file), dir.join(file)).unwrap();
    }
    let data = testdata(&dir, &sdk);
    let tap = format!("exsdks{}", std::process::id() % 100_000);
    let _remove = RemoveLinks(vec![tap.clone()]);
    let jailer = Path::new(env!("CARGO_BIN_EXE_exitless")).with_file_name("exitless-jailer");
    let names: Vec<&str> = TESTS.iter().filter(|t| !t.contains('/')).copied().collect();
    let out = Command::new(go)
        .args(["test", "-count=1", "-v", "-timeout=5m", "-skip", SKIP])
        .arg(format!("-run=^({})$", names.join("|")))
        .arg("github.com/firecracker-microvm/firecracker-go-sdk")
        .current_dir(&*dir)
        .env("FC_TEST_BIN", env!("CARGO_BIN_EXE_exitless"))
        .env("FC_TEST_JAILER_BIN", &jailer)
        .env("FC_TEST_TAP", &tap)
        .env("FC_TEST_DATA_PATH", &data)
        // Empty: the SDK's root tests run (we are root).
        .env("DISABLE_ROOT_TESTS", "")
        .env("GOFLAGS", "-mod=readonly")
        .output()
        .expect("run go test");
    let text = format!("{}\n{}", stdout(&out), stderr(&out));
    assert!(out.status.success(), "{text}");
    for name in TESTS {
        let line = format!("--- PASS: {}", name.replace(' ', "_"));
        assert!(text.lines().any(|l| l.trim_start().starts_with(&format!("{line} "))), "{name} did not pass:\n{text}");
    }
}

/// A clone of the SDK at `PINNED` in `to`, from the cached checkout (made from $GOSDK_GIT or
/// GitHub the first time).
fn pinned_checkout(to: &Path) -> Option<PathBuf> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let cache = std::env::var("GOSDK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(home).join(".cache/exitless/gosdk/sdk"));
    let git = |args: &[&str]| Command::new("git").args(args).output().is_ok_and(|o| o.status.success());
    let has_pin =
        |repo: &Path| git(&["-C", repo.to_str()?, "cat-file", "-e", &format!("{PINNED}^{{commit}}")]).then_some(());
    if has_pin(&cache).is_none() {
        // $GOSDK_GIT, else a local mirror where this project's machines keep one (GitHub
        // itself is out of reach from some of them), else GitHub.
        const MIRROR: &str = "/work/.mirror/firecracker-microvm+firecracker-go-sdk/repo";
        let url = std::env::var("GOSDK_GIT").unwrap_or_else(|_| match Path::new(MIRROR).exists() {
            true => MIRROR.into(),
            false => "https://github.com/firecracker-microvm/firecracker-go-sdk".into(),
        });
        if !cache.join(".git").exists() {
            git(&["clone", "-q", &url, cache.to_str()?]);
        } else {
            git(&["-C", cache.to_str()?, "fetch", "-q", &url]);
        }
        has_pin(&cache)?;
    }
    let ok = git(&["clone", "-q", "--no-checkout", cache.to_str()?, to.to_str()?])
        && git(&["-C", to.to_str()?, "checkout", "-q", PINNED]);
    ok.then(|| to.to_path_buf())
}

/// FC_TEST_DATA_PATH: the SDK's own testdata files, and in place of its S3 downloads the
/// `wait` payload as `vmlinux` and empty root images (the tests run leave them unread).
fn testdata(dir: &Path, sdk: &Path) -> PathBuf {
    let data = dir.join("testdata");
    std::fs::create_dir_all(&data).unwrap();
    for entry in std::fs::read_dir(sdk.join("testdata")).unwrap().flatten() {
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), data.join(entry.file_name())).unwrap();
        }
    }
    let payloads = payloads_in(dir);
    std::fs::copy(payloads.join("wait.elf"), data.join("vmlinux")).unwrap();
    for image in ["root-drive.img", "root-drive-with-ssh.img"] {
        let file = std::fs::File::create(data.join(image)).unwrap();
        file.set_len(8 << 20).unwrap();
    }
    std::fs::write(data.join("root-drive-ssh-key"), "unused: the SSH subtest is skipped\n").unwrap();
    data
}
