//! Boot lab: process start to the guest's first serial byte, and the VMM's resident
//! memory beyond guest RAM, over repeated runs of `exitless run`.

use crate::stats::median;
use serde_json::json;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

pub struct Options {
    pub runs: u32,
    pub mem: u64,
    pub json: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum BootBenchError {
    #[error("cannot start `exitless run`: {0}")]
    Spawn(std::io::Error),
    #[error("`exitless run` failed: {0}")]
    Run(String),
    #[error(transparent)]
    Write(#[from] crate::report::WriteError),
}

/// One run: ms to the first stdout byte, and the run's own report of VMM memory.
fn one_run(exe: &std::path::Path, mem: u64, report: &std::path::Path) -> Result<(f64, Option<f64>), BootBenchError> {
    let start = Instant::now();
    let mut child = Command::new(exe)
        .args(["run", "--mem", &mem.to_string(), "--json"])
        .arg(report)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(BootBenchError::Spawn)?;
    // The child's last stderr line says why, when it fails.
    let mut stderr = child.stderr.take().ok_or_else(|| BootBenchError::Run("no stderr".into()))?;
    let why = std::thread::spawn(move || {
        exitless_vmm::seccomp::confine_or_log(exitless_vmm::seccomp::ThreadKind::Helper);
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text.lines().rev().find(|l| !l.trim().is_empty()).map(|l| l.trim().to_string())
    });
    let failed = |what: &str, why: std::thread::JoinHandle<Option<String>>| {
        let why = why.join().ok().flatten().unwrap_or_default();
        BootBenchError::Run(if why.is_empty() { what.to_string() } else { format!("{what}: {why}") })
    };
    let mut stdout = child.stdout.take().ok_or_else(|| BootBenchError::Run("no stdout".into()))?;
    let mut first = [0u8; 1];
    let got = stdout.read(&mut first).map_err(|e| BootBenchError::Run(e.to_string()))?;
    let first_byte_ms = start.elapsed().as_secs_f64() * 1e3;
    if got == 0 {
        let _ = child.wait();
        return Err(failed("the guest printed nothing", why));
    }
    std::io::copy(&mut stdout, &mut std::io::sink()).map_err(|e| BootBenchError::Run(e.to_string()))?;
    let status = child.wait().map_err(|e| BootBenchError::Run(e.to_string()))?;
    if !status.success() {
        return Err(failed(&format!("exit status {status}"), why));
    }
    let text = std::fs::read_to_string(report).map_err(|e| BootBenchError::Run(e.to_string()))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| BootBenchError::Run(e.to_string()))?;
    Ok((first_byte_ms, value["vmm_rss_kib"].as_f64()))
}

pub fn run(opts: &Options) -> Result<(), BootBenchError> {
    if let Some(path) = &opts.json {
        std::fs::File::create(path).map_err(|e| crate::report::WriteError(path.clone(), e))?;
    }
    let exe = crate::exitless_binary().map_err(BootBenchError::Spawn)?;
    let report = std::env::temp_dir().join(format!("exitless-boot-{}.json", std::process::id()));
    let (mut first, mut rss) = (Vec::new(), Vec::new());
    let runs: Result<(), BootBenchError> = (0..opts.runs).try_for_each(|_| {
        let (ms, kib) = one_run(&exe, opts.mem, &report)?;
        first.push(ms);
        rss.extend(kib);
        Ok(())
    });
    // Removed on a failed run as well: every run's report is written to this one file.
    let _ = std::fs::remove_file(&report);
    runs?;
    let (first_ms, rss_kib) = (median(&first), median(&rss));
    let mut table = format!("boot lab: {} runs, {} MiB guest, medians\n", opts.runs, opts.mem >> 20);
    table += &format!("  {:<40} {:>10}\n", "metric", "value");
    table += &format!("  {:<40} {:>10.1}\n", "process start to first serial byte (ms)", first_ms);
    table += &format!("  {:<40} {:>10.0}\n", "VMM resident memory beyond guest RAM (KiB)", rss_kib);
    crate::report::print_table(&table)?;
    if let Some(path) = &opts.json {
        let value = json!({"bench": "boot", "runs": opts.runs, "mem_mib": opts.mem >> 20,
            "first_byte_ms": first_ms, "vmm_rss_kib": rss_kib, "first_byte_ms_all": first});
        std::fs::write(path, value.to_string() + "\n").map_err(|e| crate::report::WriteError(path.clone(), e))?;
    }
    Ok(())
}
