//! The labs: benchmarks that measure each exit-avoiding path against the slow one.

pub mod api_client;
pub mod blk;
pub mod boot;
pub mod chart;
pub mod control;
pub mod density;
pub mod devices;
pub mod doorbell;
pub mod fleet;
pub mod fork;
pub mod fs;
pub mod mmds;
pub mod net;
pub mod net_pair;
pub mod net_rtt;
pub mod net_rx;
pub mod net_wire;
pub mod netns;
pub mod pci;
pub mod peers;
pub mod report;
pub mod sink;
pub mod snapshot;
pub mod stats;
pub mod vsock;

/// The `exitless` binary the labs start VMs with: beside the running one (the labs run
/// from `exitless-bench`, installed next to `exitless`).
pub fn exitless_binary() -> std::io::Result<std::path::PathBuf> {
    let me = std::env::current_exe()?;
    let vmm = me.with_file_name("exitless");
    if vmm.is_file() {
        Ok(vmm)
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{} is missing (cargo build --release builds it)", vmm.display()),
        ))
    }
}
