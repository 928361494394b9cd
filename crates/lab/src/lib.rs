//! The labs: benchmarks that measure each exit-avoiding path against the slow one.

pub mod boot;
pub mod control;
pub mod doorbell;
pub mod pci;
pub mod stats;
pub mod svg;
