//! What device modules add to the structs others own: their keys of the configuration
//! file and `GET /vm/config` (flattened into `VmConfig` in api/model.rs) and their
//! `exitless run` flags (flattened into `RunArgs` in args/mod.rs). A new device's own
//! types join here, one line each; the two structs that hold these never change for it.
//! This file is a leaf of the devices: the device folders' `config`/`run` files import
//! neither this file nor the model, so the model can hold these without a circle.

use super::fs::config::Fs;
use super::fs::run::FsFlags;
use crate::api::null::null_is_default;
use exitless_vmm::device_manager::Attach;
use serde::{Deserialize, Serialize};
use std::any::Any;

/// The devices' keys of `VmConfig` (flattened into it), in the order they are written
/// there: where `pmem` ends and `memory-hotplug` begins. One level only: serde's
/// `deny_unknown_fields` on `VmConfig` does not see through a flatten within a flatten.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct Sections {
    /// virtio-fs devices (an exitless extension, Cloud Hypervisor's `fs`).
    #[serde(default, deserialize_with = "null_is_default", skip_serializing_if = "Vec::is_empty")]
    pub fs: Vec<Fs>,
}

/// Keys whose values are lists (beside Firecracker's in api/model.rs's shape check).
pub const LIST_KEYS: &[&str] = &["fs"];

impl Sections {
    /// How many devices each list holds, named (for `VmConfig::too_many`).
    pub fn counts(&self) -> Vec<(&'static str, usize)> {
        vec![("fs devices", self.fs.len())]
    }
}

/// The devices' `exitless run` flags.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct RunFlags {
    #[command(flatten)]
    pub fs: FsFlags,
}

impl RunFlags {
    /// The devices these flags ask for, added to `devices` after the command line's
    /// others, and the backend processes started for them (vhost-user: they map guest
    /// RAM, which must then be shared), in `backends`, which the run keeps until its end.
    pub fn launch(&self, devices: &mut Vec<Attach>, backends: &mut Vec<Box<dyn Any>>) -> Result<(), String> {
        self.fs.launch(devices, backends)
    }
}

#[cfg(test)]
mod tests {
    use crate::api::model::{from_json, VmConfig};

    const FILE: &str = r#"{"boot-source": {"kernel_image_path": "k"},
        "pmem": [{"id": "p", "path_on_host": "f"}],
        "fs": [{"fs_id": "f0", "tag": "t", "socket": "/s"}],
        "memory-hotplug": {"total_size_mib": 1024}}"#;

    #[test]
    fn a_device_key_reads_and_writes_in_its_place() {
        let c: VmConfig = from_json(FILE.as_bytes()).unwrap();
        assert_eq!(c.devices.fs.len(), 1);
        assert_eq!(c.devices.fs[0].num_request_queues, exitless_vmm::virtio::fs::DEFAULT_REQUEST_QUEUES);
        let text = serde_json::to_string(&c).unwrap();
        let at = |key: &str| text.find(&format!("\"{key}\"")).unwrap_or_else(|| panic!("{key} in {text}"));
        assert!(at("pmem") < at("fs") && at("fs") < at("memory-hotplug"), "{text}");
        // Empty, the key is left out, as before virtio-fs; null reads as empty.
        let none: VmConfig = from_json(br#"{"fs": null}"#).unwrap();
        assert!(!serde_json::to_string(&none).unwrap().contains("\"fs\""));
    }

    #[test]
    fn unknown_keys_are_still_refused_beside_a_flattened_one() {
        let e = from_json::<VmConfig>(br#"{"fs": [], "fss": 1}"#).unwrap_err();
        assert!(e.contains("unknown field `fss`"), "{e}");
        let e = from_json::<VmConfig>(br#"{"fs": [{"fs_id": "f", "tag": "t", "socket": "s", "dax": 1}]}"#);
        assert!(e.unwrap_err().contains("dax"));
        let e = from_json::<VmConfig>(br#"{"fs": {"fs_id": "f"}}"#).unwrap_err();
        assert!(!e.is_empty());
    }
}
