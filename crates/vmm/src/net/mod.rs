//! Host-side network backends.

pub mod tap;

pub use tap::Tap;
