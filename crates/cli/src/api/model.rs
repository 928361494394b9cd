//! Firecracker's request bodies and config file, field for field (its swagger, v1.16).
//! Unknown fields are refused (as Firecracker does), so a misspelt option is an error, not
//! a silent default; `null` means the field is absent, as in the files Firecracker writes.

use super::devices::parts::{Sections, LIST_KEYS as DEVICE_LIST_KEYS};
use super::null::null_is_default;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MachineConfig {
    pub vcpu_count: u8,
    pub mem_size_mib: u64,
    #[serde(default)]
    pub smt: bool,
    #[serde(default)]
    pub track_dirty_pages: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_template: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub huge_pages: Option<String>,
}

impl Default for MachineConfig {
    /// Firecracker's defaults: one vCPU, 128 MiB.
    fn default() -> Self {
        MachineConfig {
            vcpu_count: 1,
            mem_size_mib: 128,
            smt: false,
            track_dirty_pages: false,
            cpu_template: None,
            huge_pages: None,
        }
    }
}

/// `PATCH /machine-config`: any subset of the fields.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineConfigUpdate {
    pub vcpu_count: Option<u8>,
    pub mem_size_mib: Option<u64>,
    pub smt: Option<bool>,
    pub track_dirty_pages: Option<bool>,
    pub cpu_template: Option<String>,
    pub huge_pages: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BootSource {
    pub kernel_image_path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_args: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Drive {
    pub drive_id: String,
    /// The backing file; absent for a vhost-user drive (`socket`), as Firecracker's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_on_host: Option<String>,
    pub is_root_device: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_read_only: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partuuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_type: Option<String>,
    /// "Async" (io_uring, the default here) or "Sync" (the thread pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_engine: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<RateLimiter>,
    /// A vhost-user-blk backend's socket (then path_on_host, is_read_only, rate_limiter
    /// and io_engine must be absent, as Firecracker's `VhostUserBlockConfig` says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
}

/// `PATCH /drives/{id}`: a new backing file and/or new rate limits for a running guest.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialDrive {
    pub drive_id: String,
    #[serde(default)]
    pub path_on_host: Option<String>,
    #[serde(default)]
    pub rate_limiter: Option<RateLimiter>,
}

/// A token bucket: `size` tokens, refilled over `refill_time` ms, plus a first burst. A
/// size or refill time of 0 (or `{}`, which some clients send) limits nothing.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TokenBucket {
    #[serde(default)]
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_time_burst: Option<u64>,
    #[serde(default)]
    pub refill_time: u64,
}

impl TokenBucket {
    /// The VMM's bucket (Firecracker's `refill_time` is in milliseconds).
    pub fn bucket(&self) -> exitless_vmm::rate_limiter::Bucket {
        exitless_vmm::rate_limiter::Bucket {
            size: self.size,
            one_time_burst: self.one_time_burst.unwrap_or(0),
            refill_time: std::time::Duration::from_millis(self.refill_time),
        }
    }
}

/// Firecracker's rate limiter: a bandwidth (bytes) and an ops bucket, each optional.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RateLimiter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<TokenBucket>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops: Option<TokenBucket>,
}

impl RateLimiter {
    /// The device's limits (refill times are in milliseconds).
    pub fn limits(&self) -> exitless_vmm::rate_limiter::Limits {
        exitless_vmm::rate_limiter::Limits {
            bandwidth: self.bandwidth.as_ref().map(TokenBucket::bucket),
            ops: self.ops.as_ref().map(TokenBucket::bucket),
        }
    }
}

/// The limits of an optional limiter (none: unlimited).
pub fn limits(r: Option<&RateLimiter>) -> exitless_vmm::rate_limiter::Limits {
    r.map(RateLimiter::limits).unwrap_or_default()
}

/// `PUT /vsock`: Firecracker's vsock device (`vsock_id` is accepted and ignored, as
/// Firecracker has deprecated it).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Vsock {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock_id: Option<String>,
    pub guest_cid: u32,
    pub uds_path: String,
}

/// `PUT /snapshot/create` on a paused microVM.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotCreate {
    #[serde(default)]
    pub snapshot_type: Option<SnapshotType>,
    pub snapshot_path: String,
    pub mem_file_path: String,
    /// Firecracker's deprecated field: accepted, nothing to choose.
    #[serde(default)]
    pub version: Option<String>,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub enum SnapshotType {
    Full,
    Diff,
}

/// `PUT /snapshot/load` on a VMM nothing was configured in.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotLoad {
    pub snapshot_path: String,
    /// Firecracker's older way to name the memory file.
    #[serde(default)]
    pub mem_file_path: Option<String>,
    #[serde(default)]
    pub mem_backend: Option<MemBackend>,
    #[serde(default)]
    pub enable_diff_snapshots: Option<bool>,
    #[serde(default)]
    pub track_dirty_pages: Option<bool>,
    #[serde(default)]
    pub resume_vm: Option<bool>,
    #[serde(default)]
    pub network_overrides: Option<Vec<NetworkOverride>>,
    #[serde(default)]
    pub vsock_override: Option<VsockOverride>,
    #[serde(default)]
    pub clock_realtime: Option<bool>,
}

/// A restored NIC on another tap than the snapshotted one's (a clone on another host).
/// Other keys are ignored, as Firecracker's struct (without deny_unknown_fields) does.
#[derive(Clone, Debug, Deserialize)]
pub struct NetworkOverride {
    pub iface_id: String,
    pub host_dev_name: String,
}

/// A restored vsock device on another Unix socket than the snapshotted one's.
#[derive(Clone, Debug, Deserialize)]
pub struct VsockOverride {
    pub uds_path: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemBackend {
    pub backend_type: MemBackendType,
    pub backend_path: String,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub enum MemBackendType {
    File,
    Uffd,
}

/// `PUT /mmds/config`: the NICs that answer MMDS, its address and version.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MmdsConfig {
    #[serde(default)]
    pub version: MmdsVersion,
    pub network_interfaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4_address: Option<std::net::Ipv4Addr>,
    #[serde(default)]
    pub imds_compat: bool,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub enum MmdsVersion {
    #[default]
    V1,
    V2,
}

/// `PUT /entropy`: a virtio-rng device, optionally rate limited.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Entropy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<RateLimiter>,
}

/// `PUT /balloon` (Firecracker's `BalloonDeviceConfig`; `GET /balloon` answers with it).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Balloon {
    pub amount_mib: u32,
    pub deflate_on_oom: bool,
    #[serde(default)]
    pub stats_polling_interval_s: u16,
    #[serde(default)]
    pub free_page_hinting: bool,
    #[serde(default)]
    pub free_page_reporting: bool,
}

/// `PUT /pmem/{id}` (Firecracker's `PmemConfig`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Pmem {
    pub id: String,
    pub path_on_host: String,
    #[serde(default)]
    pub root_device: bool,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub rate_limiter: Option<RateLimiter>,
}

/// `PATCH /pmem/{id}`: only the rate limiter changes.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PmemUpdate {
    pub id: String,
    pub rate_limiter: Option<RateLimiter>,
}

/// `PUT /hotplug/memory` and the config file's `memory-hotplug` (Firecracker's
/// `MemoryHotplugConfig`; its defaults: 2 MiB blocks, 128 MiB slots).
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MemoryHotplug {
    pub total_size_mib: u64,
    #[serde(default = "default_block_size_mib")]
    pub block_size_mib: u64,
    #[serde(default = "default_slot_size_mib")]
    pub slot_size_mib: u64,
}

fn default_block_size_mib() -> u64 {
    exitless_vmm::virtio::mem::DEFAULT_BLOCK_SIZE_MIB
}

fn default_slot_size_mib() -> u64 {
    exitless_vmm::virtio::mem::DEFAULT_SLOT_SIZE_MIB
}

/// `PATCH /hotplug/memory`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MemoryHotplugUpdate {
    pub requested_size_mib: u64,
}

/// `PATCH /balloon`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BalloonUpdate {
    pub amount_mib: u32,
}

/// `PATCH /balloon/statistics`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BalloonStatsUpdate {
    pub stats_polling_interval_s: u16,
}

/// `PATCH /balloon/hinting/start` (an empty body: acknowledge on stop).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub struct StartHinting {
    #[serde(default = "yes")]
    pub acknowledge_on_stop: bool,
}

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NetworkInterface {
    pub iface_id: String,
    pub host_dev_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_mac: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_rate_limiter: Option<RateLimiter>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_rate_limiter: Option<RateLimiter>,
    /// Advertised to the guest with VIRTIO_NET_F_MTU (68 to 65535).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u16>,
    /// exitless's own: `false` offers no checksum or segmentation offloads (default on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offloads: Option<bool>,
}

/// `PATCH /network-interfaces/{id}`: new rate limits.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialNetworkInterface {
    pub iface_id: String,
    #[serde(default)]
    pub rx_rate_limiter: Option<RateLimiter>,
    #[serde(default)]
    pub tx_rate_limiter: Option<RateLimiter>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Logger {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub show_level: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub show_log_origin: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Metrics {
    pub metrics_path: String,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub enum ActionType {
    InstanceStart,
    SendCtrlAltDel,
    FlushMetrics,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    pub action_type: ActionType,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub enum VmState {
    Paused,
    Resumed,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vm {
    pub state: VmState,
}

/// `--config-file` and `GET /vm/config`: the whole pre-boot configuration. Every key of
/// Firecracker's file parses. `cpu-config` is kept as JSON: a file's path or a template
/// when read, the template itself once configured (crate::api::cpu_config).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct VmConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_source: Option<BootSource>,
    #[serde(default, deserialize_with = "null_is_default")]
    pub machine_config: MachineConfig,
    #[serde(default, deserialize_with = "null_is_default")]
    pub drives: Vec<Drive>,
    #[serde(default, deserialize_with = "null_is_default")]
    pub network_interfaces: Vec<NetworkInterface>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logger: Option<Logger>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Metrics>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_config: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balloon: Option<Balloon>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock: Option<Vsock>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmds_config: Option<MmdsConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entropy: Option<Entropy>,
    #[serde(default, deserialize_with = "null_is_default", skip_serializing_if = "Vec::is_empty")]
    pub pmem: Vec<Pmem>,
    /// The keys device modules own (api/devices/parts.rs): exitless's extensions.
    #[serde(flatten)]
    pub devices: Sections,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_hotplug: Option<MemoryHotplug>,
    /// Firecracker's `PUT /serial` (its config file has no such section; exitless takes
    /// one, as it takes every other PUT's body).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<Serial>,
}

/// `PUT /serial`: where the guest's console goes and a byte rate limit on it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Serial {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial_out_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<TokenBucket>,
}

/// The most devices of one kind a machine holds: a PCI bus has 32 slots (MMIO fewer lines).
pub const MAX_DEVICES: usize = 32;
/// At most this many network interfaces (each takes a PCI slot and a device thread).
pub const MAX_NICS: u8 = 8;

impl VmConfig {
    /// A list longer than any machine holds, if one is: named. Such a configuration can
    /// never be built, and its lists are searched by id for each other's entries (MMDS
    /// interfaces, network overrides): a crafted state file listing millions would cost
    /// their product before the build refused it. Network interfaces are held to the
    /// API's own limit (PUT /network-interfaces), which a state file skipped.
    pub fn too_many(&self) -> Option<String> {
        let mmds = self.mmds_config.as_ref().map_or(0, |m| m.network_interfaces.len());
        [
            ("drives", self.drives.len(), MAX_DEVICES),
            ("network-interfaces", self.network_interfaces.len(), usize::from(MAX_NICS)),
            ("pmem devices", self.pmem.len(), MAX_DEVICES),
            ("MMDS network interfaces", mmds, MAX_DEVICES),
        ]
        .into_iter()
        .chain(self.devices.counts().into_iter().map(|(what, n)| (what, n, MAX_DEVICES)))
        .find(|&(_, n, most)| n > most)
        .map(|(what, n, most)| format!("{n} {what}, where a microVM holds at most {most}"))
    }
}

/// The keys whose values are lists in Firecracker's schema; everywhere else a list is
/// refused. serde would otherwise take `[1, 64]` for `{"vcpu_count": 1, "mem_size_mib": 64}`.
const LIST_KEYS: &[&str] = &[
    "drives",
    "network-interfaces",
    "network_interfaces",
    "pmem",
    "network_overrides",
    // A CPU template's (`cpu-config`).
    "kvm_capabilities",
    "cpuid_modifiers",
    "modifiers",
    "msr_modifiers",
];

/// Whether `key` holds a list: Firecracker's or a device module's (api/devices/parts.rs).
fn is_list_key(key: &str) -> bool {
    LIST_KEYS.contains(&key) || DEVICE_LIST_KEYS.contains(&key)
}

/// Checks that `value` is an object whose objects are objects: a list only under a key
/// that holds one (LIST_KEYS), and only of objects or strings.
pub fn check_shape(value: &serde_json::Value) -> Result<(), String> {
    fn walk(value: &serde_json::Value, key: &str) -> Result<(), String> {
        use serde_json::Value;
        match value {
            Value::Object(map) => map.iter().try_for_each(|(k, v)| walk(v, k)),
            Value::Array(items) if is_list_key(key) => items.iter().try_for_each(|v| match v {
                Value::Object(_) | Value::String(_) => walk(v, key),
                _ => Err(format!("{key} must be a list of objects or strings")),
            }),
            Value::Array(_) => Err(format!("{key} must be an object, not a list")),
            _ => Ok(()),
        }
    }
    match value {
        serde_json::Value::Object(_) => walk(value, ""),
        _ => Err("the body must be a JSON object".into()),
    }
}

/// Parses a request body or config file: JSON, shaped as [`check_shape`] wants, then `T`.
/// `T` is read from the text again, not from the parsed value: a JSON map keeps one of two
/// equal keys, where serde's structs refuse a field given twice, as Firecracker's do.
pub fn from_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    check_shape(&value)?;
    serde_json::from_slice(bytes).map_err(|e| e.to_string())
}
