//! The PC's CMOS real-time clock (an MC146818 at ports 0x70/0x71): the time of day from
//! the host's clock, the update-in-progress bit, the alarm, and 128 bytes of CMOS RAM.
//! The alarm can wake a guest sleeping in ACPI S3 (crate::machine::sleep), which is what
//! kvm-unit-tests' `s3` does. Its flags are kept lazily: register C reports the updates
//! and alarm matches since it was last read. It raises no interrupt (IRQ 8), so the
//! FADT keeps saying "no CMOS RTC" to Linux and it comes with `--testdevs` only.

use crate::bus::BusDevice;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub const RTC_PORT: u16 = 0x70;
pub const RTC_LEN: u64 = 2;

const SECONDS: usize = 0x00;
const SECONDS_ALARM: usize = 0x01;
const MINUTES: usize = 0x02;
const MINUTES_ALARM: usize = 0x03;
const HOURS: usize = 0x04;
const HOURS_ALARM: usize = 0x05;
const WEEKDAY: usize = 0x06;
const DAY: usize = 0x07;
const MONTH: usize = 0x08;
const YEAR: usize = 0x09;
const REG_A: usize = 0x0a;
const REG_B: usize = 0x0b;
const REG_C: usize = 0x0c;
const REG_D: usize = 0x0d;
const CENTURY: usize = 0x32;

/// Register A: the update cycle is about to run (or running) for this long before each
/// second begins. Hardware sets it 244 us ahead and holds it for the 1984 us the update
/// takes; a guest polling it through exits of tens of microseconds must not miss it.
const UIP_BEFORE: Duration = Duration::from_millis(2);
const REG_A_UIP: u8 = 0x80;
/// 32.768 kHz time base, 1.024 kHz periodic rate: what a BIOS leaves.
const REG_A_DEFAULT: u8 = 0x26;
const REG_B_SET: u8 = 0x80;
const REG_B_AIE: u8 = 0x20;
const REG_B_BINARY: u8 = 0x04;
const REG_B_24H: u8 = 0x02;
const REG_C_IRQF: u8 = 0x80;
const REG_C_AF: u8 = 0x20;
const REG_C_UF: u8 = 0x10;
/// Register D: the battery is good.
const REG_D_VRT: u8 = 0x80;
/// An alarm byte with both top bits set matches every value.
const DONT_CARE: u8 = 0xc0;

struct State {
    index: usize,
    ram: [u8; 128],
    /// Guest time minus host time, in seconds (the guest may set the clock).
    offset: i64,
    /// When register C was last read: its flags cover what happened since.
    flags_since: SystemTime,
}

pub struct CmosRtc {
    state: Mutex<State>,
}

impl Default for CmosRtc {
    fn default() -> Self {
        let mut ram = [0u8; 128];
        ram[REG_A] = REG_A_DEFAULT;
        ram[REG_B] = REG_B_24H;
        ram[REG_D] = REG_D_VRT;
        CmosRtc { state: Mutex::new(State { index: 0, ram, offset: 0, flags_since: SystemTime::now() }) }
    }
}

/// Seconds since the epoch -> (year, month, day, weekday 1-7 with Sunday 1, hours, minutes, seconds).
fn civil(secs: i64) -> (i64, u8, u8, u8, u8, u8, u8) {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = ((days + 4).rem_euclid(7) + 1) as u8; // 1970-01-01 was a Thursday
    (year, month, day, weekday, (rem / 3600) as u8, (rem / 60 % 60) as u8, (rem % 60) as u8)
}

/// (year, month, day, hours, minutes, seconds) -> seconds since the epoch.
fn epoch_seconds(year: i64, month: u8, day: u8, h: u8, m: u8, s: u8) -> i64 {
    let y = year - i64::from(month <= 2);
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (i64::from(month) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + i64::from(h) * 3600 + i64::from(m) * 60 + i64::from(s)
}

fn unix(t: SystemTime) -> (i64, Duration) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, Duration::from_nanos(u64::from(d.subsec_nanos()))),
        Err(_) => (0, Duration::ZERO),
    }
}

impl State {
    fn binary(&self) -> bool {
        self.ram[REG_B] & REG_B_BINARY != 0
    }

    fn encode(&self, v: u8) -> u8 {
        if self.binary() {
            v
        } else {
            (v / 10) << 4 | (v % 10)
        }
    }

    fn decode(&self, v: u8) -> u8 {
        if self.binary() {
            v
        } else {
            (v >> 4) * 10 + (v & 0x0f)
        }
    }

    fn encode_hours(&self, h: u8) -> u8 {
        if self.ram[REG_B] & REG_B_24H != 0 {
            return self.encode(h);
        }
        let pm = if h >= 12 { 0x80 } else { 0 };
        self.encode(match h % 12 {
            0 => 12,
            x => x,
        }) | pm
    }

    /// The guest's time at host time `t`, whole seconds.
    fn guest_seconds(&self, t: SystemTime) -> i64 {
        unix(t).0.saturating_add(self.offset)
    }

    /// Whether the alarm matches the guest second `secs`.
    fn alarm_matches(&self, secs: i64) -> bool {
        let (_, _, _, _, h, m, s) = civil(secs);
        let field = |alarm: usize, now: u8| {
            let a = self.ram[alarm];
            a & DONT_CARE == DONT_CARE || a == now
        };
        field(SECONDS_ALARM, self.encode(s))
            && field(MINUTES_ALARM, self.encode(m))
            && field(HOURS_ALARM, self.encode_hours(h))
    }

    /// The first whole guest second after `t` at which the alarm matches (looking a day ahead).
    fn next_alarm(&self, t: SystemTime) -> Option<SystemTime> {
        let first = self.guest_seconds(t) + 1;
        let ahead = (0..=86_400).find(|&k| self.alarm_matches(first + k))?;
        Some(t + Duration::from_secs(ahead as u64 + 1) - unix(t).1)
    }

    fn read(&mut self, reg: usize, now: SystemTime) -> u8 {
        let (year, month, day, weekday, h, m, s) = civil(self.guest_seconds(now));
        match reg {
            SECONDS => self.encode(s),
            MINUTES => self.encode(m),
            HOURS => self.encode_hours(h),
            WEEKDAY => self.encode(weekday),
            DAY => self.encode(day),
            MONTH => self.encode(month),
            YEAR => self.encode(year.rem_euclid(100) as u8),
            CENTURY => self.encode(year.div_euclid(100).clamp(0, 99) as u8),
            REG_A => {
                let to_next = Duration::from_secs(1) - unix(now).1;
                let uip = self.ram[REG_B] & REG_B_SET == 0 && to_next <= UIP_BEFORE;
                self.ram[REG_A] & !REG_A_UIP | if uip { REG_A_UIP } else { 0 }
            }
            REG_C => {
                let (from, to) = (self.guest_seconds(self.flags_since), self.guest_seconds(now));
                let mut flags = 0;
                if to > from {
                    flags |= REG_C_UF;
                    // A day of seconds covers every alarm there is.
                    if (from + 1..=to.min(from + 86_400)).any(|s| self.alarm_matches(s)) {
                        flags |= REG_C_AF;
                    }
                }
                if flags & self.ram[REG_B] & (REG_C_AF | REG_C_UF) != 0 {
                    flags |= REG_C_IRQF;
                }
                self.flags_since = now;
                flags
            }
            r => self.ram[r],
        }
    }

    fn write(&mut self, reg: usize, value: u8, now: SystemTime) {
        match reg {
            SECONDS | MINUTES | HOURS | DAY | MONTH | YEAR | CENTURY => {
                let (mut year, mut month, mut day, _, mut h, mut m, mut s) = civil(self.guest_seconds(now));
                let v = self.decode(value & if reg == HOURS { 0x7f } else { 0xff });
                match reg {
                    SECONDS => s = v.min(59),
                    MINUTES => m = v.min(59),
                    HOURS => {
                        h = if self.ram[REG_B] & REG_B_24H != 0 {
                            v.min(23)
                        } else {
                            v % 12 + if value & 0x80 != 0 { 12 } else { 0 }
                        }
                    }
                    DAY => day = v.clamp(1, 31),
                    MONTH => month = v.clamp(1, 12),
                    YEAR => year = year - year.rem_euclid(100) + i64::from(v.min(99)),
                    _ => year = i64::from(v.min(99)) * 100 + year.rem_euclid(100),
                }
                self.offset = epoch_seconds(year, month, day, h, m, s) - unix(now).0;
            }
            REG_A => self.ram[REG_A] = value & !REG_A_UIP,
            REG_C | REG_D => {} // read-only
            r => self.ram[r] = value,
        }
    }
}

impl CmosRtc {
    /// When the alarm next fires, if its interrupt is enabled (what wakes a guest from S3).
    pub fn next_wake(&self, now: SystemTime) -> Option<SystemTime> {
        let state = crate::sync::lock(&self.state);
        (state.ram[REG_B] & REG_B_AIE != 0).then(|| state.next_alarm(now)).flatten()
    }
}

impl BusDevice for CmosRtc {
    fn read(&self, offset: u64, data: &mut [u8]) {
        let mut state = crate::sync::lock(&self.state);
        let value = match offset {
            1 => {
                let reg = state.index;
                state.read(reg, SystemTime::now())
            }
            _ => 0xff, // the index port is write-only
        };
        data.fill(value);
    }

    fn write(&self, offset: u64, data: &[u8]) {
        let Some(&value) = data.first() else { return };
        let mut state = crate::sync::lock(&self.state);
        match offset {
            // Bit 7 masks NMIs on a PC; there is nothing here for it to mask.
            0 => state.index = usize::from(value & 0x7f),
            _ => {
                let reg = state.index;
                state.write(reg, value, SystemTime::now());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64, millis: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis)
    }

    #[test]
    fn dates_convert_both_ways() {
        // 2026-11-23 21:30:05 UTC, a Monday.
        let t = 1_795_469_405;
        assert_eq!(civil(t), (2026, 11, 23, 2, 21, 30, 5));
        assert_eq!(epoch_seconds(2026, 11, 23, 21, 30, 5), t);
        assert_eq!(civil(951_782_400), (2000, 2, 29, 3, 0, 0, 0), "a leap day, a Tuesday");
        assert_eq!(epoch_seconds(2000, 2, 29, 0, 0, 0), 951_782_400);
    }

    #[test]
    fn time_reads_in_bcd_or_binary_and_the_guest_can_set_it() {
        let mut s = CmosRtc::default().state.into_inner().unwrap();
        let now = at(1_795_469_405, 100);
        assert_eq!([s.read(HOURS, now), s.read(MINUTES, now), s.read(SECONDS, now)], [0x21, 0x30, 0x05]);
        assert_eq!(
            [s.read(DAY, now), s.read(MONTH, now), s.read(YEAR, now), s.read(CENTURY, now)],
            [0x23, 0x11, 0x26, 0x20]
        );
        s.write(REG_B, REG_B_24H | REG_B_BINARY, now);
        assert_eq!(s.read(MINUTES, now), 30);
        s.write(HOURS, 7, now);
        assert_eq!((s.read(HOURS, now), s.read(MINUTES, now), s.offset), (7, 30, -14 * 3600));
        s.write(REG_B, 0, now); // 12-hour BCD: 7 am
        assert_eq!(s.read(HOURS, now), 0x07);
        s.write(HOURS, 0x80 | 0x09, now); // 9 pm
        s.write(REG_B, REG_B_24H, now);
        assert_eq!(s.read(HOURS, now), 0x21);
    }

    #[test]
    fn uip_shows_just_before_each_second_and_flags_say_what_passed() {
        let mut s = CmosRtc::default().state.into_inner().unwrap();
        assert_eq!(s.read(REG_A, at(100, 500)) & REG_A_UIP, 0);
        assert_eq!(s.read(REG_A, at(100, 999)) & REG_A_UIP, REG_A_UIP);
        s.flags_since = at(100, 100);
        assert_eq!(s.read(REG_C, at(100, 900)), 0, "no second boundary passed");
        assert_eq!(s.read(REG_C, at(101, 10)), REG_C_UF, "an update, no alarm set (alarm 0:00:00)");
        for alarm in [SECONDS_ALARM, MINUTES_ALARM, HOURS_ALARM] {
            s.write(alarm, DONT_CARE, at(101, 20));
        }
        s.write(REG_B, REG_B_24H | REG_B_AIE, at(101, 20));
        assert_eq!(s.read(REG_C, at(102, 10)), REG_C_IRQF | REG_C_AF | REG_C_UF, "every second matches");
        assert_eq!(s.read(REG_C, at(102, 20)), 0, "read clears");
    }

    #[test]
    fn the_alarm_wakes_at_the_next_matching_second() {
        let rtc = CmosRtc::default();
        let now = at(1_795_469_405, 250); // 21:30:05.25
        assert_eq!(rtc.next_wake(now), None, "alarm interrupt off");
        {
            let mut s = rtc.state.lock().unwrap();
            s.write(REG_B, REG_B_24H | REG_B_AIE, now);
            s.write(SECONDS_ALARM, 0x10, now);
            s.write(MINUTES_ALARM, DONT_CARE, now);
            s.write(HOURS_ALARM, DONT_CARE, now);
        }
        assert_eq!(rtc.next_wake(now), Some(at(1_795_469_410, 0)), "at 21:30:10");
        rtc.state.lock().unwrap().write(SECONDS_ALARM, DONT_CARE, now);
        assert_eq!(rtc.next_wake(now), Some(at(1_795_469_406, 0)), "the next second");
    }
}
