//! The API socket is a microVM's handle: an orchestrator that tears its VM down removes
//! it (firecracker-containerd's cleanup deletes the shim directory holding it when the
//! shim died and never asked the VMM to stop). A VMM whose socket is gone can never be
//! asked anything again, so exitless ends as on SIGTERM instead of running on unseen.
//! One thread reads inotify events for the socket's directory; when its name is removed
//! or renamed away, or the directory itself goes, and the path no longer leads to the
//! socket this process bound, the thread signals the process SIGTERM (whose handler
//! removes what is left and ends it, as for any SIGTERM).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Set once the process removes its own socket (it is ending): the watch then stays quiet
/// rather than race the ending with a SIGTERM of its own.
static REMOVED_BY_US: AtomicBool = AtomicBool::new(false);

/// Whether this process bound its socket, and whether it is ending. A signal's cleanup
/// may run before the bind (the path may then be another VMM's: it is left alone) or
/// during it (the lock orders the two: the socket is removed, or never made).
struct Own {
    bound: bool,
    ending: bool,
}

static OWN: Mutex<Own> = Mutex::new(Own { bound: false, ending: false });

/// Binds the API socket at `path`, refusing to take over a path that exists (another VMM
/// may be serving it). Once the process is ending it never returns: the thread that
/// removes the socket ends the process.
pub fn bind_own(path: &Path) -> Result<UnixListener, String> {
    let mut own = exitless_vmm::sync::lock(&OWN);
    if own.ending {
        drop(own);
        loop {
            std::thread::park();
        }
    }
    if path.exists() {
        return Err(format!(
            "cannot serve the API on {}: the path exists (remove a stale socket first)",
            path.display()
        ));
    }
    let listener = UnixListener::bind(path).map_err(|e| format!("cannot serve the API on {}: {e}", path.display()))?;
    own.bound = true;
    Ok(listener)
}

/// Removes the process's own API socket (if it bound one), as it ends.
pub fn remove_own(path: &Path) {
    let mut own = exitless_vmm::sync::lock(&OWN);
    own.ending = true;
    REMOVED_BY_US.store(true, Ordering::SeqCst);
    if own.bound {
        if let Err(e) = std::fs::remove_file(path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("exitless: cannot remove the API socket {}: {e}", path.display());
            }
        }
    }
}

/// Ends the process once the guest stops: removes the socket, then exits with the
/// guest's status. A thread of its own, started before Landlock holds any thread, does
/// it: the thread that ran the machine is held, and is given no right at all in the
/// socket's directory (removing the socket needs the right to remove any entry beneath
/// it: all of /run for the default socket).
pub struct Ender(std::sync::mpsc::SyncSender<i32>);

impl Ender {
    /// Starts the thread for `socket`; returns once it is confined (under Landlock it
    /// would be held, and could remove nothing).
    pub fn start(socket: &Path) -> Result<Ender, String> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<i32>(1);
        let (ready_tx, ready) = std::sync::mpsc::channel::<bool>();
        let socket = socket.to_path_buf();
        std::thread::Builder::new()
            .name("api-end".into())
            .spawn(move || {
                // The signal thread's filter: its cleanup is this one's (unlink the socket).
                let confined = exitless_vmm::seccomp::confine_or_log(exitless_vmm::seccomp::ThreadKind::Signals);
                let _ = ready_tx.send(confined);
                if !confined {
                    return;
                }
                if let Ok(status) = rx.recv() {
                    remove_own(&socket);
                    std::process::exit(status);
                }
            })
            .map_err(|e| format!("cannot start the thread that ends the VMM: {e}"))?;
        match ready.recv() {
            Ok(true) => Ok(Ender(tx)),
            _ => Err("the thread that ends the VMM could not be confined".into()),
        }
    }

    /// Hands the exit to the thread; if it is gone, removes the socket (Landlock may
    /// refuse that) and exits here.
    pub fn end(ender: Option<&Ender>, socket: Option<&Path>, status: i32) -> ! {
        if ender.is_some_and(|e| e.0.send(status).is_ok()) {
            loop {
                std::thread::park();
            }
        }
        if let Some(path) = socket {
            remove_own(path);
        }
        std::process::exit(status);
    }
}

/// Starts the watch for `socket` (already bound). An error leaves the VMM running as it
/// would without the watch; the caller logs it.
pub fn start(socket: &Path) -> Result<(), String> {
    let ino = std::fs::metadata(socket).map_err(|e| format!("cannot stat {}: {e}", socket.display()))?.ino();
    let dir = match socket.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name = socket.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    // SAFETY: inotify_init1 returns a new descriptor or -1; we own it from here.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(format!("inotify_init1: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: fd is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let cdir = CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|_| "a NUL in the socket's path")?;
    let mask = libc::IN_DELETE | libc::IN_MOVED_FROM | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF;
    // SAFETY: a valid inotify descriptor and a NUL-terminated path.
    if unsafe { libc::inotify_add_watch(fd.as_raw_fd(), cdir.as_ptr(), mask) } < 0 {
        return Err(format!("inotify_add_watch {}: {}", dir.display(), std::io::Error::last_os_error()));
    }
    let socket = socket.to_path_buf();
    std::thread::Builder::new()
        .name("api-socket".into())
        .spawn(move || {
            if !exitless_vmm::seccomp::confine_or_log(exitless_vmm::seccomp::ThreadKind::SocketWatch) {
                return;
            }
            let mut buf = [0u8; 4096];
            loop {
                // SAFETY: reads into our buffer, at most its length.
                let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if n <= 0 {
                    if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    return;
                }
                if !touches(&buf[..n as usize], name.as_encoded_bytes()) {
                    continue;
                }
                if REMOVED_BY_US.load(Ordering::SeqCst) {
                    return;
                }
                let ours = std::fs::metadata(&socket).map(|m| m.ino() == ino).unwrap_or(false);
                if !ours {
                    tracing::warn!("the API socket {} was removed: ending the microVM", socket.display());
                    eprintln!("exitless: the API socket {} was removed: ending the microVM", socket.display());
                    // SAFETY: a process-directed SIGTERM, taken by the signals thread.
                    unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
                    return;
                }
            }
        })
        .map(|_| ())
        .map_err(|e| format!("cannot start the API socket's watch: {e}"))
}

/// Whether the inotify events in `events` name `name` or concern the watched directory.
fn touches(events: &[u8], name: &[u8]) -> bool {
    let header = std::mem::size_of::<libc::inotify_event>();
    let mut at = 0;
    while at + header <= events.len() {
        // SAFETY: `header` bytes at `at` are inside the buffer the kernel filled; read
        // unaligned as the buffer is a byte array.
        let e: libc::inotify_event = unsafe { std::ptr::read_unaligned(events[at..].as_ptr().cast()) };
        let len = e.len as usize;
        let end = (at + header + len).min(events.len());
        let event_name = &events[at + header..end];
        let event_name = &event_name[..event_name.iter().position(|&b| b == 0).unwrap_or(event_name.len())];
        if e.mask & (libc::IN_DELETE_SELF | libc::IN_MOVE_SELF | libc::IN_IGNORED) != 0 || event_name == name {
            return true;
        }
        at = end;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::touches;

    fn event(mask: u32, name: &str) -> Vec<u8> {
        let padded = (name.len() + 1).div_ceil(16) * 16;
        let e = libc::inotify_event { wd: 1, mask, cookie: 0, len: if name.is_empty() { 0 } else { padded as u32 } };
        // SAFETY: inotify_event is plain data; its bytes as the kernel writes them.
        let mut out = unsafe {
            std::slice::from_raw_parts((&e as *const libc::inotify_event).cast::<u8>(), std::mem::size_of_val(&e))
        }
        .to_vec();
        if !name.is_empty() {
            let mut n = name.as_bytes().to_vec();
            n.resize(padded, 0);
            out.extend(n);
        }
        out
    }

    #[test]
    fn only_the_sockets_name_or_its_directory_counts() {
        let other = event(libc::IN_DELETE, "fc-logs.fifo");
        assert!(!touches(&other, b"firecracker.sock"));
        let mut both = other.clone();
        both.extend(event(libc::IN_DELETE, "firecracker.sock"));
        assert!(touches(&both, b"firecracker.sock"));
        assert!(touches(&event(libc::IN_DELETE_SELF, ""), b"firecracker.sock"));
        assert!(!touches(&event(libc::IN_DELETE, "firecracker.sock2"), b"firecracker.sock"));
    }
}
