//! The labs: benchmarks that measure each exit-avoiding path against the slow one.

pub mod boot;
pub mod stats;
