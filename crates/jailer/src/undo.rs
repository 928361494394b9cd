//! What the jailer made, undone if a later step fails: nothing is left behind outside the
//! jail, and a failed jail is removed whole (Firecracker leaves both). cgroups are held by
//! open descriptors, which still reach them once the host's root is unmounted (pivot_root).

use std::ffi::CString;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

enum Made {
    File(PathBuf),
    Dir(PathBuf),
    /// A cgroup directory: its parent, open, and its name.
    Cgroup(std::fs::File, CString, PathBuf),
    /// The process joined a cgroup; undone by writing its pid to its old one's procs file.
    Joined(std::fs::File, PathBuf),
}

#[derive(Default)]
pub struct Undo {
    made: Vec<Made>,
}

impl Undo {
    pub fn made_file(&mut self, path: PathBuf) {
        self.made.push(Made::File(path));
    }

    pub fn made_dir(&mut self, path: PathBuf) {
        self.made.push(Made::Dir(path));
    }

    /// A cgroup directory made (its parent is opened now, to remove it later from anywhere).
    pub fn made_cgroup(&mut self, path: PathBuf) {
        let parent = path.parent().and_then(|p| std::fs::File::open(p).ok());
        let name = path.file_name().and_then(|n| CString::new(n.as_encoded_bytes()).ok());
        if let (Some(parent), Some(name)) = (parent, name) {
            self.made.push(Made::Cgroup(parent, name, path));
        }
    }

    /// About to join a cgroup: `back` is the procs file of the one the process is in.
    pub fn moved_to_cgroup(&mut self, back: PathBuf) {
        if let Ok(file) = std::fs::OpenOptions::new().write(true).open(&back) {
            self.made.push(Made::Joined(file, back));
        }
    }

    /// The jail's paths under `from` are now under `to` (after pivot_root).
    pub fn rebase(&mut self, from: &Path, to: &Path) {
        for made in &mut self.made {
            if let Made::File(p) | Made::Dir(p) = made {
                if let Ok(rest) = p.strip_prefix(from) {
                    *p = to.join(rest);
                }
            }
        }
    }

    /// Keeps everything: the jail is made.
    pub fn forget(&mut self) {
        self.made.clear();
    }

    /// Removes what was made, newest first; each failure is said and the rest still done.
    pub fn run(&mut self) {
        while let Some(made) = self.made.pop() {
            let (what, result) = match made {
                Made::File(p) => (p.clone(), std::fs::remove_file(&p)),
                Made::Dir(p) => (p.clone(), std::fs::remove_dir(&p)),
                Made::Cgroup(parent, name, p) => {
                    // SAFETY: unlinkat on a directory fd we own and a NUL-terminated name.
                    let r = unsafe { libc::unlinkat(parent.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) };
                    (p, if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) })
                }
                Made::Joined(mut file, p) => (p, file.write_all(std::process::id().to_string().as_bytes())),
            };
            if let Err(e) = result {
                eprintln!("exitless-jailer: cannot undo {}: {e}", what.display());
            }
        }
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        self.run();
    }
}
