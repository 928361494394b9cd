//! `exitless bench vsock`: the `vsockecho` guest under `exitless run --vsock`, a host
//! client on the Unix socket the way Firecracker's users reach a guest agent
//! (`CONNECT <port>\n`). Round trips of 64 bytes, one at a time; a stream of 64 KiB writes
//! echoed back, every byte verified both ways. Each in its own VM, so that the VM's exit
//! profile (its report) counts that measure's exits, less those of a VM that only starts
//! and takes one connection (the steady state's exits per message). Beside it, in the same run,
//! `bench net --rtt`'s round trip (guest and host over virtio-net), when a tap and a
//! network namespace can be made.

use crate::report::{print_table, targets_json, targets_text, Target, WriteError};
use exitless_vmm::poll::PollMode;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PORT: u32 = 1234;
const RTT_BYTES: usize = 64;
const CHUNK: usize = 64 << 10;

pub struct Options {
    /// The device thread's polling modes, each measured (as `--poll-us` takes them).
    pub modes: Vec<PollMode>,
    pub rounds: u32,
    /// Bytes the stream sends (and gets back).
    pub stream_bytes: usize,
    pub json: Option<PathBuf>,
    pub timeout: Duration,
}

/// What stops the vsock lab (crate::report::LabError).
pub type VsockBenchError = crate::report::LabError;

/// One polling mode's measures.
#[derive(Clone, Debug)]
pub struct Row {
    pub poll: PollMode,
    pub rtt_us: f64,
    pub rtt_p99_us: f64,
    pub exits_per_rtt: f64,
    pub stream_gbytes_per_s: f64,
    pub exits_per_chunk: f64,
}

#[derive(Clone, Debug, Default)]
pub struct Report {
    pub rows: Vec<Row>,
    /// `bench net --rtt`'s round trip (polling off), in the same run; None without a tap.
    pub net_rtt_us: Option<f64>,
}

/// A VM running `vsockecho` until its one stream closes; its report lands in `report`.
struct Guest {
    child: Child,
    /// Held open: the guest's console output goes on after its first line.
    _console: BufReader<std::process::ChildStdout>,
    report: PathBuf,
    uds: PathBuf,
}

impl Guest {
    fn start(dir: &Path, name: &str, poll: PollMode, timeout: Duration) -> Result<Guest, VsockBenchError> {
        let exe = crate::exitless_binary().map_err(|e| VsockBenchError::Setup(e.to_string()))?;
        let (uds, report) = (dir.join(format!("{name}.vsock")), dir.join(format!("{name}.json")));
        let vsock = format!("cid=3,uds={}", uds.display());
        let mut child = Command::new(exe)
            .args(["run", "--payload", "vsockecho", "--vsock", &vsock, "--params", &format!("{PORT},1")])
            .args(["--poll-us", &poll.to_string()])
            .args(["--timeout", &timeout.as_secs().to_string(), "--json"])
            .arg(&report)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| VsockBenchError::Setup(format!("cannot start exitless: {e}")))?;
        let stdout = child.stdout.take().ok_or_else(|| VsockBenchError::Setup("no stdout".into()))?;
        let mut console = BufReader::new(stdout);
        crate::api_client::wait_for_line(&mut console, "listening").map_err(VsockBenchError::Run)?;
        Ok(Guest { child, _console: console, report, uds })
    }

    fn connect(&self) -> Result<(UnixStream, BufReader<UnixStream>), VsockBenchError> {
        let fail = |e: std::io::Error| VsockBenchError::Run(format!("the vsock socket: {e}"));
        let mut s = UnixStream::connect(&self.uds).map_err(fail)?;
        s.set_read_timeout(Some(Duration::from_secs(30))).map_err(fail)?;
        s.write_all(format!("CONNECT {PORT}\n").as_bytes()).map_err(fail)?;
        let mut reader = BufReader::new(s.try_clone().map_err(fail)?);
        let mut ok = String::new();
        reader.read_line(&mut ok).map_err(fail)?;
        if !ok.starts_with("OK ") {
            return Err(VsockBenchError::Run(format!("CONNECT {PORT} answered {ok:?}")));
        }
        Ok((s, reader))
    }

    /// Waits for the guest to end; its VMM's exits to userspace (port and MMIO).
    fn finish(mut self) -> Result<f64, VsockBenchError> {
        let status = self.child.wait().map_err(|e| VsockBenchError::Run(e.to_string()))?;
        if !status.success() {
            return Err(VsockBenchError::Run(format!("the guest's VM ended with {status}")));
        }
        let text = std::fs::read_to_string(&self.report).map_err(|e| VsockBenchError::Run(e.to_string()))?;
        let report: Value = serde_json::from_str(&text).map_err(|e| VsockBenchError::Run(e.to_string()))?;
        let exits = &report["exits"];
        Ok(["io_in", "io_out", "mmio_read", "mmio_write"].iter().filter_map(|k| exits[k].as_f64()).sum())
    }
}

/// A guest the lab gave up on (an error half way) must not keep spinning a core.
impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pattern(i: usize) -> u8 {
    (i * 131 + 17) as u8
}

fn io(e: std::io::Error) -> VsockBenchError {
    VsockBenchError::Run(format!("the stream: {e}"))
}

/// The exits of a VM whose guest only starts, takes one connection and sees it close:
/// what every measure's VM spends besides its messages.
fn baseline_exits(dir: &Path, poll: PollMode, opts: &Options) -> Result<f64, VsockBenchError> {
    let guest = Guest::start(dir, "baseline", poll, opts.timeout)?;
    drop(guest.connect()?);
    guest.finish()
}

/// Round trips of 64 bytes: median and 99th percentile, and exits per round trip beyond
/// the VM's `baseline`.
fn round_trips(dir: &Path, poll: PollMode, opts: &Options, baseline: f64) -> Result<(f64, f64, f64), VsockBenchError> {
    let guest = Guest::start(dir, "rtt", poll, opts.timeout)?;
    let (mut s, mut reader) = guest.connect()?;
    let mut times = Vec::with_capacity(opts.rounds as usize);
    let mut back = [0u8; RTT_BYTES];
    for round in 0..opts.rounds as usize {
        let msg: Vec<u8> = (0..RTT_BYTES).map(|i| pattern(round + i)).collect();
        let t = Instant::now();
        s.write_all(&msg).map_err(io)?;
        reader.read_exact(&mut back).map_err(io)?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
        if back[..] != msg[..] {
            return Err(VsockBenchError::Run(format!("round {round}: the echo differs")));
        }
    }
    drop((s, reader));
    let exits = guest.finish()?;
    times.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| times.get(((times.len() as f64 - 1.0) * q) as usize).copied().unwrap_or(f64::NAN);
    Ok((at(0.5), at(0.99), (exits - baseline).max(0.0) / f64::from(opts.rounds.max(1))))
}

/// The stream: 64 KiB writes from one thread, the echo read and checked by this one.
fn stream(dir: &Path, poll: PollMode, opts: &Options, baseline: f64) -> Result<(f64, f64), VsockBenchError> {
    let guest = Guest::start(dir, "stream", poll, opts.timeout)?;
    let (mut s, mut reader) = guest.connect()?;
    let total = opts.stream_bytes;
    // The pattern repeats every 256 bytes: one table serves every offset, so the client
    // writes and checks with memcpy and memcmp speed and leaves this 2-core host's cores to
    // the guest and the device thread.
    let table: std::sync::Arc<Vec<u8>> = std::sync::Arc::new((0..CHUNK + 256).map(pattern).collect());
    let at_offset = |table: &[u8], at: usize, n: usize| table[at % 256..at % 256 + n].to_vec();
    let writes = table.clone();
    let began = Instant::now();
    let writer = std::thread::spawn(move || -> std::io::Result<UnixStream> {
        for at in (0..total).step_by(CHUNK) {
            let n = CHUNK.min(total - at);
            s.write_all(&writes[at % 256..at % 256 + n])?;
        }
        Ok(s)
    });
    let mut buf = vec![0u8; CHUNK];
    let mut seen = 0;
    while seen < total {
        let n = reader.read(&mut buf).map_err(io)?;
        if n == 0 {
            return Err(VsockBenchError::Run(format!("the stream closed after {seen} of {total} bytes")));
        }
        if buf[..n] != table[seen % 256..seen % 256 + n] {
            let wrong = at_offset(&table, seen, n).iter().zip(&buf[..n]).position(|(a, b)| a != b).unwrap_or(0);
            return Err(VsockBenchError::Run(format!("the echo differs at byte {}", seen + wrong)));
        }
        seen += n;
    }
    let seconds = began.elapsed().as_secs_f64();
    let s = writer.join().map_err(|_| VsockBenchError::Run("the writer panicked".into()))?.map_err(io)?;
    drop((s, reader));
    let exits = guest.finish()?;
    Ok((total as f64 / seconds / 1e9, (exits - baseline).max(0.0) / total.div_ceil(CHUNK) as f64))
}

pub fn measure(opts: &Options) -> Result<Report, VsockBenchError> {
    let dir = std::env::temp_dir().join(format!("exitless-vsock-lab-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| VsockBenchError::Setup(format!("{}: {e}", dir.display())))?;
    let result = (|| -> Result<Report, VsockBenchError> {
        let mut rows = Vec::new();
        for &poll in &opts.modes {
            let baseline = baseline_exits(&dir, poll, opts)?;
            let (rtt_us, rtt_p99_us, exits_per_rtt) = round_trips(&dir, poll, opts, baseline)?;
            let (stream_gbytes_per_s, exits_per_chunk) = stream(&dir, poll, opts, baseline)?;
            rows.push(Row { poll, rtt_us, rtt_p99_us, exits_per_rtt, stream_gbytes_per_s, exits_per_chunk });
        }
        Ok(Report { rows, net_rtt_us: None })
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let mut report = result?;
    report.net_rtt_us = net_round_trip(opts);
    Ok(report)
}

/// `bench net --rtt`'s round trip with polling off, when it can run here (root, a tap).
fn net_round_trip(opts: &Options) -> Option<f64> {
    if !crate::netns::available() {
        return None;
    }
    let rtt = crate::net_rtt::RttOptions {
        rounds: u64::from(opts.rounds),
        size: RTT_BYTES,
        repeat: 1,
        outputs: Default::default(),
        timeout: opts.timeout,
    };
    let rows = crate::net_rtt::measure(&rtt).ok()?;
    rows.iter().find(|r| r.poll == "off").map(|r| r.rtt_us)
}

pub fn targets(r: &Report) -> Vec<Target> {
    let best = |f: fn(&Row) -> f64, smaller: bool| {
        r.rows.iter().map(|row| (f(row), row.poll)).reduce(|a, b| if (b.0 < a.0) == smaller { b } else { a })
    };
    let mut t = Vec::new();
    if let Some((gbs, poll)) = best(|row| row.stream_gbytes_per_s, false) {
        t.push(Target::new("stream >= 1 GB/s", format!("{gbs:.2} GB/s (poll {poll})"), gbs >= 1.0));
    }
    if let Some(row) = r.rows.iter().find(|row| row.poll != PollMode::Off).or(r.rows.first()) {
        t.push(Target::new(
            "0 exits per message in steady state, polling",
            format!("{:.3}/rtt, {:.3}/64K", row.exits_per_rtt, row.exits_per_chunk),
            row.exits_per_rtt < 0.01 && row.exits_per_chunk < 0.01,
        ));
    }
    let what = "round trip within 1.5x of net --rtt's";
    match (best(|row| row.rtt_us, true), r.net_rtt_us) {
        (Some((rtt, poll)), Some(net)) => {
            t.push(Target::new(what, format!("{rtt:.1} (poll {poll}) vs {net:.1} us"), rtt <= 1.5 * net))
        }
        _ => t.push(Target::new(what, "no tap here", false)),
    }
    t
}

pub fn table(r: &Report, opts: &Options) -> String {
    use std::fmt::Write;
    let mut s = format!(
        "vsock lab: the vsockecho guest, a host client through CONNECT {PORT} on the Unix socket; \
         {} round trips of {RTT_BYTES} B, a stream of {} MiB in 64 KiB writes, echoed\n",
        opts.rounds,
        opts.stream_bytes >> 20
    );
    let _ = writeln!(
        s,
        "{:<10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "poll", "rtt us", "p99 us", "exits/rtt", "GB/s", "exits/64K"
    );
    for row in &r.rows {
        let _ = writeln!(
            s,
            "{:<10} {:>10.1} {:>10.1} {:>10.3} {:>10.2} {:>10.3}",
            row.poll.to_string(),
            row.rtt_us,
            row.rtt_p99_us,
            row.exits_per_rtt,
            row.stream_gbytes_per_s,
            row.exits_per_chunk
        );
    }
    let net = r.net_rtt_us.map_or("no tap here".into(), |n| format!("{n:.1} us"));
    let _ = writeln!(s, "net --rtt round trip (poll off), same run: {net}");
    s + &targets_text(&targets(r))
}

pub fn run(opts: &Options) -> Result<Report, VsockBenchError> {
    if let Some(path) = &opts.json {
        std::fs::File::create(path).map_err(|e| WriteError(path.clone(), e))?;
    }
    let r = measure(opts)?;
    print_table(&table(&r, opts))?;
    if let Some(path) = &opts.json {
        let rows: Vec<Value> = r
            .rows
            .iter()
            .map(|row| {
                json!({"poll": row.poll.to_string(), "rtt_us": row.rtt_us, "rtt_p99_us": row.rtt_p99_us,
                       "exits_per_rtt": row.exits_per_rtt, "stream_gbytes_per_s": row.stream_gbytes_per_s,
                       "exits_per_64k": row.exits_per_chunk})
            })
            .collect();
        let value = json!({
            "bench": "vsock", "rounds": opts.rounds, "stream_bytes": opts.stream_bytes, "rows": rows,
            "net_rtt_us": r.net_rtt_us, "targets": targets_json(&targets(&r)),
        });
        std::fs::write(path, value.to_string() + "\n").map_err(|e| WriteError(path.clone(), e))?;
    }
    Ok(r)
}
