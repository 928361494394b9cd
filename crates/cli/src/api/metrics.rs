//! Metrics as Firecracker writes them: one JSON object per line, to a file or FIFO given
//! by `--metrics-path` or `PUT /metrics`, every minute and on `FlushMetrics`, with
//! Firecracker's top-level groups and field names (so Kata's and firecracker-containerd's
//! readers parse them), what exitless counts filled in, and exitless's own `exits` group
//! (the exit profile). As in Firecracker, a counter is written as what it gained since the
//! line before; a gauge (a time, a count of faults) as it stands.

use super::sink;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

pub const PERIOD: std::time::Duration = std::time::Duration::from_secs(60);

/// Firecracker's groups of plain counters, each field starting at 0 (v1.16's names).
const GROUPS: &[(&str, &[&str])] = &[
    ("api_server", &["process_startup_time_us", "process_startup_time_cpu_us"]),
    ("deprecated_api", &["deprecated_http_api_calls"]),
    (
        "get_api_requests",
        &["instance_info_count", "machine_cfg_count", "mmds_count", "vmm_version_count", "hotplug_memory_count"],
    ),
    ("i8042", &["error_count", "missed_read_count", "missed_write_count", "read_count", "reset_count", "write_count"]),
    (
        "latencies_us",
        &[
            "full_create_snapshot",
            "diff_create_snapshot",
            "load_snapshot",
            "pause_vm",
            "resume_vm",
            "vmm_full_create_snapshot",
            "vmm_diff_create_snapshot",
            "vmm_load_snapshot",
            "vmm_pause_vm",
            "vmm_resume_vm",
        ],
    ),
    ("logger", &["missed_metrics_count", "metrics_fails", "missed_log_count", "rate_limited_log_count"]),
    (
        "mmds",
        &[
            "rx_accepted",
            "rx_accepted_err",
            "rx_accepted_unusual",
            "rx_bad_eth",
            "rx_invalid_token",
            "rx_no_token",
            "rx_count",
            "tx_bytes",
            "tx_count",
            "tx_errors",
            "tx_frames",
            "connections_created",
            "connections_destroyed",
        ],
    ),
    (
        "patch_api_requests",
        &[
            "drive_count",
            "drive_fails",
            "network_count",
            "network_fails",
            "machine_cfg_count",
            "machine_cfg_fails",
            "mmds_count",
            "mmds_fails",
            "hotplug_memory_count",
            "hotplug_memory_fails",
            "pmem_count",
            "pmem_fails",
        ],
    ),
    (
        "put_api_requests",
        &[
            "actions_count",
            "actions_fails",
            "boot_source_count",
            "boot_source_fails",
            "drive_count",
            "drive_fails",
            "logger_count",
            "logger_fails",
            "machine_cfg_count",
            "machine_cfg_fails",
            "cpu_cfg_count",
            "cpu_cfg_fails",
            "metrics_count",
            "metrics_fails",
            "network_count",
            "network_fails",
            "mmds_count",
            "mmds_fails",
            "vsock_count",
            "vsock_fails",
            "pmem_count",
            "pmem_fails",
            "serial_count",
            "serial_fails",
            "hotplug_memory_count",
            "hotplug_memory_fails",
        ],
    ),
    (
        "balloon",
        &[
            "activate_fails",
            "inflate_count",
            "stats_updates_count",
            "stats_update_fails",
            "deflate_count",
            "event_fails",
            "free_page_report_count",
            "free_page_report_freed",
            "free_page_report_fails",
            "free_page_hint_count",
            "free_page_hint_freed",
            "free_page_hint_fails",
        ],
    ),
    ("rtc", &["error_count", "missed_read_count", "missed_write_count"]),
    ("seccomp", &["num_faults"]),
    ("signals", &["sigbus", "sigsegv", "sigxfsz", "sigxcpu", "sigpipe", "sighup", "sigill"]),
    (
        "uart",
        &[
            "error_count",
            "flush_count",
            "missed_read_count",
            "missed_write_count",
            "read_count",
            "write_count",
            "rate_limiter_dropped_bytes",
        ],
    ),
    ("vcpu", &["exit_io_in", "exit_io_out", "exit_mmio_read", "exit_mmio_write", "failures", "kvmclock_ctrl_fails"]),
    ("vmm", &["panic_count"]),
    ("interrupts", &["triggers", "config_updates"]),
];

/// virtio-blk's fields, for `block` (all drives) and `block_<drive_id>`.
const BLOCK: &[&str] = &[
    "activate_fails",
    "cfg_fails",
    "no_avail_buffer",
    "event_fails",
    "execute_fails",
    "invalid_reqs_count",
    "flush_count",
    "queue_event_count",
    "rate_limiter_event_count",
    "update_count",
    "update_fails",
    "read_bytes",
    "write_bytes",
    "read_count",
    "write_count",
    "rate_limiter_throttled_events",
    "io_engine_throttled_events",
    "remaining_reqs_count",
];

/// A vhost-user device's fields (no group of all: Firecracker writes none).
const VHOST_USER: &[&str] =
    &["activate_fails", "cfg_fails", "init_time_us", "activate_time_us", "config_change_time_us"];

/// virtio-net's fields, for `net` (all NICs) and `net_<iface_id>`.
const NET: &[&str] = &[
    "activate_fails",
    "cfg_fails",
    "mac_address_updates",
    "no_rx_avail_buffer",
    "no_tx_avail_buffer",
    "event_fails",
    "rx_queue_event_count",
    "rx_event_rate_limiter_count",
    "rx_rate_limiter_throttled",
    "rx_tap_event_count",
    "rx_bytes_count",
    "rx_packets_count",
    "rx_fails",
    "rx_count",
    "tap_read_fails",
    "tap_write_fails",
    "tx_bytes_count",
    "tx_malformed_frames",
    "tx_fails",
    "tx_count",
    "tx_packets_count",
    "tx_queue_event_count",
    "tx_rate_limiter_event_count",
    "tx_rate_limiter_throttled",
    "tx_spoofed_mac_count",
    "tx_remaining_reqs_count",
];

/// Latency aggregates Firecracker writes as `{min_us, max_us, sum_us}`.
const LATENCIES: &[(&str, &str)] = &[
    ("vcpu", "exit_io_in_agg"),
    ("vcpu", "exit_io_out_agg"),
    ("vcpu", "exit_mmio_read_agg"),
    ("vcpu", "exit_mmio_write_agg"),
];

/// Written as they stand (Firecracker's `SharedStoreMetric`s), not as what they gained.
fn is_gauge(group: &str, field: &str) -> bool {
    matches!(group, "api_server" | "latencies_us" | "seccomp" | "vmm")
        || (group == "signals" && field != "sigpipe")
        || field.ends_with("_agg")
        || (group.starts_with("vhost_user_") && field.ends_with("_time_us"))
}

/// Counts from the running machine, each `(group, field, value)`, plus the exit profile.
#[derive(Default)]
pub struct Sample {
    pub counts: Vec<(String, &'static str, u64)>,
    /// Device groups (`block_ID`, `net_ID`) present even when nothing was counted.
    pub devices: Vec<(String, &'static [&'static str])>,
    pub exits: Value,
}

impl Sample {
    pub fn block(&mut self, id: &str, counts: &[(&'static str, u64)]) {
        self.device(format!("block_{id}"), "block", BLOCK, counts);
    }
    /// A vhost-user device's group, `vhost_user_<name>` (Firecracker's vhost_user_metrics.rs).
    pub fn vhost_user(&mut self, name: &str, counts: &[(&'static str, u64)]) {
        let group = format!("vhost_user_{name}");
        for &(field, n) in counts {
            self.counts.push((group.clone(), field, n));
        }
        self.devices.push((group, VHOST_USER));
    }
    pub fn net(&mut self, id: &str, counts: &[(&'static str, u64)]) {
        self.device(format!("net_{id}"), "net", NET, counts);
    }
    /// One device's counts, under its own group and added into the group of all.
    fn device(&mut self, group: String, all: &str, fields: &'static [&'static str], counts: &[(&'static str, u64)]) {
        for &(field, n) in counts {
            self.counts.push((group.clone(), field, n));
            self.counts.push((all.to_string(), field, n));
        }
        self.devices.push((group, fields));
    }
    pub fn count(&mut self, group: &str, field: &'static str, n: u64) {
        self.counts.push((group.to_string(), field, n));
    }
}

#[derive(Default)]
pub struct Metrics {
    file: Mutex<Option<File>>,
    /// Every counter's value when the last line was written.
    last: Mutex<BTreeMap<(String, String), u64>>,
    /// API requests by Firecracker's group and field.
    requests: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    startup_us: AtomicU64,
    startup_cpu_us: AtomicU64,
    missed_lines: AtomicU64,
    failed_writes: AtomicU64,
}

impl Metrics {
    pub fn open(&self, path: &str) -> Result<(), String> {
        let file = sink::open(path).map_err(|e| format!("Cannot open the metrics file {path}: {e}"))?;
        *exitless_vmm::sync::lock(&self.file) = Some(file);
        Ok(())
    }

    pub fn is_open(&self) -> bool {
        exitless_vmm::sync::lock(&self.file).is_some()
    }

    /// The API is ready: the process's start-up time (wall and CPU), as Firecracker reports it.
    pub fn api_ready(&self) {
        let since = |clock| {
            let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: clock_gettime writes one timespec.
            unsafe { libc::clock_gettime(clock, &mut t) };
            t.tv_sec as u64 * 1_000_000 + t.tv_nsec as u64 / 1000
        };
        self.startup_cpu_us.store(since(libc::CLOCK_PROCESS_CPUTIME_ID), Ordering::Relaxed);
        if let Some(started) = process_start_us() {
            let now = since(libc::CLOCK_BOOTTIME);
            self.startup_us.store(now.saturating_sub(started), Ordering::Relaxed);
        }
    }

    /// Counts a request in Firecracker's `get/put/patch_api_requests` groups.
    pub fn count_request(&self, method: &str, path: &str, status: u16) {
        let Some((group, name)) = request_counter(method, path) else { return };
        let mut requests = exitless_vmm::sync::lock(&self.requests);
        *requests.entry((group, name.0)).or_default() += 1;
        if status >= 400 {
            if let Some(fails) = name.1 {
                *requests.entry((group, fails)).or_default() += 1;
            }
        }
    }

    /// Writes one line from `sample`; a line the file would not take is counted and dropped.
    pub fn write(&self, sample: Sample) -> Result<(), String> {
        let mut file = exitless_vmm::sync::lock(&self.file);
        let Some(file) = file.as_mut() else { return Err("No metrics file: PUT /metrics first.".into()) };
        let mut line = self.line(sample).to_string();
        line.push('\n');
        if !sink::write_line(file, line.as_bytes()) {
            self.missed_lines.fetch_add(1, Ordering::Relaxed);
            self.failed_writes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The JSON object of one line: every group, counters as gained since the last line.
    fn line(&self, mut sample: Sample) -> Value {
        sample.count("api_server", "process_startup_time_us", self.startup_us.load(Ordering::Relaxed));
        sample.count("api_server", "process_startup_time_cpu_us", self.startup_cpu_us.load(Ordering::Relaxed));
        sample.count("logger", "missed_metrics_count", self.missed_lines.load(Ordering::Relaxed));
        sample.count("logger", "metrics_fails", self.failed_writes.load(Ordering::Relaxed));
        sample.count("logger", "missed_log_count", super::logging::MISSED_LINES.load(Ordering::Relaxed));
        sample.count("uart", "rate_limiter_dropped_bytes", super::serial::DROPPED_BYTES.load(Ordering::Relaxed));
        sample.count("logger", "rate_limited_log_count", super::log_rate::RATE_LIMITED.load(Ordering::Relaxed));
        for (&(group, field), &n) in exitless_vmm::sync::lock(&self.requests).iter() {
            sample.count(group, field, n);
        }
        let mut groups: Map<String, Value> = Map::new();
        let zeros = |fields: &[&str]| fields.iter().map(|f| (f.to_string(), json!(0))).collect::<Map<_, _>>();
        for &(group, fields) in GROUPS {
            groups.insert(group.into(), Value::Object(zeros(fields)));
        }
        groups.insert("block".into(), Value::Object(zeros(BLOCK)));
        groups.insert("net".into(), Value::Object(zeros(NET)));
        for (group, fields) in &sample.devices {
            groups.insert(group.clone(), Value::Object(zeros(fields)));
        }
        for &(group, field) in LATENCIES {
            groups[group][field] = json!({"min_us": 0, "max_us": 0, "sum_us": 0});
        }
        let mut totals: BTreeMap<(String, String), u64> = BTreeMap::new();
        for (group, field, n) in sample.counts {
            *totals.entry((group, field.to_string())).or_default() += n;
        }
        let mut last = exitless_vmm::sync::lock(&self.last);
        for ((group, field), n) in totals {
            let value = match is_gauge(&group, &field) {
                true => n,
                false => n.saturating_sub(last.get(&(group.clone(), field.clone())).copied().unwrap_or(0)),
            };
            last.insert((group.clone(), field.clone()), n);
            if let Some(Value::Object(g)) = groups.get_mut(&group) {
                g.insert(field, json!(value));
            }
        }
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let mut line = Map::new();
        line.insert("utc_timestamp_ms".into(), json!(u64::try_from(now.as_millis()).unwrap_or(u64::MAX)));
        line.extend(groups);
        line.insert("exits".into(), sample.exits);
        Value::Object(line)
    }
}

/// A request's counter in Firecracker's groups, and its failure counter if it has one.
fn request_counter(method: &str, path: &str) -> Option<(&'static str, (&'static str, Option<&'static str>))> {
    let first = path.trim_start_matches('/').split('/').next().unwrap_or_default();
    let pair = |count, fails| Some((count, Some(fails)));
    let (group, names) = match method {
        "GET" => (
            "get_api_requests",
            match first {
                "" => Some(("instance_info_count", None)),
                "machine-config" => Some(("machine_cfg_count", None)),
                "mmds" => Some(("mmds_count", None)),
                "version" => Some(("vmm_version_count", None)),
                _ => None,
            },
        ),
        "PUT" => (
            "put_api_requests",
            match first {
                "actions" => pair("actions_count", "actions_fails"),
                "boot-source" => pair("boot_source_count", "boot_source_fails"),
                "drives" => pair("drive_count", "drive_fails"),
                "logger" => pair("logger_count", "logger_fails"),
                "machine-config" => pair("machine_cfg_count", "machine_cfg_fails"),
                "cpu-config" => pair("cpu_cfg_count", "cpu_cfg_fails"),
                "metrics" => pair("metrics_count", "metrics_fails"),
                "network-interfaces" => pair("network_count", "network_fails"),
                "mmds" => pair("mmds_count", "mmds_fails"),
                "vsock" => pair("vsock_count", "vsock_fails"),
                _ => None,
            },
        ),
        "PATCH" => (
            "patch_api_requests",
            match first {
                "drives" => pair("drive_count", "drive_fails"),
                "network-interfaces" => pair("network_count", "network_fails"),
                "machine-config" => pair("machine_cfg_count", "machine_cfg_fails"),
                "mmds" => pair("mmds_count", "mmds_fails"),
                _ => None,
            },
        ),
        _ => return None,
    };
    names.map(|n| (group, n))
}

/// When this process started, in CLOCK_BOOTTIME microseconds (/proc/self/stat's start time).
fn process_start_us() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let ticks: u64 = stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()?;
    // SAFETY: sysconf reads a constant.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok().filter(|&h| h > 0)?;
    Some(ticks * 1_000_000 / hz)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_has_firecrackers_groups_and_counters_as_gained_since_the_last() {
        let m = Metrics::default();
        m.count_request("PUT", "/drives/root", 204);
        m.count_request("PUT", "/drives/x", 400);
        m.count_request("GET", "/", 200);
        let mut s = Sample::default();
        s.block("root", &[("read_count", 5), ("read_bytes", 5 * 512)]);
        s.net("eth0", &[("tx_packets_count", 3)]);
        s.count("vcpu", "exit_io_out", 7);
        let line = m.line(s);
        for group in [
            "api_server",
            "block",
            "block_root",
            "get_api_requests",
            "i8042",
            "latencies_us",
            "logger",
            "mmds",
            "net",
            "net_eth0",
            "patch_api_requests",
            "put_api_requests",
            "seccomp",
            "signals",
            "uart",
            "vcpu",
            "vmm",
        ] {
            assert!(line[group].is_object(), "{group} missing: {line}");
        }
        assert_eq!(line["put_api_requests"]["drive_count"], 2);
        assert_eq!(line["put_api_requests"]["drive_fails"], 1);
        assert_eq!(line["get_api_requests"]["instance_info_count"], 1);
        assert_eq!(line["block_root"]["read_count"], 5);
        assert_eq!(line["block"]["read_bytes"], 2560);
        assert_eq!(line["net"]["tx_packets_count"], 3);
        assert_eq!(line["vcpu"]["exit_io_out"], 7);
        assert_eq!(line["vcpu"]["exit_io_in_agg"]["sum_us"], 0);
        assert!(line["utc_timestamp_ms"].as_u64().unwrap() > 1_700_000_000_000);
        // The next line counts only what was gained since; gauges stand as they are.
        m.api_ready();
        let mut s = Sample::default();
        s.block("root", &[("read_count", 8)]);
        let line = m.line(s);
        assert_eq!(line["block_root"]["read_count"], 3);
        assert_eq!(line["put_api_requests"]["drive_count"], 0);
        assert!(line["api_server"]["process_startup_time_cpu_us"].as_u64().unwrap() > 0);
        let again = m.line(Sample::default());
        assert_eq!(
            again["api_server"]["process_startup_time_cpu_us"],
            line["api_server"]["process_startup_time_cpu_us"]
        );
    }

    #[test]
    fn requests_are_counted_under_firecrackers_names() {
        assert_eq!(
            request_counter("PATCH", "/drives/a"),
            Some(("patch_api_requests", ("drive_count", Some("drive_fails"))))
        );
        assert_eq!(request_counter("GET", "/version"), Some(("get_api_requests", ("vmm_version_count", None))));
        assert_eq!(request_counter("DELETE", "/drives/a"), None);
        assert_eq!(request_counter("PUT", "/nope"), None);
    }
}
