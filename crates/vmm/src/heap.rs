//! glibc malloc's tunables and the main stack: what a VMM holds resident in every VM of
//! a fleet beyond what it uses.

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

/// Hands back the pages of the main thread's stack below the caller's frame (and a
/// margin): the API's thread builds the machine deep in its stack (a snapshot's state
/// parsed, every device restored, about 60 KiB more than a request needs) and from then
/// on only answers requests near its top. Call it from the main thread, at a shallow
/// point, before confinement (it reads /proc/self/maps); elsewhere it does nothing.
pub fn give_back_main_stack() {
    // SAFETY: getpid and gettid only read the caller's ids.
    let main = unsafe { libc::getpid() == libc::gettid() };
    let Some((low, _)) = main.then(main_stack).flatten() else { return };
    let here = std::hint::black_box(0u8);
    let sp = &here as *const u8 as usize;
    // What this thread calls from here, and a signal's frame, stay resident.
    let end = sp.saturating_sub(16 << 10) & !0xfff;
    if end > low {
        // SAFETY: the pages lie below this frame's stack pointer (and the margin) in the
        // main thread's own stack, which only this thread uses: nothing lives there, and
        // a later touch finds zeros, as in a stack never used so deep.
        unsafe { libc::madvise(low as *mut libc::c_void, end - low, libc::MADV_DONTNEED) };
    }
}

/// The `[stack]` mapping's range.
fn main_stack() -> Option<(usize, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps.lines().find(|l| l.ends_with("[stack]"))?;
    let (low, high) = line.split_whitespace().next()?.split_once('-')?;
    Some((usize::from_str_radix(low, 16).ok()?, usize::from_str_radix(high, 16).ok()?))
}
