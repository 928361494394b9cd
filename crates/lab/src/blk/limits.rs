//! Rate limits held: the guest's random 4K reads at queue depth 32 under an operations
//! limit, and its sequential 64K reads under a bandwidth limit (Firecracker's token
//! buckets, crate exitless_vmm::rate_limiter), each measured by the guest over its window
//! and compared with the limit. Buckets hold 10 ms of tokens, so the full bucket a run
//! starts with is worth under 1% of a 2 s row.

use super::guest::{self, GuestRun};
use super::{BlkBenchError, Options, Workload};
use crate::report::Target;
use crate::stats::median;
use exitless_vmm::rate_limiter::Limits;
use serde_json::json;
use std::time::Duration;

/// How far from its limit a rate may be and still count as held.
const TOLERANCE: f64 = 0.05;
/// What a bucket holds: 10 ms worth of its rate.
const BUCKET_TIME: Duration = Duration::from_millis(10);

pub struct LimitRow {
    /// "ops" (requests per second) or "bandwidth" (MB/s).
    pub kind: &'static str,
    pub workload: Workload,
    pub limit: f64,
    pub measured: f64,
    /// Times a request waited for tokens (all runs).
    pub throttled: u64,
    pub verified: bool,
}

impl LimitRow {
    fn unit(&self) -> &'static str {
        if self.kind == "ops" {
            "IOPS"
        } else {
            "MB/s"
        }
    }

    fn ratio(&self) -> f64 {
        self.measured / self.limit
    }
}

pub fn measure(
    opts: &Options,
    file: &std::path::Path,
    tsc_khz: u64,
    stamp: &mut u64,
    progress: bool,
) -> Result<Vec<LimitRow>, BlkBenchError> {
    let cases = [
        ("ops", Workload::RandRead, Limits::per_second(opts.limit_iops, 0, BUCKET_TIME), opts.limit_iops as f64),
        (
            "bandwidth",
            Workload::SeqRead,
            Limits::per_second(0, opts.limit_bytes, BUCKET_TIME),
            opts.limit_bytes as f64 / 1e6,
        ),
    ];
    let mut rows = Vec::new();
    for (kind, workload, limits, limit) in cases {
        let (mut measured, mut throttled, mut verified) = (Vec::new(), 0, true);
        for r in 0..opts.repeat {
            if progress {
                eprint!("\rblk: {} qd 32 limited ({kind}) run {}/{} ...\x1b[K", workload.name(), r + 1, opts.repeat);
            }
            *stamp += 1;
            let result = guest::run(&GuestRun {
                file,
                workload,
                qd: 32,
                seconds: opts.seconds,
                stamp: *stamp,
                seed: *stamp * 0x9e37_79b9,
                tsc_khz,
                poll_us: opts.guest_poll_us,
                device_poll: exitless_vmm::poll::PollMode::default(),
                limits,
                timeout: opts.timeout,
            })?;
            let rate = match kind {
                "ops" => result.requests as f64 / result.seconds,
                _ => result.bytes as f64 / result.seconds / 1e6,
            };
            measured.push(rate);
            throttled += result.throttled;
            verified &= result.requests > 0 && result.failed == 0 && result.bad_sectors == 0;
        }
        rows.push(LimitRow { kind, workload, limit, measured: median(&measured), throttled, verified });
    }
    Ok(rows)
}

pub fn targets(rows: &[LimitRow]) -> Vec<Target> {
    rows.iter()
        .map(|r| {
            let held = (r.ratio() - 1.0).abs() <= TOLERANCE && r.throttled > 0 && r.verified;
            Target::new(
                format!("{} limit of {:.0} {} held within 5% ({} qd32)", r.kind, r.limit, r.unit(), r.workload.name()),
                format!("{:.0} {} ({:.3}x, {} throttled)", r.measured, r.unit(), r.ratio(), r.throttled),
                held,
            )
        })
        .collect()
}

pub fn table(rows: &[LimitRow]) -> String {
    let mut s = format!("\nrate limits (guest, qd 32, buckets of {} ms):\n", BUCKET_TIME.as_millis());
    s += &format!(
        "{:<13} {:<17} {:>10} {:>10} {:>8} {:>10} {:>9}\n",
        "workload", "limit", "limit", "measured", "ratio", "throttled", "verified"
    );
    for r in rows {
        s += &format!(
            "{:<13} {:<17} {:>10.1} {:>10.1} {:>8.3} {:>10} {:>9}\n",
            r.workload.name(),
            format!("{} ({})", r.kind, r.unit()),
            r.limit,
            r.measured,
            r.ratio(),
            r.throttled,
            if r.verified { "yes" } else { "NO" }
        );
    }
    s
}

pub fn json(rows: &[LimitRow]) -> serde_json::Value {
    rows.iter()
        .map(|r| {
            json!({"kind": r.kind, "workload": r.workload.name(), "unit": r.unit(), "limit": r.limit,
                   "measured": r.measured, "ratio": r.ratio(), "throttled": r.throttled, "verified": r.verified})
        })
        .collect()
}
