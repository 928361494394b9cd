//! `bench peers`: exitless beside Firecracker and Cloud Hypervisor, the same guest (the
//! `wait` payload) under each, each driven through its own API as its users drive it,
//! interleaved run by run: spawn to API ready, spawn to the guest's first line, and the
//! VMM's memory beyond guest RAM once the guest runs. A peer not given is skipped.

use crate::api_client::{expect_ok, listening};
use crate::stats::median;
use serde_json::{json, Value};
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What the guest prints once it runs.
const FIRST_LINE: &str = "wait: running";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vmm {
    Exitless,
    Firecracker,
    CloudHypervisor,
}

impl Vmm {
    pub fn name(self) -> &'static str {
        match self {
            Vmm::Exitless => "exitless",
            Vmm::Firecracker => "firecracker",
            Vmm::CloudHypervisor => "cloud-hypervisor",
        }
    }
}

pub struct Options {
    pub exitless: PathBuf,
    pub firecracker: Option<PathBuf>,
    pub cloud_hypervisor: Option<PathBuf>,
    pub runs: u32,
    pub mem_mib: u32,
    pub timeout: Duration,
}

/// A table row: its name, what it reads from a sample, and its decimals.
type Metric = (&'static str, fn(&Sample) -> f64, usize);

/// One start of one VMM.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    pub api_ready_ms: f64,
    pub first_line_ms: f64,
    pub rss_kib: u64,
    pub pss_kib: u64,
    pub anon_kib: u64,
}

/// Each VMM's version and samples, in the order given.
pub struct Report {
    pub mem_mib: u32,
    pub vmms: Vec<(Vmm, String, Vec<Sample>)>,
}

#[derive(Debug, thiserror::Error)]
pub enum PeersError {
    #[error("cannot write the guest image to {0}")]
    Image(PathBuf, #[source] std::io::Error),
    #[error("{vmm}: {what}")]
    Start { vmm: &'static str, what: String },
}

pub fn run(opts: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report, PeersError> {
    let dir = std::env::temp_dir().join(format!("exitless-peers-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let kernel = dir.join("wait.elf");
    let elf = exitless_payloads::find("wait").map(|p| p.elf).unwrap_or_default();
    std::fs::write(&kernel, elf).map_err(|e| PeersError::Image(kernel.clone(), e))?;
    let mut vmms = vec![(Vmm::Exitless, opts.exitless.clone())];
    vmms.extend(opts.firecracker.clone().map(|p| (Vmm::Firecracker, p)));
    vmms.extend(opts.cloud_hypervisor.clone().map(|p| (Vmm::CloudHypervisor, p)));
    let mut report =
        Report { mem_mib: opts.mem_mib, vmms: vmms.iter().map(|(v, p)| (*v, version(p), Vec::new())).collect() };
    for run in 0..opts.runs {
        for (i, (vmm, exe)) in vmms.iter().enumerate() {
            let sample =
                start(*vmm, exe, &dir, &kernel, opts).map_err(|what| PeersError::Start { vmm: vmm.name(), what })?;
            progress(&format!(
                "run {}/{} {}: first line {:.1} ms, {} KiB resident",
                run + 1,
                opts.runs,
                vmm.name(),
                sample.first_line_ms,
                sample.rss_kib
            ));
            report.vmms[i].2.push(sample);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(report)
}

/// `PATH --version`'s first line.
fn version(exe: &Path) -> String {
    let out = Command::new(exe).arg("--version").stderr(Stdio::null()).output();
    out.ok().and_then(|o| String::from_utf8_lossy(&o.stdout).lines().next().map(str::to_string)).unwrap_or_default()
}

/// Spawns `vmm`, boots the guest through its API, waits for the guest's first line and
/// reads the VMM's memory; then kills it.
fn start(vmm: Vmm, exe: &Path, dir: &Path, kernel: &Path, opts: &Options) -> Result<Sample, String> {
    let sock = dir.join(format!("{}.sock", vmm.name()));
    let _ = std::fs::remove_file(&sock);
    let mut cmd = Command::new(exe);
    match vmm {
        Vmm::Exitless | Vmm::Firecracker => cmd.arg("--api-sock").arg(&sock),
        Vmm::CloudHypervisor => cmd.arg("--api-socket").arg(&sock),
    };
    let spawned = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let result = boot(vmm, &mut child, &sock, kernel, opts, spawned);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&sock);
    result
}

fn boot(
    vmm: Vmm,
    child: &mut Child,
    sock: &Path,
    kernel: &Path,
    opts: &Options,
    spawned: Instant,
) -> Result<Sample, String> {
    let stdout = child.stdout.take().ok_or("no stdout")?;
    while !listening(sock) {
        if spawned.elapsed() > opts.timeout {
            return Err(format!("its API socket did not appear within {:?}", opts.timeout));
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("it exited ({status}) before serving its API"));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let api_ready = spawned.elapsed();
    let mem = u64::from(opts.mem_mib);
    match vmm {
        Vmm::Exitless | Vmm::Firecracker => {
            expect_ok(sock, "PUT", "/machine-config", Some(&json!({"vcpu_count": 1, "mem_size_mib": mem})))?;
            expect_ok(sock, "PUT", "/boot-source", Some(&json!({"kernel_image_path": kernel})))?;
            expect_ok(sock, "PUT", "/actions", Some(&json!({"action_type": "InstanceStart"})))?;
        }
        Vmm::CloudHypervisor => {
            let config = json!({
                "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
                "memory": {"size": mem << 20},
                "payload": {"kernel": kernel},
                "serial": {"mode": "Tty"},
                "console": {"mode": "Off"},
            });
            expect_ok(sock, "PUT", "/api/v1/vm.create", Some(&config))?;
            expect_ok(sock, "PUT", "/api/v1/vm.boot", None)?;
        }
    }
    let mut console = BufReader::new(stdout);
    crate::api_client::wait_for_line(&mut console, FIRST_LINE)?;
    let first_line = spawned.elapsed();
    let (rss_kib, pss_kib, anon_kib) = memory_beyond_guest(child.id(), mem << 20).ok_or("cannot read its smaps")?;
    Ok(Sample {
        api_ready_ms: api_ready.as_secs_f64() * 1e3,
        first_line_ms: first_line.as_secs_f64() * 1e3,
        rss_kib,
        pss_kib,
        anon_kib,
    })
}

/// Resident, proportional and anonymous KiB of process `pid`, less every mapping at least
/// as large as guest RAM (`guest_bytes`): what the VMM costs beyond the memory it gives.
pub fn memory_beyond_guest(pid: u32, guest_bytes: u64) -> Option<(u64, u64, u64)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let kib = |v: &str| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok();
    let (mut rss, mut pss, mut anon, mut guest) = (0, 0, 0, false);
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((start, end)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
            let size = u64::from_str_radix(end, 16).ok()?.saturating_sub(u64::from_str_radix(start, 16).ok()?);
            guest = size >= guest_bytes;
        } else if !guest {
            let value = || kib(line.split_once(':').map_or("", |(_, v)| v));
            match first {
                "Rss:" => rss += value()?,
                "Pss:" => pss += value()?,
                "Anonymous:" => anon += value()?,
                _ => {}
            }
        }
    }
    Some((rss, pss, anon))
}

impl Report {
    fn median(&self, vmm: Vmm, f: impl Fn(&Sample) -> f64) -> Option<f64> {
        let (_, _, samples) = self.vmms.iter().find(|(v, _, _)| *v == vmm)?;
        Some(median(&samples.iter().map(f).collect::<Vec<_>>()))
    }

    /// The targets: start and resident memory at most Firecracker's, anonymous
    /// memory at most 300 KiB.
    pub fn targets(&self) -> Vec<(String, String, Option<bool>)> {
        let me = |f: fn(&Sample) -> f64| self.median(Vmm::Exitless, f).unwrap_or(f64::NAN);
        let fc = |f: fn(&Sample) -> f64| self.median(Vmm::Firecracker, f);
        let vs = |name: &str, f: fn(&Sample) -> f64, unit: &str| match fc(f) {
            Some(theirs) => (
                format!("{name} <= Firecracker's"),
                format!("{:.1} vs {theirs:.1} {unit}", me(f)),
                Some(me(f) <= theirs),
            ),
            None => (format!("{name} <= Firecracker's"), "no Firecracker given".into(), None),
        };
        vec![
            vs("spawn to first line", |s| s.first_line_ms, "ms"),
            vs("resident beyond guest RAM", |s| s.rss_kib as f64, "KiB"),
            (
                "anonymous beyond guest RAM <= 300 KiB".into(),
                format!("{:.0} KiB", me(|s| s.anon_kib as f64)),
                Some(me(|s| s.anon_kib as f64) <= 300.0),
            ),
        ]
    }

    pub fn table(&self, runs: u32) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ =
            writeln!(s, "peers lab: the wait payload, 1 vCPU, {} MiB, {runs} runs interleaved (medians)", self.mem_mib);
        let _ = write!(s, "  {:<40}", "metric");
        for (vmm, _, _) in &self.vmms {
            let _ = write!(s, " {:>16}", vmm.name());
        }
        s.push('\n');
        let rows: [Metric; 5] = [
            ("spawn to API ready (ms)", |x| x.api_ready_ms, 1),
            ("spawn to the guest's first line (ms)", |x| x.first_line_ms, 1),
            ("resident beyond guest RAM (KiB)", |x| x.rss_kib as f64, 0),
            ("proportional beyond guest RAM (KiB)", |x| x.pss_kib as f64, 0),
            ("anonymous beyond guest RAM (KiB)", |x| x.anon_kib as f64, 0),
        ];
        for (name, f, digits) in rows {
            let _ = write!(s, "  {name:<40}");
            for (vmm, _, _) in &self.vmms {
                let _ = write!(s, " {:>16.*}", digits, self.median(*vmm, f).unwrap_or(f64::NAN));
            }
            s.push('\n');
        }
        for (vmm, version, _) in &self.vmms {
            let _ = writeln!(s, "  {}: {version}", vmm.name());
        }
        let _ = writeln!(s, "targets:");
        for (target, measured, met) in self.targets() {
            let verdict = match met {
                Some(true) => "met",
                Some(false) => "NOT met",
                None => "skipped",
            };
            let _ = writeln!(s, "  {target:<44} {measured:>24}  {verdict}");
        }
        s
    }

    pub fn json(&self) -> Value {
        let vmms: serde_json::Map<String, Value> = self
            .vmms
            .iter()
            .map(|(vmm, version, _)| {
                let m = |f: fn(&Sample) -> f64| self.median(*vmm, f);
                (
                    vmm.name().to_string(),
                    json!({
                        "version": version,
                        "api_ready_ms": m(|s| s.api_ready_ms),
                        "first_line_ms": m(|s| s.first_line_ms),
                        "rss_kib": m(|s| s.rss_kib as f64),
                        "pss_kib": m(|s| s.pss_kib as f64),
                        "anon_kib": m(|s| s.anon_kib as f64),
                    }),
                )
            })
            .collect();
        let targets: Vec<Value> = self
            .targets()
            .into_iter()
            .map(|(target, measured, met)| json!({"target": target, "measured": measured, "met": met}))
            .collect();
        json!({"mem_mib": self.mem_mib, "vmms": vmms, "targets": targets})
    }
}
