#![no_main]
// See exitless_vmm::fuzzing::virtio_mem for what the input drives.
libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless_vmm::fuzzing::virtio_mem(data));
