//! glibc malloc's tunables: what a VMM's heap holds resident in every VM of a fleet.

/// Two files glibc's malloc reads once per process, the first time it needs them, which a
/// confined thread may not open: /sys/devices/system/cpu/online (to bound the number of
/// arenas when a thread first allocates) and /proc/sys/vm/overcommit_memory (the first
/// time it shrinks a thread's heap). With one arena there is no thread heap to size or
/// shrink, so neither is ever read; the trim threshold keeps malloc from giving memory
/// back on every free (the start hands back once: [`give_back_start_garbage`]).
/// Called by the first confinement, and by the CLI before it starts any thread (so that
/// no thread makes an arena of its own before the bound is set).
pub fn keep_thread_heaps() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // One: the VMM's threads barely allocate once running (the exit paths never do),
        // and a second arena was 32 KiB resident in every VM.
        // SAFETY: mallopt only sets malloc tunables.
        #[cfg(target_env = "gnu")]
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        }
    });
}

/// Hands back to the host the heap pages that building the machine used and freed
/// (command-line and request parsing, the kernel's load, the device tables): about
/// 100 KiB a VM would otherwise hold for its life. Called once, just before the vCPUs run;
/// brk and madvise, all it calls, are in every thread's seccomp filter.
pub fn give_back_start_garbage() {
    // SAFETY: malloc_trim only releases free memory of malloc's own heap.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}
