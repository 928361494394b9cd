//! The vhost-user frontend (the rust-vmm `vhost` crate's): virtio devices whose queues a
//! backend process serves over a Unix socket (virtio-fs with virtiofsd). Guest RAM is
//! then a memfd mapped shared (machine/ram.rs), which the backend maps too.

pub mod backend;
mod deadline;
pub mod device;
pub mod metrics;
pub mod reconnect;

pub use backend::{Backend, BackendError, ConfigReader, REPLY_TIMEOUT};
pub use device::{Health, Spec, VhostUserDevice};
pub use metrics::VhostUserMetrics;
pub use reconnect::Reconnect;
