//! Devices that sit on the buses.

pub mod debug_exit;
pub mod doorbell;
pub mod idle;
pub mod serial;

pub use debug_exit::DebugExit;
pub use doorbell::Doorbell;
pub use serial::Serial;
