//! The file behind a drive: opened once, locked against a second writer, its size fixed
//! as the disk's capacity, and (with `direct=on`) a second O_DIRECT descriptor used for
//! every request whose buffers and offset meet the file's direct-I/O alignment.

use super::request::{ID_LEN, SECTOR_SIZE};
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::PathBuf;

/// `--drive path=FILE[,readonly=on][,id=NAME][,direct=on]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriveConfig {
    pub path: PathBuf,
    pub readonly: bool,
    /// What GET_ID answers (at most 20 bytes); the file name when not given.
    pub id: Option<String>,
    /// The id its configuration knows it by (Firecracker's `drive_id`), by which it is
    /// found again (PATCH /drives/{id}); the device manager's name when not given.
    pub config_id: Option<String>,
    /// Bypass the host page cache (O_DIRECT) where the filesystem allows it.
    pub direct: bool,
    /// Use the thread pool even where io_uring exists (Firecracker's io_engine "Sync"
    /// has the same role: a host whose io_uring is off or distrusted).
    pub thread_pool: bool,
    /// Rate limits on the drive's requests (Firecracker's rate_limiter).
    pub limits: crate::rate_limiter::Limits,
}

impl DriveConfig {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        DriveConfig {
            path: path.into(),
            readonly: false,
            id: None,
            config_id: None,
            direct: false,
            thread_pool: false,
            limits: Default::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("cannot open drive {0}")]
    Open(PathBuf, #[source] std::io::Error),
    #[error("drive {0} is in use by another process (it holds a lock on the file)")]
    Locked(PathBuf),
    #[error("drive {0} is not a regular file or block device")]
    NotAFile(PathBuf),
    #[error("drive id {0:?} is longer than 20 bytes")]
    IdTooLong(String),
    #[error("cannot start the virtio-blk thread")]
    Thread(#[source] std::io::Error),
}

pub struct Disk {
    file: File,
    direct: Option<File>,
    /// Direct-I/O alignment of memory and of offsets and lengths.
    align: (u64, u64),
    pub capacity: u64,
    pub readonly: bool,
    /// Whether holes can be punched and ranges zeroed (fallocate works on this file).
    pub can_discard: bool,
    pub id: [u8; ID_LEN],
    pub path: PathBuf,
}

impl Disk {
    pub fn open(config: &DriveConfig) -> Result<Disk, DiskError> {
        Self::open_locking(config, true)
    }

    /// Opens `config`'s file, taking its lock only if `lock` (a drive swapped to the file
    /// it already has: the lock held by the old descriptor would refuse the new one).
    pub fn open_locking(config: &DriveConfig, lock: bool) -> Result<Disk, DiskError> {
        let path = &config.path;
        // Without waiting on a FIFO (a read-only open of one blocks until a writer comes):
        // the type is checked on the descriptor, which then blocks as usual.
        let open = |direct: bool| {
            crate::files::open_nonblocking(path, !config.readonly, if direct { libc::O_DIRECT } else { 0 })
        };
        let (file, meta) = open(false).map_err(|e| match e {
            crate::files::FileError::Open { source, .. } => DiskError::Open(path.clone(), source),
            e => DiskError::Open(path.clone(), std::io::Error::other(e)),
        })?;
        let kind = meta.file_type();
        if !kind.is_file() && !kind.is_block_device() {
            return Err(DiskError::NotAFile(path.clone()));
        }
        let kind_of_lock = if config.readonly { libc::LOCK_SH } else { libc::LOCK_EX };
        // SAFETY: flock on a descriptor we own; no memory is passed.
        if lock && unsafe { libc::flock(file.as_raw_fd(), kind_of_lock | libc::LOCK_NB) } != 0 {
            return Err(DiskError::Locked(path.clone()));
        }
        // SAFETY: lseek on a descriptor we own.
        let size = unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_END) };
        // A file of size 0 is a drive of 0 sectors (Kata's spare drives), swapped later.
        let capacity = (size.max(0) as u64) / SECTOR_SIZE * SECTOR_SIZE;
        let direct = match config.direct {
            // The same file as the one checked, or none (the path may name another by now).
            true => match open(true) {
                Ok((f, m)) if (m.dev(), m.ino()) == (meta.dev(), meta.ino()) => Some(f),
                Ok(_) => {
                    tracing::warn!("drive {}: the file changed while opened; using the page cache", path.display());
                    None
                }
                Err(e) => {
                    tracing::warn!("drive {}: no O_DIRECT here ({e}); using the page cache", path.display());
                    None
                }
            },
            false => None,
        };
        let id = match &config.id {
            Some(id) if id.len() > ID_LEN => return Err(DiskError::IdTooLong(id.clone())),
            Some(id) => id.clone(),
            None => path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        };
        let mut id_bytes = [0u8; ID_LEN];
        let n = id.len().min(ID_LEN);
        id_bytes[..n].copy_from_slice(&id.as_bytes()[..n]);
        let can_discard = !config.readonly && kind.is_file() && punch_hole_works(&file, size as u64);
        let align = direct.as_ref().map_or((SECTOR_SIZE, SECTOR_SIZE), dio_alignment);
        Ok(Disk {
            file,
            direct,
            align,
            capacity,
            readonly: config.readonly,
            can_discard,
            id: id_bytes,
            path: path.clone(),
        })
    }

    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// The descriptor a transfer at `offset` over `iov` goes through: the O_DIRECT one
    /// when everything is aligned as it needs, else the cached one.
    pub fn fd_for(&self, offset: u64, iov: &[libc::iovec]) -> RawFd {
        if let Some(direct) = &self.direct {
            let (mem, off) = self.align;
            let aligned = offset.is_multiple_of(off)
                && iov
                    .iter()
                    .all(|v| (v.iov_base as u64).is_multiple_of(mem) && (v.iov_len as u64).is_multiple_of(off));
            if aligned {
                return direct.as_raw_fd();
            }
        }
        self.file.as_raw_fd()
    }

    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Deallocates (`unmap`) or zeroes `len` bytes at `offset`.
    pub fn discard(&self, offset: u64, len: u64, unmap: bool) -> std::io::Result<()> {
        let mode = if unmap {
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
        } else {
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE
        };
        // SAFETY: fallocate on a descriptor we own; the range was checked against capacity.
        if unsafe { libc::fallocate(self.file.as_raw_fd(), mode, offset as i64, len as i64) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Whether this file supports punching holes: tried past its end, where it changes nothing.
fn punch_hole_works(file: &File, size: u64) -> bool {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate on a descriptor we own, over a range past the end (KEEP_SIZE).
    unsafe { libc::fallocate(file.as_raw_fd(), mode, size as i64, 4096) == 0 }
}

/// (memory alignment, offset alignment) for O_DIRECT on this file, from statx where the
/// kernel reports it, else 4096 for both (safe on every common device).
fn dio_alignment(file: &File) -> (u64, u64) {
    // SAFETY: statx writes into the zeroed struct we pass; the path is empty with AT_EMPTY_PATH.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let r = unsafe { libc::statx(file.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut stx) };
    if r == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 && stx.stx_dio_mem_align > 0 {
        (u64::from(stx.stx_dio_mem_align), u64::from(stx.stx_dio_offset_align.max(1)))
    } else {
        (4096, 4096)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_transfers_bypass_the_page_cache_and_others_do_not() {
        let file = vmm_sys_util::tempfile::TempFile::new().unwrap();
        file.as_file().set_len(1 << 20).unwrap();
        let config = DriveConfig { direct: true, id: Some("x".into()), ..DriveConfig::new(file.as_path()) };
        let disk = Disk::open(&config).unwrap();
        assert_eq!(disk.capacity, 1 << 20);
        assert_eq!(&disk.id[..2], b"x\0");
        if !disk.is_direct() {
            return eprintln!("SKIPPED: no O_DIRECT on this filesystem");
        }
        let mut buf = vec![0u8; 3 * 4096];
        let at = buf.as_ptr().align_offset(4096);
        let mut iov = |off: usize, len| [libc::iovec { iov_base: buf[at + off..].as_mut_ptr().cast(), iov_len: len }];
        let (aligned, shifted, short) = (iov(0, 4096), iov(1, 4096), iov(0, 100));
        assert_ne!(disk.fd_for(4096, &aligned), disk.fd());
        assert_eq!(disk.fd_for(4096, &shifted), disk.fd());
        assert_eq!(disk.fd_for(4096, &short), disk.fd());
        assert_eq!(disk.fd_for(4097, &aligned), disk.fd());
        // A second writer is refused while the first holds the file.
        assert!(matches!(Disk::open(&config), Err(DiskError::Locked(_))));
    }
}
