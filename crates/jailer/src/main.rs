//! exitless-jailer: Firecracker v1.16.1's jailer contract (its flags, jail layout, device
//! nodes, cgroups, limits, pid file and the VMM's command line) for exitless. The order is
//! Firecracker's, except that every flag is checked before anything is made, and what was
//! made is removed if a later step fails. A failure is one line on stderr and exit 1.

mod args;
mod cgroup;
mod error;
mod fsat;
mod jail;
mod undo;

use args::{Args, Plan};
use clap::Parser;
use error::JailError;
use std::os::unix::process::CommandExt;
use undo::Undo;

/// Firecracker's jailer version this one's contract is, as `--version` prints it.
const FIRECRACKER_JAILER_VERSION: &str = "1.16.1";

fn main() -> std::process::ExitCode {
    let start_us = clock_us(libc::CLOCK_MONOTONIC);
    let start_cpu_us = clock_us(libc::CLOCK_PROCESS_CPUTIME_ID);
    sanitize();
    // Firecracker's parser: --help or -h, then --version, anywhere before `--`, win over
    // everything else (even missing required flags).
    let argv: Vec<String> = std::env::args().skip(1).take_while(|a| a != "--").collect();
    if argv.iter().any(|a| a == "--version") && !argv.iter().any(|a| a == "--help" || a == "-h") {
        println!("Jailer v{FIRECRACKER_JAILER_VERSION}\n");
        return std::process::ExitCode::SUCCESS;
    }
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) if matches!(e.kind(), clap::error::ErrorKind::DisplayHelp) => {
            println!("Jailer v{FIRECRACKER_JAILER_VERSION} (exitless-jailer {})\n", env!("CARGO_PKG_VERSION"));
            let _ = e.print();
            return std::process::ExitCode::SUCCESS;
        }
        Err(e) => return fail(&JailError::Step(one_line(&e))),
    };
    let result = args.plan().and_then(|plan| run(plan, start_us, start_cpu_us));
    match result {
        Ok(never) => match never {},
        Err(e) => fail(&e),
    }
}

fn fail(e: &JailError) -> std::process::ExitCode {
    eprintln!("exitless-jailer: {e}");
    std::process::ExitCode::FAILURE
}

/// clap's message without its usage lines.
fn one_line(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.trim_start_matches("error: ").to_string()
}

/// Nothing inherited reaches the jail: descriptors past stdio closed, the environment
/// emptied (the VMM is exec'd with none).
fn sanitize() {
    // SAFETY: close_range on descriptors this process does not use (Rust opened none yet).
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    for (key, _) in std::env::vars_os() {
        // SAFETY: the process is single-threaded here; nothing else reads the environment.
        unsafe { std::env::remove_var(key) };
    }
}

fn clock_us(clock: libc::clockid_t) -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(clock, &mut t) };
    (t.tv_sec as u64) * 1_000_000 + (t.tv_nsec as u64) / 1000
}

/// Makes the jail and becomes the VMM in it; returns only on failure (with everything made
/// removed).
fn run(plan: Plan, start_us: u64, start_cpu_us: u64) -> Result<std::convert::Infallible, JailError> {
    // Opened before the jail's mount namespace is made (in `prepare`), so the VMM's stdio
    // is the host's /dev/null by its path too.
    let dev_null = if plan.daemonize {
        Some(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
                .map_err(|e| JailError::io("Failed to open /dev/null", e))?,
        )
    } else {
        None
    };
    let mut undo = Undo::default();
    let jail = jail::prepare(&plan, &mut undo)?;
    if let Some(netns) = &plan.netns {
        // SAFETY: setns on a namespace file we opened and checked.
        if unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(netns), libc::CLONE_NEWNET) } != 0 {
            return Err(JailError::os("--netns: Failed to join network namespace: netns"));
        }
    }
    set_limits(&plan)?;
    cgroup::setup(&plan.cgroups, plan.cgroup_version, &plan.parent_cgroup, &plan.id, &mut undo)?;
    jail::enter(&jail)?;
    if let Some(dev_null) = dev_null {
        daemonize(&dev_null)?;
    }
    let jailer_cpu_us = clock_us(libc::CLOCK_PROCESS_CPUTIME_ID).saturating_sub(start_cpu_us);
    if plan.new_pid_ns {
        // SAFETY: getsid(0) and getpid() read this process's ids.
        let leader = !plan.daemonize && unsafe { libc::getsid(0) == libc::getpid() };
        // The child waits until the parent has written the pid file, so that the pid file
        // is the child's to remove should its exec fail (the parent has gone by then).
        let (ready_rx, mut ready_tx) = std::io::pipe().map_err(|e| JailError::io("Failed to create a pipe", e))?;
        // SAFETY: a fork-like clone into a new PID namespace (no stack: the child runs on a
        // copy of this one, as after fork); this process is single-threaded.
        let child = unsafe { libc::syscall(libc::SYS_clone, libc::CLONE_NEWPID, 0usize, 0usize, 0usize, 0usize) };
        match child {
            -1 => return Err(JailError::os("--new-pid-ns: Failed cloning into a new child process")),
            0 => {
                drop(ready_tx);
                let mut byte = [0u8];
                if std::io::Read::read(&mut &ready_rx, &mut byte).ok() != Some(1) {
                    // The parent failed and removes the jail itself.
                    undo.forget();
                    // SAFETY: leaving without running anything else of the jailer.
                    unsafe { libc::_exit(1) };
                }
                jail::pid_file_made(&jail, &plan.exec_name, &mut undo)?;
                // SAFETY: setsid in the new namespace's first process.
                if leader && unsafe { libc::setsid() } < 0 {
                    return Err(JailError::os("Failed to daemonize: setsid"));
                }
            }
            pid => {
                drop(ready_rx);
                jail::write_pid_file(&jail, &plan.exec_name, pid as libc::pid_t, &mut undo)?;
                std::io::Write::write_all(&mut ready_tx, b"1")
                    .map_err(|e| JailError::io("Failed to start the child", e))?;
                undo.forget();
                // SAFETY: the parent's work is done; the child goes on in the jail.
                unsafe { libc::_exit(0) };
            }
        }
    } else {
        // SAFETY: getpid reads this process's id.
        jail::write_pid_file(&jail, &plan.exec_name, unsafe { libc::getpid() }, &mut undo)?;
    }
    Err(exec(&plan, start_us, jailer_cpu_us, undo))
}

/// Firecracker's limits: the file size if asked, always the number of open files (2048
/// unless asked), soft and hard alike.
fn set_limits(plan: &Plan) -> Result<(), JailError> {
    let set = |resource, value: u64, what: &str| {
        let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
        // SAFETY: setrlimit reads the struct we own.
        if unsafe { libc::setrlimit(resource, &limit) } != 0 {
            return Err(JailError::os(format!("--resource-limit: Failed to set limit for resource: {what}")));
        }
        Ok(())
    };
    if let Some(fsize) = plan.fsize {
        set(libc::RLIMIT_FSIZE, fsize, "size of file")?;
    }
    set(libc::RLIMIT_NOFILE, plan.no_file, "number of file descriptors")
}

/// Two forks (the jailer's caller sees it end at once), a new session, stdio on /dev/null.
fn daemonize(dev_null: &std::fs::File) -> Result<(), JailError> {
    for step in 0..2 {
        // SAFETY: fork in a single-threaded process; the parent only exits.
        match unsafe { libc::fork() } {
            -1 => return Err(JailError::os("Failed to daemonize")),
            0 => {}
            // SAFETY: the parent leaves without running the child's cleanup.
            _ => unsafe { libc::_exit(0) },
        }
        // SAFETY: setsid in the first child.
        if step == 0 && unsafe { libc::setsid() } < 0 {
            return Err(JailError::os("Failed to daemonize: setsid"));
        }
    }
    for fd in 0..3 {
        // SAFETY: dup2 of a descriptor we own onto stdio.
        if unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(dev_null), fd) } < 0 {
            return Err(JailError::os("Failed to duplicate fd"));
        }
    }
    Ok(())
}

/// Becomes `/<exec name>` as the jailed user and group (supplementary groups dropped), with
/// no environment and Firecracker's arguments before the caller's: returns only on failure,
/// root again and with the jail removed.
fn exec(plan: &Plan, start_us: u64, jailer_cpu_us: u64, mut undo: Undo) -> JailError {
    let program = format!("/{}", plan.exec_name);
    let cpu_now = clock_us(libc::CLOCK_PROCESS_CPUTIME_ID);
    if let Err(e) = drop_ids(plan) {
        undo.run();
        return e;
    }
    let e = std::process::Command::new(&program)
        .arg0(&program)
        .args(["--id", &plan.id])
        .args(["--start-time-us", &start_us.to_string()])
        .args(["--start-time-cpu-us", &cpu_now.to_string()])
        .args(["--parent-cpu-time-us", &jailer_cpu_us.to_string()])
        .args(&plan.extra)
        .env_clear()
        .current_dir("/")
        .exec();
    let failed = JailError::Step(format!("Failed to exec into {program}: {e}"));
    // SAFETY: setresuid takes numbers; the saved uid is still 0 (see drop_ids).
    if unsafe { libc::setresuid(0, 0, 0) } != 0 {
        return JailError::os(format!("{failed}; cannot take root back to remove the jail"));
    }
    undo.run();
    failed
}

/// The jailed group and user, supplementary groups dropped, but the saved uid kept 0:
/// execve makes it the jailed uid too (and clears the capabilities), while a failed exec
/// can take root back to remove the jail (std's Command::uid is a setuid: root gone for
/// good, the jail left behind).
fn drop_ids(plan: &Plan) -> Result<(), JailError> {
    // SAFETY: setgroups with no list, setresgid and setresuid with numbers.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 {
            return Err(JailError::os("Failed to drop supplementary groups"));
        }
        if libc::setresgid(plan.gid, plan.gid, plan.gid) != 0 {
            return Err(JailError::os(format!("Failed to set gid {}", plan.gid)));
        }
        if libc::setresuid(plan.uid, plan.uid, 0) != 0 {
            return Err(JailError::os(format!("Failed to set uid {}", plan.uid)));
        }
    }
    Ok(())
}
