//! `exitless run --fs tag=T,dir=DIR` (repeatable): a virtiofsd started for each directory
//! (virtiofsd.rs) and the virtio-fs device on its socket, placed after the command line's
//! other devices.

use super::virtiofsd::{parse_share, Daemon, Share};
use exitless_vmm::device_manager::Attach;
use exitless_vmm::virtio::fs::{attach, FsConfig, DEFAULT_QUEUE_SIZE, DEFAULT_REQUEST_QUEUES};
use std::any::Any;

/// The flag, flattened into `exitless run`'s by devices/parts.rs.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct FsFlags {
    /// A host directory in the guest (repeatable): a virtio-fs device the guest mounts by
    /// TAG (`mount -t virtiofs TAG /mnt`), served by a virtiofsd started for the run.
    #[arg(long, value_name = "tag=TAG,dir=DIR", value_parser = parse_share)]
    pub fs: Vec<Share>,
}

impl FsFlags {
    /// Starts each directory's virtiofsd and adds its device to `devices`; the daemons go
    /// in `backends`, ended with the run when it drops them.
    pub fn launch(&self, devices: &mut Vec<Attach>, backends: &mut Vec<Box<dyn Any>>) -> Result<(), String> {
        for (i, share) in self.fs.iter().enumerate() {
            let daemon = Daemon::start(share, i)?;
            devices.push(attach(FsConfig {
                id: format!("fs{i}"),
                tag: share.tag.clone(),
                socket: daemon.socket.clone(),
                num_request_queues: DEFAULT_REQUEST_QUEUES,
                queue_size: DEFAULT_QUEUE_SIZE,
            }));
            backends.push(Box::new(daemon));
        }
        Ok(())
    }
}
