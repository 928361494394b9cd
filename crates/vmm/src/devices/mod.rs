//! Devices that sit on the buses.

pub mod acpi_pm;
pub mod boot_timer;
pub mod cmos_rtc;
pub mod console_out;
pub mod debug_exit;
pub mod doorbell;
pub mod fw_cfg;
pub mod i8042;
pub mod idle;
pub mod pc_testdev;
pub mod serial;

pub use acpi_pm::AcpiPm;
pub use debug_exit::DebugExit;
pub use doorbell::Doorbell;
pub use i8042::I8042;
pub use serial::Serial;
