#![no_main]
// Raw bytes on one API connection (request lines, headers, Content-Length, chunked
// bodies, pipelining, a client that stops mid-request), served by the real HTTP server.
libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless::api::fuzzing::http(data));
