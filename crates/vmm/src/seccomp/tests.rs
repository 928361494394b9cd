use super::*;

/// Runs in a child process of the test binary (see the test below).
#[test]
fn seccomp_child() {
    let Ok(kind) = std::env::var("EXITLESS_SECCOMP_CHILD") else { return };
    let ioctl = kind == "ioctl";
    let kind = if kind == "console" { ThreadKind::ConsoleOut } else { ThreadKind::Vcpu };
    std::thread::spawn(move || {
        confine(kind).unwrap();
        if ioctl {
            // Allowed: KVM_RUN's number (on no descriptor: EBADF). Forbidden: TIOCSTI.
            // (glibc takes the request as c_ulong, musl as c_int.)
            // SAFETY: ioctls on fd -1 touch no memory and fail.
            unsafe {
                assert_eq!(libc::ioctl(-1, KVM_RUN() as _, 0), -1);
                libc::write(2, b"confined\n".as_ptr().cast(), 9);
                libc::ioctl(-1, libc::TIOCSTI, 0);
            }
            return;
        }
        // Allowed: a write. Forbidden for both kinds: socket(2).
        // SAFETY: plain syscalls with valid arguments.
        unsafe {
            libc::write(2, b"confined\n".as_ptr().cast(), 9);
            libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        }
    })
    .join()
    .unwrap();
    std::process::exit(0); // not reached when the filter works
}

#[test]
fn a_forbidden_call_stops_the_process_and_is_named() {
    for kind in ["vcpu", "console", "ioctl"] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "seccomp::tests::seccomp_child", "--nocapture", "--test-threads=1"])
            .env("EXITLESS_SECCOMP_CHILD", kind)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(EXIT_CODE), "{kind}: {err}");
        let call = if kind == "ioctl" { libc::SYS_ioctl } else { libc::SYS_socket };
        let named = format!("system call {call} it is not allowed");
        assert!(err.contains("confined") && err.contains(&named), "{kind}: {err}");
    }
}

#[test]
fn ioctl_numbers_are_the_kernels() {
    // As strace -Xraw shows them for a running VM.
    assert_eq!(KVM_RUN(), 0xae80);
    assert_eq!(KVM_GET_REGS(), 0x8090_ae81);
    assert_eq!(KVM_SET_USER_MEMORY_REGION(), 0x4020_ae46);
    assert_eq!(KVM_SET_GSI_ROUTING(), 0x4008_ae6a);
    assert_eq!(KVM_IRQFD(), 0x4020_ae76);
    assert_eq!(KVM_IOEVENTFD(), 0x4040_ae79);
    assert_eq!(KVM_GET_XSAVE(), 0x9000_aea4);
    assert_eq!(KVM_GET_LAPIC(), 0x8400_ae8e);
    assert_eq!(KVM_GET_TSC_KHZ(), 0xaea3);
}

#[test]
fn every_kind_allows_what_every_thread_needs() {
    let devices = [ThreadKind::Device, ThreadKind::Block, ThreadKind::Entropy, ThreadKind::Vsock, ThreadKind::Balloon];
    for kind in devices.into_iter().chain([ThreadKind::Vcpu]) {
        let calls = allowed(kind);
        assert!(COMMON.iter().all(|c| calls.contains(c)), "{kind:?}");
    }
    assert!(allowed(ThreadKind::Vsock).contains(&libc::SYS_connect));
    assert!(!allowed(ThreadKind::Entropy).contains(&libc::SYS_connect));
    // The balloon discards pages (madvise) and does no I/O.
    let balloon = allowed(ThreadKind::Balloon);
    assert!(balloon.contains(&libc::SYS_madvise));
    assert!(![libc::SYS_readv, libc::SYS_writev, libc::SYS_getrandom].iter().any(|c| balloon.contains(c)));
    // virtio-mem's one ioctl is the memory slots'.
    assert_eq!(ioctls(ThreadKind::Mem), Some(vec![KVM_SET_USER_MEMORY_REGION() as u32]));
    assert!(ioctls(ThreadKind::Balloon).is_none());
}

#[test]
fn every_kind_compiles() {
    for kind in [
        ThreadKind::Main,
        ThreadKind::Vcpu,
        #[cfg(feature = "lab")]
        ThreadKind::LabVcpu,
        ThreadKind::Device,
        ThreadKind::Block,
        ThreadKind::Entropy,
        ThreadKind::Balloon,
        ThreadKind::Pmem,
        ThreadKind::Mem,
        ThreadKind::VhostUser,
        ThreadKind::Vsock,
        ThreadKind::ConsoleOut,
        ThreadKind::SerialIn,
        ThreadKind::Helper,
        ThreadKind::Api,
        ThreadKind::Signals,
        ThreadKind::SocketWatch,
    ] {
        program(kind, true).unwrap();
        program(kind, false).unwrap();
    }
}
