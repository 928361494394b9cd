//! seccomp filters (rust-vmm's seccompiler), one per kind of thread, installed by each
//! thread itself before it touches guest input: if a guest ever found a hole in a device,
//! the thread it reached could make only the system calls its job needs. A call outside
//! the filter raises SIGSYS; the handler names the call on stderr and ends the process.
//! `--no-seccomp` turns them off, for debugging.

use seccompiler::{BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter};
use seccompiler::{SeccompRule, TargetArch};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

static ENABLED: AtomicBool = AtomicBool::new(true);
static HANDLER: Once = Once::new();
/// How a process stopped by its filter exits: 128 + SIGSYS.
pub const EXIT_CODE: i32 = 128 + libc::SIGSYS;

/// What a thread does, which decides what it may call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadKind {
    /// Waits for the vCPUs, then writes the report.
    Main,
    /// KVM_RUN and the exit handlers (devices, emulation completions).
    Vcpu,
    /// A lab benchmark's vCPU loop: a vCPU's calls plus what the lab does between two
    /// runs (getrusage for its CPU time, coalesced ring (un)registration). Only in a
    /// build for the labs (the `lab` feature).
    #[cfg(feature = "lab")]
    LabVcpu,
    /// A virtio device's thread: epoll on eventfds and its backend.
    Device,
    /// virtio-blk's thread: the Device calls plus its file I/O.
    Block,
    /// virtio-rng's thread: the Device calls plus getrandom.
    Entropy,
    /// virtio-balloon's thread: waiting for its queues and madvise (in every thread's set)
    /// to discard the pages the guest gives up; no I/O at all.
    Balloon,
    /// virtio-pmem's thread: waiting for its queue and msync for the guest's flushes.
    Pmem,
    /// virtio-mem's thread: waiting for its queue, adding and removing the memory slots of
    /// hotpluggable memory (KVM_SET_USER_MEMORY_REGION) and madvise to discard what the
    /// guest unplugged.
    Mem,
    /// virtio-vsock's thread: the Device calls plus accepting host connections on its
    /// listening socket and connecting to the host's `<uds_path>_<port>` sockets.
    Vsock,
    /// A vhost-user device's thread: hands a backend process the queues over its socket
    /// (send and receive with descriptors, a duplicated irqfd) and watches it close; and
    /// its deadline's, which shuts the socket down on a reply that never comes.
    VhostUser,
    /// Writes the guest's console output.
    ConsoleOut,
    /// Feeds the console's input.
    SerialIn,
    /// The API's thread once its machine runs (it built the machine, unconfined, before):
    /// it accepts connections and serves them (an epoll-driven HTTP server), kicks the
    /// vCPUs for a pause, swaps drives and writes metrics; also the API's periodic
    /// metrics thread.
    Api,
    /// Takes SIGINT/SIGTERM/SIGHUP, runs the registered cleanups (removing a socket,
    /// unmounting a network namespace) and ends the process.
    Signals,
    /// Watches the API socket's directory (inotify, made before the filter) and, when the
    /// socket is gone, signals the process SIGTERM.
    SocketWatch,
    /// The API's hotplug worker (started before the API thread is confined): it opens a
    /// plugged device's files and tap, registers its interrupts, ioeventfds and memory
    /// slot, and starts its thread, which confines itself further (filters stack: a
    /// device thread may make only the calls of both, that is its own). So it may make
    /// every call any other kind may, thread creation and confinement, and any ioctl.
    /// It reaches no guest input.
    Hotplug,
    /// Helpers beside a VM: the run watchdog (kicks the vCPUs with a signal), the thread
    /// that unmaps guest RAM's old pages after a snapshot (snapshot/fork.rs), and the
    /// labs' traffic threads (send and receive on a packet socket that already exists) and
    /// memory pollers.
    Helper,
}

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("cannot build the {0:?} thread's seccomp filter")]
    Build(ThreadKind, #[source] seccompiler::BackendError),
    #[error("cannot compile the {0:?} thread's seccomp filter")]
    Compile(ThreadKind, #[source] seccompiler::BackendError),
    #[error("cannot install the {0:?} thread's seccomp filter")]
    Install(ThreadKind, #[source] seccompiler::Error),
    #[error("cannot hold the {0:?} thread to the microVM's files")]
    Landlock(ThreadKind, #[source] crate::landlock::LandlockError),
}

/// Turns filters off for the rest of the process (`--no-seccomp`).
pub fn disable() {
    ENABLED.store(false, Ordering::Release);
}

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Acquire)
}

/// What every thread needs: memory, locks, time, its own exit, and writing diagnostics.
const COMMON: &[i64] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_futex,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect, // glibc grows a thread's malloc arena with it
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_sched_yield,
    libc::SYS_close,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigprocmask,
    libc::SYS_sigaltstack,
    libc::SYS_restart_syscall,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_getpid,
    libc::SYS_gettid,
    // The SIGSYS handler names the thread (PR_GET_NAME).
    libc::SYS_prctl,
];

/// What every device thread needs to wait for its work (beyond COMMON).
const DEVICE_WAIT: &[i64] =
    &[libc::SYS_fcntl, libc::SYS_epoll_create1, libc::SYS_epoll_wait, libc::SYS_epoll_pwait, libc::SYS_epoll_ctl];

impl ThreadKind {
    fn runs_a_vcpu(self) -> bool {
        match self {
            ThreadKind::Vcpu => true,
            #[cfg(feature = "lab")]
            ThreadKind::LabVcpu => true,
            _ => false,
        }
    }
}

/// Every kind but the hotplug worker's.
const OTHER_KINDS: &[ThreadKind] = &[
    ThreadKind::Main,
    ThreadKind::Vcpu,
    ThreadKind::Device,
    ThreadKind::Block,
    ThreadKind::Entropy,
    ThreadKind::Balloon,
    ThreadKind::Pmem,
    ThreadKind::Mem,
    ThreadKind::Vsock,
    // A vhost-user drive plugged in shakes hands with its backend on the worker.
    ThreadKind::VhostUser,
    ThreadKind::ConsoleOut,
    ThreadKind::SerialIn,
    ThreadKind::Api,
    ThreadKind::Signals,
    ThreadKind::SocketWatch,
    ThreadKind::Helper,
];

fn allowed(kind: ThreadKind) -> Vec<i64> {
    let extra: &[i64] = match kind {
        ThreadKind::Hotplug => {
            let mut calls: Vec<i64> = OTHER_KINDS.iter().flat_map(|k| allowed(*k)).collect();
            calls.extend([
                libc::SYS_clone,
                libc::SYS_clone3,
                libc::SYS_set_robust_list,
                libc::SYS_rseq,
                libc::SYS_sched_getaffinity,
                libc::SYS_seccomp,
                libc::SYS_landlock_create_ruleset,
                libc::SYS_landlock_add_rule,
                libc::SYS_landlock_restrict_self,
                libc::SYS_eventfd2,
                libc::SYS_io_uring_setup,
                libc::SYS_io_uring_register,
                libc::SYS_ioctl,
                libc::SYS_socket,
            ]);
            calls.sort_unstable();
            calls.dedup();
            return calls;
        }
        // A vCPU's calls; the lab's CPU-time reading between two runs, and its helper
        // threads (a poller, the doorbell's eventfd thread), started between two runs.
        #[cfg(feature = "lab")]
        ThreadKind::LabVcpu => {
            let lab = [libc::SYS_getrusage, libc::SYS_clone, libc::SYS_clone3, libc::SYS_set_robust_list];
            let lab = [&lab[..], &[libc::SYS_rseq, libc::SYS_sched_getaffinity, libc::SYS_seccomp]].concat();
            let devices = [libc::SYS_epoll_create1, libc::SYS_epoll_wait, libc::SYS_epoll_pwait, libc::SYS_epoll_ctl];
            return [allowed(ThreadKind::Vcpu), lab, devices.to_vec()].concat();
        }
        // KVM_RUN and the vCPU/VM ioctls of exit handling (BAR moves, routes, memslots);
        // tgkill for the stop kick; writev for string I/O to the console; eventfd2 and
        // fcntl for the ioeventfds a BAR move re-registers. A device activated by a
        // DRIVER_OK write only hands its job to its own thread (virtio::thread).
        // getrandom: std seeds a thread's hash maps with it.
        ThreadKind::Vcpu => &[
            libc::SYS_tgkill,
            // musl signals a thread with tkill(2), glibc with tgkill(2).
            libc::SYS_tkill,
            libc::SYS_writev,
            libc::SYS_readv,
            libc::SYS_eventfd2,
            libc::SYS_fcntl,
            libc::SYS_getrandom,
            // A pmem file's length, read again when KVM_RUN fails with EFAULT (truncated
            // under the guest: crate::kvm::FaultRepair); musl fstat(2), glibc statx(2).
            libc::SYS_fstat,
            libc::SYS_statx,
        ],
        // Every device thread waits in epoll; std's debug builds check a descriptor with
        // F_GETFD as they close it. getrandom: a NIC with MMDS makes V2 session tokens.
        ThreadKind::Device => {
            return [COMMON, DEVICE_WAIT, &[libc::SYS_readv, libc::SYS_writev, libc::SYS_getrandom]].concat()
        }
        // std's UnixStream reads and writes with recv/send.
        ThreadKind::Vsock => {
            let sockets = [libc::SYS_accept4, libc::SYS_socket, libc::SYS_connect, libc::SYS_shutdown];
            let io = [libc::SYS_readv, libc::SYS_writev, libc::SYS_recvfrom, libc::SYS_sendto];
            return [COMMON, DEVICE_WAIT, &sockets, &io].concat();
        }
        ThreadKind::Entropy => return [COMMON, DEVICE_WAIT, &[libc::SYS_getrandom]].concat(),
        ThreadKind::Balloon => return [COMMON, DEVICE_WAIT].concat(),
        ThreadKind::Pmem => return [COMMON, DEVICE_WAIT, &[libc::SYS_msync]].concat(),
        // fallocate punches unplugged blocks out of the memfd a vhost-user backend maps.
        ThreadKind::Mem => return [COMMON, DEVICE_WAIT, &[libc::SYS_fallocate]].concat(),
        ThreadKind::VhostUser => {
            // socket and connect: a restarted backend is reconnected (reconnect.rs).
            let socket = [
                libc::SYS_sendmsg,
                libc::SYS_recvmsg,
                libc::SYS_dup,
                libc::SYS_shutdown,
                libc::SYS_socket,
                libc::SYS_connect,
            ];
            return [COMMON, DEVICE_WAIT, &socket].concat();
        }
        // The ring is made before any filter; the thread only enters it (or, without
        // io_uring, makes the calls itself); fallocate serves discard and write-zeroes.
        ThreadKind::Block => {
            let io = [
                libc::SYS_io_uring_enter,
                libc::SYS_preadv,
                libc::SYS_pwritev,
                libc::SYS_fdatasync,
                libc::SYS_fallocate,
            ];
            return [COMMON, DEVICE_WAIT, &io].concat();
        }
        ThreadKind::ConsoleOut | ThreadKind::SerialIn => &[],
        // getrandom: std's HashMap seeds itself.
        // getsockopt: the sink reads its socket's drop count. fcntl: std's debug builds
        // check a descriptor with F_GETFD as they close it.
        ThreadKind::Helper => &[
            libc::SYS_tgkill,
            // musl signals a thread with tkill(2), glibc with tgkill(2).
            libc::SYS_tkill,
            libc::SYS_sendto,
            libc::SYS_recvfrom,
            libc::SYS_getsockopt,
            libc::SYS_getrandom,
            libc::SYS_fcntl,
        ],
        // Joining threads, kicking vCPUs, reading /proc/self for the report, writing the
        // JSON report, restoring the terminal (ioctl TCSETS), dropping KVM objects.
        // unlink: a vsock device dropped with the machine removes its socket.
        ThreadKind::Main => &[
            libc::SYS_unlink,
            libc::SYS_tgkill,
            // musl signals a thread with tkill(2), glibc with tgkill(2).
            libc::SYS_tkill,
            libc::SYS_openat,
            // musl opens with open(2), glibc with openat(2).
            libc::SYS_open,
            libc::SYS_newfstatat,
            // musl stats a path with stat(2), glibc with newfstatat(2) or statx(2).
            libc::SYS_stat,
            libc::SYS_fstat,
            libc::SYS_statx,
            libc::SYS_lseek,
            libc::SYS_fcntl,
            libc::SYS_getrandom,
            libc::SYS_rt_sigaction,
            libc::SYS_sched_getaffinity,
            libc::SYS_poll,
        ],
        // Accepting and serving connections (tokio's epoll loop; hyper writes with writev);
        // tgkill for the pause kick; reading /proc/self (smaps) for the metrics' memory
        // figures; opening, locking and sizing a drive's new backing file (PATCH /drives).
        ThreadKind::Api => &[
            libc::SYS_accept4,
            libc::SYS_epoll_wait,
            libc::SYS_epoll_pwait,
            libc::SYS_epoll_ctl,
            libc::SYS_writev,
            libc::SYS_sendto,
            libc::SYS_recvfrom,
            libc::SYS_shutdown,
            libc::SYS_flock,
            libc::SYS_fallocate,
            libc::SYS_fstat,
            libc::SYS_tgkill,
            // musl signals a thread with tkill(2), glibc with tgkill(2).
            libc::SYS_tkill,
            libc::SYS_openat,
            // musl opens with open(2), glibc with openat(2).
            libc::SYS_open,
            libc::SYS_newfstatat,
            // musl stats a path with stat(2), glibc with newfstatat(2) or statx(2).
            libc::SYS_stat,
            libc::SYS_statx,
            libc::SYS_lseek,
            libc::SYS_fcntl,
            libc::SYS_getrandom,
            libc::SYS_poll,
            // PUT /snapshot/create writes the state and memory files (a Diff without
            // dirty tracking asks which pages are resident).
            libc::SYS_write,
            libc::SYS_mincore,
            libc::SYS_pwrite64,
            libc::SYS_ftruncate,
            // ... each at a staged name renamed over its path, a staged file removed if the
            // create fails; a symlink at the path followed (realpath). Guest RAM kept in a
            // file (--ram-dir) is made once the room for it is checked (statfs), and a
            // snapshot links it (snapshot::fork).
            libc::SYS_rename,
            libc::SYS_renameat,
            libc::SYS_renameat2,
            libc::SYS_unlinkat,
            libc::SYS_unlink,
            libc::SYS_linkat,
            libc::SYS_readlink,
            libc::SYS_getcwd,
            libc::SYS_statfs,
        ],
        // sigwait, then the cleanups: unlink a socket, detach and unlink a namespace's mount,
        // flush metrics (which read /proc/self: the API thread's rights to open and size a
        // file); then the signal again, by default action.
        ThreadKind::Signals => &[
            libc::SYS_rt_sigtimedwait,
            // musl's open marks O_CLOEXEC with fcntl(F_SETFD) after open(2).
            libc::SYS_fcntl,
            libc::SYS_unlink,
            libc::SYS_umount2,
            libc::SYS_openat,
            // musl opens with open(2), glibc with openat(2).
            libc::SYS_open,
            libc::SYS_fstat,
            libc::SYS_newfstatat,
            // musl stats a path with stat(2), glibc with newfstatat(2) or statx(2).
            libc::SYS_stat,
            libc::SYS_statx,
            libc::SYS_lseek,
            libc::SYS_rt_sigaction,
            libc::SYS_tgkill,
            // musl signals a thread with tkill(2), glibc with tgkill(2).
            libc::SYS_tkill,
        ],
        // fcntl: the log file's writer (musl's open marks O_CLOEXEC with it).
        ThreadKind::SocketWatch => {
            &[libc::SYS_fcntl, libc::SYS_newfstatat, libc::SYS_stat, libc::SYS_statx, libc::SYS_getpid, libc::SYS_kill]
        }
    };
    [COMMON, extra].concat()
}

use crate::kvm::ioctl_numbers::*;

/// The ioctl requests a thread kind may make; `None` where it makes none.
fn ioctls(kind: ThreadKind) -> Option<Vec<u32>> {
    // Exit handling moves BARs (memslots for the ECAM window, ioeventfds), reroutes
    // MSI-X (GSI routing, irqfds) and raises pc-testdev lines.
    let vm = [KVM_SET_USER_MEMORY_REGION(), KVM_IOEVENTFD(), KVM_IRQFD(), KVM_SET_GSI_ROUTING(), KVM_IRQ_LINE()];
    match kind {
        ThreadKind::Vcpu => Some(
            [
                KVM_RUN(),
                KVM_GET_REGS(),
                KVM_SET_REGS(),
                KVM_GET_SREGS(),
                KVM_TRANSLATE(),
                KVM_GET_FPU(),
                KVM_SET_FPU(),
                KVM_GET_VCPU_EVENTS(),
                KVM_SET_VCPU_EVENTS(),
                // Finishing a system call the host left at CPL3 (emulate::syscall).
                KVM_SET_SREGS(),
                KVM_GET_MSRS(),
                KVM_SET_MSRS(),
                KVM_SET_GUEST_DEBUG(),
                // Telling a halted vCPU from a spinning one (crate::vcpu::stuck); an application
                // processor waits for SIPI again after S3 (crate::machine::sleep).
                KVM_GET_MP_STATE(),
                KVM_SET_MP_STATE(),
                // A NIC's activation gives its tap the receive offloads the guest negotiated.
                crate::net::tap::TUNSETOFFLOAD as _,
                // A snapshot asks each parked vCPU for its state (crate::snapshot).
                KVM_GET_XSAVE(),
                KVM_GET_XCRS(),
                KVM_GET_DEBUGREGS(),
                KVM_GET_LAPIC(),
                KVM_GET_TSC_KHZ(),
            ]
            .into_iter()
            .chain(vm)
            .map(|r| r as u32)
            .collect(),
        ),
        #[cfg(feature = "lab")]
        ThreadKind::LabVcpu => {
            let mut requests = ioctls(ThreadKind::Vcpu)?;
            requests.extend([KVM_REGISTER_COALESCED_MMIO() as u32, KVM_UNREGISTER_COALESCED_MMIO() as u32]);
            Some(requests)
        }
        ThreadKind::Mem => Some(vec![KVM_SET_USER_MEMORY_REGION() as u32]),
        // std makes a socket non-blocking with FIONBIO.
        ThreadKind::Vsock => Some(vec![libc::FIONBIO as u32]),
        // PUT /snapshot/create reads the VM's in-kernel devices, KVM's MSR list and dirty log.
        ThreadKind::Api => Some(
            [KVM_GET_MSR_INDEX_LIST(), KVM_GET_IRQCHIP(), KVM_GET_PIT2(), KVM_GET_CLOCK(), KVM_GET_DIRTY_LOG()]
                .map(|r| r as u32)
                .to_vec(),
        ),
        // Restoring the terminal (TCGETS/TCSETS*); tearing down what the VM registered.
        ThreadKind::Main => {
            let terminal = [libc::TCGETS, libc::TCSETS, libc::TCSETSW, libc::TCSETSF].map(|r| r as u32);
            Some(terminal.into_iter().chain(vm.map(|r| r as u32)).collect())
        }
        _ => None,
    }
}

/// What a vCPU thread may do beyond [`ThreadKind::Vcpu`] on a nested host (crate::host):
/// completing an instruction KVM could not emulate translates addresses, reads and writes
/// FPU state and pending events; the LSTAR watch reads and writes MSRs and sets hardware
/// breakpoints.
fn nested_vcpu_ioctls() -> Vec<u32> {
    let ioctls = [
        KVM_TRANSLATE(),
        KVM_GET_FPU(),
        KVM_SET_FPU(),
        KVM_GET_VCPU_EVENTS(),
        KVM_SET_VCPU_EVENTS(),
        KVM_GET_MSRS(),
        KVM_SET_MSRS(),
        KVM_SET_GUEST_DEBUG(),
    ];
    // rdrand's value comes from the host's getrandom, which the base filter allows.
    ioctls.into_iter().map(|r| r as u32).collect()
}

fn program(kind: ThreadKind, nested: bool) -> Result<BpfProgram, SeccompError> {
    let mut requests = ioctls(kind);
    if nested && kind.runs_a_vcpu() {
        requests.get_or_insert_with(Vec::new).extend(nested_vcpu_ioctls());
    }
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = allowed(kind).into_iter().map(|c| (c, vec![])).collect();
    if let Some(requests) = requests {
        let build = |e| SeccompError::Build(kind, e);
        let by_request = requests
            .into_iter()
            .map(|r| {
                // The kernel takes the request as an unsigned int: compare the low 32 bits.
                let cond = SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, u64::from(r));
                SeccompRule::new(vec![cond.map_err(build)?]).map_err(build)
            })
            .collect::<Result<_, _>>()?;
        rules.insert(libc::SYS_ioctl, by_request);
    }
    let filter = SeccompFilter::new(rules, SeccompAction::Trap, SeccompAction::Allow, TargetArch::x86_64)
        .map_err(|e| SeccompError::Build(kind, e))?;
    filter.try_into().map_err(|e| SeccompError::Compile(kind, e))
}

/// Confines the calling thread to what `kind` needs (nothing, with `--no-seccomp`), or
/// says why it could not; for threads that should not run unconfined, see [`confine`].
pub fn confine_or_log(kind: ThreadKind) -> bool {
    confine(kind).map_err(|e| tracing::error!("{kind:?} thread: not running unconfined: {e}")).is_ok()
}

/// Confines the calling thread to what `kind` needs (nothing, with `--no-seccomp`).
pub fn confine(kind: ThreadKind) -> Result<(), SeccompError> {
    install(kind, false)
}

/// Confines a vCPU thread (`kind` Vcpu or LabVcpu) to what it needs on `host`.
pub fn confine_vcpu(kind: ThreadKind, host: &crate::host::HostProfile) -> Result<(), SeccompError> {
    install(kind, host.nested())
}

fn install(kind: ThreadKind, nested: bool) -> Result<(), SeccompError> {
    // Landlock first: the filter below refuses Landlock's own calls. Not the API threads:
    // they open what the socket's client names (PATCH /drives' next file, a snapshot's
    // files: firecracker-containerd's snapshots, Kata's loop devices), as Firecracker's
    // API thread alone may open files; what a guest reaches (vCPUs, devices) is held.
    // Nor the threads that end the process (the signals thread, the API's ender): they
    // remove the API socket, to which no held thread has a right, and reach nothing a
    // guest gives them. The signals thread starts before any policy, but under load it
    // may first run after one was set: it must not be held by a race.
    if !matches!(kind, ThreadKind::Api | ThreadKind::Signals | ThreadKind::Hotplug) {
        crate::landlock::restrict_current_thread().map_err(|e| SeccompError::Landlock(kind, e))?;
    }
    if !enabled() {
        return Ok(());
    }
    HANDLER.call_once(install_sigsys_handler);
    crate::heap::keep_thread_heaps();
    let program = program(kind, nested)?;
    seccompiler::apply_filter(&program).map_err(|e| SeccompError::Install(kind, e))
}

/// SIGSYS: says which call was refused, without allocating, and ends the process.
extern "C" fn on_sigsys(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel hands SIGSYS handlers a valid siginfo whose _sigsys member holds
    // the call number at byte 24 (after signo, errno, code, padding and the call address).
    let nr = unsafe { *(info as *const u8).add(24).cast::<i32>() };
    let mut digits = [0u8; 10];
    let (mut n, mut at) = (nr.unsigned_abs(), digits.len());
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 || at == 0 {
            break;
        }
    }
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into `name`.
    unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    let name_len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let prefix: &[u8] = b"exitless: seccomp: thread ";
    let middle: &[u8] = b" made system call ";
    let suffix: &[u8] = b" it is not allowed; stopping\n";
    // SAFETY: write and _exit are async-signal-safe; the buffers are live.
    unsafe {
        libc::write(2, prefix.as_ptr().cast(), prefix.len());
        libc::write(2, name.as_ptr().cast(), name_len);
        libc::write(2, middle.as_ptr().cast(), middle.len());
        libc::write(2, digits[at..].as_ptr().cast(), digits.len() - at);
        libc::write(2, suffix.as_ptr().cast(), suffix.len());
        libc::_exit(EXIT_CODE);
    }
}

fn install_sigsys_handler() {
    // SAFETY: a zeroed sigaction with our handler and SA_SIGINFO is a valid argument.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigsys as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests;
