//! The labs: benchmarks that measure each exit-avoiding path against the slow one.

pub mod api_client;
pub mod blk;
pub mod boot;
pub mod control;
pub mod devices;
pub mod doorbell;
pub mod fleet;
pub mod net;
pub mod net_rtt;
pub mod netns;
pub mod pci;
pub mod peers;
pub mod report;
pub mod sink;
pub mod stats;
pub mod svg;
