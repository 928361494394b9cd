//! `exitless bench density`: a hundred sandboxes restored from one snapshot, the way
//! agent-sandbox fleets use Firecracker. Per VMM (exitless, and Firecracker if given, on
//! the same guest): the `wait` guest writes most of its RAM and is snapshotted once; then
//! N processes of that VMM each load the snapshot (the memory file mapped privately: its
//! pages shared by all until a guest writes one) with the guest resumed, and each is asked
//! once (Ctrl-Alt-Del, which the guest answers with a line). Measured: from the first
//! load request to the last answer, each load request, and, while all N run, each
//! process's resident and proportional memory (smaps_rollup), whose anonymous part is what
//! a guest costs beyond the snapshot file it shares.

use crate::report::{print_table, targets_json, targets_text, LabError, Outputs, Target};
use crate::snapshot::Vmm;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub struct Options {
    pub firecracker: Option<PathBuf>,
    /// Sandboxes per VMM.
    pub vms: u32,
    pub mem_mib: u64,
    /// Share of RAM the guest writes before the snapshot.
    pub written: f64,
    pub outputs: Outputs,
}

#[derive(Clone, Debug)]
pub struct Row {
    pub vmm: &'static str,
    pub vms: u32,
    pub all_answered_ms: f64,
    pub load_ms_median: f64,
    pub rss_kib_per_guest: f64,
    pub pss_kib_per_guest: f64,
    pub pss_anon_kib_per_guest: f64,
    pub snapshot_memory_kib: u64,
}

/// How long one guest may take to boot, load or answer.
const WAIT: Duration = Duration::from_secs(60);
const ANSWER: &str = "wait: ctrl-alt-del 1";

fn fail(vmm: &str, what: impl std::fmt::Display) -> LabError {
    LabError::Run(format!("{vmm}: {what}"))
}

/// The one snapshot every sandbox of `vmm` loads: the guest booted, its RAM written,
/// paused and saved. Returns the state and memory files.
fn make_snapshot(name: &str, exe: &Path, dir: &Path, opts: &Options) -> Result<(PathBuf, PathBuf), LabError> {
    let fill_mib = (opts.mem_mib as f64 * opts.written) as u64;
    let base = Vmm::start(exe, dir.join(format!("{name}-base.sock")))?;
    base.put("/machine-config", json!({"vcpu_count": 1, "mem_size_mib": opts.mem_mib}))?;
    let args = format!("console=ttyS0 kbd echo exitless.params={fill_mib}");
    base.put("/boot-source", json!({"kernel_image_path": dir.join("wait.elf"), "boot_args": args}))?;
    let started = Instant::now();
    base.put("/actions", json!({"action_type": "InstanceStart"}))?;
    while base.line_at(started, "wait: running").is_none() {
        if started.elapsed() > WAIT {
            return Err(fail(name, "the guest never said it runs"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    base.put("/vm", json!({"state": "Paused"}))?;
    let (state, memory) = (dir.join(format!("{name}-state")), dir.join(format!("{name}-memory")));
    base.put("/snapshot/create", json!({"snapshot_path": state, "mem_file_path": memory}))?;
    drop(base);
    // On disk before the loads, for both VMMs alike (the writeback would run during them).
    for file in [&state, &memory] {
        std::fs::File::open(file).and_then(|f| f.sync_all()).map_err(|e| fail(name, format!("sync: {e}")))?;
    }
    Ok((state, memory))
}

/// Rss, Pss and Pss_Anon of a process, in KiB.
pub(crate) fn memory_of(pid: u32) -> Option<(u64, u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
    };
    Some((field("Rss:")?, field("Pss:")?, field("Pss_Anon:").unwrap_or(0)))
}

fn run_vmm(name: &'static str, exe: &Path, dir: &Path, opts: &Options) -> Result<Row, LabError> {
    eprintln!("density: {name}: booting the guest and taking its snapshot ...");
    let (state, memory) = make_snapshot(name, exe, dir, opts)?;
    let snapshot_memory_kib = std::fs::metadata(&memory).map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.blocks() * 512 / 1024
    });
    eprintln!("density: {name}: starting {} processes ...", opts.vms);
    let sandboxes =
        (0..opts.vms).map(|i| Vmm::start(exe, dir.join(format!("{name}-{i}.sock")))).collect::<Result<Vec<_>, _>>()?;
    let load = json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": memory},
                      "resume_vm": true});
    let started = Instant::now();
    let mut loads = Vec::with_capacity(sandboxes.len());
    for (i, vm) in sandboxes.iter().enumerate() {
        loads.push(vm.put("/snapshot/load", load.clone())?.as_secs_f64() * 1e3);
        vm.put("/actions", json!({"action_type": "SendCtrlAltDel"}))?;
        if (i + 1) % 10 == 0 {
            eprintln!("density: {name}: {} of {} loaded and asked", i + 1, sandboxes.len());
        }
    }
    let mut last = started;
    for (i, vm) in sandboxes.iter().enumerate() {
        loop {
            if let Some(at) = vm.line_at(started, ANSWER) {
                last = last.max(at);
                break;
            }
            if started.elapsed() > WAIT * 2 {
                return Err(fail(name, format!("sandbox {i} never answered")));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let all_answered_ms = (last - started).as_secs_f64() * 1e3;
    let mut sums = (0u64, 0u64, 0u64);
    for (i, vm) in sandboxes.iter().enumerate() {
        let (rss, pss, anon) =
            memory_of(vm.child.id()).ok_or_else(|| fail(name, format!("sandbox {i}: no smaps_rollup")))?;
        sums = (sums.0 + rss, sums.1 + pss, sums.2 + anon);
    }
    drop(sandboxes);
    let n = f64::from(opts.vms);
    Ok(Row {
        vmm: name,
        vms: opts.vms,
        all_answered_ms,
        load_ms_median: crate::stats::median(&loads),
        rss_kib_per_guest: sums.0 as f64 / n,
        pss_kib_per_guest: sums.1 as f64 / n,
        pss_anon_kib_per_guest: sums.2 as f64 / n,
        snapshot_memory_kib: snapshot_memory_kib.unwrap_or(0),
    })
}

pub fn measure(opts: &Options) -> Result<Vec<Row>, LabError> {
    let exe = crate::exitless_binary().map_err(|e| LabError::Setup(e.to_string()))?;
    let dir = std::env::temp_dir().join(format!("exitless-bench-density-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| LabError::Setup(e.to_string()))?;
    let elf = exitless_payloads::find("wait").map(|p| p.elf).unwrap_or_default();
    std::fs::write(dir.join("wait.elf"), elf).map_err(|e| LabError::Setup(e.to_string()))?;
    let mut vmms: Vec<(&'static str, &Path)> = vec![("exitless", exe.as_path())];
    if let Some(fc) = &opts.firecracker {
        vmms.push(("firecracker", fc.as_path()));
    }
    let rows = vmms.iter().map(|&(name, exe)| run_vmm(name, exe, &dir, opts)).collect();
    let _ = std::fs::remove_dir_all(&dir);
    rows
}

pub fn targets(rows: &[Row]) -> Vec<Target> {
    let (Some(ours), Some(fc)) =
        (rows.iter().find(|r| r.vmm == "exitless"), rows.iter().find(|r| r.vmm == "firecracker"))
    else {
        return Vec::new();
    };
    vec![
        Target::new(
            format!("{} sandboxes: all answered sooner than Firecracker's", ours.vms),
            format!("{:.0} vs {:.0} ms", ours.all_answered_ms, fc.all_answered_ms),
            ours.all_answered_ms < fc.all_answered_ms,
        ),
        Target::new(
            "proportional memory per guest at or below Firecracker's",
            format!("{:.0} vs {:.0} KiB", ours.pss_kib_per_guest, fc.pss_kib_per_guest),
            ours.pss_kib_per_guest <= fc.pss_kib_per_guest,
        ),
    ]
}

pub fn text(rows: &[Row], opts: &Options) -> String {
    let mut s = format!(
        "density lab: N sandboxes restored from one snapshot of the wait guest ({} MiB, {:.0}% written), each asked once\n",
        opts.mem_mib,
        opts.written * 100.0
    );
    s += &format!(
        "  {:<12} {:>5} {:>16} {:>14} {:>12} {:>12} {:>14} {:>15}\n",
        "VMM", "N", "all answered ms", "load ms (med)", "RSS KiB/VM", "PSS KiB/VM", "anon PSS KiB", "snapshot KiB"
    );
    for r in rows {
        s += &format!(
            "  {:<12} {:>5} {:>16.0} {:>14.1} {:>12.0} {:>12.0} {:>14.0} {:>15}\n",
            r.vmm,
            r.vms,
            r.all_answered_ms,
            r.load_ms_median,
            r.rss_kib_per_guest,
            r.pss_kib_per_guest,
            r.pss_anon_kib_per_guest,
            r.snapshot_memory_kib
        );
    }
    s + &targets_text(&targets(rows))
}

pub fn json(rows: &[Row], opts: &Options) -> Value {
    let rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({"vmm": r.vmm, "vms": r.vms, "all_answered_ms": r.all_answered_ms, "load_ms_median": r.load_ms_median,
                   "rss_kib_per_guest": r.rss_kib_per_guest, "pss_kib_per_guest": r.pss_kib_per_guest,
                   "pss_anon_kib_per_guest": r.pss_anon_kib_per_guest, "snapshot_memory_kib": r.snapshot_memory_kib})
        })
        .collect();
    json!({"lab": "density", "mem_mib": opts.mem_mib, "written_fraction": opts.written, "rows": rows})
}

pub fn run(opts: &Options) -> Result<Vec<Row>, LabError> {
    opts.outputs.check()?;
    let rows = measure(opts)?;
    print_table(&text(&rows, opts))?;
    let doc = || {
        let mut doc = json(&rows, opts);
        doc["targets"] = Value::Array(targets_json(&targets(&rows)));
        doc
    };
    let svg = || {
        let triples = rows.iter().map(|r| ("PSS per guest".to_string(), r.vmm.to_string(), r.pss_kib_per_guest));
        crate::chart::draw(&[crate::chart::Panel::grouped(
            "Proportional memory per restored guest",
            "KiB",
            false,
            triples,
        )])
    };
    opts.outputs.write(doc, svg)?;
    Ok(rows)
}
