//! Replays every kept fuzz corpus file (fuzz/corpus/TARGET/*) through the same entry
//! point the fuzz target uses, on the stable toolchain: what the fuzzers once found stays
//! fixed, and CI needs no nightly or libFuzzer for it.

use std::path::Path;

#[test]
fn every_corpus_file_runs_through_its_target_without_a_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    for (name, target) in exitless_vmm::fuzzing::TARGETS {
        let dir = root.join(name);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{name}: an empty corpus replays nothing");
        for file in files {
            let data = std::fs::read(&file).unwrap();
            // A panic names the file through the test's output.
            eprintln!("{name}: {}", file.display());
            target(&data);
        }
    }
}
