//! Firecracker's request bodies and config file, field for field. Unknown fields are
//! refused (as Firecracker does), so a misspelt option is an error, not a silent default.

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
    pub path_on_host: String,
    pub is_root_device: bool,
    #[serde(default)]
    pub is_read_only: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partuuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_type: Option<String>,
    /// "Async" (io_uring, the default here) or "Sync" (the thread pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_engine: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NetworkInterface {
    pub iface_id: String,
    pub host_dev_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_mac: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_rate_limiter: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_rate_limiter: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Logger {
    pub log_path: String,
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

/// `--config-file` and `GET /vm/config`: the whole pre-boot configuration.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    #[serde(rename = "boot-source", default, skip_serializing_if = "Option::is_none")]
    pub boot_source: Option<BootSource>,
    #[serde(rename = "machine-config", default)]
    pub machine_config: MachineConfig,
    #[serde(default)]
    pub drives: Vec<Drive>,
    #[serde(rename = "network-interfaces", default)]
    pub network_interfaces: Vec<NetworkInterface>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logger: Option<Logger>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Metrics>,
}
