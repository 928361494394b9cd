//! qemu-storage-daemon as a vhost-user-blk backend, where it is installed.

use super::skip_or_fail;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// qemu-storage-daemon exporting `image` on `socket`, if installed (else None, said).
pub fn storage_daemon(image: &Path, socket: &Path, test: &str) -> Option<Daemon> {
    let binary = Path::new("/usr/bin/qemu-storage-daemon");
    if !binary.exists() {
        skip_or_fail(test, "qemu-storage-daemon is not installed (Debian's qemu-system-common)");
        return None;
    }
    let _ = std::fs::remove_file(socket);
    let child = Command::new(binary)
        .arg("--blockdev")
        .arg(format!("driver=file,node-name=f,filename={}", image.display()))
        .arg("--export")
        .arg(format!("type=vhost-user-blk,id=e,node-name=f,addr.type=unix,addr.path={},writable=on", socket.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start qemu-storage-daemon");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !socket.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(socket.exists(), "qemu-storage-daemon did not listen on {}", socket.display());
    Some(Daemon(child))
}

pub struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
