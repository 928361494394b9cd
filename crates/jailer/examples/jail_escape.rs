//! A process that tries to get out of the jail exitless-jailer made for it, exec'd in
//! exitless's place (tests/jail.rs): each attempt in a child of its own, held first by the
//! Landlock rules a started exitless sets for itself and then by one of exitless's thread
//! filters (vCPU, device, vsock), all built by exitless's own code. Prints one line per
//! attempt, `refused ...` or `ESCAPED ...`, and exits 0 only if every attempt was refused.
//! A test program, never part of a release: the VMM carries no such path.

use exitless_vmm::landlock::{Policy, Reach};
use exitless_vmm::seccomp::{self, ThreadKind};
use std::ffi::CString;

/// What an attempt's child reports: it did what it tried (0), or the kernel refused (1);
/// a seccomp filter ends it with seccomp::EXIT_CODE.
const DONE: i32 = 0;
const REFUSED: i32 = 1;

/// One try at getting out, given a process outside the jail; true if it got through.
type Attempt = fn(libc::pid_t) -> bool;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let host_pid: libc::pid_t = args
        .iter()
        .position(|a| a == "--host-pid")
        .and_then(|i| args.get(i + 1))
        .and_then(|p| p.parse().ok())
        .expect("--host-pid PID: a process outside the jail");
    let attempts: [(&str, Attempt); 9] = [
        ("open a host file (/etc/passwd)", |_| open("/etc/passwd", libc::O_RDONLY)),
        ("open a host file through /proc (/proc/1/root/etc/passwd)", |_| {
            open("/proc/1/root/etc/passwd", libc::O_RDONLY)
        }),
        ("make a device node for a host disk", |_| {
            // SAFETY: mknod with a literal path; no memory handed over.
            unsafe { libc::mknod(c"/sda".as_ptr(), libc::S_IFBLK | 0o600, libc::makedev(8, 0)) == 0 }
        }),
        ("open a TCP socket to 127.0.0.1:22", |_| tcp_connect()),
        ("exec a program (/jail_escape)", |_| exec("/jail_escape")),
        ("ptrace another process", |pid| {
            // SAFETY: ptrace with no memory handed over.
            unsafe { libc::ptrace(libc::PTRACE_ATTACH, pid, 0, 0) == 0 }
        }),
        ("signal another process", |pid| {
            // SAFETY: tgkill takes numbers only; SIGCONT changes nothing if it did get through.
            unsafe { libc::syscall(libc::SYS_tgkill, pid, pid, libc::SIGCONT) == 0 }
        }),
        ("mount a filesystem", |_| {
            // SAFETY: mount(2) with NUL-terminated literals.
            unsafe { libc::mount(c"none".as_ptr(), c"/run".as_ptr(), c"tmpfs".as_ptr(), 0, std::ptr::null()) == 0 }
        }),
        ("leave its namespaces (unshare, chroot ..)", |_| {
            // SAFETY: unshare and chroot take a flag and a literal path.
            unsafe { libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWUSER) == 0 || libc::chroot(c"..".as_ptr()) == 0 }
        }),
    ];
    let mut escaped = 0;
    // Landlock and the jail alone first (what they hold without seccomp's help: host files,
    // device nodes, TCP, ptrace, signals, mount; exec and leaving the namespaces are
    // seccomp's to refuse: the jail's own files are the microVM's), then with each filter.
    let seccomps_own = ["exec a program (/jail_escape)", "leave its namespaces (unshare, chroot ..)"];
    for kind in [None, Some(ThreadKind::Vcpu), Some(ThreadKind::Device), Some(ThreadKind::Vsock)] {
        let held = kind.map_or("Landlock alone".to_string(), |k| format!("a {k:?} thread"));
        for (what, attempt) in attempts.iter().filter(|(w, _)| kind.is_some() || !seccomps_own.contains(w)) {
            let (ok, how) = in_child(kind, host_pid, *attempt);
            if ok {
                escaped += 1;
                println!("ESCAPED {what} as {held}");
            } else {
                println!("refused {what} as {held}: {how}");
            }
        }
    }
    std::process::exit(if escaped == 0 { 0 } else { 1 });
}

/// The Landlock policy a started exitless sets for itself in a jail (crates/cli/src/api/
/// landlock.rs): the jail's root, everything in which was made for the microVM, and
/// /proc/self (which a jail has none of).
fn policy() -> Policy {
    Policy { rules: vec![("/proc/self".into(), Reach::Read), ("/".into(), Reach::Write)] }
}

/// Runs `attempt` in a child held by Landlock and `kind`'s filter (if any): whether it got through,
/// and how it was stopped if not.
fn in_child(kind: Option<ThreadKind>, host_pid: libc::pid_t, attempt: Attempt) -> (bool, String) {
    // SAFETY: fork in a single-threaded process; the child only runs the attempt and exits.
    match unsafe { libc::fork() } {
        -1 => (false, format!("fork failed: {}", std::io::Error::last_os_error())),
        0 => {
            // As the VMM's own policy: what the jail lacks (/proc) is left out.
            let mut policy = policy();
            policy.rules.retain(|(p, _)| p.exists());
            let held =
                exitless_vmm::landlock::restrict(&policy).is_ok() && kind.is_none_or(|k| seccomp::confine(k).is_ok());
            if !held {
                // SAFETY: leaving the child.
                unsafe { libc::_exit(100) };
            }
            let code = if attempt(host_pid) { DONE } else { REFUSED };
            // SAFETY: leaving the child without running the parent's cleanup.
            unsafe { libc::_exit(code) }
        }
        child => {
            let mut status = 0;
            // SAFETY: waitpid on our own child, writing into `status`.
            unsafe { libc::waitpid(child, &mut status, 0) };
            match libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)) {
                Some(DONE) => (true, String::new()),
                Some(REFUSED) => (false, "the kernel refused it (Landlock, namespaces or credentials)".into()),
                Some(c) if c == seccomp::EXIT_CODE => (false, "the thread's seccomp filter stopped it".into()),
                Some(100) => (false, "ERROR: could not apply Landlock and seccomp".into()),
                _ => (false, format!("ended otherwise (status {status:#x})")),
            }
        }
    }
}

fn open(path: &str, flags: libc::c_int) -> bool {
    let c = CString::new(path).unwrap_or_default();
    // SAFETY: open with a NUL-terminated path; the descriptor, if any, is left to exit.
    unsafe { libc::open(c.as_ptr(), flags) >= 0 }
}

fn exec(path: &str) -> bool {
    let c = CString::new(path).unwrap_or_default();
    let argv = [c.as_ptr(), std::ptr::null()];
    // SAFETY: execve with a NUL-terminated path and argv; returns only on failure.
    unsafe { libc::execve(c.as_ptr(), argv.as_ptr(), [std::ptr::null()].as_ptr()) };
    false
}

fn tcp_connect() -> bool {
    // SAFETY: socket and connect with a sockaddr_in on the stack.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        if fd < 0 {
            return false;
        }
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as u16,
            sin_port: 22u16.to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from_be_bytes([127, 0, 0, 1]).to_be() },
            sin_zero: [0; 8],
        };
        let r = libc::connect(fd, (&addr as *const libc::sockaddr_in).cast(), std::mem::size_of_val(&addr) as u32);
        // Refused by the network namespace (nothing listens) is not Landlock's doing:
        // only EACCES (Landlock) counts as held.
        r == 0 || *libc::__errno_location() != libc::EACCES
    }
}
