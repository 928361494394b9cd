//! cgroups as Firecracker's jailer sets them (its `cgroup.rs`): hierarchies found in
//! /proc/mounts; with v1 one cgroup per controller at `<mount>/<parent>/<id>`, each value
//! first inherited from the parent; with v2 one cgroup at `<unified>/<parent>/<id>`, its
//! controllers enabled from the root down. The jailer joins each (so the VMM it becomes is
//! in them). A file the kernel does not offer is refused, and what was made is removed.

use crate::error::JailError;
use crate::undo::Undo;
use std::path::{Path, PathBuf};

/// What the jailer reads of /proc/mounts (a host with tens of thousands of mounts has a
/// few MiB) and of any other kernel file (a cgroup's value, /proc/self/cgroup).
const MOUNTS_CAP: u64 = 64 << 20;
const FILE_CAP: u64 = 1 << 20;

fn read_kernel_file(path: impl AsRef<Path>, cap: u64) -> std::io::Result<String> {
    crate::fsat::read_kernel_file(path.as_ref(), cap)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// One `--cgroup <file>=<value>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupArg {
    pub file: String,
    pub value: String,
    /// The text before the file's first '.' (`cpuset` of `cpuset.cpus`).
    pub controller: String,
}

/// Firecracker's parsing: exactly one '=', a value, a relative file with a controller; and
/// more than Firecracker checks, since both are written as they are into a cgroup's files:
/// the file one name of a cgroup's (letters, digits, '_', '-', '.': no '/', no '..' of its
/// own, no NUL, no newline), the value one line (no control character: the kernel takes
/// what is written as it is, and a second line is a second input to the file). Messages
/// show the argument escaped, so each stays one line.
pub fn parse(arg: &str, _version: Version) -> Result<CgroupArg, String> {
    let shown = arg.escape_debug();
    let parts: Vec<&str> = arg.split('=').collect();
    let [file, value] = parts.as_slice() else { return Err(format!("Invalid format for cgroups: {shown}")) };
    if value.is_empty() {
        return Err(format!("Invalid format for cgroups: {shown}"));
    }
    let path = Path::new(file);
    if file.is_empty() || path.components().any(|c| !matches!(c, std::path::Component::Normal(_))) {
        return Err(format!("Cgroup invalid file: {shown}"));
    }
    if !file.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) {
        return Err(format!("Cgroup invalid file: {shown}: a cgroup file's name is letters, digits, '_', '-' and '.'"));
    }
    let Some((controller, property)) = file.split_once('.') else {
        return Err(format!("Cgroup invalid file: {}", file.escape_debug()));
    };
    if controller.is_empty() || property.is_empty() {
        return Err(format!("Cgroup invalid file: {shown}: the file is <controller>.<property>"));
    }
    if value.chars().any(char::is_control) {
        return Err(format!("Cgroup invalid value: {shown}: a value is one line, with no control character"));
    }
    Ok(CgroupArg { file: file.to_string(), value: value.to_string(), controller: controller.to_string() })
}

/// Where the cgroup filesystems are mounted.
struct Mounts {
    /// v1: (mount point, options) of each hierarchy.
    v1: Vec<(PathBuf, String)>,
    unified: Option<PathBuf>,
}

fn mounts() -> Result<Mounts, String> {
    let text = read_kernel_file("/proc/mounts", MOUNTS_CAP).map_err(|e| format!("Failed to read /proc/mounts: {e}"))?;
    let mut found = Mounts { v1: Vec::new(), unified: None };
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        match fields.as_slice() {
            [_, dir, "cgroup", options, ..] => found.v1.push((PathBuf::from(dir), options.to_string())),
            [_, dir, "cgroup2", ..] if found.unified.is_none() => found.unified = Some(PathBuf::from(dir)),
            _ => {}
        }
    }
    Ok(found)
}

/// This process's cgroup in the hierarchy `key` names in /proc/self/cgroup (a v1
/// controller, or "" for v2), to move back to on failure.
fn own_cgroup(key: &str) -> Option<PathBuf> {
    let text = read_kernel_file("/proc/self/cgroup", FILE_CAP).ok()?;
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = if key.is_empty() { controllers.is_empty() } else { controllers.split(',').any(|c| c == key) };
        matches.then(|| PathBuf::from(path.trim_start_matches('/')))
    })
}

/// Sets the jail's cgroups and moves this process into them; everything made is recorded in
/// `undo` (directories made, and the move, undone by moving back).
pub fn setup(args: &[CgroupArg], version: Version, parent: &Path, id: &str, undo: &mut Undo) -> Result<(), JailError> {
    let m = mounts().map_err(JailError::Step)?;
    let pid = std::process::id().to_string();
    let missing = || {
        JailError::flag("--cgroup-version", "Hierarchy not found: No hierarchy found for this cgroup version.".into())
    };
    match version {
        Version::V1 => {
            if args.is_empty() {
                return Ok(());
            }
            if m.v1.is_empty() {
                return Err(missing());
            }
            // One cgroup per controller, its values in command-line order.
            let mut cgroups: Vec<(PathBuf, String, Vec<&CgroupArg>)> = Vec::new();
            for arg in args {
                let mount = m.v1.iter().find(|(_, options)| options.split(',').any(|o| o == arg.controller));
                let Some((mount, _)) = mount else {
                    return Err(JailError::flag("--cgroup", format!("Controller {} is unavailable", arg.controller)));
                };
                match cgroups.iter_mut().find(|(m, ..)| m == mount) {
                    Some((_, _, list)) => list.push(arg),
                    None => cgroups.push((mount.clone(), arg.controller.clone(), vec![arg])),
                }
            }
            for (mount, controller, list) in &cgroups {
                let dir = mount.join(parent).join(id);
                make_dirs(&dir, undo)?;
                for arg in list {
                    let file = offered(&dir, arg)?;
                    inherit(&dir, &arg.file, parent.components().count())?;
                    write(&file, &arg.value)?;
                }
                undo.moved_to_cgroup(mount.join(own_cgroup(controller).unwrap_or_default()).join("tasks"));
                write(&dir.join("tasks"), &pid)?;
            }
        }
        Version::V2 => {
            let unified = m.unified.ok_or_else(missing)?;
            if args.is_empty() {
                // Firecracker's: an existing parent cgroup is joined as it is.
                let dir = unified.join(parent);
                if dir.is_dir() {
                    undo.moved_to_cgroup(unified.join(own_cgroup("").unwrap_or_default()).join("cgroup.procs"));
                    std::fs::write(dir.join("cgroup.procs"), &pid).map_err(|e| {
                        JailError::flag(
                            "--parent-cgroup",
                            format!("Failed to move process to cgroup ({}): {e}", dir.display()),
                        )
                    })?;
                }
                return Ok(());
            }
            let available = read_kernel_file(unified.join("cgroup.controllers"), FILE_CAP).unwrap_or_default();
            let dir = unified.join(parent).join(id);
            for arg in args {
                if !available.split_whitespace().any(|c| c == arg.controller) {
                    return Err(JailError::flag("--cgroup", format!("Controller {} is unavailable", arg.controller)));
                }
            }
            make_dirs(&dir, undo)?;
            for arg in args {
                enable(&unified, dir.parent().unwrap_or(&unified), &arg.controller)?;
                write(&offered(&dir, arg)?, &arg.value)?;
            }
            undo.moved_to_cgroup(unified.join(own_cgroup("").unwrap_or_default()).join("cgroup.procs"));
            write(&dir.join("cgroup.procs"), &pid)?;
        }
    }
    Ok(())
}

/// `mkdir -p`, each directory made recorded (removed on failure, deepest first).
fn make_dirs(dir: &Path, undo: &mut Undo) -> Result<(), JailError> {
    let mut missing: Vec<&Path> = dir.ancestors().take_while(|d| !d.exists()).collect();
    missing.reverse();
    for d in missing {
        std::fs::create_dir(d).map_err(|e| JailError::io(format!("Failed to create directory {}", d.display()), e))?;
        undo.made_cgroup(d.to_path_buf());
    }
    Ok(())
}

/// `file`'s value in `dir` from its parent, as Firecracker's v1 does (a new cgroup's cpuset
/// is empty until set): an empty parent first inherits from its own, up to `depth` levels.
fn inherit(dir: &Path, file: &str, depth: usize) -> Result<(), JailError> {
    let refused = || {
        JailError::flag(
            "--cgroup",
            format!("Failed to inherit cgroups configurations from file {file} in path {}", dir.display()),
        )
    };
    let parent = dir.parent().ok_or_else(refused)?;
    let read = || read_kernel_file(parent.join(file), FILE_CAP).unwrap_or_default();
    let mut value = read();
    if value.trim().is_empty() && depth > 0 {
        inherit(parent, file, depth - 1)?;
        value = read();
    }
    if value.trim().is_empty() {
        return Err(refused());
    }
    write(&dir.join(file), value.trim_end_matches('\n'))
}

/// `+controller` in cgroup.subtree_control from the root down to `upto`.
fn enable(root: &Path, upto: &Path, controller: &str) -> Result<(), JailError> {
    let mut chain: Vec<&Path> = upto.ancestors().take_while(|p| p.starts_with(root)).collect();
    chain.reverse();
    for dir in chain {
        write(&dir.join("cgroup.subtree_control"), &format!("+{controller}"))?;
    }
    Ok(())
}

/// The file `arg` names, as the kernel offers it in `dir`; one it does not offer is the
/// user's mistake.
fn offered(dir: &Path, arg: &CgroupArg) -> Result<PathBuf, JailError> {
    let path = dir.join(&arg.file);
    if !path.exists() {
        return Err(JailError::flag(
            "--cgroup",
            format!("{}={}: the cgroup file {} does not exist in {}", arg.file, arg.value, arg.file, dir.display()),
        ));
    }
    Ok(path)
}

fn write(path: &Path, value: &str) -> Result<(), JailError> {
    std::fs::write(path, format!("{value}\n"))
        .map_err(|e| JailError::io(format!("Failed to write to {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_arguments_parse_as_firecracker() {
        let a = parse("cpuset.cpus=0-1", Version::V1).unwrap();
        assert_eq!((a.file.as_str(), a.value.as_str(), a.controller.as_str()), ("cpuset.cpus", "0-1", "cpuset"));
        assert_eq!(parse("cpu.shares", Version::V1).unwrap_err(), "Invalid format for cgroups: cpu.shares");
        assert_eq!(parse("a=b=c", Version::V1).unwrap_err(), "Invalid format for cgroups: a=b=c");
        assert_eq!(parse("cpu.shares=", Version::V1).unwrap_err(), "Invalid format for cgroups: cpu.shares=");
        assert_eq!(parse("../x.y=1", Version::V1).unwrap_err(), "Cgroup invalid file: ../x.y=1");
        assert_eq!(parse("/x.y=1", Version::V1).unwrap_err(), "Cgroup invalid file: /x.y=1");
        assert_eq!(parse("noperiod=1", Version::V1).unwrap_err(), "Cgroup invalid file: noperiod");
    }

    #[test]
    fn a_cgroup_file_is_one_name_and_a_value_one_line() {
        for file in ["pids/pids.max", "pids.max\n", "pids.max\0", ".max", "pids.", "pids. max", "pids.max\\x"] {
            let arg = format!("{file}=1");
            let e = parse(&arg, Version::V2).unwrap_err();
            assert!(e.starts_with("Cgroup invalid file: "), "{arg:?}: {e}");
            assert_eq!(e.lines().count(), 1, "{arg:?}: {e}");
        }
        for value in ["64\n", "64\nmax", "a *:* rwm\r", "1\0", "1\t2", "\u{85}"] {
            let arg = format!("pids.max={value}");
            let e = parse(&arg, Version::V1).unwrap_err();
            assert!(e.starts_with("Cgroup invalid value: pids.max="), "{arg:?}: {e}");
            assert_eq!(e.lines().count(), 1, "{arg:?}: {e}");
        }
        for ok in ["hugetlb.2MB.max=4194304", "cpu.max=100000 100000", "devices.allow=c 10:200 rwm", "io.bfq-x.y=1"] {
            assert!(parse(ok, Version::V2).is_ok(), "{ok}");
        }
    }
}
