//! Attaching the PC devices a guest finds at fixed ports, each wired to its ISA interrupt,
//! and how the machine and the API reach them (COM1's output, Ctrl-Alt-Del, S3).

use super::cmos_rtc::{CmosRtc, RTC_LEN, RTC_PORT};
use super::{boot_timer, debug_exit, i8042, serial, AcpiPm, DebugExit, Serial, I8042};
use crate::device_manager::{DeviceError, DeviceHandle, DeviceKind, DeviceManager, Saves};
use crate::layout;
use crate::run_control::PowerEvents;
use exitless_payloads::abi;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Instant;
use vmm_sys_util::eventfd::EventFd;

pub const SERIAL: DeviceKind = DeviceKind("serial");
pub const KEYBOARD: DeviceKind = DeviceKind("i8042");
pub const DEBUG_EXIT: DeviceKind = DeviceKind("debug-exit");
pub const POWER: DeviceKind = DeviceKind("acpi-pm");
pub const RTC: DeviceKind = DeviceKind("cmos-rtc");
pub const BOOT_TIMER: DeviceKind = DeviceKind("boot-timer");

// The page the allocators keep for the boot timer is the one Firecracker puts it at.
const _: () = assert!(boot_timer::BOOT_TIMER_GPA == crate::layout::PCI_MMIO32_START);

/// An irqfd on ISA line `irq` for device `name`.
fn isa_irqfd(dm: &DeviceManager, name: &'static str, irq: u32) -> Result<EventFd, DeviceError> {
    let fd = EventFd::new(libc::EFD_NONBLOCK).map_err(|source| DeviceError::Setup { name: name.into(), source })?;
    dm.vm().register_irqfd(&fd, irq)?;
    Ok(fd)
}

impl DeviceManager {
    /// COM1: output to `out` from a thread of its own, input from `input` if given.
    pub fn attach_serial(
        &mut self,
        out: Box<dyn Write + Send>,
        input: Option<Box<dyn Read + Send>>,
    ) -> Result<Arc<Serial>, DeviceError> {
        let setup = |source| DeviceError::Setup { name: "serial".into(), source };
        let irq =
            serial::IrqLine::new(Some(isa_irqfd(self, "serial", layout::COM1_IRQ)?), Some(self.gsi_router().clone()));
        let serial = Arc::new(Serial::new(out, irq).map_err(setup)?);
        if let Some(input) = input {
            serial.spawn_input(input).map_err(setup)?;
        }
        let handle = DeviceHandle::reached_by(serial.clone()).saving(Saves::State(serial.clone()));
        self.attach_pio("serial", SERIAL, layout::COM1_PORT, serial::SERIAL_LEN, serial.clone(), handle)?;
        Ok(serial)
    }

    /// The port a payload writes its exit status to.
    pub fn attach_debug_exit(&mut self, power: PowerEvents) -> Result<(), DeviceError> {
        let device = Arc::new(DebugExit::new(power));
        let (port, len) = (abi::DEBUG_EXIT_PORT as u16, debug_exit::DEBUG_EXIT_LEN);
        self.attach_pio("debug-exit", DEBUG_EXIT, port, len, device, DeviceHandle::bus()).map(drop)
    }

    /// The PS/2 controller: its reset line, and Ctrl-Alt-Del from the API.
    pub fn attach_keyboard(&mut self, power: PowerEvents) -> Result<(), DeviceError> {
        let keyboard = Arc::new(I8042::new(power, Some(isa_irqfd(self, "i8042", layout::I8042_IRQ)?)));
        let handle = DeviceHandle::reached_by(keyboard.clone()).saving(Saves::State(keyboard.clone()));
        let (port, len) = (layout::I8042_DATA_PORT, i8042::I8042_LEN);
        self.attach_pio("i8042", KEYBOARD, port, len, keyboard, handle).map(drop)
    }

    /// ACPI's PM registers (power off, reset; S3 when `s3`).
    pub fn attach_power(&mut self, power: PowerEvents, s3: bool) -> Result<Arc<AcpiPm>, DeviceError> {
        let pm = Arc::new(AcpiPm::new(power, s3));
        let (port, len) = (layout::ACPI_PM_PORT, layout::ACPI_PM_LEN);
        let handle = DeviceHandle::reached_by(pm.clone()).saving(Saves::State(pm.clone()));
        self.attach_pio("acpi-pm", POWER, port, len, pm.clone(), handle)?;
        Ok(pm)
    }

    /// The CMOS RTC, whose alarm wakes a guest from S3.
    pub fn attach_rtc(&mut self) -> Result<Arc<CmosRtc>, DeviceError> {
        let rtc = Arc::new(CmosRtc::default());
        self.attach_pio("cmos-rtc", RTC, RTC_PORT, RTC_LEN, rtc.clone(), DeviceHandle::bus())?;
        Ok(rtc)
    }

    /// Firecracker's boot-timer device, at the address Firecracker gives it (the first
    /// page of the 32-bit PCI window, which the allocators keep for it). The VMM's own
    /// stopwatch: not part of what a snapshot saves.
    pub fn attach_boot_timer(&mut self, started: Instant) -> Result<(), DeviceError> {
        use boot_timer::{BootTimer, BOOT_TIMER_GPA, BOOT_TIMER_LEN};
        let timer = Arc::new(BootTimer::new(started));
        let handle = DeviceHandle::bus().saving(Saves::Excluded);
        self.attach_mmio("boot-timer", BOOT_TIMER, BOOT_TIMER_GPA, BOOT_TIMER_LEN, timer, handle).map(drop)
    }

    /// COM1, whose queued output is drained before a run returns.
    pub fn serial(&self) -> Option<&Arc<Serial>> {
        self.find()
    }

    /// The PS/2 controller, through which the API sends Ctrl-Alt-Del.
    pub fn keyboard(&self) -> Option<&Arc<I8042>> {
        self.find()
    }

    /// The ACPI PM registers and timer.
    pub fn power(&self) -> Option<&Arc<AcpiPm>> {
        self.find()
    }
}
