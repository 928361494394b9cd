//! docs/architecture.md names files as a reader's way into the code: each must exist.

use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
        let path = entry.path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// Every `name.rs` or `dir/name.rs` the text mentions.
fn named(text: &str) -> Vec<String> {
    let word = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '/' | '-' | '.');
    text.split(|c: char| !word(c))
        .map(|w| w.trim_matches('.'))
        .filter(|w| w.ends_with(".rs") && w.len() > 3)
        .map(String::from)
        .collect()
}

#[test]
fn every_file_the_architecture_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let mut all = Vec::new();
    files(&root.join("crates"), &mut all);
    let all: Vec<String> = all.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let names = named(&text);
    assert!(names.len() > 20, "too few file names read to judge: {names:?}");
    let missing: Vec<&String> =
        names.iter().filter(|n| !all.iter().any(|p| p.ends_with(&format!("/{}", n.trim_start_matches('/'))))).collect();
    assert!(missing.is_empty(), "docs/architecture.md names files that do not exist: {missing:?}");
}

#[test]
fn a_missing_file_is_seen() {
    assert_eq!(named("see `vcpu/state.rs`, and lib.rs."), ["vcpu/state.rs", "lib.rs"]);
}
