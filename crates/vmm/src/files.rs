//! Files the VMM is given by name (in an API request, on its command line, in a
//! snapshot's configuration) and reads whole or maps: opened without blocking, checked on
//! the descriptor opened (so what is checked is what is read, whatever the path names
//! later), and read to a bound. A FIFO would hang the thread that opens or reads it, a
//! device like /dev/zero never ends, and both report a length of 0: neither is a file the
//! VMM reads whole or maps.

use std::fs::{File, Metadata, OpenOptions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot open {path}: {source}")]
    Open { path: String, source: std::io::Error },
    #[error("{path} is {kind}, not a regular file")]
    NotRegular { path: String, kind: &'static str },
    #[error("{path} holds more than the {max} bytes it may")]
    TooLarge { path: String, max: u64 },
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
}

/// Opens `path` to read (and to write, if `write`) without waiting for a FIFO's other
/// end or a device's carrier, returning the descriptor and what it is (fstat). The
/// descriptor is made blocking again: regular files ignore the flag, but io_uring would
/// answer EAGAIN on one that has it.
pub fn open_nonblocking(path: &Path, write: bool, extra_flags: i32) -> Result<(File, Metadata), FileError> {
    let open = |source| FileError::Open { path: path.display().to_string(), source };
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC | extra_flags)
        .open(path)
        .map_err(open)?;
    let meta = file.metadata().map_err(open)?;
    blocking(&file).map_err(open)?;
    Ok((file, meta))
}

/// Opens `path` as [`open_nonblocking`] does, and refuses it unless it is a regular
/// file; its length as the descriptor has it.
pub fn open_regular(path: &Path, write: bool) -> Result<(File, u64), FileError> {
    let (file, meta) = open_nonblocking(path, write, 0)?;
    if !meta.file_type().is_file() {
        return Err(FileError::NotRegular { path: path.display().to_string(), kind: kind(&meta) });
    }
    Ok((file, meta.len()))
}

/// The whole of the regular file at `path`, at most `max` bytes: read from the
/// descriptor that was checked, never past `max + 1` bytes (a file may grow while read).
pub fn read_regular_bounded(path: &Path, max: u64) -> Result<Vec<u8>, FileError> {
    let too_large = || FileError::TooLarge { path: path.display().to_string(), max };
    let (file, len) = open_regular(path, false).map_err(|e| match e {
        FileError::Open { path, source } => FileError::Read { path, source },
        e => e,
    })?;
    if len > max {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| FileError::Read { path: path.display().to_string(), source })?;
    if bytes.len() as u64 > max {
        return Err(too_large());
    }
    Ok(bytes)
}

/// Creates (or truncates) the regular file at `path` to write it whole (read too, if
/// `read`); anything else there is refused untouched, without waiting on a FIFO.
pub fn create_regular(path: &Path, read: bool) -> Result<File, FileError> {
    let open = |source| FileError::Open { path: path.display().to_string(), source };
    // Not O_TRUNC: only a file checked to be regular is truncated.
    let file = OpenOptions::new()
        .read(read)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(open)?;
    let meta = file.metadata().map_err(open)?;
    if !meta.file_type().is_file() {
        return Err(FileError::NotRegular { path: path.display().to_string(), kind: kind(&meta) });
    }
    blocking(&file).map_err(open)?;
    file.set_len(0).map_err(open)?;
    Ok(file)
}

/// Clears O_NONBLOCK on `file`.
fn blocking(file: &File) -> std::io::Result<()> {
    // SAFETY: F_GETFL on a descriptor `file` owns; no memory is passed.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    // SAFETY: F_SETFL on the same descriptor, with its own flags less one.
    if flags < 0 || unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// What a file that is not a regular one is, for a refusal.
pub fn kind(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    match () {
        _ if t.is_file() => "a regular file",
        _ if t.is_dir() => "a directory",
        _ if t.is_fifo() => "a FIFO",
        _ if t.is_char_device() => "a character device",
        _ if t.is_block_device() => "a block device",
        _ if t.is_socket() => "a socket",
        _ => "not a file",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn fifo(dir: &Path) -> std::path::PathBuf {
        let path = dir.join("fifo");
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        path
    }

    #[test]
    fn only_a_regular_file_is_read_and_only_to_its_bound() {
        let dir = std::env::temp_dir().join(format!("exitless-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("file");
        std::fs::write(&file, b"0123456789").unwrap();
        assert_eq!(read_regular_bounded(&file, 10).unwrap(), b"0123456789");
        assert!(matches!(read_regular_bounded(&file, 9), Err(FileError::TooLarge { max: 9, .. })));
        let started = Instant::now();
        let fifo = fifo(&dir);
        for (path, kind) in [(&fifo, "a FIFO"), (&"/dev/zero".into(), "a character device"), (&dir, "a directory")] {
            let e = read_regular_bounded(path, 1 << 20).unwrap_err();
            assert!(matches!(&e, FileError::NotRegular { kind: k, .. } if *k == kind), "{e}");
            assert!(e.to_string().contains("not a regular file"), "{e}");
        }
        assert!(matches!(open_regular(&fifo, false), Err(FileError::NotRegular { .. })));
        // Nothing waited for a writer to the FIFO.
        assert!(started.elapsed() < Duration::from_secs(5));
        // Created over a FIFO: refused, the FIFO left as it was.
        assert!(matches!(create_regular(&fifo, true), Err(FileError::NotRegular { kind: "a FIFO", .. })));
        let out = create_regular(&file, false).unwrap();
        assert_eq!(out.metadata().unwrap().len(), 0, "a regular file is truncated");
        // The descriptor handed out blocks as usual.
        // SAFETY: F_GETFL on a descriptor `out` owns.
        assert_eq!(unsafe { libc::fcntl(out.as_raw_fd(), libc::F_GETFL) } & libc::O_NONBLOCK, 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
