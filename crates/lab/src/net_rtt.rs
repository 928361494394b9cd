//! Round trips through virtio-net (`bench net --rtt`): the host sends one frame into the
//! tap, the `netecho` guest sends it back, the host sends the next (one frame in flight),
//! with the device thread sleeping after work (`--poll-us off`) and polling (`adaptive`).
//! A round trip wakes the device thread twice when it sleeps (the frame from the tap, the
//! guest's TX kick); polling, the kick finds it awake.

use crate::control::{drive, Window};
use crate::net::{boot_with, start_at_begin, thread_cpu, NetBenchError, HOST_MAC};
use crate::netns::Netns;
use crate::report::{targets_json, targets_text, Outputs, Target};
use crate::sink::frame;
use crate::sink::FrameKind;
use crate::stats::median;
use exitless_vmm::poll::PollMode;
use exitless_vmm::virtio::net::TxMode;
use exitless_vmm::Machine;
use serde_json::json;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

pub struct RttOptions {
    pub rounds: u64,
    pub size: usize,
    pub repeat: u32,
    pub outputs: Outputs,
    pub timeout: Duration,
}

/// One polling mode: medians over the repeats.
pub struct RttRow {
    pub poll: &'static str,
    /// The median round trip, host send to host receive.
    pub rtt_us: f64,
    /// The device thread's CPU time per round trip.
    pub cpu_us_per_rtt: f64,
    /// Times the device thread woke from epoll per round trip.
    pub wakeups_per_rtt: f64,
    /// The device thread's CPU over one second, after a second with no frame (the guest
    /// waiting for one), halfway through the first run.
    pub idle_cpu_pct: f64,
    pub rounds: u64,
}

const MODES: [(&str, PollMode); 2] = [("off", PollMode::Off), ("adaptive", PollMode::Adaptive)];

#[derive(Clone, Copy)]
struct Counters {
    cpu: Duration,
    wakeups: u64,
}

fn counters(machine: &Machine) -> Counters {
    let wakeups = machine.devices().nets().next().map_or(0, |n| n.stats.poll.counts().wakeups);
    Counters { cpu: thread_cpu(machine), wakeups }
}

/// What one run measured.
type Run = (f64, f64, f64, Option<f64>);

/// One guest, `rounds` round trips: (median rtt in us, device CPU us per rtt, wake-ups per
/// rtt, and with `idle` the device thread's CPU % in the second of two idle seconds halfway).
fn run_one(netns: &Netns, poll: PollMode, opts: &RttOptions, idle: bool) -> Result<Run, NetBenchError> {
    let (machine, control, sink) =
        boot_with(netns, "netecho", vec![opts.rounds], (TxMode::Zerocopy, poll), (opts.size, FrameKind::Lab), None)?;
    let (sender, seen) = (sink.sender(), sink.frames_seen());
    let (rounds, size) = (opts.rounds, opts.size);
    let device = machine.devices().nets().next().map(|n| n.stats.clone());
    let mut lab = Window::<Counters, NetBenchError>::new(counters);
    let pinger = start_at_begin(&mut lab, move || {
        let mut rtts = Vec::with_capacity(rounds as usize);
        let mut idle_pct = None;
        for seq in 0..rounds {
            if idle && seq == rounds / 2 {
                // The guest waits for the next frame (spinning at CPL3, no kick): the
                // device thread is idle, and should have stopped polling within a second.
                let cpu = || device.as_ref().and_then(|d| d.thread_cpu());
                std::thread::sleep(Duration::from_secs(1));
                let (t, before) = (Instant::now(), cpu());
                std::thread::sleep(Duration::from_secs(1));
                if let (Some(b), Some(a)) = (before, cpu()) {
                    idle_pct = Some((a - b).as_secs_f64() / t.elapsed().as_secs_f64() * 100.0);
                }
            }
            let t = Instant::now();
            if sender.send(&frame(HOST_MAC, size, seq)).is_err() {
                break;
            }
            while seen.get() <= seq {
                // Generous: a loaded host may hold a round trip up for seconds.
                if t.elapsed() > Duration::from_secs(30) {
                    return (rtts, idle_pct); // lost: the guest then waits for its timeout
                }
                // Yield, not spin: on 2 cores the vCPU (netecho spins) and the device
                // thread need them more than the waiting host side.
                std::thread::yield_now();
            }
            rtts.push(t.elapsed().as_secs_f64() * 1e6);
        }
        (rtts, idle_pct)
    });
    drive(&machine, &control, opts.timeout, &mut lab)?;
    let (rtts, idle_pct) = pinger.join().unwrap_or_default();
    let (begin, (end, _)) =
        (lab.begin.ok_or(NetBenchError::Missing("start"))?, lab.end.ok_or(NetBenchError::Missing("end"))?);
    if rtts.len() as u64 != opts.rounds {
        return Err(NetBenchError::Lost(opts.rounds - rtts.len() as u64));
    }
    let n = opts.rounds as f64;
    let cpu_per_rtt = (end.cpu - begin.cpu).as_secs_f64() * 1e6 / n;
    Ok((median(&rtts), cpu_per_rtt, (end.wakeups - begin.wakeups) as f64 / n, idle_pct))
}

pub fn measure(opts: &RttOptions) -> Result<Vec<RttRow>, NetBenchError> {
    let netns = Netns::create("rtt")?;
    let progress = std::io::stderr().is_terminal();
    let mut runs: [Vec<Run>; 2] = Default::default();
    for r in 0..opts.repeat as usize {
        for i in [r % 2, 1 - r % 2] {
            if progress {
                eprint!("\rnet rtt: poll {} run {}/{} ...\x1b[K", MODES[i].0, r + 1, opts.repeat);
            }
            runs[i].push(run_one(&netns, MODES[i].1, opts, r == 0)?);
        }
    }
    if progress {
        eprint!("\r\x1b[K");
    }
    Ok(MODES
        .iter()
        .zip(&runs)
        .map(|(&(poll, _), runs)| {
            let med = |f: fn(&Run) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
            RttRow {
                poll,
                rtt_us: med(|r| r.0),
                cpu_us_per_rtt: med(|r| r.1),
                wakeups_per_rtt: med(|r| r.2),
                // The thread's CPU clock unreadable: reported as busy, never as idle.
                idle_cpu_pct: runs.iter().find_map(|r| r.3).unwrap_or(100.0),
                rounds: opts.rounds * u64::from(opts.repeat),
            }
        })
        .collect())
}

pub fn targets(rows: &[RttRow]) -> Vec<Target> {
    let find = |p| rows.iter().find(|r| r.poll == p);
    let mut out = Vec::new();
    if let (Some(off), Some(adaptive)) = (find("off"), find("adaptive")) {
        let x = off.rtt_us / adaptive.rtt_us;
        out.push(Target::new("round trip >= 1.5x shorter with adaptive polling", format!("{x:.2}x"), x >= 1.5));
        let idle = adaptive.idle_cpu_pct;
        out.push(Target::new("device thread CPU < 1% after 1 s idle (adaptive)", format!("{idle:.2}%"), idle < 1.0));
    }
    out
}

pub fn table(rows: &[RttRow], opts: &RttOptions) -> String {
    let mut s = format!(
        "net round trips: {} rounds of {}-byte frames per run, one in flight, {} repeats interleaved (medians)\n",
        opts.rounds, opts.size, opts.repeat
    );
    s += &format!(
        "{:<10} {:>10} {:>20} {:>14} {:>20}\n",
        "poll", "rtt us", "device CPU us/rtt", "wake-ups/rtt", "device CPU % idle"
    );
    for r in rows {
        s += &format!(
            "{:<10} {:>10.1} {:>20.1} {:>14.2} {:>20.2}\n",
            r.poll, r.rtt_us, r.cpu_us_per_rtt, r.wakeups_per_rtt, r.idle_cpu_pct
        );
    }
    s += "rtt: host send to host receive through the tap and the netecho guest (median round trip).\n";
    s += "device CPU: the virtio-net thread's CPU time, polling included; idle: over the second\n";
    s += "  after a second with no frame, halfway through the first run.\n";
    s + &targets_text(&targets(rows))
}

pub fn run(opts: &RttOptions) -> Result<Vec<RttRow>, NetBenchError> {
    opts.outputs.check()?;
    let rows = measure(opts)?;
    crate::report::print_table(&table(&rows, opts))?;
    let targets = targets_json(&targets(&rows));
    opts.outputs.write(
        || {
            let rows: Vec<_> = rows
                .iter()
                .map(|r| {
                    json!({"poll": r.poll, "rtt_us": r.rtt_us, "cpu_us_per_rtt": r.cpu_us_per_rtt,
                                "wakeups_per_rtt": r.wakeups_per_rtt, "idle_cpu_pct": r.idle_cpu_pct,
                           "rounds": r.rounds})
                })
                .collect();
            json!({"bench": "net-rtt", "size": opts.size, "repeat": opts.repeat, "rows": rows, "targets": targets})
        },
        || {
            let bars = rows.iter().map(|r| ("round trip".to_string(), format!("poll {}", r.poll), r.rtt_us));
            crate::chart::draw(&[crate::chart::Panel::grouped(
                "net: round trip (shorter is better)",
                "us",
                false,
                bars,
            )])
        },
    )?;
    Ok(rows)
}
