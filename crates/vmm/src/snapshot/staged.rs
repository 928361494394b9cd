//! A snapshot's file written beside its path and renamed over it once whole: a create
//! that fails or is interrupted leaves the previous snapshot's file as it was, and a
//! running clone that maps the previous memory file keeps its pages (a rename leaves the
//! old file to those that hold it; writing it in place would change or truncate them).

use crate::files::FileError;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A file to be at `path`, written at a name of its own in the same directory first.
pub struct Staged {
    path: PathBuf,
    temp: PathBuf,
    committed: bool,
}

impl Staged {
    /// The staged name of `path`. A symlink there is followed (the file it names is
    /// replaced, as a write through it would); anything there but a regular file (a FIFO,
    /// a device, a directory) is refused untouched.
    pub fn new(path: &Path) -> Result<Staged, FileError> {
        let meta = std::fs::symlink_metadata(path);
        let path = match &meta {
            Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(path)
                .map_err(|source| FileError::Open { path: path.display().to_string(), source })?,
            _ => path.to_path_buf(),
        };
        if let Ok(m) = std::fs::metadata(&path) {
            if !m.file_type().is_file() {
                return Err(FileError::NotRegular { path: path.display().to_string(), kind: crate::files::kind(&m) });
            }
        }
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let unique = format!(".{name}.exitless-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let temp = path.with_file_name(unique);
        Ok(Staged { path, temp, committed: false })
    }

    /// Where the file is written (it does not exist yet).
    pub fn temp(&self) -> &Path {
        &self.temp
    }

    /// Where the file goes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Creates the staged file, to write (and read).
    pub fn create(&self) -> Result<std::fs::File, FileError> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&self.temp)
            .map_err(|source| FileError::Open { path: self.path.display().to_string(), source })
    }

    /// Renames the staged file over `path`.
    pub fn commit(mut self) -> std::io::Result<()> {
        std::fs::rename(&self.temp, &self.path)?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Staged {
    /// An uncommitted file goes (there may be none: the create failed before it).
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn the_old_file_stays_until_the_new_one_is_committed_and_a_fifo_is_refused() {
        let dir = std::env::temp_dir().join(format!("exitless-staged-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("mem");
        std::fs::write(&path, b"old").unwrap();
        let held = std::fs::File::open(&path).unwrap();
        let staged = Staged::new(&path).unwrap();
        staged.create().unwrap().write_all(b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"old", "nothing changes before the commit");
        drop(staged);
        assert_eq!(std::fs::read(&path).unwrap(), b"old", "an abandoned create leaves the file");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "and no staged file behind");
        let staged = Staged::new(&path).unwrap();
        staged.create().unwrap().write_all(b"new").unwrap();
        staged.commit().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let mut old = String::new();
        std::io::Read::read_to_string(&mut &held, &mut old).unwrap();
        assert_eq!(old, "old", "who held the old file still reads it");
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(Staged::new(&fifo), Err(FileError::NotRegular { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
