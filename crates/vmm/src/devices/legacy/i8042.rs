//! The i8042 PS/2 controller with a keyboard that has nothing to type but Ctrl-Alt-Del:
//! the controller commands a guest's driver sends while it probes (self-test, interface
//! test, command byte), the keyboard commands it sends (reset, identify, LEDs, scan code
//! set), each answered as a keyboard would; the CPU reset line (command 0xfe on port 0x64),
//! which Linux's `reboot=k` uses; and [`I8042::ctrl_alt_del`], the API's `SendCtrlAltDel`,
//! which puts the three keys in the output buffer and raises IRQ 1, as Firecracker does.

use crate::bus::BusDevice;
use crate::persist::{Persist, PersistError};
use crate::run_control::PowerEvents;
use std::collections::VecDeque;
use std::sync::Mutex;
use vmm_sys_util::eventfd::EventFd;

/// Covers ports 0x60 (data) to 0x64 (status/command).
pub const I8042_LEN: u64 = 5;
const DATA_OFFSET: u64 = 0;
const CMD_OFFSET: u64 = 4;

// Controller commands (port 0x64).
const CMD_READ_CTR: u8 = 0x20;
const CMD_WRITE_CTR: u8 = 0x60;
const CMD_SELF_TEST: u8 = 0xaa;
const CMD_KBD_TEST: u8 = 0xab;
const CMD_KBD_DISABLE: u8 = 0xad;
const CMD_KBD_ENABLE: u8 = 0xae;
const CMD_READ_OUTP: u8 = 0xd0;
const CMD_WRITE_OUTP: u8 = 0xd1;
const CMD_WRITE_AUX: u8 = 0xd4;
const CMD_RESET_CPU: u8 = 0xfe;

// Status register bits.
const SB_OUT_DATA_AVAIL: u8 = 0x01;
const SB_SYSTEM_FLAG: u8 = 0x04;
const SB_LAST_WAS_CMD: u8 = 0x08;

// Command byte bits: keyboard interrupt enabled, system flag, keyboard disabled.
const CB_KBD_INT: u8 = 0x01;
const CB_POST_OK: u8 = 0x04;
const CB_KBD_DISABLED: u8 = 0x10;

// Keyboard replies.
const KBD_ACK: u8 = 0xfa;
const KBD_SELF_TEST_OK: u8 = 0xaa;
const CTRL_SELF_TEST_OK: u8 = 0x55;

/// Scan code set 2 make codes: left Ctrl, left Alt, Delete.
pub const CTRL_ALT_DEL: [u8; 4] = [0x14, 0x11, 0xe0, 0x71];

/// Bytes the controller holds for the guest; a real one holds one, a few is kinder to a
/// slow driver, and the bound keeps a guest that never reads from growing it.
const BUFFER: usize = 16;

/// The controller's registers and queued bytes, as a snapshot keeps them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    out: VecDeque<u8>,
    command_byte: u8,
    /// A controller command waiting for its data byte on port 0x60.
    awaiting: Option<u8>,
    /// A keyboard command waiting for its parameter byte (LEDs, scan code set, rate).
    keyboard_param: bool,
    last_was_command: bool,
}

impl crate::persist::DeviceState for State {
    const VERSION: u32 = 1;
}

pub struct I8042 {
    power: PowerEvents,
    state: Mutex<State>,
    /// IRQ 1 (an irqfd), when the machine wired one.
    irq: Option<EventFd>,
}

impl I8042 {
    pub fn new(power: PowerEvents, irq: Option<EventFd>) -> Self {
        let state = State {
            out: VecDeque::with_capacity(BUFFER),
            command_byte: CB_KBD_INT | CB_POST_OK,
            awaiting: None,
            keyboard_param: false,
            last_was_command: false,
        };
        I8042 { power, state: Mutex::new(state), irq }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// Ctrl, Alt and Delete pressed: false if the guest left no room for them (it is not
    /// reading its keyboard) or has the keyboard disabled.
    pub fn ctrl_alt_del(&self) -> bool {
        let mut s = self.lock();
        if s.out.len() + CTRL_ALT_DEL.len() > BUFFER || s.command_byte & CB_KBD_DISABLED != 0 {
            return false;
        }
        s.out.extend(CTRL_ALT_DEL);
        self.interrupt(&s);
        true
    }

    fn push(&self, s: &mut State, bytes: &[u8]) {
        for &b in bytes {
            if s.out.len() < BUFFER {
                s.out.push_back(b);
            }
        }
        self.interrupt(s);
    }

    /// An edge on IRQ 1 when the guest has keyboard interrupts on and data is waiting.
    fn interrupt(&self, s: &State) {
        if s.command_byte & CB_KBD_INT != 0 && !s.out.is_empty() {
            if let Some(irq) = &self.irq {
                let _ = irq.write(1);
            }
        }
    }

    fn command(&self, s: &mut State, cmd: u8) {
        match cmd {
            CMD_READ_CTR => {
                let b = s.command_byte;
                self.push(s, &[b]);
            }
            CMD_WRITE_CTR | CMD_WRITE_OUTP | CMD_WRITE_AUX => s.awaiting = Some(cmd),
            CMD_SELF_TEST => self.push(s, &[CTRL_SELF_TEST_OK]),
            CMD_KBD_TEST => self.push(s, &[0x00]),
            CMD_KBD_DISABLE => s.command_byte |= CB_KBD_DISABLED,
            CMD_KBD_ENABLE => s.command_byte &= !CB_KBD_DISABLED,
            CMD_READ_OUTP => self.push(s, &[0x01]), // the reset line not asserted
            CMD_RESET_CPU => {
                tracing::info!("guest pulsed the i8042 reset line");
                self.power.reset();
            }
            // Mouse port commands and the rest: no mouse, nothing to answer.
            _ => {}
        }
    }

    fn data(&self, s: &mut State, value: u8) {
        match s.awaiting.take() {
            Some(CMD_WRITE_CTR) => {
                s.command_byte = value;
                return;
            }
            // Output port bit 0 low is the reset line.
            Some(CMD_WRITE_OUTP) if value & 1 == 0 => return self.power.reset(),
            Some(_) => return,
            None => {}
        }
        if std::mem::take(&mut s.keyboard_param) {
            return self.push(s, &[KBD_ACK]);
        }
        match value {
            0xff => self.push(s, &[KBD_ACK, KBD_SELF_TEST_OK]), // reset
            0xf2 => self.push(s, &[KBD_ACK, 0xab, 0x83]),       // identify: an MF2 keyboard
            0xed | 0xf0 | 0xf3 => {
                // LEDs, scan code set, typematic rate: a parameter byte follows.
                s.keyboard_param = true;
                self.push(s, &[KBD_ACK]);
            }
            _ => self.push(s, &[KBD_ACK]),
        }
    }
}

/// The controller's registers and queued bytes.
impl Persist<'_> for I8042 {
    type State = State;
    type SaveArgs = ();
    type RestoreArgs = ();

    fn save(&self, (): ()) -> Result<State, PersistError> {
        Ok(self.lock().clone())
    }

    /// Queued bytes beyond what the controller holds are dropped.
    fn restore(&self, (): (), state: &State) -> Result<(), PersistError> {
        let mut state = state.clone();
        state.out.truncate(BUFFER);
        *self.lock() = state;
        Ok(())
    }
}

impl BusDevice for I8042 {
    fn read(&self, offset: u64, data: &mut [u8]) {
        let mut s = self.lock();
        let value = match offset {
            DATA_OFFSET => {
                let b = s.out.pop_front().unwrap_or(0);
                // More waiting: another edge, as the controller would after each byte.
                self.interrupt(&s);
                b
            }
            CMD_OFFSET => {
                let mut status = SB_SYSTEM_FLAG;
                if !s.out.is_empty() {
                    status |= SB_OUT_DATA_AVAIL;
                }
                if s.last_was_command {
                    status |= SB_LAST_WAS_CMD;
                }
                status
            }
            _ => 0,
        };
        data.fill(0);
        if let Some(first) = data.first_mut() {
            *first = value;
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        let Some(&value) = data.first() else { return };
        let mut s = self.lock();
        match offset {
            CMD_OFFSET => {
                s.last_was_command = true;
                self.command(&mut s, value);
            }
            DATA_OFFSET => {
                s.last_was_command = false;
                self.data(&mut s, value);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run_control::{GuestStop, RunControl};
    use std::sync::Arc;

    fn read(dev: &I8042, offset: u64) -> u8 {
        let mut b = [0u8];
        dev.read(offset, &mut b);
        b[0]
    }

    fn drain(dev: &I8042) -> Vec<u8> {
        let mut out = Vec::new();
        while read(dev, CMD_OFFSET) & SB_OUT_DATA_AVAIL != 0 {
            out.push(read(dev, DATA_OFFSET));
        }
        out
    }

    #[test]
    fn only_the_reset_command_resets() {
        let control = Arc::new(RunControl::default());
        let dev = I8042::new(PowerEvents::new(control.clone()), None);
        dev.write(0, &[0xfe]);
        dev.write(4, &[0xaa]);
        assert_eq!(control.guest_stopped(), None);
        drain(&dev);
        assert_eq!(read(&dev, 4) & 0x3, 0, "no data pending, ready for input");
        dev.write(4, &[0xfe]);
        assert_eq!(control.guest_stopped(), Some(GuestStop::Reset));
    }

    #[test]
    fn a_driver_probing_gets_a_keyboards_answers() {
        let dev = I8042::new(PowerEvents::new(Arc::default()), None);
        dev.write(CMD_OFFSET, &[CMD_SELF_TEST]);
        assert_eq!(drain(&dev), [0x55]);
        dev.write(CMD_OFFSET, &[CMD_KBD_TEST]);
        assert_eq!(drain(&dev), [0x00]);
        dev.write(CMD_OFFSET, &[CMD_WRITE_CTR]);
        dev.write(DATA_OFFSET, &[0x47]);
        dev.write(CMD_OFFSET, &[CMD_READ_CTR]);
        assert_eq!(drain(&dev), [0x47]);
        dev.write(DATA_OFFSET, &[0xff]);
        assert_eq!(drain(&dev), [KBD_ACK, KBD_SELF_TEST_OK]);
        dev.write(DATA_OFFSET, &[0xf2]);
        assert_eq!(drain(&dev), [KBD_ACK, 0xab, 0x83]);
        // LEDs: ACK for the command, ACK for its parameter (not taken as a command).
        dev.write(DATA_OFFSET, &[0xed]);
        dev.write(DATA_OFFSET, &[0xff]);
        assert_eq!(drain(&dev), [KBD_ACK, KBD_ACK]);
    }

    #[test]
    fn ctrl_alt_del_reaches_the_guest_with_an_interrupt_and_is_bounded() {
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let dev = I8042::new(PowerEvents::new(Arc::default()), Some(irq.try_clone().unwrap()));
        assert!(dev.ctrl_alt_del());
        assert!(irq.read().unwrap() >= 1, "IRQ 1 raised");
        assert_eq!(drain(&dev), CTRL_ALT_DEL);
        // A guest that never reads: the buffer fills, further presses are refused.
        let presses = (0..100).filter(|_| dev.ctrl_alt_del()).count();
        assert_eq!(presses, BUFFER / CTRL_ALT_DEL.len());
        // A guest that disabled its keyboard gets nothing.
        drain(&dev);
        dev.write(CMD_OFFSET, &[CMD_KBD_DISABLE]);
        assert!(!dev.ctrl_alt_del());
        // Garbage from the guest never grows the buffer past its bound.
        for v in 0..=255u8 {
            dev.write(CMD_OFFSET, &[v.wrapping_add(1) & 0xfd]);
            dev.write(DATA_OFFSET, &[v]);
        }
        assert!(drain(&dev).len() <= BUFFER);
    }
}
