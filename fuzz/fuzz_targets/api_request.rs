#![no_main]
// Firecracker API requests (method, path, JSON body) against a microVM that is never started.
libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless::api::fuzzing::requests(data));
