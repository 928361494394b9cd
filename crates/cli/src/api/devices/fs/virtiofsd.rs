//! `exitless run --fs tag=T,dir=DIR` (run.rs): virtiofsd started for the run, on a listening
//! socket the VMM made (handed over as `--fd`, so the device connects at once, with no wait
//! for the daemon to create it), and ended with the run. The binary: `$EXITLESS_VIRTIOFSD`,
//! else scripts/virtiofsd.sh's (`~/.cache/exitless/virtiofsd/bin/virtiofsd`), else the
//! PATH's.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// `--fs`'s value: the tag the guest mounts by, the host directory it sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Share {
    pub tag: String,
    pub dir: PathBuf,
}

/// `tag=T,dir=DIR`.
pub fn parse_share(s: &str) -> Result<Share, String> {
    let (mut tag, mut dir) = (None, None);
    for part in s.split(',') {
        match part.split_once('=') {
            Some(("tag", t)) if !t.is_empty() => tag = Some(t.to_string()),
            Some(("dir", d)) if !d.is_empty() => dir = Some(PathBuf::from(d)),
            _ => return Err(format!("'{part}' is not tag=TAG or dir=DIR")),
        }
    }
    Ok(Share { tag: tag.ok_or("--fs needs tag=TAG")?, dir: dir.ok_or("--fs needs dir=DIR")? })
}

/// A running virtiofsd; its socket removed when dropped. The daemon ends by itself when
/// the machine (dropped first) closes its connection, and with this process in any case
/// (PR_SET_PDEATHSIG): the run's main thread, held to its seccomp filter by then, may not
/// signal or reap it.
pub struct Daemon {
    _child: Child,
    pub socket: PathBuf,
}

/// The virtiofsd binary to run.
fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("EXITLESS_VIRTIOFSD") {
        return path.into();
    }
    let cached = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/exitless/virtiofsd/bin/virtiofsd"));
    cached.filter(|p| p.exists()).unwrap_or_else(|| "virtiofsd".into())
}

impl Daemon {
    /// virtiofsd serving `share.dir`, the `index`th of this process.
    pub fn start(share: &Share, index: usize) -> Result<Daemon, String> {
        if !share.dir.is_dir() {
            return Err(format!("--fs: {} is not a directory", share.dir.display()));
        }
        let socket = std::env::temp_dir().join(format!("exitless-{}-fs{index}.sock", std::process::id()));
        let _ = std::fs::remove_file(&socket);
        let listener =
            UnixListener::bind(&socket).map_err(|e| format!("--fs: cannot listen on {}: {e}", socket.display()))?;
        let fd = listener.as_raw_fd();
        let mut command = Command::new(binary());
        command.arg("--shared-dir").arg(&share.dir).arg("--fd=3").arg("--log-level=error").stdin(Stdio::null());
        // Unprivileged, virtiofsd cannot make its namespace sandbox.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            command.arg("--sandbox=none");
        }
        // SAFETY: between fork and exec the child only makes async-signal-safe calls:
        // dup2 or fcntl on a descriptor it inherited, and prctl.
        unsafe {
            command.pre_exec(move || {
                // The listening socket as fd 3, open across exec; the daemon
                // ends with this process even if the VMM is killed.
                let moved = match fd {
                    3 => libc::fcntl(3, libc::F_SETFD, 0),
                    _ => libc::dup2(fd, 3),
                };
                if moved < 0 || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        };
        let child = command.spawn().map_err(|e| format!("--fs: cannot start {}: {e}", binary().display()))?;
        drop(listener);
        Ok(Daemon { _child: child, socket })
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_needs_its_tag_and_its_directory() {
        assert_eq!(parse_share("tag=t,dir=/srv"), Ok(Share { tag: "t".into(), dir: "/srv".into() }));
        assert!(parse_share("tag=t").unwrap_err().contains("dir=DIR"));
        assert!(parse_share("dir=/srv").unwrap_err().contains("tag=TAG"));
        assert!(parse_share("tag=t,dir=/srv,cache=x").unwrap_err().contains("cache=x"));
    }
}
