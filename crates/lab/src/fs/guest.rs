//! The guest's side: virtiofsd on the share (started here, its cache mode named), an
//! exitless VM booted through the API with the workload as /init and the share as a
//! virtio-fs device (`PUT /fs`), read from its console until the workload is done.

use super::workload::{self, Params, Passes};
use super::Options;
use crate::peers::Transport;
use crate::snapshot::Vmm;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The tag fsbench.c mounts.
const TAG: &str = "fsbench";
/// virtiofsd's cache mode for the run: its default, which lets the guest cache what it
/// read until the file changes (fsbench.c drops the guest's caches before each pass).
pub const CACHE: &str = "auto";

/// A virtiofsd serving the share; killed (and its socket removed) when dropped.
struct Virtiofsd {
    child: Child,
    socket: PathBuf,
}

impl Virtiofsd {
    fn start(exe: &Path, share: &Path, socket: &Path) -> Result<Virtiofsd, String> {
        let _ = std::fs::remove_file(socket);
        let child = Command::new(exe)
            .arg("--shared-dir")
            .arg(share)
            .arg("--socket-path")
            .arg(socket)
            .arg(format!("--cache={CACHE}"))
            .arg("--log-level=error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
        let mut daemon = Virtiofsd { child, socket: socket.to_path_buf() };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                return Err(format!("virtiofsd exited ({status}) before it listened"));
            }
            if Instant::now() > deadline {
                return Err(format!("virtiofsd did not listen on {} within 10 s", socket.display()));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(daemon)
    }
}

impl Drop for Virtiofsd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// `PATH --version`'s first line (virtiofsd's names its version).
pub fn version(exe: &Path) -> String {
    let out = Command::new(exe).arg("--version").stderr(Stdio::null()).output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    text.lines().next().unwrap_or("version unknown").trim().to_string()
}

/// Drops the host's cached pages of `path` (the guest's cold pass reads it from disk, as
/// the host's did): written back first, then let go with POSIX_FADV_DONTNEED. Only this
/// file: the rest of the host's cache is not the lab's to drop.
pub fn drop_host_cache(path: &Path) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    file.sync_all().map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: advice on a descriptor this function holds open.
    let err = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    match err {
        0 => Ok(()),
        e => Err(format!("posix_fadvise on {}: {}", path.display(), std::io::Error::from_raw_os_error(e))),
    }
}

/// The guest's passes on `share`: one boot, the workload's whole run.
pub fn run(
    opts: &Options,
    dir: &Path,
    share: &Path,
    params: &Params,
    progress: &mut dyn FnMut(&str),
) -> Result<Passes, String> {
    let initrd = dir.join("fsbench.cpio");
    std::fs::write(&initrd, super::initramfs::archive(workload::image()?))
        .map_err(|e| format!("cannot write {}: {e}", initrd.display()))?;
    drop_host_cache(&share.join(workload::LARGE))?;
    let _virtiofsd = Virtiofsd::start(&opts.virtiofsd, share, &dir.join("virtiofsd.sock"))?;
    let flags: &[&str] = if opts.fs_transport == Transport::Pci { &["--enable-pci"] } else { &[] };
    let mut vm = Vmm::start_with(&opts.exitless, dir.join("exitless-fs.sock"), flags).map_err(|e| e.to_string())?;
    let put = |path: &str, body| vm.put(path, body).map_err(|e| e.to_string());
    put("/machine-config", json!({"vcpu_count": 1, "mem_size_mib": opts.mem_mib}))?;
    let words = workload::args("guest", "/mnt", params).join(",");
    let boot_args = format!("console=ttyS0 reboot=k panic=-1 quiet fsbench={words}");
    put("/boot-source", json!({"kernel_image_path": opts.kernel, "initrd_path": initrd, "boot_args": boot_args}))?;
    put("/fs/share", json!({"fs_id": "share", "tag": TAG, "socket": dir.join("virtiofsd.sock")}))?;
    let started = Instant::now();
    put("/actions", json!({"action_type": "InstanceStart"}))?;
    let mut seen = 0;
    loop {
        let lines = vm.lines_starting("FSBENCH");
        for line in &lines[seen..] {
            progress(&format!("guest: {}", line.trim_start_matches("FSBENCH ")));
        }
        seen = lines.len();
        if lines.iter().any(|l| l.starts_with("FSBENCH done") || l.starts_with("FSBENCH error")) {
            return workload::parse(lines.iter().map(String::as_str)).map_err(|e| format!("in the guest: {e}"));
        }
        if let Ok(Some(status)) = vm.child.try_wait() {
            return Err(format!("exitless ended ({status}) before the guest's workload was done ({seen} lines)"));
        }
        if started.elapsed() > opts.timeout {
            return Err(format!("the guest's workload was not done within {:?} ({seen} lines)", opts.timeout));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
