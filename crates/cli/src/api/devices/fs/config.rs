//! virtio-fs in the configuration: `PUT /fs/{fs_id}`'s body, an entry of the configuration
//! file's and `GET /vm/config`'s `fs` list (devices/parts.rs).

use serde::{Deserialize, Serialize};

/// `PUT /fs/{fs_id}`: a virtio-fs device on a vhost-user backend's socket (virtiofsd), an
/// exitless extension with Cloud Hypervisor's `--fs` names.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Fs {
    pub fs_id: String,
    pub tag: String,
    pub socket: String,
    #[serde(default = "default_request_queues")]
    pub num_request_queues: u16,
    #[serde(default = "default_fs_queue_size")]
    pub queue_size: u16,
}

fn default_request_queues() -> u16 {
    exitless_vmm::virtio::fs::DEFAULT_REQUEST_QUEUES
}

fn default_fs_queue_size() -> u16 {
    exitless_vmm::virtio::fs::DEFAULT_QUEUE_SIZE
}
