//! The PC devices a guest expects to find at fixed ports: COM1, the PS/2 controller (for
//! Ctrl-Alt-Del), ACPI's PM registers, the CMOS RTC, and exitless's own exits (the
//! debug-exit port and Firecracker's boot timer).

pub mod acpi_pm;
pub mod attach;
pub mod boot_timer;
pub mod cmos_rtc;
pub mod debug_exit;
pub mod i8042;
pub mod serial;

pub use acpi_pm::AcpiPm;
pub use debug_exit::DebugExit;
pub use i8042::I8042;
pub use serial::Serial;
