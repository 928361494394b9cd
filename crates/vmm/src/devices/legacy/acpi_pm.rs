//! The ACPI fixed-hardware registers the FADT points at (see [`crate::acpi`]): PM1a event
//! (status, enable), PM1a control (SCI_EN, SLP_TYP, SLP_EN), the 3.579545 MHz PM timer, and
//! the reset register. Sleeping in S5 powers the guest off; the reset value resets it.
//! Sleeping in S3, where offered (crate::machine::sleep), parks the vCPUs until a wake event.

use crate::bus::BusDevice;
use crate::layout;
use crate::persist::{Persist, PersistError};
use crate::run_control::PowerEvents;
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::time::Instant;

/// The ACPI PM timer's frequency.
pub const PM_TIMER_HZ: u64 = 3_579_545;
/// SLP_TYP for S5, as the DSDT's `_S5_` package says.
const SLP_TYP_S5: u16 = 5;
/// SLP_TYP for S3, as QEMU's DSDT says (kvm-unit-tests' `s3` writes it as is).
const SLP_TYP_S3: u16 = 1;
/// PM1 status: the machine woke (WAK_STS), the RTC alarm fired (RTC_STS); PM1 enable:
/// the RTC alarm may wake it (RTC_EN).
pub const WAK_STS: u16 = 1 << 15;
pub const RTC_STS: u16 = 1 << 10;
pub const RTC_EN: u16 = 1 << 10;
const SLP_EN: u16 = 1 << 13;
/// SCI_EN: the platform is always in ACPI mode (there is no SMI command port).
const SCI_EN: u16 = 1;

const EVT: u64 = (layout::ACPI_PM1_EVT - layout::ACPI_PM_PORT) as u64;
const CNT: u64 = (layout::ACPI_PM1_CNT - layout::ACPI_PM_PORT) as u64;
const TMR: u64 = (layout::ACPI_PM_TMR - layout::ACPI_PM_PORT) as u64;
const RESET: u64 = (layout::ACPI_RESET - layout::ACPI_PM_PORT) as u64;

/// PM1 status, enable and control, and the PM timer, as a snapshot keeps them.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PmState {
    pub status: u16,
    pub enable: u16,
    pub cnt: u16,
    pub timer: u32,
}

impl crate::persist::DeviceState for PmState {
    const VERSION: u32 = 1;
}

pub struct AcpiPm {
    power: PowerEvents,
    started: Instant,
    status: AtomicU16,
    enable: AtomicU16,
    cnt: AtomicU16,
    /// Added to the ticks since `started`: a restored machine's timer goes on from the
    /// snapshot's value, never back.
    timer_offset: AtomicU32,
    /// Whether S3 is offered (with `--testdevs`: only a wake by the RTC alarm is modelled).
    s3: bool,
}

impl AcpiPm {
    pub fn new(power: PowerEvents, s3: bool) -> Self {
        AcpiPm {
            power,
            started: Instant::now(),
            status: AtomicU16::new(0),
            enable: AtomicU16::new(0),
            cnt: AtomicU16::new(SCI_EN),
            timer_offset: AtomicU32::new(0),
            s3,
        }
    }

    /// PM1 enable, as the guest last wrote it.
    pub fn enabled(&self) -> u16 {
        self.enable.load(Ordering::Relaxed)
    }

    /// Raises PM1 status bits (a wake event).
    pub fn raise_status(&self, bits: u16) {
        self.status.fetch_or(bits, Ordering::Relaxed);
    }

    /// The 32-bit PM timer: ticks since the machine was made.
    fn timer(&self) -> u32 {
        let ns = self.started.elapsed().as_nanos();
        let ticks = (ns * u128::from(PM_TIMER_HZ) / 1_000_000_000) as u32;
        ticks.wrapping_add(self.timer_offset.load(Ordering::Relaxed))
    }

    /// The registers' bytes from `EVT` on, for reads of any width and offset.
    fn bytes(&self) -> [u8; layout::ACPI_PM_LEN as usize] {
        let mut b = [0u8; layout::ACPI_PM_LEN as usize];
        b[0..2].copy_from_slice(&self.status.load(Ordering::Relaxed).to_le_bytes());
        b[2..4].copy_from_slice(&self.enable.load(Ordering::Relaxed).to_le_bytes());
        b[4..6].copy_from_slice(&self.cnt.load(Ordering::Relaxed).to_le_bytes());
        b[8..12].copy_from_slice(&self.timer().to_le_bytes());
        b
    }
}

/// The registers, the timer's value among them (a restored guest's timer goes on).
impl Persist<'_> for AcpiPm {
    type State = PmState;
    type SaveArgs = ();
    type RestoreArgs = ();

    /// The registers a snapshot keeps, the timer's value among them.
    fn save(&self, (): ()) -> Result<PmState, PersistError> {
        Ok(PmState {
            status: self.status.load(Ordering::Relaxed),
            enable: self.enable.load(Ordering::Relaxed),
            cnt: self.cnt.load(Ordering::Relaxed),
            timer: self.timer(),
        })
    }

    fn restore(&self, (): (), s: &PmState) -> Result<(), PersistError> {
        self.status.store(s.status, Ordering::Relaxed);
        self.enable.store(s.enable, Ordering::Relaxed);
        // SCI_EN stays set, SLP_EN never sticks: as any write leaves them.
        self.cnt.store((s.cnt | SCI_EN) & !SLP_EN, Ordering::Relaxed);
        self.timer_offset.store(0, Ordering::Relaxed);
        self.timer_offset.store(s.timer.wrapping_sub(self.timer()), Ordering::Relaxed);
        Ok(())
    }
}

fn le16(data: &[u8]) -> u16 {
    u16::from_le_bytes([data[0], data.get(1).copied().unwrap_or(0)])
}

impl BusDevice for AcpiPm {
    fn read(&self, offset: u64, data: &mut [u8]) {
        let regs = self.bytes();
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = regs.get(offset as usize + i).copied().unwrap_or(0);
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        match (offset, data.len()) {
            // Status bits are write-one-to-clear.
            (EVT, 2 | 4) => {
                self.status.fetch_and(!le16(data), Ordering::Relaxed);
                if data.len() == 4 {
                    self.enable.store(le16(&data[2..]), Ordering::Relaxed);
                }
            }
            (o, 2) if o == EVT + 2 => self.enable.store(le16(data), Ordering::Relaxed),
            (CNT, 2) => {
                let value = le16(data);
                self.cnt.store((value & !SLP_EN) | SCI_EN, Ordering::Relaxed);
                match (value & SLP_EN != 0, (value >> 10) & 7) {
                    (true, SLP_TYP_S5) => {
                        tracing::info!("guest entered ACPI S5 (soft off)");
                        self.power.power_off();
                    }
                    (true, SLP_TYP_S3) if self.s3 => {
                        tracing::info!("guest entered ACPI S3 (suspend to RAM)");
                        self.power.sleep();
                    }
                    _ => {}
                }
            }
            (RESET, 1) if data[0] == layout::ACPI_RESET_VALUE => {
                tracing::info!("guest wrote the ACPI reset register");
                self.power.reset();
            }
            (TMR, _) => {} // read-only
            _ => tracing::debug!("ignored {}-byte ACPI PM write at +{offset}", data.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run_control::{GuestStop, RunControl};
    use std::sync::Arc;

    #[test]
    fn timer_runs_s5_powers_off_and_reset_resets() {
        let control = Arc::new(RunControl::default());
        let pm = AcpiPm::new(PowerEvents::new(control.clone()), false);
        let mut t0 = [0u8; 4];
        pm.read(TMR, &mut t0);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let mut t1 = [0u8; 4];
        pm.read(TMR, &mut t1);
        let ticks = u32::from_le_bytes(t1).wrapping_sub(u32::from_le_bytes(t0));
        assert!(ticks >= 7000, "2 ms is at least 7159 ticks: {ticks}");
        let mut cnt = [0u8; 2];
        pm.read(CNT, &mut cnt);
        assert_eq!(le16(&cnt) & SCI_EN, SCI_EN);
        pm.write(CNT, &(SLP_TYP_S3 << 10 | SLP_EN).to_le_bytes()); // S3: not offered, ignored
        pm.write(RESET, &[0]);
        assert_eq!(control.guest_stopped(), None);
        assert!(!control.is_suspended());
        pm.write(CNT, &(SLP_TYP_S5 << 10 | SLP_EN).to_le_bytes());
        assert_eq!(control.guest_stopped(), Some(GuestStop::PowerOff));
        let other = Arc::new(RunControl::default());
        AcpiPm::new(PowerEvents::new(other.clone()), false).write(RESET, &[layout::ACPI_RESET_VALUE]);
        assert_eq!(other.guest_stopped(), Some(GuestStop::Reset));
        // Where S3 is offered, SLP_TYP 1 suspends: the vCPUs park until a wake.
        let s3 = Arc::new(RunControl::default());
        AcpiPm::new(PowerEvents::new(s3.clone()), true).write(CNT, &(SLP_TYP_S3 << 10 | SLP_EN).to_le_bytes());
        assert!(s3.is_suspended() && s3.guest_stopped().is_none());
    }
}

#[cfg(test)]
mod snapshot_tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_restored_timer_goes_on_from_the_saved_value_and_registers_come_back() {
        let old = AcpiPm::new(PowerEvents::new(Arc::default()), false);
        old.write(EVT + 2, &RTC_EN.to_le_bytes());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let saved_at = std::time::Instant::now();
        let saved = old.save(()).unwrap();
        assert!(saved.timer > 0 && saved.enable == RTC_EN, "{saved:?}");
        // A new machine's timer starts near 0; the restored one goes on from the snapshot's:
        // ahead of it by no more than the time since the save (a tick of rounding).
        let new = AcpiPm::new(PowerEvents::new(Arc::default()), false);
        new.restore((), &saved).unwrap();
        let mut t = [0u8; 4];
        new.read(TMR, &mut t);
        let since = saved_at.elapsed().as_nanos() * u128::from(PM_TIMER_HZ) / 1_000_000_000;
        let ahead = u32::from_le_bytes(t).wrapping_sub(saved.timer);
        assert!(u128::from(ahead) <= since + 1, "{} then {} ({since} ticks later)", saved.timer, u32::from_le_bytes(t));
        assert_eq!(new.save(()).unwrap().enable, RTC_EN);
        assert_eq!(new.save(()).unwrap().cnt & SCI_EN, SCI_EN);
    }
}
