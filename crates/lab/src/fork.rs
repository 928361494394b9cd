//! `exitless bench fork`: a running sandbox snapshotted and cloned, the way sandbox
//! platforms fork one. Per guest size and VMM (exitless with `--ram-dir` on the tmpfs that
//! holds the snapshot, and Firecracker if given, on the same `wait` guest): the guest
//! writes most of its RAM; its pause is timed from `PATCH /vm Paused` to `Resumed` with
//! `PUT /snapshot/create` between, and the bytes the VMM wrote meanwhile counted (its
//! write(2)s, /proc/PID/io); then N clones are loaded from the snapshot in VMMs of their
//! own and each asked once (Ctrl-Alt-Del, answered with a line), while the parent runs on
//! (asked last: it must still answer). Measured: from the first load to the last answer,
//! and each clone's resident, proportional and anonymous memory (smaps_rollup).

use crate::density::memory_of;
use crate::report::{print_table, targets_json, targets_text, LabError, Outputs, Target};
use crate::snapshot::Vmm;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub struct Options {
    pub firecracker: Option<PathBuf>,
    pub sizes_mib: Vec<u64>,
    /// Clones per size and VMM.
    pub clones: u32,
    /// Share of RAM the guest writes before the snapshot.
    pub written: f64,
    /// Where the snapshots (and exitless's RAM files) go: a tmpfs.
    pub dir: PathBuf,
    pub outputs: Outputs,
}

#[derive(Clone, Debug)]
pub struct Row {
    pub vmm: &'static str,
    pub mem_mib: u64,
    /// Paused to Resumed, the create between.
    pub pause_ms: f64,
    pub create_ms: f64,
    /// What the VMM wrote during the create (state and memory files).
    pub written_bytes: u64,
    pub clones: u32,
    /// From the first load request to the last clone's answer.
    pub all_answered_ms: f64,
    pub load_ms_median: f64,
    pub rss_kib_per_clone: f64,
    pub pss_kib_per_clone: f64,
    pub anon_kib_per_clone: f64,
}

const ANSWER: &str = "wait: ctrl-alt-del 1";

fn fail(vmm: &str, what: impl std::fmt::Display) -> LabError {
    LabError::Run(format!("{vmm}: {what}"))
}

/// The bytes process `pid` has written with write(2) and its kin.
fn wchar(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines().find_map(|l| l.strip_prefix("wchar: ")?.trim().parse().ok())
}

/// Waits for a line starting with `prefix` from `vmm` at or after `since`.
fn wait_line(vmm: &Vmm, name: &str, since: Instant, prefix: &str, wait: Duration) -> Result<Instant, LabError> {
    loop {
        if let Some(at) = vmm.line_at(since, prefix) {
            return Ok(at);
        }
        if since.elapsed() > wait {
            return Err(fail(name, format!("no {prefix:?} within {wait:?}")));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn run_one(name: &'static str, exe: &Path, dir: &Path, mem_mib: u64, opts: &Options) -> Result<Row, LabError> {
    let here = dir.join(format!("{name}-{mem_mib}"));
    std::fs::create_dir_all(&here).map_err(|e| LabError::Setup(e.to_string()))?;
    let ram_dir = here.to_str().unwrap_or_default().to_string();
    let flags: Vec<&str> = if name == "exitless" { vec!["--ram-dir", &ram_dir] } else { vec![] };
    let parent = Vmm::start_with(exe, dir.join(format!("{name}-{mem_mib}-parent.sock")), &flags)?;
    parent.put("/machine-config", json!({"vcpu_count": 1, "mem_size_mib": mem_mib}))?;
    let fill_mib = (mem_mib as f64 * opts.written) as u64;
    let args = format!("console=ttyS0 kbd echo exitless.params={fill_mib}");
    parent.put("/boot-source", json!({"kernel_image_path": dir.join("wait.elf"), "boot_args": args}))?;
    eprintln!("fork: {name}: {mem_mib} MiB: booting the guest, which writes {fill_mib} MiB ...");
    let booted = Instant::now();
    parent.put("/actions", json!({"action_type": "InstanceStart"}))?;
    // Writing guest RAM at CPL0 is emulated on a nested host: allow for it.
    let boot_wait = Duration::from_secs(60 + mem_mib / 8);
    wait_line(&parent, name, booted, "wait: running", boot_wait)?;
    eprintln!("fork: {name}: {mem_mib} MiB booted and written; starting {} clone processes", opts.clones);
    let clones = (0..opts.clones)
        .map(|i| Vmm::start(exe, dir.join(format!("{name}-{mem_mib}-{i}.sock"))))
        .collect::<Result<Vec<_>, _>>()?;
    let (state, memory) = (here.join("state"), here.join("memory"));
    let pid = parent.child.id();
    let before = wchar(pid).ok_or_else(|| fail(name, "no /proc/PID/io"))?;
    let paused = Instant::now();
    parent.put("/vm", json!({"state": "Paused"}))?;
    let create = parent.put("/snapshot/create", json!({"snapshot_path": state, "mem_file_path": memory}))?;
    parent.put("/vm", json!({"state": "Resumed"}))?;
    let pause = paused.elapsed();
    let written_bytes = wchar(pid).unwrap_or(before) - before;
    let load = json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": memory},
                      "resume_vm": true});
    eprintln!(
        "fork: {name}: {mem_mib} MiB: paused {:.1} ms for the snapshot; loading the clones ...",
        pause.as_secs_f64() * 1e3
    );
    let started = Instant::now();
    let mut loads = Vec::with_capacity(clones.len());
    for (i, vm) in clones.iter().enumerate() {
        loads.push(vm.put("/snapshot/load", load.clone())?.as_secs_f64() * 1e3);
        vm.put("/actions", json!({"action_type": "SendCtrlAltDel"}))?;
        if (i + 1) % 10 == 0 && i + 1 < clones.len() {
            eprintln!("fork: {name}: {mem_mib} MiB: {} of {} clones loaded and asked", i + 1, clones.len());
        }
    }
    let mut last = started;
    for (i, vm) in clones.iter().enumerate() {
        let at = wait_line(vm, name, started, ANSWER, Duration::from_secs(120))
            .map_err(|e| fail(name, format!("clone {i}: {e}")))?;
        last = last.max(at);
    }
    let all_answered = last - started;
    eprintln!(
        "fork: {name}: {mem_mib} MiB: all {} clones answered in {:.0} ms",
        clones.len(),
        all_answered.as_secs_f64() * 1e3
    );
    let mut sums = (0u64, 0u64, 0u64);
    for (i, vm) in clones.iter().enumerate() {
        let (rss, pss, anon) = memory_of(vm.child.id()).ok_or_else(|| fail(name, format!("clone {i}: no smaps")))?;
        sums = (sums.0 + rss, sums.1 + pss, sums.2 + anon);
    }
    // The parent went on: it answers too.
    let asked = Instant::now();
    parent.put("/actions", json!({"action_type": "SendCtrlAltDel"}))?;
    wait_line(&parent, name, asked, ANSWER, Duration::from_secs(60)).map_err(|e| fail(name, format!("parent: {e}")))?;
    drop(clones);
    drop(parent);
    let _ = std::fs::remove_dir_all(&here);
    let n = f64::from(opts.clones.max(1));
    Ok(Row {
        vmm: name,
        mem_mib,
        pause_ms: pause.as_secs_f64() * 1e3,
        create_ms: create.as_secs_f64() * 1e3,
        written_bytes,
        clones: opts.clones,
        all_answered_ms: all_answered.as_secs_f64() * 1e3,
        load_ms_median: crate::stats::median(&loads),
        rss_kib_per_clone: sums.0 as f64 / n,
        pss_kib_per_clone: sums.1 as f64 / n,
        anon_kib_per_clone: sums.2 as f64 / n,
    })
}

pub fn measure(opts: &Options) -> Result<Vec<Row>, LabError> {
    let exe = crate::exitless_binary().map_err(|e| LabError::Setup(e.to_string()))?;
    let dir = opts.dir.join(format!("exitless-bench-fork-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| LabError::Setup(format!("{}: {e}", dir.display())))?;
    let elf = exitless_payloads::find("wait").map(|p| p.elf).unwrap_or_default();
    std::fs::write(dir.join("wait.elf"), elf).map_err(|e| LabError::Setup(e.to_string()))?;
    let mut vmms: Vec<(&'static str, &Path)> = vec![("exitless", exe.as_path())];
    if let Some(fc) = &opts.firecracker {
        vmms.push(("firecracker", fc.as_path()));
    }
    let mut rows = Vec::new();
    let began = Instant::now();
    for &size in &opts.sizes_mib {
        for &(name, exe) in &vmms {
            match run_one(name, exe, &dir, size, opts) {
                Ok(row) => {
                    eprintln!("fork: {name}: {size} MiB done; {:.0} s since the start", began.elapsed().as_secs_f64());
                    rows.push(row)
                }
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(e);
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(rows)
}

fn row<'a>(rows: &'a [Row], vmm: &str, size: u64) -> Option<&'a Row> {
    rows.iter().find(|r| r.vmm == vmm && r.mem_mib == size)
}

/// The largest size's pause over the smallest's, for `vmm`: 1 where the pause does not
/// grow with memory.
fn pause_ratio(rows: &[Row], opts: &Options, vmm: &str) -> Option<f64> {
    let (small, large) = (opts.sizes_mib.iter().min()?, opts.sizes_mib.iter().max()?);
    Some(row(rows, vmm, *large)?.pause_ms / row(rows, vmm, *small)?.pause_ms)
}

pub fn targets(rows: &[Row], opts: &Options) -> Vec<Target> {
    let mut targets = Vec::new();
    let (Some(&small), Some(&large)) = (opts.sizes_mib.iter().min(), opts.sizes_mib.iter().max()) else {
        return targets;
    };
    let ratio = |vmm| pause_ratio(rows, opts, vmm);
    if let (Some(s), Some(l), Some(r)) = (row(rows, "exitless", small), row(rows, "exitless", large), ratio("exitless"))
    {
        let fc = ratio("firecracker").map(|f| format!("; Firecracker's {f:.1}x")).unwrap_or_default();
        targets.push(Target::new(
            format!("pause at {large} MiB within 2x of the pause at {small} MiB"),
            format!("{:.1} vs {:.1} ms: {r:.2}x{fc}", l.pause_ms, s.pause_ms),
            r <= 2.0,
        ));
    }
    for &size in &opts.sizes_mib {
        let (Some(ours), Some(fc)) = (row(rows, "exitless", size), row(rows, "firecracker", size)) else { continue };
        let (a, b) = (ours.create_ms + ours.all_answered_ms, fc.create_ms + fc.all_answered_ms);
        targets.push(Target::new(
            format!("{size} MiB: {} clones all answered sooner than Firecracker's (create included)", ours.clones),
            format!("{a:.0} vs {b:.0} ms"),
            a < b,
        ));
        targets.push(Target::new(
            format!("{size} MiB: PSS per clone at or below Firecracker's"),
            format!("{:.0} vs {:.0} KiB", ours.pss_kib_per_clone, fc.pss_kib_per_clone),
            ours.pss_kib_per_clone <= fc.pss_kib_per_clone,
        ));
    }
    targets
}

pub fn text(rows: &[Row], opts: &Options) -> String {
    let mut s = format!(
        "fork lab: the wait guest ({:.0}% of RAM written) paused, snapshotted and resumed, then {} clones loaded and asked once\n",
        opts.written * 100.0,
        opts.clones
    );
    s += &format!(
        "  {:<12} {:>8} {:>10} {:>10} {:>14} {:>16} {:>10} {:>11} {:>11} {:>11}\n",
        "VMM",
        "MiB",
        "pause ms",
        "create ms",
        "bytes written",
        "all answered ms",
        "load ms",
        "RSS KiB",
        "PSS KiB",
        "anon KiB"
    );
    for r in rows {
        s += &format!(
            "  {:<12} {:>8} {:>10.1} {:>10.1} {:>14} {:>16.0} {:>10.1} {:>11.0} {:>11.0} {:>11.0}\n",
            r.vmm,
            r.mem_mib,
            r.pause_ms,
            r.create_ms,
            r.written_bytes,
            r.all_answered_ms,
            r.load_ms_median,
            r.rss_kib_per_clone,
            r.pss_kib_per_clone,
            r.anon_kib_per_clone
        );
    }
    if let (Some(small), Some(large)) = (opts.sizes_mib.iter().min(), opts.sizes_mib.iter().max()) {
        let ratio = |vmm| pause_ratio(rows, opts, vmm).map(|r| format!("{r:.2}x")).unwrap_or_else(|| "-".into());
        s += &format!(
            "  pause at {large} MiB over the pause at {small} MiB: exitless {}, Firecracker {}\n",
            ratio("exitless"),
            ratio("firecracker")
        );
    }
    s + &targets_text(&targets(rows, opts))
}

pub fn json(rows: &[Row], opts: &Options) -> Value {
    let ratio = |vmm| pause_ratio(rows, opts, vmm);
    let pause_ratio = json!({"exitless": ratio("exitless"), "firecracker": ratio("firecracker")});
    let rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({"vmm": r.vmm, "mem_mib": r.mem_mib, "pause_ms": r.pause_ms, "create_ms": r.create_ms,
                   "written_bytes": r.written_bytes, "clones": r.clones, "all_answered_ms": r.all_answered_ms,
                   "load_ms_median": r.load_ms_median, "rss_kib_per_clone": r.rss_kib_per_clone,
                   "pss_kib_per_clone": r.pss_kib_per_clone, "anon_kib_per_clone": r.anon_kib_per_clone})
        })
        .collect();
    json!({"lab": "fork", "written_fraction": opts.written, "clones": opts.clones, "rows": rows,
           "pause_ratio": pause_ratio})
}

pub fn run(opts: &Options) -> Result<Vec<Row>, LabError> {
    opts.outputs.check()?;
    let rows = measure(opts)?;
    print_table(&text(&rows, opts))?;
    let doc = || {
        let mut doc = json(&rows, opts);
        doc["targets"] = Value::Array(targets_json(&targets(&rows, opts)));
        doc
    };
    let svg = || {
        let triples = rows.iter().map(|r| (format!("{} MiB", r.mem_mib), r.vmm.to_string(), r.pause_ms));
        crate::chart::draw(&[crate::chart::Panel::grouped("Pause for a snapshot", "ms", false, triples)])
    };
    opts.outputs.write(doc, svg)?;
    Ok(rows)
}
