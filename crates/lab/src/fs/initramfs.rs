//! The guest's initramfs: the workload as /init, and the console it prints on. An
//! uncompressed newc cpio (nothing to decompress at emulated CPL0), as
//! scripts/make-initramfs.py writes for the Linux checks.

/// A newc archive of `/dev`, `/dev/console` (5:1: without it init has no stdout), `/proc`
/// and `/init` (`init`, executable).
pub fn archive(init: &[u8]) -> Vec<u8> {
    const DIR: u32 = 0o040755;
    /// Name, mode, the device a node is (major, minor), contents.
    type Entry<'a> = (&'a str, u32, (u32, u32), &'a [u8]);
    let entries: [Entry; 4] = [
        ("dev", DIR, (0, 0), b""),
        ("dev/console", 0o020600, (5, 1), b""),
        ("proc", DIR, (0, 0), b""),
        ("init", 0o100755, (0, 0), init),
    ];
    let mut out = Vec::with_capacity(init.len() + 1024);
    for (i, (name, mode, rdev, data)) in entries.iter().enumerate() {
        record(&mut out, i as u32 + 1, name, *mode, *rdev, data);
    }
    record(&mut out, 0, "TRAILER!!!", 0, (0, 0), b"");
    out.resize(out.len().next_multiple_of(512), 0);
    out
}

fn record(out: &mut Vec<u8>, ino: u32, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
    let nlink = if mode & 0o040000 != 0 { 2 } else { 1 };
    let fields = [ino, mode, 0, 0, nlink, 0, data.len() as u32, 0, 0, rdev.0, rdev.1, name.len() as u32 + 1, 0];
    out.extend_from_slice(b"070701");
    for f in fields {
        out.extend_from_slice(format!("{f:08x}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    out.resize(out.len().next_multiple_of(4), 0);
    out.extend_from_slice(data);
    out.resize(out.len().next_multiple_of(4), 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_names_and_data_are_aligned() {
        let a = archive(b"#!init");
        assert_eq!(a.len() % 512, 0);
        assert!(a.starts_with(b"070701"));
        // The console's header: mode 020600, rdev 5:1.
        let at = a.windows(11).position(|w| w == b"dev/console").unwrap();
        let header = std::str::from_utf8(&a[at - 110..at]).unwrap();
        assert_eq!(&header[14..22], "00002180");
        assert_eq!(&header[78..94], "0000000500000001");
        let init = a.windows(5).position(|w| w == b"init\0").unwrap();
        assert_eq!(&a[init + 6..init + 12], b"#!init", "the name padded to 4 after the 110-byte header");
        assert!(a.windows(10).any(|w| w == b"TRAILER!!!"));
    }
}
