//! Firecracker's register bitmaps: `"0b"` then one character per bit, most significant
//! first: `0` clears the bit, `1` sets it, `x` leaves the host's value; `_` separates groups
//! and counts for nothing. A string shorter than the register leaves the high bits alone;
//! a longer one is refused.

use super::error::SchemaError;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The bits a bitmap decides (`filter`) and what it sets them to (`value`), for a register
/// of `BITS` bits (32 for CPUID, 64 for MSRs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Bitmap<const BITS: u32> {
    pub filter: u64,
    pub value: u64,
}

impl<const BITS: u32> Bitmap<BITS> {
    /// Parses `text` (with or without its `0b`).
    pub fn parse(text: &str) -> Result<Self, SchemaError> {
        let digits = text.strip_prefix("0b").unwrap_or(text);
        let (mut filter, mut value, mut bit) = (0u64, 0u64, 0u32);
        for c in digits.chars().rev() {
            if c == '_' {
                continue;
            }
            if !matches!(c, '0' | '1' | 'x') {
                return Err(SchemaError::BitmapChar(text.into(), c));
            }
            if bit == BITS {
                return Err(SchemaError::BitmapTooLong(text.into(), BITS));
            }
            match c {
                '0' => filter |= 1 << bit,
                '1' => (filter, value) = (filter | 1 << bit, value | 1 << bit),
                _ => {}
            }
            bit += 1;
        }
        if bit == 0 {
            return Err(SchemaError::BitmapEmpty(text.into()));
        }
        Ok(Bitmap { filter, value })
    }

    /// `register` with the decided bits set as the bitmap says.
    pub fn apply(&self, register: u64) -> u64 {
        (register & !self.filter) | self.value
    }

    /// The bits the bitmap sets to 1.
    pub fn ones(&self) -> u64 {
        self.filter & self.value
    }

    /// The bits the bitmap clears.
    pub fn zeros(&self) -> u64 {
        self.filter & !self.value
    }
}

impl<const BITS: u32> std::fmt::Display for Bitmap<BITS> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("0b")?;
        for bit in (0..BITS).rev() {
            let c = match (self.filter >> bit & 1, self.value >> bit & 1) {
                (0, _) => 'x',
                (_, 0) => '0',
                _ => '1',
            };
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

impl<const BITS: u32> Serialize for Bitmap<BITS> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de, const BITS: u32> Deserialize<'de> for Bitmap<BITS> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Bitmap::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_ones_and_xs_decide_bits_and_underscores_are_nothing() {
        let b = Bitmap::<32>::parse("0b0_1x0").unwrap();
        assert_eq!((b.filter, b.value), (0b1101, 0b0100));
        assert_eq!(b.apply(0xffff_fff0), 0xffff_fff4);
        assert_eq!(b.apply(0b1011), 0b0110);
        assert_eq!((b.ones(), b.zeros()), (0b0100, 0b1001));
        // Without its prefix, and as long as the register.
        let full = Bitmap::<32>::parse(&"1".repeat(32)).unwrap();
        assert_eq!((full.filter, full.value), (0xffff_ffff, 0xffff_ffff));
        let msr = Bitmap::<64>::parse(&format!("0b1{}", "x".repeat(63))).unwrap();
        assert_eq!((msr.filter, msr.value), (1 << 63, 1 << 63));
        // Written back as it reads, every bit spelt out.
        assert_eq!(b.to_string(), format!("0b{}01x0", "x".repeat(28)));
        assert_eq!(Bitmap::<32>::parse(&b.to_string()).unwrap(), b);
    }

    #[test]
    fn a_bitmap_too_long_or_with_a_stranger_is_refused_by_name() {
        let long = format!("0b{}", "0".repeat(33));
        assert_eq!(Bitmap::<32>::parse(&long), Err(SchemaError::BitmapTooLong(long.clone(), 32)));
        assert!(Bitmap::<64>::parse(&long).is_ok(), "33 bits fit an MSR");
        assert_eq!(Bitmap::<32>::parse("0b01y1"), Err(SchemaError::BitmapChar("0b01y1".into(), 'y')));
        assert_eq!(Bitmap::<32>::parse("0b0_xϽ1"), Err(SchemaError::BitmapChar("0b0_xϽ1".into(), 'Ͻ')));
        assert_eq!(Bitmap::<32>::parse("0b"), Err(SchemaError::BitmapEmpty("0b".into())));
        assert_eq!(Bitmap::<32>::parse("0b__"), Err(SchemaError::BitmapEmpty("0b__".into())));
        let e = Bitmap::<32>::parse("0b2").unwrap_err().to_string();
        assert!(e.contains("[0b2]") && e.contains("unknown character"), "{e}");
        // Through serde, the same words.
        let e = serde_json::from_str::<Bitmap<32>>("\"0bxx1z\"").unwrap_err().to_string();
        assert!(e.contains("unknown character: 'z'"), "{e}");
        assert!(serde_json::from_str::<Bitmap<32>>("17").is_err(), "a number is not a bitmap");
    }
}
