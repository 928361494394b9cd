//! The threads that end the process (ThreadKind::Signals) are never held by Landlock, even
//! when they first run after the policy was set: they remove the API socket, which no held
//! thread may. (A signals thread scheduled late under load was held, and SIGINT left the
//! socket behind.) A binary of its own: the policy is the process's.

use exitless_vmm::landlock::{self, Policy, Reach};
use exitless_vmm::seccomp::{self, ThreadKind};

#[test]
fn a_signals_thread_confined_after_the_policy_may_still_remove_the_socket() {
    if landlock::kernel_abi() == 0 {
        exitless_vmm::testing::skip_or_fail(
            "a_signals_thread_confined_after_the_policy_may_still_remove_the_socket",
            "the kernel has no Landlock",
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!("exitless-landlock-signals-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (held, ender) = (dir.join("held.sock"), dir.join("api.sock"));
    std::fs::write(&held, b"").unwrap();
    std::fs::write(&ender, b"").unwrap();
    // The policy gives nothing under `dir`.
    landlock::install(Policy { rules: vec![("/proc".into(), Reach::Read)] }).unwrap();
    // A held thread cannot remove a file there: the policy is in force.
    let path = held.clone();
    let refused = std::thread::spawn(move || {
        landlock::restrict_current_thread().unwrap();
        std::fs::remove_file(&path).unwrap_err().kind()
    });
    assert_eq!(refused.join().unwrap(), std::io::ErrorKind::PermissionDenied);
    // A thread confined as the signals thread is, after the policy, removes the socket.
    let path = ender.clone();
    let removed = std::thread::spawn(move || {
        seccomp::confine(ThreadKind::Signals).unwrap();
        std::fs::remove_file(&path).map_err(|e| e.to_string())
    });
    assert_eq!(removed.join().unwrap(), Ok(()));
    assert!(!ender.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
