//! `exitless bench snapshot`: the `counter` guest, after writing a share of its RAM, is
//! paused and snapshotted through the API, its VMM killed, and the snapshot loaded (and
//! resumed) by a new VMM; by guest memory size and written share. Measured: the create
//! request, what the files hold, the load request, and from the load request to the
//! guest's next line (the guest running again); the files are synced to disk before the
//! load. Every restored guest must go on counting from the tick it had reached. A Diff row snapshots the same guest Full first (the
//! base), lets it count three more ticks, and takes a Diff: what the Diff holds and costs
//! to create is measured, and the load is of the base with the Diff laid over it. A
//! Uffd2M row runs the guest on 2 MiB hugetlbfs pages (`huge_pages: "2M"`) and loads it
//! through a page-fault handler (`exitless uffd-handler`, Firecracker's handshake, for
//! either VMM): the load request resumed (the guest running) and its first line after it
//! (its first answer).

mod huge;
mod lines;

use crate::api_client::{expect_ok_within, listening};
use crate::report::{print_table, targets_json, targets_text, Outputs, Target};
use serde_json::{json, Value};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Options {
    /// Firecracker's binary, measured beside exitless on the same guest (`bench peers`
    /// builds one), if given.
    pub firecracker: Option<PathBuf>,
    pub sizes_mib: Vec<u64>,
    /// The sizes of the Uffd2M rows (a guest on huge pages: the host reserves all of it).
    pub huge_sizes_mib: Vec<u64>,
    /// Shares of RAM the guest writes before the snapshot (0 to 1).
    pub dirty: Vec<f64>,
    /// Full rows, Diff rows, or both.
    pub kinds: Vec<Kind>,
    /// Runs per VMM, size and share, interleaved between the VMMs; medians are reported.
    pub runs: u32,
    pub outputs: Outputs,
}

/// What stops the snapshot lab (crate::report::LabError).
pub type SnapshotBenchError = crate::report::LabError;

/// A snapshot type, as `PUT /snapshot/create` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Full,
    Diff,
    /// Full, of a guest on 2 MiB huge pages, loaded through UFFD.
    Uffd2M,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Full => "Full",
            Kind::Diff => "Diff",
            Kind::Uffd2M => "Uffd2M",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Row {
    pub vmm: &'static str,
    pub kind: Kind,
    pub mem_mib: u64,
    pub dirty: f64,
    pub create_ms: f64,
    pub state_kib: u64,
    pub memory_written_kib: u64,
    pub load_ms: f64,
    pub running_again_ms: f64,
}

/// A VMM process started with `--api-sock`, every guest line of its stdout kept with when
/// it came, log messages cut out (lines.rs; also `bench density`'s and `bench fork`'s).
pub(crate) struct Vmm {
    pub(crate) child: Child,
    sock: PathBuf,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Vmm {
    pub(crate) fn start(exe: &Path, sock: PathBuf) -> Result<Vmm, SnapshotBenchError> {
        Vmm::start_with(exe, sock, &[])
    }

    /// [`Vmm::start`] with more flags (`bench fork`'s `--ram-dir`).
    pub(crate) fn start_with(exe: &Path, sock: PathBuf, flags: &[&str]) -> Result<Vmm, SnapshotBenchError> {
        let _ = std::fs::remove_file(&sock);
        let mut child = Command::new(exe)
            .args(["--api-sock", sock.to_str().unwrap_or_default()])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| SnapshotBenchError::Run(format!("cannot start {}: {e}", exe.display())))?;
        let out = child.stdout.take().ok_or_else(|| SnapshotBenchError::Run("no stdout".into()))?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            let mut guest = lines::GuestLines::default();
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let Some(line) = guest.push(&line) else { continue };
                if let Ok(mut l) = sink.lock() {
                    l.push((Instant::now(), line));
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while !listening(&sock) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(Vmm { child, sock, lines, reader: Some(reader) })
    }

    pub(crate) fn put(&self, path: &str, body: Value) -> Result<Duration, SnapshotBenchError> {
        let started = Instant::now();
        // A minute: the create of a large guest on huge pages reads every page, and an
        // untouched hugetlbfs page is allocated and zeroed when read (no shared zero page).
        let method = if path == "/vm" { "PATCH" } else { "PUT" };
        expect_ok_within(&self.sock, method, path, Some(&body), Duration::from_secs(60))
            .map_err(|e| SnapshotBenchError::Run(format!("{path}: {e}")))?;
        Ok(started.elapsed())
    }

    /// When the first line starting with `prefix` came at or after `since`, if it has.
    pub(crate) fn line_at(&self, since: Instant, prefix: &str) -> Option<Instant> {
        let lines = self.lines.lock().ok()?;
        lines.iter().find_map(|(at, line)| (line.starts_with(prefix) && *at >= since).then_some(*at))
    }

    /// Every line so far that starts with `prefix`, in order (`bench fs` reads its
    /// guest's results so).
    pub(crate) fn lines_starting(&self, prefix: &str) -> Vec<String> {
        let Ok(lines) = self.lines.lock() else { return Vec::new() };
        lines.iter().filter(|(_, l)| l.starts_with(prefix)).map(|(_, l)| l.trim_end().to_string()).collect()
    }

    /// The first tick line after `since`, and when it came.
    fn tick_after(&self, since: Instant, wait: Duration) -> Option<(Instant, u64)> {
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            let found = self.lines.lock().ok().and_then(|l| {
                l.iter().find_map(|(at, line)| {
                    let tick = line.strip_prefix("counter: tick ")?.parse().ok()?;
                    (*at >= since).then_some((*at, tick))
                })
            });
            if found.is_some() {
                return found;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        None
    }
}

impl Vmm {
    /// Kills the VMM and reads what it printed to the end: its last tick.
    fn last_tick(mut self) -> Option<u64> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let lines = self.lines.lock().ok()?;
        lines.iter().rev().find_map(|(_, line)| line.strip_prefix("counter: tick ")?.parse::<u64>().ok())
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_one(
    vmm: (&'static str, &Path),
    exitless: &Path,
    dir: &Path,
    mem_mib: u64,
    dirty: f64,
    kind: Kind,
) -> Result<Row, SnapshotBenchError> {
    let (name, exe) = vmm;
    let fail = |what: &str| SnapshotBenchError::Run(format!("{name}, {mem_mib} MiB, {dirty}, {kind:?}: {what}"));
    let kernel = dir.join("counter.elf");
    let dirty_mib = ((mem_mib as f64 * dirty) as u64).min(mem_mib.saturating_sub(18));
    let huge = kind == Kind::Uffd2M;
    // The guest's pages and a few more, while the row runs.
    let _pool = if huge { Some(huge::Pool::reserve(mem_mib / 2 + 4)?) } else { None };
    let first = Vmm::start(exe, dir.join("a.sock"))?;
    let track = kind == Kind::Diff;
    let mut machine = json!({"vcpu_count": 1, "mem_size_mib": mem_mib, "track_dirty_pages": track});
    if huge {
        machine["huge_pages"] = json!("2M");
    }
    first.put("/machine-config", machine)?;
    first.put(
        "/boot-source",
        json!({"kernel_image_path": kernel, "boot_args": format!("exitless.params=1000000000,{dirty_mib}")}),
    )?;
    let booted = Instant::now();
    first.put("/actions", json!({"action_type": "InstanceStart"}))?;
    first.tick_after(booted, Duration::from_secs(60)).ok_or_else(|| fail("the guest never ticked"))?;
    first.put("/vm", json!({"state": "Paused"}))?;
    let (state, memory) = (dir.join("state.json"), dir.join("memory.bin"));
    let mut create = first.put("/snapshot/create", json!({"snapshot_path": state, "mem_file_path": memory}))?;
    let (mut state_kib, mut memory_written_kib) = (kib(&state, false), kib(&memory, true));
    if kind == Kind::Diff {
        // Three more ticks, then only what the guest wrote since the base.
        first.put("/vm", json!({"state": "Resumed"}))?;
        for _ in 0..3 {
            first.tick_after(Instant::now(), Duration::from_secs(30)).ok_or_else(|| fail("no tick after the base"))?;
        }
        first.put("/vm", json!({"state": "Paused"}))?;
        let diff = dir.join("diff.bin");
        let body = json!({"snapshot_type": "Diff", "snapshot_path": state, "mem_file_path": diff});
        create = first.put("/snapshot/create", body)?;
        (state_kib, memory_written_kib) = (kib(&state, false), kib(&diff, true));
        // What a restore of a Diff loads: the base with the Diff laid over it.
        let open = |p: &Path, w: bool| std::fs::OpenOptions::new().read(true).write(w).open(p);
        let (base, laid) = (open(&memory, true), open(&diff, false));
        let (Ok(base), Ok(laid)) = (base, laid) else { return Err(fail("cannot open the memory files")) };
        exitless_vmm::snapshot::memory::rebase(&base, &laid).map_err(|e| fail(&format!("rebase: {e}")))?;
    }
    let last_tick = first.last_tick();
    // The files on disk before the load, for both VMMs alike: otherwise the kernel's
    // writeback of what the create just wrote (up to the whole RAM) runs during the load on
    // this 2-core host, and the row measures that rather than the load.
    for file in [&state, &memory] {
        std::fs::File::open(file).and_then(|f| f.sync_all()).map_err(|e| fail(&format!("sync: {e}")))?;
    }
    let handler = if huge { Some(huge::Handler::start(exitless, dir.join("uffd.sock"), &memory)?) } else { None };
    let backend = match &handler {
        Some(h) => json!({"backend_type": "Uffd", "backend_path": h.socket}),
        None => json!({"backend_type": "File", "backend_path": memory}),
    };
    let second = Vmm::start(exe, dir.join("b.sock"))?;
    let loaded_at = Instant::now();
    let load =
        second.put("/snapshot/load", json!({"snapshot_path": state, "mem_backend": backend, "resume_vm": true}))?;
    let (ran_at, tick) =
        second.tick_after(loaded_at, Duration::from_secs(30)).ok_or_else(|| fail("the restored guest never ticked"))?;
    // exitless's console keeps every line it took before the kill: the next tick must follow
    // the last. Firecracker may lose the last lines it buffered when killed: there the
    // restored guest must only go on, not start again.
    let follows = |last: u64| match name {
        "exitless" => tick == last + 1 || tick == last + 2,
        _ => tick > last,
    };
    if last_tick.is_some_and(|last| !follows(last)) {
        return Err(fail(&format!("the restored guest ticked {tick} after {last_tick:?}")));
    }
    Ok(Row {
        vmm: name,
        kind,
        mem_mib,
        dirty,
        create_ms: create.as_secs_f64() * 1e3,
        state_kib,
        memory_written_kib,
        load_ms: load.as_secs_f64() * 1e3,
        running_again_ms: (ran_at - loaded_at).as_secs_f64() * 1e3,
    })
}

/// A file's size in KiB, or (`allocated`) its blocks on disk: a memory file's holes take none.
fn kib(path: &Path, allocated: bool) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path);
    meta.map(|m| if allocated { m.blocks() * 512 / 1024 } else { m.len() / 1024 }).unwrap_or(0)
}

fn median_row(runs: &[Row]) -> Row {
    let med = |f: fn(&Row) -> f64| crate::stats::median(&runs.iter().map(f).collect::<Vec<_>>());
    Row {
        create_ms: med(|r| r.create_ms),
        load_ms: med(|r| r.load_ms),
        running_again_ms: med(|r| r.running_again_ms),
        ..runs[0].clone()
    }
}

pub fn measure(opts: &Options) -> Result<Vec<Row>, SnapshotBenchError> {
    let exe = crate::exitless_binary().map_err(|e| SnapshotBenchError::Run(e.to_string()))?;
    let dir = std::env::temp_dir().join(format!("exitless-bench-snapshot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| SnapshotBenchError::Run(e.to_string()))?;
    let elf = exitless_payloads::find("counter").map(|p| p.elf).unwrap_or_default();
    std::fs::write(dir.join("counter.elf"), elf).map_err(|e| SnapshotBenchError::Run(e.to_string()))?;
    let mut vmms: Vec<(&'static str, &Path)> = vec![("exitless", exe.as_path())];
    if let Some(fc) = &opts.firecracker {
        vmms.push(("firecracker", fc.as_path()));
    }
    let mut rows = Vec::new();
    for &kind in &opts.kinds {
        let sizes = if kind == Kind::Uffd2M { &opts.huge_sizes_mib } else { &opts.sizes_mib };
        for &mem in sizes {
            for &dirty in &opts.dirty {
                let mut runs: Vec<Vec<Row>> = vec![Vec::new(); vmms.len()];
                for run in 0..opts.runs as usize {
                    // Each run starts at the next VMM, so neither always goes first.
                    for k in 0..vmms.len() {
                        let v = (run + k) % vmms.len();
                        eprintln!(
                            "snapshot: {} {kind:?} {mem} MiB, {:.0}% written, run {}/{} ...",
                            vmms[v].0,
                            dirty * 100.0,
                            run + 1,
                            opts.runs
                        );
                        runs[v].push(run_one(vmms[v], &exe, &dir, mem, dirty, kind)?);
                    }
                }
                rows.extend(runs.iter().map(|r| median_row(r)));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(rows)
}

pub fn targets(rows: &[Row]) -> Vec<Target> {
    let mut out: Vec<Target> = rows
        .iter()
        .filter(|r| r.mem_mib == 512 && r.vmm == "exitless" && r.kind == Kind::Full)
        .map(|r| {
            let what = format!("512 MiB ({:.0}% written): load to running <= 10 ms", r.dirty * 100.0);
            Target::new(what, format!("{:.1} ms", r.running_again_ms), r.running_again_ms <= 10.0)
        })
        .collect();
    // Beside Firecracker on the same guest, size and share.
    for fc in rows.iter().filter(|r| r.vmm == "firecracker" && r.kind != Kind::Diff) {
        let ours = rows
            .iter()
            .find(|r| r.vmm == "exitless" && r.kind == fc.kind && r.mem_mib == fc.mem_mib && r.dirty == fc.dirty);
        if let Some(ours) = ours {
            let what = format!(
                "{} {} MiB ({:.0}% written): load to running <= Firecracker's",
                fc.kind.name(),
                fc.mem_mib,
                fc.dirty * 100.0
            );
            let measured = format!("{:.1} vs {:.1} ms", ours.running_again_ms, fc.running_again_ms);
            out.push(Target::new(what, measured, ours.running_again_ms <= fc.running_again_ms));
        }
    }
    out
}

pub fn text(rows: &[Row]) -> String {
    let mut s = String::from(
        "snapshot lab: the counter guest, snapshots through the API, restored in a new VMM (Diff: 3 ticks after a Full base, loaded laid over it; Uffd2M: on 2 MiB huge pages, loaded through exitless uffd-handler)\n",
    );
    s += &format!(
        "  {:<12} {:<6} {:>8} {:>8} {:>11} {:>10} {:>14} {:>9} {:>16}\n",
        "VMM", "type", "RAM MiB", "written", "create ms", "state KiB", "memory KiB", "load ms", "to running ms"
    );
    for r in rows {
        s += &format!(
            "  {:<12} {:<6} {:>8} {:>7.0}% {:>11.1} {:>10} {:>14} {:>9.1} {:>16.1}\n",
            r.vmm,
            r.kind.name(),
            r.mem_mib,
            r.dirty * 100.0,
            r.create_ms,
            r.state_kib,
            r.memory_written_kib,
            r.load_ms,
            r.running_again_ms
        );
    }
    s + &targets_text(&targets(rows))
}

pub fn json(rows: &[Row]) -> Value {
    let rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({"vmm": r.vmm, "mem_mib": r.mem_mib, "dirty_fraction": r.dirty, "snapshot_type": r.kind.name(), "create_ms": r.create_ms,
                   "state_kib": r.state_kib, "memory_written_kib": r.memory_written_kib, "load_ms": r.load_ms,
                   "load_to_running_ms": r.running_again_ms})
        })
        .collect();
    json!({"lab": "snapshot", "rows": rows})
}

pub fn run(opts: &Options) -> Result<Vec<Row>, SnapshotBenchError> {
    opts.outputs.check()?;
    let rows = measure(opts)?;
    print_table(&text(&rows))?;
    let doc = || {
        let mut doc = json(&rows);
        doc["targets"] = Value::Array(targets_json(&targets(&rows)));
        doc
    };
    let svg = || {
        let triples = rows.iter().flat_map(|r| {
            let group = format!("{} MiB, {:.0}% written", r.mem_mib, r.dirty * 100.0);
            let series = r.vmm.to_string();
            [(group, series, r.running_again_ms)]
        });
        crate::chart::draw(&[crate::chart::Panel::grouped("Load to running again", "ms", false, triples)])
    };
    opts.outputs.write(doc, svg)?;
    Ok(rows)
}
