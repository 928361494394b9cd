//! What the jailer made, undone if a later step fails: nothing is left behind outside the
//! jail, and a failed jail is removed whole (Firecracker leaves both). Everything is held
//! by open descriptors (a name in an open directory, a cgroup's parent): they still reach
//! the host's files once the host's root is unmounted (pivot_root), and a name is never
//! looked up through a link the jailed user put in the jail meanwhile.

use crate::fsat::Dir;
use std::ffi::CString;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

enum Made {
    /// A file or directory (`true`) made in an open directory, by name.
    Entry(Dir, CString, bool),
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
    /// `name` was made in `dir` (a directory if `is_dir`).
    pub fn made(&mut self, dir: &Dir, name: CString, is_dir: bool) {
        self.made.push(Made::Entry(dir.clone(), name, is_dir));
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

    /// Keeps everything: the jail is made.
    pub fn forget(&mut self) {
        self.made.clear();
    }

    /// Removes what was made, newest first; each failure is said and the rest still done.
    pub fn run(&mut self) {
        while let Some(made) = self.made.pop() {
            let (what, result) = match made {
                Made::Entry(dir, name, is_dir) => {
                    (dir.path_of(std::ffi::OsStr::from_bytes(name.to_bytes())), dir.remove(&name, is_dir))
                }
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
