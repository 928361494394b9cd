//! Firecracker v1.16.1 jailer's flags (its `src/jailer/src/main.rs`), checked here all at
//! once, before anything is created: a bad flag leaves nothing behind. Where Firecracker
//! accepts what the issue calls wrong (a chroot base that is a symlink, a netns path that
//! is no namespace, a cgroup version it ignores), exitless-jailer refuses it.

use crate::cgroup::{self, CgroupArg, Version};
use crate::error::JailError;
use clap::Parser;
use std::path::{Component, Path, PathBuf};

/// The jailer's command line, as Firecracker's: `--flag value` (a value may start with one
/// '-', to be refused by its own rule), then `--` and the VMM's own flags.
#[derive(Parser, Debug)]
#[command(
    name = "exitless-jailer",
    disable_version_flag = true,
    about = "Starts exitless (or any static binary) as Firecracker's jailer starts Firecracker: copied into \
             <chroot-base-dir>/<exec-file name>/<id>/root, in new mount (and optionally PID) namespaces, \
             a network namespace, cgroups and resource limits, as an unprivileged uid and gid.",
    after_help = "Any arguments after the -- separator will be supplied to the jailed binary."
)]
pub struct Args {
    /// Jail ID: 1 to 64 letters, digits or '-'.
    #[arg(long, value_name = "id", allow_hyphen_values = true)]
    pub id: String,
    /// File path to exec into.
    #[arg(long, value_name = "exec-file", allow_hyphen_values = true)]
    pub exec_file: PathBuf,
    /// The user identifier the jailer switches to after exec.
    #[arg(long, value_name = "uid", allow_hyphen_values = true)]
    pub uid: String,
    /// The group identifier the jailer switches to after exec.
    #[arg(long, value_name = "gid", allow_hyphen_values = true)]
    pub gid: String,
    /// The base folder where chroot jails are located.
    #[arg(long, value_name = "chroot-base-dir", default_value = "/srv/jailer")]
    pub chroot_base_dir: PathBuf,
    /// Path to the network namespace this microVM should join.
    #[arg(long, value_name = "netns", allow_hyphen_values = true)]
    pub netns: Option<PathBuf>,
    /// Daemonize the jailer before exec, by invoking setsid(), and redirecting the standard
    /// I/O file descriptors to /dev/null.
    #[arg(long)]
    pub daemonize: bool,
    /// Exec into a new PID namespace.
    #[arg(long)]
    pub new_pid_ns: bool,
    /// Cgroup and value to be set by the jailer: <cgroup_file>=<value> (e.g cpu.shares=10).
    /// Repeatable.
    #[arg(long, value_name = "cgroup", allow_hyphen_values = true)]
    pub cgroup: Vec<String>,
    /// Select the cgroup version used by the jailer.
    #[arg(long, value_name = "cgroup-version", default_value = "1")]
    pub cgroup_version: String,
    /// Parent cgroup in which the cgroup of this microvm will be placed.
    #[arg(long, value_name = "parent-cgroup", allow_hyphen_values = true)]
    pub parent_cgroup: Option<String>,
    /// Resource limit: <resource>=<value>, fsize (bytes a file may grow to) or no-file (one
    /// more than the highest file descriptor). Repeatable.
    #[arg(long, value_name = "resource-limit", allow_hyphen_values = true)]
    pub resource_limit: Vec<String>,
    /// Print the binary version number.
    #[arg(long)]
    _version: bool,
    /// The jailed binary's own flags.
    #[arg(last = true, value_name = "VMM FLAGS")]
    pub extra: Vec<String>,
}

/// Everything the jail is made from, checked.
#[derive(Debug)]
pub struct Plan {
    pub id: String,
    pub exec_file: PathBuf,
    pub exec_name: String,
    pub uid: u32,
    pub gid: u32,
    /// `<base>`, canonical.
    pub chroot_base: PathBuf,
    pub netns: Option<std::fs::File>,
    pub daemonize: bool,
    pub new_pid_ns: bool,
    pub cgroups: Vec<CgroupArg>,
    pub cgroup_version: Version,
    pub parent_cgroup: PathBuf,
    pub fsize: Option<u64>,
    pub no_file: u64,
    pub extra: Vec<String>,
}

/// Firecracker's default open-file limit for the jailed process.
const DEFAULT_NO_FILE: u64 = 2048;

impl Args {
    /// Every flag checked, in Firecracker's order; the first wrong one refused.
    pub fn plan(self) -> Result<Plan, JailError> {
        check_id(&self.id)?;
        let flag = |f: &'static str| move |m: String| JailError::flag(f, m);
        let exec_file = std::fs::canonicalize(&self.exec_file).map_err(|e| {
            JailError::flag("--exec-file", format!("Failed to canonicalize path {}: {e}", self.exec_file.display()))
        })?;
        if !exec_file.is_file() {
            return Err(JailError::flag("--exec-file", format!("{} is not a file", exec_file.display())));
        }
        let exec_name = exec_file
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| {
                JailError::flag("--exec-file", format!("Failed to extract filename from path {}", exec_file.display()))
            })?
            .to_string();
        let base = check_base(&self.chroot_base_dir).map_err(flag("--chroot-base-dir"))?;
        let uid = parse_id(&self.uid).ok_or_else(|| JailError::flag("--uid", format!("Invalid uid: {}", self.uid)))?;
        let gid = parse_id(&self.gid).ok_or_else(|| JailError::flag("--gid", format!("Invalid gid: {}", self.gid)))?;
        let netns = self.netns.as_deref().map(open_netns).transpose().map_err(flag("--netns"))?;
        let parent_cgroup = PathBuf::from(self.parent_cgroup.clone().unwrap_or_else(|| exec_name.clone()));
        if parent_cgroup.as_os_str().is_empty()
            || parent_cgroup.components().any(|c| !matches!(c, Component::Normal(_)))
        {
            return Err(JailError::flag(
                "--parent-cgroup",
                "Parent cgroup path is invalid. Path should not be absolute or contain '..' or '.'".into(),
            ));
        }
        // A newline in a cgroup's name would be a line of its own in /proc/<pid>/cgroup.
        if parent_cgroup.as_os_str().as_encoded_bytes().iter().any(|b| b.is_ascii_control()) {
            return Err(JailError::flag(
                "--parent-cgroup",
                format!(
                    "Parent cgroup path is invalid: {}: a control character in it",
                    parent_cgroup.display().to_string().escape_debug()
                ),
            ));
        }
        let cgroup_version = match self.cgroup_version.as_str() {
            "1" => Version::V1,
            "2" => Version::V2,
            v => {
                return Err(JailError::flag("--cgroup-version", format!("{v} is an invalid cgroup version specifier")))
            }
        };
        let cgroups = self
            .cgroup
            .iter()
            .map(|c| cgroup::parse(c, cgroup_version).map_err(|m| JailError::flag("--cgroup", m)))
            .collect::<Result<Vec<_>, _>>()?;
        let (fsize, no_file) = parse_limits(&self.resource_limit).map_err(flag("--resource-limit"))?;
        Ok(Plan {
            id: self.id,
            exec_file,
            exec_name,
            uid,
            gid,
            chroot_base: base,
            netns,
            daemonize: self.daemonize,
            new_pid_ns: self.new_pid_ns,
            cgroups,
            cgroup_version,
            parent_cgroup,
            fsize,
            no_file,
            extra: self.extra,
        })
    }
}

/// Firecracker's rule: 1 to 64 bytes, each character alphanumeric or '-' (so no '/', no
/// '.', nothing a path could be made of).
fn check_id(id: &str) -> Result<(), JailError> {
    let refused = |why: String| JailError::flag("--id", format!("Invalid instance ID: {why}"));
    if id.is_empty() || id.len() > 64 {
        return Err(refused(format!("Invalid len ({});  the length must be between 1 and 64", id.len())));
    }
    match id.chars().enumerate().find(|(_, c)| !(c.is_alphanumeric() || *c == '-')) {
        Some((i, c)) => Err(refused(format!("Invalid char ({c}) at position {i}"))),
        None => Ok(()),
    }
}

/// A decimal u32, as Rust parses it (Firecracker's `parse::<u32>`).
fn parse_id(text: &str) -> Option<u32> {
    text.parse::<u32>().ok()
}

/// The chroot base: an existing directory, not a symlink (a symlink's target could be moved
/// under the jailer's feet); returned absolute.
fn check_base(base: &Path) -> Result<PathBuf, String> {
    let meta = std::fs::symlink_metadata(base).map_err(|e| format!("{}: {e}", base.display()))?;
    if meta.file_type().is_symlink() {
        return Err(format!("{} is a symlink: give the directory itself", base.display()));
    }
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", base.display()));
    }
    std::fs::canonicalize(base).map_err(|e| format!("Failed to canonicalize path {}: {e}", base.display()))
}

/// The network namespace at `path`, checked to be one (an nsfs file whose type is a network
/// namespace), open for setns.
fn open_netns(path: &Path) -> Result<std::fs::File, String> {
    // Opened only once seen to be a regular file (nsfs files are): a FIFO's open would wait.
    let file = crate::fsat::open_regular_path(path, true, libc::O_RDONLY).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidInput => format!("{} is not a network namespace", path.display()),
        _ => format!("Failed to open file {}: {e}", path.display()),
    })?;
    const NS_GET_NSTYPE: libc::Ioctl = 0xb703;
    // SAFETY: an ioctl on a file we own that takes no argument.
    let kind = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&file), NS_GET_NSTYPE) };
    if kind != libc::CLONE_NEWNET {
        return Err(format!("{} is not a network namespace", path.display()));
    }
    Ok(file)
}

/// `--resource-limit` values: (fsize, no-file), the last of each name winning.
fn parse_limits(limits: &[String]) -> Result<(Option<u64>, u64), String> {
    let (mut fsize, mut no_file) = (None, DEFAULT_NO_FILE);
    for arg in limits {
        let (name, value) = arg.split_once('=').ok_or_else(|| format!("Invalid format for resources limits: {arg}"))?;
        let value: u64 = value.parse().map_err(|e| format!("Invalid limit value for resource: {value}: {e}"))?;
        match name {
            "fsize" => fsize = Some(value),
            "no-file" => no_file = value,
            _ => return Err(format!("Invalid resource argument: {name}")),
        }
    }
    Ok((fsize, no_file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_firecrackers() {
        assert!(check_id("vm-1").is_ok());
        assert!(check_id(&"a".repeat(64)).is_ok());
        for bad in ["", "a/b", "..", "a.b", "a b", &"a".repeat(65)] {
            let e = check_id(bad).unwrap_err().to_string();
            assert!(e.starts_with("--id: Invalid instance ID: "), "{e}");
        }
        assert_eq!(
            check_id("ab/c").unwrap_err().to_string(),
            "--id: Invalid instance ID: Invalid char (/) at position 2"
        );
    }

    #[test]
    fn limits_parse_as_firecracker_and_no_file_defaults() {
        assert_eq!(parse_limits(&[]).unwrap(), (None, 2048));
        let given = ["fsize=10".to_string(), "no-file=7".into(), "no-file=9".into()];
        assert_eq!(parse_limits(&given).unwrap(), (Some(10), 9));
        assert_eq!(parse_limits(&["x".into()]).unwrap_err(), "Invalid format for resources limits: x");
        assert_eq!(parse_limits(&["cpu=1".into()]).unwrap_err(), "Invalid resource argument: cpu");
        assert!(parse_limits(&["fsize=-1".into()]).unwrap_err().starts_with("Invalid limit value for resource: -1: "));
    }

    #[test]
    fn uids_are_decimal_u32() {
        assert_eq!(parse_id("1000"), Some(1000));
        assert_eq!((parse_id("-1"), parse_id("x"), parse_id("4294967296")), (None, None, None));
    }
}
