//! fsbench.c, the one program both sides run: its image, its command line, and what it
//! prints, read back.

use std::path::{Path, PathBuf};

/// The static program build.rs compiled (empty where the host had no static C library).
const FSBENCH: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fsbench"));

/// The large file's name in the share.
pub const LARGE: &str = "large.bin";

/// What both sides are asked to do.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub file_mib: u64,
    pub runs: u32,
    pub files: u32,
    pub file_bytes: u32,
}

/// The program's image.
pub fn image() -> Result<&'static [u8], String> {
    if FSBENCH.is_empty() {
        return Err("the guest workload (crates/lab/src/fs/fsbench.c) was not built: the build host had no \
                    `cc -static` (Debian: libc6-dev)"
            .into());
    }
    Ok(FSBENCH)
}

/// Its command line: `mode` host or guest, on `dir` (the share, or the guest's mount point).
pub fn args(mode: &str, dir: &str, p: &Params) -> Vec<String> {
    let (mib, runs, files, bytes) = (p.file_mib, p.runs, p.files, p.file_bytes);
    [mode, dir, LARGE]
        .iter()
        .map(|s| s.to_string())
        .chain([mib, runs.into(), files.into(), bytes.into(), 1].map(|n: u64| n.to_string()))
        .collect()
}

/// One timed pass: how much it did (bytes or files) in how long.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    pub count: u64,
    pub ns: u64,
}

impl Timing {
    /// Per second: MB/s for bytes (10^6), operations per second for files.
    pub fn rate(&self, unit: f64) -> f64 {
        self.count as f64 / unit / (self.ns.max(1) as f64 / 1e9)
    }
}

/// One side's passes, as printed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Passes {
    pub seq_cold: Vec<Timing>,
    pub seq_warm: Vec<Timing>,
    pub create: Vec<Timing>,
    pub stat: Vec<Timing>,
    pub remove: Vec<Timing>,
    /// Of the large file's bytes: both sides must agree.
    pub checksum: Option<u64>,
    /// Short reads and files of the wrong size.
    pub bad: u64,
}

/// The passes from the program's lines (other lines, a guest's kernel's, are skipped); an
/// error line, or no `done`, is the error.
pub fn parse<'a>(lines: impl IntoIterator<Item = &'a str>) -> Result<Passes, String> {
    let mut p = Passes::default();
    let mut done = false;
    for line in lines {
        let Some(rest) = line.trim().strip_prefix("FSBENCH ") else { continue };
        let words: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| words.get(i).and_then(|w| w.parse::<u64>().ok());
        match words.first().copied() {
            Some("error") => return Err(format!("the workload failed: {}", words[1..].join(" "))),
            Some("done") => done = true,
            Some("bad") => p.bad = num(1).ok_or_else(|| format!("unexpected line {line:?}"))?,
            Some("checksum") => {
                let sum = words.get(1).and_then(|w| u64::from_str_radix(w, 16).ok());
                p.checksum = Some(sum.ok_or_else(|| format!("unexpected line {line:?}"))?);
            }
            Some(pass) => {
                let list = match pass {
                    "seq-cold" => &mut p.seq_cold,
                    "seq-warm" => &mut p.seq_warm,
                    "create" => &mut p.create,
                    "stat" => &mut p.stat,
                    "remove" => &mut p.remove,
                    _ => continue,
                };
                let (count, ns) = num(2).zip(num(3)).ok_or_else(|| format!("unexpected line {line:?}"))?;
                list.push(Timing { count, ns });
            }
            None => {}
        }
    }
    if !done {
        return Err("the workload stopped before it was done".into());
    }
    Ok(p)
}

/// The program written to `dir` (executable), for the host's passes.
pub fn write_program(dir: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("fsbench");
    std::fs::write(&path, image()?).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("cannot make {} executable: {e}", path.display()))?;
    Ok(path)
}

/// The host's passes on `share`, by the lab's own child process.
pub fn run_host(program: &Path, share: &Path, p: &Params) -> Result<Passes, String> {
    let share = share.to_str().ok_or("the share's path is not UTF-8")?;
    let out = std::process::Command::new(program)
        .args(args("host", share, p))
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse(text.lines()).map_err(|e| format!("on the host: {e}"))
}

/// The large file, `mib` MiB of pseudo-random bytes (no page of it alike, nothing a
/// filesystem could compress or share), written once for both sides.
pub fn write_large(share: &Path, mib: u64) -> Result<(), String> {
    use std::io::Write;
    let path = share.join(LARGE);
    let mut file = std::fs::File::create(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut chunk = vec![0u8; 1 << 20];
    for _ in 0..mib {
        for word in chunk.chunks_exact_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&state.to_le_bytes());
        }
        file.write_all(&chunk).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    file.sync_all().map_err(|e| format!("cannot sync {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_sides_lines() {
        let text = "[    1.0] virtiofs: ...\nFSBENCH seq-cold 1 1048576 1000000\r\nFSBENCH checksum 00ff\n\
                    FSBENCH seq-warm 1 1048576 500000\nFSBENCH create 1 10 2000\nFSBENCH stat 1 10 1000\n\
                    FSBENCH remove 1 10 500\nFSBENCH bad 0\nFSBENCH done\r";
        let p = parse(text.lines()).unwrap();
        assert_eq!(p.seq_cold, vec![Timing { count: 1 << 20, ns: 1_000_000 }]);
        assert_eq!(p.checksum, Some(0xff));
        assert_eq!(p.create[0].rate(1.0), 5e6);
        assert!((p.seq_warm[0].rate(1e6) - 2097.152).abs() < 1e-6);
        assert_eq!(p.bad, 0);
        assert!(parse("FSBENCH seq-warm 1 2 3".lines()).unwrap_err().contains("before it was done"));
        let err = parse("FSBENCH error mount -t virtiofs fsbench: No such device\nFSBENCH done".lines());
        assert!(err.unwrap_err().contains("No such device"));
        assert!(parse("FSBENCH create 1 x 3\nFSBENCH done".lines()).is_err());
    }

    #[test]
    fn both_sides_get_the_same_command_line() {
        let p = Params { file_mib: 256, runs: 3, files: 10_000, file_bytes: 1024 };
        assert_eq!(args("guest", "/mnt", &p), ["guest", "/mnt", LARGE, "256", "3", "10000", "1024", "1"]);
    }
}
