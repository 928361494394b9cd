//! A drive's backing file, swappable on a running guest (Firecracker's
//! `PATCH /drives/{id}` with a new `path_on_host`). The device thread follows a swap
//! between requests: the requests in flight finish on the old file, every request taken
//! off the queue after it goes to the new one; the old file closes (and its lock goes)
//! when the last of them has completed.

use super::disk::{Disk, DiskError, DriveConfig};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub struct DiskSlot {
    config: DriveConfig,
    disk: Mutex<Arc<Disk>>,
    /// Bumped by every swap, so the device thread notices one with a single load.
    generation: AtomicU64,
}

impl DiskSlot {
    pub fn open(config: &DriveConfig) -> Result<Self, DiskError> {
        let disk = Arc::new(Disk::open(config)?);
        Ok(DiskSlot { config: config.clone(), disk: Mutex::new(disk), generation: AtomicU64::new(0) })
    }

    pub fn current(&self) -> Arc<Disk> {
        crate::sync::lock(&self.disk).clone()
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Opens `path` with the drive's options (read-only, id, direct I/O) and makes it the
    /// backing file; the caller tells the guest its configuration changed.
    pub fn swap(&self, path: &std::path::Path) -> Result<Arc<Disk>, DiskError> {
        let old = self.current();
        let mut config = self.config.clone();
        config.path = path.to_path_buf();
        if config.id.is_none() {
            // The serial stays the drive's, not the new file's name.
            config.id = Some(String::from_utf8_lossy(&old.id).trim_end_matches('\0').to_string());
        }
        let same_file = same_file(&old.path, path);
        drop(old);
        let disk = Arc::new(Disk::open_locking(&config, !same_file)?);
        *crate::sync::lock(&self.disk) = disk.clone();
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(disk)
    }
}

/// Whether two paths name one file (the lock the old descriptor holds covers it).
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_swap_opens_the_new_file_keeps_the_serial_and_is_counted() {
        let dir = std::env::temp_dir().join(format!("exitless-slot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.img"), dir.join("b.img"));
        std::fs::write(&a, vec![0u8; 4096]).unwrap();
        std::fs::write(&b, vec![0u8; 8192]).unwrap();
        let slot = DiskSlot::open(&DriveConfig::new(&a)).unwrap();
        assert_eq!((slot.current().capacity, slot.generation()), (4096, 0));
        let disk = slot.swap(&b).unwrap();
        assert_eq!((disk.capacity, slot.generation()), (8192, 1));
        assert_eq!(&disk.id[..5], b"a.img");
        drop(disk);
        // The same file again (it grew): re-read, not refused by its own lock.
        std::fs::write(&b, vec![0u8; 16384]).unwrap();
        assert_eq!(slot.swap(&b).unwrap().capacity, 16384);
        // A file that cannot be opened leaves the drive as it was.
        assert!(slot.swap(&dir.join("missing")).is_err());
        assert_eq!((slot.current().capacity, slot.generation()), (16384, 2));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
