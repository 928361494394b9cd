//! Host-side network backends: the tap, and MMDS, which the VMM itself answers.

pub mod mmds;
pub mod tap;

pub use tap::Tap;
