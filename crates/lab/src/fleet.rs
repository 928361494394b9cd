//! `exitless bench fleet`: N microVMs started the way an orchestrator starts Firecracker's:
//! one `exitless --api-sock` process each, configured and booted through the API, all at
//! once. Each boots the `wait` payload (it prints one line, then halts until stopped).
//! Measured: when each guest's line reached its VMM's stdout (from that process's spawn and
//! from the start of the fleet), the VMM memory of each, and that SIGTERM stops every one
//! with its socket removed and nothing left in the fleet's directory.

use crate::api_client::expect_ok;
use crate::report::{print_table, targets_json, targets_text, Target, WriteError};
use serde_json::{json, Value};
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Options {
    pub vms: u32,
    /// Guest RAM per VM (MiB): mapped, not touched, as in a fleet of idle guests.
    pub mem_mib: u32,
    pub json: Option<PathBuf>,
    /// How long one VM may take to come up, or to go.
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("cannot prepare the fleet: {0}")]
    Setup(String),
    #[error("microVM {0}: {1}")]
    Vm(u32, String),
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// The bound Firecracker publishes for its own memory overhead per microVM.
const TARGET_KIB: f64 = 5.0 * 1024.0;
const TARGET_ALL_RUNNING: Duration = Duration::from_secs(3);
/// What the `wait` payload prints once it runs.
const RUNNING_LINE: &str = "wait: running";

/// One microVM of the fleet, up and running.
struct Running {
    child: Child,
    /// Held open so that the guest's console never writes to a closed pipe.
    _console: BufReader<ChildStdout>,
    sock: PathBuf,
    /// From spawning its process to its guest's line on stdout.
    spawn_to_running: Duration,
    /// From the start of the fleet to that line.
    fleet_to_running: Duration,
}

/// Spawns, configures and boots microVM `i`; returns once its guest runs.
fn start_one(exe: &Path, dir: &Path, kernel: &Path, i: u32, opts: &Options, fleet: Instant) -> Result<Running, String> {
    let sock = dir.join(format!("vm{i}.sock"));
    let spawned = Instant::now();
    let mut child = Command::new(exe)
        .args(["--api-sock".as_ref(), sock.as_os_str(), "--id".as_ref(), format!("vm{i}").as_ref()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let result = (|| {
        while !crate::api_client::listening(&sock) {
            if spawned.elapsed() > opts.timeout {
                return Err(format!("its API socket did not appear within {:?}", opts.timeout));
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("it exited ({status}) before serving its API"));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        expect_ok(&sock, "PUT", "/machine-config", Some(&json!({"vcpu_count": 1, "mem_size_mib": opts.mem_mib})))?;
        expect_ok(&sock, "PUT", "/boot-source", Some(&json!({"kernel_image_path": kernel})))?;
        expect_ok(&sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"})))?;
        let mut console = BufReader::new(stdout);
        crate::api_client::wait_for_line_within(&mut console, RUNNING_LINE, child.id(), opts.timeout)?;
        Ok(console)
    })();
    match result {
        Ok(console) => Ok(Running {
            child,
            _console: console,
            sock,
            spawn_to_running: spawned.elapsed(),
            fleet_to_running: fleet.elapsed(),
        }),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(&sock);
            Err(e)
        }
    }
}

/// Stops one microVM as an orchestrator would (SIGTERM); true if it went cleanly: exited
/// by that signal's status, socket removed.
fn stop_one(vm: &mut Running, timeout: Duration) -> bool {
    // SAFETY: kill on a child we spawned and have not reaped, so its pid is still ours.
    unsafe { libc::kill(vm.child.id() as i32, libc::SIGTERM) };
    let start = Instant::now();
    let status = loop {
        match vm.child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if start.elapsed() < timeout => std::thread::sleep(Duration::from_millis(2)),
            _ => {
                let _ = vm.child.kill();
                let _ = vm.child.wait();
                break None;
            }
        }
    };
    use std::os::unix::process::ExitStatusExt;
    status.and_then(|s| s.signal()) == Some(libc::SIGTERM) && !vm.sock.exists()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n => sorted[((p * n as f64).ceil() as usize).clamp(1, n) - 1],
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn run(opts: &Options) -> Result<(), FleetError> {
    if let Some(path) = &opts.json {
        std::fs::File::create(path).map_err(|e| WriteError(path.clone(), e))?;
    }
    let exe = crate::exitless_binary().map_err(|e| FleetError::Setup(e.to_string()))?;
    // No dots in the path: some Firecracker clients cannot reach a socket under one.
    let dir = std::env::temp_dir().join(format!("exitless_fleet_{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| FleetError::Setup(format!("{}: {e}", dir.display())))?;
    let kernel = dir.join("wait.elf");
    let payload = exitless_payloads::find("wait").ok_or_else(|| FleetError::Setup("no wait payload".into()))?;
    std::fs::write(&kernel, payload.elf).map_err(|e| FleetError::Setup(format!("{}: {e}", kernel.display())))?;
    eprintln!("fleet: starting {} microVMs through their APIs", opts.vms);

    let fleet = Instant::now();
    let results: Vec<Result<Running, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..opts.vms)
            .map(|i| {
                s.spawn({
                    let (exe, dir, kernel) = (&exe, &dir, &kernel);
                    move || start_one(exe, dir, kernel, i, opts, fleet)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("its starter thread panicked".into()))).collect()
    });
    let all_running = fleet.elapsed();
    let mut vms = Vec::new();
    let mut failed = None;
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(vm) => vms.push(vm),
            Err(e) => failed = failed.or(Some(FleetError::Vm(i as u32, e))),
        }
    }
    eprintln!(
        "fleet: {} of {} running after {:.2} s; measuring memory",
        vms.len(),
        opts.vms,
        all_running.as_secs_f64()
    );

    // Memory while all of them run, beyond guest RAM, from each VMM's live report: resident
    // (Firecracker's measure: the binary's and libraries' pages counted whole in every VM)
    // and proportional (pages shared across the fleet divided among its processes).
    let mut rss = Vec::new();
    let mut pss = Vec::new();
    for vm in &vms {
        if let Ok(Some(exits)) = expect_ok(&vm.sock, "GET", "/exits", None) {
            rss.extend(exits["vmm_rss_kib"].as_f64());
            pss.extend(exits["vmm_pss_kib"].as_f64());
        }
    }

    eprintln!("fleet: stopping them with SIGTERM");
    let clean = vms.iter_mut().map(|vm| stop_one(vm, opts.timeout)).filter(|&ok| ok).count();
    let _ = std::fs::remove_file(&kernel);
    let left: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    let _ = std::fs::remove_dir(&dir);
    if let Some(e) = failed {
        return Err(e);
    }

    let sorted = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v
    };
    let per_vm = sorted(vms.iter().map(|v| millis(v.spawn_to_running)).collect());
    let from_fleet = sorted(vms.iter().map(|v| millis(v.fleet_to_running)).collect());
    let (rss, pss) = (sorted(rss), sorted(pss));
    let n = opts.vms;
    let mut table = format!("fleet lab: {n} microVMs, each an `exitless --api-sock` process booted through the API (wait payload, 1 vCPU, {} MiB)\n", opts.mem_mib);
    let rows = [
        ("all running, from the first spawn (s)", format!("{:.2}", all_running.as_secs_f64())),
        ("spawn to guest running, per VM, median (ms)", format!("{:.1}", percentile(&per_vm, 0.5))),
        ("spawn to guest running, per VM, p99 (ms)", format!("{:.1}", percentile(&per_vm, 0.99))),
        ("fleet start to guest running, median (ms)", format!("{:.1}", percentile(&from_fleet, 0.5))),
        ("VMM RSS beyond guest RAM, median (KiB)", format!("{:.0}", percentile(&rss, 0.5))),
        ("VMM RSS beyond guest RAM, max (KiB)", format!("{:.0}", percentile(&rss, 1.0))),
        ("VMM PSS beyond guest RAM, median (KiB)", format!("{:.0}", percentile(&pss, 0.5))),
        ("VMM PSS beyond guest RAM, max (KiB)", format!("{:.0}", percentile(&pss, 1.0))),
        ("stopped cleanly by SIGTERM (killed by it, socket gone)", format!("{clean}/{n}")),
        ("files left in the fleet's directory", format!("{}", left.len())),
    ];
    table += &format!("  {:<52} {:>10}\n", "metric", "value");
    for (what, v) in &rows {
        table += &format!("  {what:<52} {v:>10}\n");
    }
    let targets = [
        Target::new(
            format!("{n} VMs running in under {} s", TARGET_ALL_RUNNING.as_secs()),
            format!("{:.2} s", all_running.as_secs_f64()),
            all_running < TARGET_ALL_RUNNING,
        ),
        Target::new(
            "VMM memory per VM at most 5 MiB, resident (max)",
            format!("{:.0} KiB", percentile(&rss, 1.0)),
            rss.len() == vms.len() && percentile(&rss, 1.0) <= TARGET_KIB,
        ),
        Target::new(
            "VMM memory per VM at most 5 MiB, proportional (max)",
            format!("{:.0} KiB", percentile(&pss, 1.0)),
            pss.len() == vms.len() && percentile(&pss, 1.0) <= TARGET_KIB,
        ),
        Target::new(
            "all stop cleanly, nothing left behind",
            format!("{clean}/{n}"),
            clean as u32 == n && left.is_empty(),
        ),
    ];
    table += &targets_text(&targets);
    print_table(&table)?;
    if let Some(path) = &opts.json {
        let value: Value = json!({
            "bench": "fleet", "vms": n, "mem_mib": opts.mem_mib,
            "all_running_s": all_running.as_secs_f64(),
            "spawn_to_running_ms_median": percentile(&per_vm, 0.5),
            "spawn_to_running_ms_p99": percentile(&per_vm, 0.99),
            "fleet_to_running_ms": from_fleet,
            "vmm_rss_kib_median": percentile(&rss, 0.5), "vmm_rss_kib_max": percentile(&rss, 1.0),
            "vmm_pss_kib_median": percentile(&pss, 0.5), "vmm_pss_kib_max": percentile(&pss, 1.0),
            "stopped_cleanly": clean, "left_behind": left,
            "targets": targets_json(&targets),
        });
        std::fs::write(path, value.to_string() + "\n").map_err(|e| WriteError(path.clone(), e))?;
    }
    Ok(())
}
