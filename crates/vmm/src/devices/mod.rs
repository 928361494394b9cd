//! Devices that sit on the buses.

pub mod debug_exit;
pub mod serial;

pub use debug_exit::DebugExit;
pub use serial::Serial;
