//! Net TX lab: a guest sends sequence-numbered frames of each size through virtio-net on
//! both TX paths (copy, zerocopy) into a tap inside the lab's own network namespace,
//! where a sink checks every frame. Also the echo round trip used by the tests.

use crate::chart;
use crate::control::{drive, guest_tsc_khz, lab_machine, payload_failure, LabMachine, Window};
use crate::netns::{Netns, NetnsError};
use crate::report::{no_row_slower_than_off, targets_json, targets_text, Outputs, Target, WriteError};
use crate::sink::{frame, FrameKind, Sink, SinkError, SinkReport};
use crate::stats::median;
use exitless_vmm::machine::read_result;
use exitless_vmm::poll::PollMode;
use exitless_vmm::virtio::net::TxMode;
use exitless_vmm::{Machine, MachineError, NetConfig};
use serde_json::json;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// The guest's MAC in the labs (locally administered).
pub const LAB_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0xe1, 0xe5, 0x02];

pub struct Options {
    pub sizes: Vec<usize>,
    /// What the guest sends (sink.rs): the lab's frames, TCP with offloads (at `sizes`),
    /// TCP without them (MTU-sized only: a guest without TSO sends no larger).
    pub kinds: Vec<FrameKind>,
    pub seconds: f64,
    pub repeat: u32,
    /// The device thread's polling modes to measure each row with.
    pub polls: Vec<PollMode>,
    pub outputs: Outputs,
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum NetBenchError {
    #[error(transparent)]
    Machine(#[from] MachineError),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error("the guest never announced its {0}")]
    Missing(&'static str),
    #[error("cannot set up the lab: {0}")]
    Setup(String),
    #[error("{0} frames of the round trips never came back")]
    Lost(u64),
    #[error("{0}")]
    Guest(String),
    #[error("the guest sent no frame in its window: nothing was measured")]
    NothingSent,
    #[error(transparent)]
    Write(#[from] WriteError),
}

#[derive(Clone, Debug)]
pub struct Row {
    pub kind: FrameKind,
    pub size: usize,
    pub path: TxMode,
    pub poll: PollMode,
    pub sent: u64,
    pub received: u64,
    pub gbps: f64,
    pub vmm_cpu_pct: f64,
    pub exits_per_pkt: f64,
    /// Of those, the guest's kicks (ioeventfd signals, no exit).
    pub kicks_per_pkt: f64,
    /// Port and MMIO exits of the send window.
    pub userspace_exits: u64,
    /// Times the guest slept on a full ring (each a port write to the idle device).
    pub idle_waits: u64,
    /// What the device counted: frames it wrote to the tap, and frames it dropped.
    pub device_tx_frames: u64,
    pub device_tx_dropped: u64,
    pub irqs_per_pkt: f64,
    /// Times the device thread woke from epoll per packet.
    pub wakeups_per_pkt: f64,
    pub lost: u64,
    pub corrupt: u64,
    /// Frames the sink saw more than once.
    pub duplicates: u64,
    /// Of the lost, how many the sink's socket dropped (host side, not the VMM).
    pub sink_drops: u64,
    /// Throughput per second of the device thread's CPU: the zero-copy target's measure.
    pub gbps_per_cpu_second: f64,
    /// VMM time per packet spent copying chains into its buffer (0 on zerocopy but for
    /// chains under 2 KiB).
    pub copy_ns_per_pkt: f64,
}

pub fn kind_name(k: FrameKind) -> &'static str {
    match k {
        FrameKind::Lab => "lab",
        FrameKind::Tso => "tcp+tso",
        FrameKind::Plain => "tcp",
    }
}

/// The size plain TCP rows are sent at: a full 1500-byte MTU.
pub const MTU_FRAME: usize = 1514;

pub fn path_name(p: TxMode) -> &'static str {
    match p {
        TxMode::Copy => "copy",
        TxMode::Zerocopy => "zerocopy",
    }
}

/// CPU time of the device thread so far.
pub(crate) fn thread_cpu(machine: &Machine) -> Duration {
    machine.devices().nets().next().and_then(|n| n.stats.thread_cpu()).unwrap_or_default()
}

/// Counters at one instant, to take differences over the send window.
#[derive(Clone, Copy)]
struct Snapshot {
    at: Instant,
    cpu: Duration,
    kicks: u64,
    irqs: u64,
    copy_cycles: u64,
    /// The device thread's wake-ups from epoll (crate::poll's accounting).
    wakeups: u64,
}

fn snapshot(machine: &Machine) -> Snapshot {
    let n = machine.devices().nets().next().map(|n| n.stats.snapshot()).unwrap_or_default();
    Snapshot {
        at: Instant::now(),
        cpu: thread_cpu(machine),
        kicks: n.kicks,
        irqs: n.irqs,
        copy_cycles: n.tx_copy_cycles,
        wakeups: n.poll.wakeups,
    }
}

type TxSteps = Window<Snapshot, NetBenchError>;

type Booted = (Machine, std::sync::Arc<crate::control::LabControl>, Sink);

/// A guest with virtio-net on a tap that sits in `netns`, and a sink on it.
pub(crate) fn boot_with(
    netns: &Netns,
    payload: &str,
    params: Vec<u64>,
    (tx, poll): (TxMode, PollMode),
    (size, kind): (usize, FrameKind),
    console: Option<crate::control::Console>,
) -> Result<Booted, NetBenchError> {
    let tap = crate::netns::unique_ifname("exl");
    // Plain TCP rows run on a NIC without offloads: "offloads off" for comparison.
    let net = NetConfig { tx, offloads: kind != FrameKind::Plain, ..NetConfig::on_tap(tap.clone(), LAB_MAC) };
    let LabMachine { machine, control, .. } = lab_machine(payload, params, |c| {
        c.devices.allocated = vec![exitless_vmm::virtio::net::attach(net, poll)];
        if let Some(console) = console {
            c.devices.serial_out = Box::new(console);
        }
    })?;
    netns.adopt(&tap)?;
    let sink = Sink::spawn_for(netns, &tap, size, kind)?;
    Ok((machine, control, sink))
}

/// One size on one path with one polling mode.
fn run_one(
    netns: &Netns,
    (kind, size): (FrameKind, usize),
    (path, poll): (TxMode, PollMode),
    opts: &Options,
    tsc_khz: u64,
) -> Result<Row, NetBenchError> {
    let params = vec![size as u64, u64::MAX, (opts.seconds * 1000.0) as u64, tsc_khz, 0, 0, kind.param()];
    let (machine, control, sink) = boot_with(netns, "nettx", params, (path, poll), (size, kind), None)?;
    let mut lab = TxSteps::new(snapshot);
    drive(&machine, &control, opts.timeout, &mut lab)?;
    if let Some(why) = payload_failure(&machine) {
        return Err(NetBenchError::Guest(why));
    }
    let sent = read_result(machine.memory(), 0);
    if sent == 0 {
        return Err(NetBenchError::NothingSent);
    }
    let seconds = read_result(machine.memory(), 1) as f64 / (tsc_khz as f64 * 1e3);
    let idle_waits = read_result(machine.memory(), 3);
    let device = machine.devices().nets().next().map(|n| n.stats.snapshot()).unwrap_or_default();
    let report: SinkReport = sink.finish(sent, Duration::from_secs(2));
    let (begin, (end, exits)) =
        (lab.begin.ok_or(NetBenchError::Missing("start"))?, lab.end.ok_or(NetBenchError::Missing("end"))?);
    let wall = (end.at - begin.at).as_secs_f64();
    let packets = sent.max(1) as f64;
    let gbps = report.bytes as f64 * 8.0 / seconds / 1e9;
    let cpu_seconds = (end.cpu - begin.cpu).as_secs_f64();
    Ok(Row {
        kind,
        size,
        path,
        poll,
        sent,
        received: report.frames,
        gbps,
        vmm_cpu_pct: cpu_seconds / wall * 100.0,
        gbps_per_cpu_second: gbps * seconds / cpu_seconds,
        copy_ns_per_pkt: (end.copy_cycles - begin.copy_cycles) as f64 / tsc_khz as f64 * 1e6 / packets,
        exits_per_pkt: (end.kicks - begin.kicks + exits) as f64 / packets,
        kicks_per_pkt: (end.kicks - begin.kicks) as f64 / packets,
        userspace_exits: exits,
        idle_waits,
        device_tx_frames: device.tx_frames,
        device_tx_dropped: device.tx_dropped,
        irqs_per_pkt: (end.irqs - begin.irqs) as f64 / packets,
        wakeups_per_pkt: (end.wakeups - begin.wakeups) as f64 / packets,
        lost: sent.saturating_sub(report.frames),
        corrupt: report.corrupt,
        duplicates: report.duplicates,
        sink_drops: report.socket_drops,
    })
}

/// Every size on both paths with each polling mode, `repeat` times, in a namespace of our
/// own; which combination goes first rotates, and each figure is the median over the repeats.
pub fn measure(opts: &Options) -> Result<Vec<Row>, NetBenchError> {
    let netns = Netns::create("net")?;
    let tsc_khz = u64::from(guest_tsc_khz()?);
    let progress = std::io::stderr().is_terminal();
    let combos: Vec<(TxMode, PollMode)> =
        opts.polls.iter().flat_map(|&poll| [(TxMode::Copy, poll), (TxMode::Zerocopy, poll)]).collect();
    let mut rows = Vec::new();
    let rows_of = |&kind: &FrameKind| {
        let sizes = if kind == FrameKind::Plain { vec![MTU_FRAME] } else { opts.sizes.clone() };
        sizes.into_iter().map(move |size| (kind, size))
    };
    for (i, (kind, size)) in opts.kinds.iter().flat_map(rows_of).enumerate() {
        let mut runs: Vec<Vec<Row>> = vec![Vec::new(); combos.len()];
        for r in 0..opts.repeat as usize {
            for k in 0..combos.len() {
                let c = (i + r + k) % combos.len();
                let (path, poll) = combos[c];
                if progress {
                    let (p, n) = (path_name(path), opts.repeat);
                    let (k, s) = (kind_name(kind), human_size(size));
                    eprint!("\rnet: {k} {s} {p} poll {poll} run {}/{n} ...\x1b[K", r + 1);
                }
                runs[c].push(run_one(&netns, (kind, size), combos[c], opts, tsc_khz)?);
            }
        }
        rows.extend(runs.iter().map(|r| median_row(r)));
    }
    if progress {
        eprint!("\r\x1b[K");
    }
    Ok(rows)
}

/// Medians of each figure over repeated runs; frames and losses are summed.
fn median_row(runs: &[Row]) -> Row {
    let med = |f: fn(&Row) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    Row {
        gbps: med(|r| r.gbps),
        vmm_cpu_pct: med(|r| r.vmm_cpu_pct),
        exits_per_pkt: med(|r| r.exits_per_pkt),
        kicks_per_pkt: med(|r| r.kicks_per_pkt),
        irqs_per_pkt: med(|r| r.irqs_per_pkt),
        wakeups_per_pkt: med(|r| r.wakeups_per_pkt),
        gbps_per_cpu_second: med(|r| r.gbps_per_cpu_second),
        copy_ns_per_pkt: med(|r| r.copy_ns_per_pkt),
        sent: runs.iter().map(|r| r.sent).sum(),
        received: runs.iter().map(|r| r.received).sum(),
        lost: runs.iter().map(|r| r.lost).sum(),
        corrupt: runs.iter().map(|r| r.corrupt).sum(),
        duplicates: runs.iter().map(|r| r.duplicates).sum(),
        userspace_exits: runs.iter().map(|r| r.userspace_exits).sum(),
        idle_waits: runs.iter().map(|r| r.idle_waits).sum(),
        device_tx_frames: runs.iter().map(|r| r.device_tx_frames).sum(),
        device_tx_dropped: runs.iter().map(|r| r.device_tx_dropped).sum(),
        sink_drops: runs.iter().map(|r| r.sink_drops).sum(),
        ..runs[0].clone()
    }
}

/// What an echo run saw.
pub struct EchoReport {
    /// Frames that came back, checked like the TX lab's.
    pub sink: SinkReport,
    /// Interrupts the device asked for.
    pub interrupts: u64,
    /// The guest's serial output.
    pub console: String,
}

/// The source address of the frames the host side sends to a guest.
pub const HOST_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];

/// Starts `work` on a helper thread now (the vCPU thread's filter would refuse it sendto),
/// confined, to run once the guest announces Begin; its handle gives back what it
/// returned (the default if it never ran).
pub(crate) fn start_at_begin<S, T: Default + Send + 'static>(
    lab: &mut Window<S, NetBenchError>,
    work: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let (go, start) = std::sync::mpsc::channel::<()>();
    lab.on_begin = Some(Box::new(move || {
        let _ = go.send(());
    }));
    std::thread::spawn(move || {
        if !exitless_vmm::seccomp::confine_or_log(exitless_vmm::seccomp::ThreadKind::Helper) || start.recv().is_err() {
            return T::default();
        }
        work()
    })
}

/// Sends `frames` frames of `size` bytes from the namespace to a `netecho` guest (with
/// mergeable receive buffers of 4 KiB if `mergeable`) and returns what came back.
pub fn echo(frames: u64, size: usize, mergeable: bool, timeout: Duration) -> Result<EchoReport, NetBenchError> {
    let netns = Netns::create("echo")?;
    let console = crate::control::Console::default();
    let (machine, control, sink) = boot_with(
        &netns,
        "netecho",
        vec![frames, u64::from(mergeable)],
        (TxMode::Zerocopy, PollMode::Off),
        (size, FrameKind::Lab),
        Some(console.clone()),
    )?;
    let sender = sink.sender();
    let mut lab = TxSteps::new(snapshot);
    start_at_begin(&mut lab, move || {
        for seq in 0..frames {
            let _ = sender.send(&frame(HOST_MAC, size, seq));
        }
    });
    drive(&machine, &control, timeout, &mut lab)?;
    if let Some(why) = payload_failure(&machine) {
        return Err(NetBenchError::Guest(why));
    }
    let devices = machine.devices();
    let nic = devices.virtio_of::<exitless_vmm::virtio::net::NetHandle>().next();
    let interrupts = nic.map_or(0, |(_, transport)| transport.core().interrupts_signalled());
    // The guest echoed every frame before it ended; on a loaded host the sink may read
    // the last ones well after that.
    Ok(EchoReport { sink: sink.finish(frames, Duration::from_secs(30)), interrupts, console: console.text() })
}

/// The issues' targets: zero-copy's and exits' on the first polling mode measured (the
/// published rows slept after work), polling's against `off`.
pub fn targets(rows: &[Row]) -> Vec<Target> {
    let mut out = Vec::new();
    let Some(first) = rows.first().map(|r| r.poll) else { return out };
    let find = |kind, size, path, poll| {
        rows.iter().find(|r| r.kind == kind && r.size == size && r.path == path && r.poll == poll)
    };
    for kind in [FrameKind::Lab, FrameKind::Tso] {
        for size in [16 * 1024, MAX_SIZE] {
            let (copy, zero) = (find(kind, size, TxMode::Copy, first), find(kind, size, TxMode::Zerocopy, first));
            if let (Some(c), Some(z)) = (copy, zero) {
                let x = z.gbps_per_cpu_second / c.gbps_per_cpu_second;
                let what =
                    format!("zerocopy Gb/s per VMM CPU-s >= 1.3x copy at {} {}", kind_name(kind), human_size(size));
                out.push(Target::new(what, format!("{x:.2}x"), x >= 1.3));
            }
        }
    }
    // The same bytes as 64K offloaded sends and as MTU-sized frames with the guest's checksums.
    let tso = find(FrameKind::Tso, MAX_SIZE, TxMode::Zerocopy, first);
    if let (Some(t), Some(p)) = (tso, find(FrameKind::Plain, MTU_FRAME, TxMode::Zerocopy, first)) {
        let x = t.gbps / p.gbps;
        out.push(Target::new(
            "64K TSO sends >= 3x the Gb/s of 1514-byte frames without offloads",
            format!("{x:.2}x"),
            x >= 3.0,
        ));
    }
    for r in rows.iter().filter(|r| r.size == MAX_SIZE && r.poll == first) {
        let ok = r.exits_per_pkt < 0.1;
        let what = format!("exits per packet < 0.1 at 64K ({})", path_name(r.path));
        out.push(Target::new(what, format!("{:.3}", r.exits_per_pkt), ok));
    }
    out.extend(no_row_slower_than_off(
        rows,
        "row",
        |r| Some(r.poll),
        |r| (r.kind.param(), r.size, r.path),
        |r| r.gbps,
        |r| format!("{} {} {}", kind_name(r.kind), human_size(r.size), path_name(r.path)),
    ));
    let lost: u64 = rows.iter().map(|r| r.lost + r.corrupt).sum();
    out.push(Target::new("lost 0 everywhere", lost.to_string(), lost == 0));
    out
}

/// "64K": the largest frame a tap takes, 65535 bytes.
pub const MAX_SIZE: usize = 65535;

fn human_size(size: usize) -> String {
    if size == MAX_SIZE {
        "64K".into()
    } else if size.is_multiple_of(1024) {
        format!("{}K", size / 1024)
    } else {
        size.to_string()
    }
}

pub fn table(rows: &[Row], opts: &Options) -> String {
    let mut s = format!(
        "net TX lab: {:.1} s per size, path and polling mode, {} repeats interleaved (medians), frames into a tap in a private namespace\n",
        opts.seconds, opts.repeat
    );
    s += &format!(
        "{:<8} {:>6} {:<9} {:<9} {:>8} {:>10} {:>10} {:>10} {:>13} {:>12} {:>6} {:>15} {:>12}\n",
        "frames",
        "size",
        "path",
        "poll",
        "Gb/s",
        "VMM CPU %",
        "exits/pkt",
        "irqs/pkt",
        "wake-ups/pkt",
        "frames",
        "lost",
        "Gb/s per CPU-s",
        "copy ns/pkt"
    );
    for r in rows {
        s += &format!(
            "{:<8} {:>6} {:<9} {:<9} {:>8.2} {:>10.1} {:>10.3} {:>10.3} {:>13.3} {:>12} {:>6} {:>15.2} {:>12.0}\n",
            kind_name(r.kind),
            human_size(r.size),
            path_name(r.path),
            r.poll.to_string(),
            r.gbps,
            r.vmm_cpu_pct,
            r.exits_per_pkt,
            r.irqs_per_pkt,
            r.wakeups_per_pkt,
            r.sent,
            r.lost + r.corrupt,
            r.gbps_per_cpu_second,
            r.copy_ns_per_pkt
        );
    }
    s + &targets_text(&targets(rows))
}

pub fn json(rows: &[Row]) -> serde_json::Value {
    let out: Vec<_> = rows
        .iter()
        .map(|r| {
            json!({"frame_kind": kind_name(r.kind), "size": r.size, "path": path_name(r.path), "poll": r.poll.to_string(), "gbps": r.gbps, "vmm_cpu_pct": r.vmm_cpu_pct,
                   "exits_per_pkt": r.exits_per_pkt, "irqs_per_pkt": r.irqs_per_pkt,
                   "wakeups_per_pkt": r.wakeups_per_pkt, "lost": r.lost + r.corrupt,
                   "frames": r.sent, "gbps_per_cpu_second": r.gbps_per_cpu_second,
                   "copy_ns_per_pkt": r.copy_ns_per_pkt, "sink_drops": r.sink_drops,
                   "kicks_per_pkt": r.kicks_per_pkt, "userspace_exits": r.userspace_exits,
                   "idle_waits": r.idle_waits, "tx_frames": r.device_tx_frames,
                   "tx_dropped": r.device_tx_dropped, "corrupt": r.corrupt, "duplicates": r.duplicates})
        })
        .collect();
    let targets = targets_json(&targets(rows));
    json!({"bench": "net", "rows": out, "targets": targets})
}

pub fn run(opts: &Options) -> Result<Vec<Row>, NetBenchError> {
    opts.outputs.check()?;
    let rows = measure(opts)?;
    crate::report::print_table(&table(&rows, opts))?;
    opts.outputs.write(
        || json(&rows),
        || {
            let bars = rows.iter().map(|r| {
                (
                    format!("{} {}", kind_name(r.kind), human_size(r.size)),
                    format!("{} poll {}", path_name(r.path), r.poll),
                    r.gbps_per_cpu_second,
                )
            });
            let title = "virtio-net TX: Gb/s per second of VMM CPU, by message size";
            chart::draw(&[chart::Panel::grouped(title, "Gb/s per CPU-s", false, bars)])
        },
    )?;
    Ok(rows)
}
