//! What the snapshot lab's rows of a guest on 2 MiB huge pages restored through UFFD need
//! beyond the others: the host's pool of huge pages, reserved for the row and given back,
//! and a page-fault handler serving the memory file (`exitless uffd-handler`, which speaks
//! Firecracker's handshake: it serves either VMM).

use super::SnapshotBenchError;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const POOL: &str = "/proc/sys/vm/nr_hugepages";

fn pool_size() -> Result<u64, SnapshotBenchError> {
    let text = std::fs::read_to_string(POOL).map_err(|e| SnapshotBenchError::Run(format!("{POOL}: {e}")))?;
    text.trim().parse().map_err(|e| SnapshotBenchError::Run(format!("{POOL}: {e}")))
}

/// The pool grown by some pages while this lives, then set back to what it was.
pub(super) struct Pool(u64);

impl Pool {
    pub(super) fn reserve(pages: u64) -> Result<Pool, SnapshotBenchError> {
        let was = pool_size()?;
        std::fs::write(POOL, (was + pages).to_string()).map_err(|e| {
            SnapshotBenchError::Run(format!("cannot reserve {pages} huge pages in {POOL} (needs root): {e}"))
        })?;
        if pool_size()? < was + pages {
            let _ = std::fs::write(POOL, was.to_string());
            return Err(SnapshotBenchError::Run(format!("the host gave fewer than {pages} more huge pages")));
        }
        Ok(Pool(was))
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = std::fs::write(POOL, self.0.to_string());
    }
}

/// `exitless uffd-handler` serving `mem` on `socket`, once it listens; killed when dropped.
pub(super) struct Handler {
    child: Child,
    pub(super) socket: PathBuf,
}

impl Handler {
    pub(super) fn start(exitless: &Path, socket: PathBuf, mem: &Path) -> Result<Handler, SnapshotBenchError> {
        let _ = std::fs::remove_file(&socket);
        let child = Command::new(exitless)
            .args(["uffd-handler", "--socket", &socket.display().to_string(), "--mem-file", &mem.display().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| SnapshotBenchError::Run(format!("cannot start the page-fault handler: {e}")))?;
        let handler = Handler { child, socket };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !handler.socket.exists() {
            if Instant::now() > deadline {
                return Err(SnapshotBenchError::Run("the page-fault handler never listened".into()));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(handler)
    }
}

impl Drop for Handler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
