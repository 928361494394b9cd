//! Replays the `api_request` and `api_http` fuzz corpora (fuzz/corpus/api_*/*) through the entry points
//! the fuzz target uses, on the stable toolchain (the VMM's targets replay in
//! crates/vmm/tests/fuzz_corpus.rs).

use std::path::Path;

#[test]
fn every_api_corpus_file_is_answered_as_the_api_answers() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/api_request");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(!files.is_empty(), "an empty corpus replays nothing");
    for file in files {
        eprintln!("api_request: {}", file.display());
        exitless::api::fuzzing::requests(&std::fs::read(&file).unwrap());
    }
}

#[test]
fn every_http_corpus_file_is_answered_with_well_formed_replies() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/api_http");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 10, "the seed corpus is missing");
    for file in files {
        eprintln!("api_http: {}", file.display());
        exitless::api::fuzzing::http(&std::fs::read(&file).unwrap());
    }
}
