#![no_main]
// See exitless_vmm::fuzzing::bus_dispatch for what the input drives.
libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless_vmm::fuzzing::bus_dispatch(data));
