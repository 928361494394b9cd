//! A device module owns its device (issue 54, item 4): a new virtio device touches at most
//! 4 shared files. The proof is virtio-fs: outside its own folders (the VMM's
//! `virtio/fs/`, the CLI's `api/devices/fs/`), the files of the product's crates (the
//! VMM, its command line and API, the jailer) that name it, by a module path, a type or a
//! launcher of its own, are listed and counted. The labs (`exitless-lab`, `exitless-bench`)
//! are not the device: a bench of it (`bench fs`) is a folder of its own there plus a
//! subcommand's lines.

use std::path::{Path, PathBuf};

/// The device's own folders, from the workspace's root.
const OWN: &[&str] = &["crates/vmm/src/virtio/fs", "crates/cli/src/api/devices/fs"];
/// The crates that make the product (`crates/<name>`), the ones a device is added to.
const PRODUCT: &[&str] = &["vmm", "cli", "jailer"];
/// The most shared files a device may name it in.
const MOST_SHARED: usize = 4;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file: each line without its comment.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().map(|l| l.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The names the device's files define: (its types, everything it makes public).
fn own_names(files: &[PathBuf]) -> (Vec<String>, Vec<String>) {
    let (mut types, mut all) = (Vec::new(), vec!["config".to_string(), "run".to_string()]);
    for file in files {
        for line in code(file).lines() {
            let words: Vec<&str> =
                line.split(|c: char| !c.is_alphanumeric() && c != '_').filter(|w| !w.is_empty()).collect();
            let Some(at) = words.iter().position(|w| *w == "pub") else { continue };
            let rest: Vec<&str> = words[at + 1..].iter().copied().filter(|w| !["crate", "super"].contains(w)).collect();
            if let [kind, name, ..] = rest[..] {
                if ["struct", "enum", "trait", "type"].contains(&kind) {
                    types.push(name.to_string());
                }
                if ["struct", "enum", "trait", "type", "fn", "const", "static", "mod"].contains(&kind) {
                    all.push(name.to_string());
                }
            }
        }
    }
    all.sort();
    all.dedup();
    (types, all)
}

/// Where `code` names the device: its module paths (`virtio::fs`, `mod fs`, `fs::X` for
/// an X of its own), one of its types, its launcher (`virtiofsd`), its configuration's
/// field (`devices.fs`) or its handle's finder (`.fs(`). The needles it matched.
fn names_it(code: &str, types: &[String], all: &[String]) -> Vec<String> {
    let mut needles: Vec<String> =
        ["virtio::fs", "mod fs", "virtiofsd", "devices.fs", ".fs("].map(String::from).to_vec();
    needles.extend(types.iter().cloned());
    needles.extend(all.iter().map(|n| format!("fs::{n}")));
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    for needle in needles {
        let hit = code.match_indices(&needle).any(|(i, _)| {
            let end = i + needle.len();
            let before_ok = i == 0 || !is_ident(bytes[i - 1]) || needle.starts_with('.');
            let after_ok = end == bytes.len() || !is_ident(bytes[end]) || needle.ends_with('(');
            before_ok && after_ok
        });
        if hit {
            found.push(needle);
        }
    }
    found
}

#[test]
fn virtio_fs_is_named_in_at_most_four_shared_files() {
    let root = root();
    let own: Vec<PathBuf> = OWN.iter().map(|d| root.join(d)).collect();
    let mut own_files = Vec::new();
    own.iter().for_each(|d| rust_files(d, &mut own_files));
    assert!(own_files.len() >= 4, "the device's own files moved: {own_files:?}");
    let (types, all) = own_names(&own_files);
    assert!(types.iter().any(|t| t == "FsConfig") && all.iter().any(|n| n == "DEVICE"), "{types:?} {all:?}");
    let mut shared = Vec::new();
    for krate in PRODUCT {
        let src = root.join("crates").join(krate).join("src");
        assert!(src.is_dir(), "{} moved", src.display());
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for file in files.into_iter().filter(|f| !own.iter().any(|d| f.starts_with(d))) {
            let hits = names_it(&code(&file), &types, &all);
            if !hits.is_empty() {
                shared.push((file.strip_prefix(&root).unwrap().display().to_string(), hits));
            }
        }
    }
    shared.sort();
    println!("shared files naming virtio-fs ({}):", shared.len());
    for (file, hits) in &shared {
        println!("  {file}: {}", hits.join(", "));
    }
    // Its `pub mod` in the VMM's virtio/mod.rs at the least: else the search is broken.
    assert!(shared.iter().any(|(f, _)| f == "crates/vmm/src/virtio/mod.rs"), "{shared:?}");
    assert!(
        shared.len() <= MOST_SHARED,
        "virtio-fs is named in {} shared files, at most {MOST_SHARED}: {shared:?}",
        shared.len()
    );
}

#[test]
fn the_search_tells_the_device_from_std() {
    let (types, all) = (vec!["FsConfig".to_string()], vec!["DEVICE".to_string(), "attach".to_string()]);
    assert_eq!(names_it("use exitless_vmm::virtio::fs::attach;", &types, &all), ["virtio::fs", "fs::attach"]);
    assert_eq!(names_it("let d = &fs::DEVICE;", &types, &all), ["fs::DEVICE"]);
    assert_eq!(names_it("x: FsConfig,", &types, &all), ["FsConfig"]);
    assert!(names_it("std::fs::read(p); let c: MyFsConfig; sregs.fs = 0;", &types, &all).is_empty());
}
