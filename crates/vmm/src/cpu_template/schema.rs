//! Custom CPU templates in Firecracker's JSON schema (docs/cpu_templates/schema.json there):
//!
//! ```json
//! {"kvm_capabilities": ["!56", "171"],
//!  "cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0x0", "flags": 0,
//!                       "modifiers": [{"register": "ecx", "bitmap": "0bx0xx..."}]}],
//!  "msr_modifiers": [{"addr": "0x10a", "bitmap": "0b0000..."}]}
//! ```
//!
//! Leaves, subleaves and MSR addresses are strings with `0x` or `0b`; `flags` is KVM's
//! `kvm_cpuid_entry2.flags`; every section may be left out. Beyond Firecracker (whose
//! check is empty), a template that names one leaf, one register of a leaf, or one MSR
//! twice is refused: the second would silently undo part of the first.

use super::bitmap::Bitmap;
use super::error::SchemaError;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A CPUID output register.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Register {
    Eax,
    Ebx,
    Ecx,
    Edx,
}

impl Register {
    pub fn name(self) -> &'static str {
        match self {
            Register::Eax => "eax",
            Register::Ebx => "ebx",
            Register::Ecx => "ecx",
            Register::Edx => "edx",
        }
    }

    fn parse(text: &str) -> Result<Register, SchemaError> {
        match text {
            "eax" => Ok(Register::Eax),
            "ebx" => Ok(Register::Ebx),
            "ecx" => Ok(Register::Ecx),
            "edx" => Ok(Register::Edx),
            other => Err(SchemaError::Register(other.into())),
        }
    }
}

impl Serialize for Register {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Register {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Register::parse(&String::deserialize(d)?).map_err(D::Error::custom)
    }
}

/// A KVM capability the template adds to those checked before the VM is built (`"171"`),
/// or takes away (`"!171"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvmCapability {
    Add(u32),
    Remove(u32),
}

impl KvmCapability {
    fn parse(text: &str) -> Result<KvmCapability, SchemaError> {
        let number = |s: &str| s.parse::<u32>().map_err(|e| SchemaError::KvmCapability(text.into(), e.to_string()));
        match text.strip_prefix('!') {
            Some(rest) => Ok(KvmCapability::Remove(number(rest)?)),
            None => Ok(KvmCapability::Add(number(text)?)),
        }
    }
}

impl Serialize for KvmCapability {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            KvmCapability::Add(cap) => s.collect_str(cap),
            KvmCapability::Remove(cap) => s.collect_str(&format_args!("!{cap}")),
        }
    }
}

impl<'de> Deserialize<'de> for KvmCapability {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        KvmCapability::parse(&String::deserialize(d)?).map_err(D::Error::custom)
    }
}

/// A number as the schema writes it: a string, `0x` hexadecimal or `0b` binary.
pub fn parse_number(text: &str) -> Result<u32, SchemaError> {
    let (digits, radix) = match (text.strip_prefix("0x"), text.strip_prefix("0b")) {
        (Some(hex), _) => (hex, 16),
        (_, Some(bin)) => (bin, 2),
        _ => return Err(SchemaError::NumberPrefix(text.into())),
    };
    u32::from_str_radix(digits, radix).map_err(|e| SchemaError::Number(text.into(), e.to_string()))
}

mod hex {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(n: &u32, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{n:#x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        super::parse_number(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// One register of a leaf and what its bitmap makes of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuidRegisterModifier {
    pub register: Register,
    pub bitmap: Bitmap<32>,
}

/// A CPUID leaf and subleaf, the KVM flags its entry gets, and its registers' bitmaps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuidLeafModifier {
    #[serde(with = "hex")]
    pub leaf: u32,
    #[serde(with = "hex")]
    pub subleaf: u32,
    pub flags: u32,
    pub modifiers: Vec<CpuidRegisterModifier>,
}

/// An MSR and the bitmap its value goes through.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MsrModifier {
    #[serde(with = "hex")]
    pub addr: u32,
    pub bitmap: Bitmap<64>,
}

/// A custom CPU template (`PUT /cpu-config`, the config file's `cpu-config`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomTemplate {
    #[serde(default)]
    pub kvm_capabilities: Vec<KvmCapability>,
    #[serde(default)]
    pub cpuid_modifiers: Vec<CpuidLeafModifier>,
    #[serde(default)]
    pub msr_modifiers: Vec<MsrModifier>,
}

impl CustomTemplate {
    /// Parses and checks a template's JSON.
    pub fn from_json(bytes: &[u8]) -> Result<CustomTemplate, SchemaError> {
        // An object, as the schema has it (serde would also take a list of the fields).
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(SchemaError::Json("a CPU template is a JSON object".into()));
        }
        let template: CustomTemplate = serde_json::from_slice(bytes).map_err(|e| SchemaError::Json(e.to_string()))?;
        template.validate()?;
        Ok(template)
    }

    /// [`CustomTemplate::from_json`] on a JSON value already parsed.
    pub fn from_value(value: serde_json::Value) -> Result<CustomTemplate, SchemaError> {
        if !value.is_object() {
            return Err(SchemaError::Json("a CPU template is a JSON object".into()));
        }
        let template: CustomTemplate = serde_json::from_value(value).map_err(|e| SchemaError::Json(e.to_string()))?;
        template.validate()?;
        Ok(template)
    }

    /// No leaf, register of a leaf, or MSR twice.
    pub fn validate(&self) -> Result<(), SchemaError> {
        let mut leaves = std::collections::BTreeSet::new();
        for m in &self.cpuid_modifiers {
            if !leaves.insert((m.leaf, m.subleaf)) {
                return Err(SchemaError::LeafTwice(m.leaf, m.subleaf));
            }
            let mut registers = std::collections::BTreeSet::new();
            for r in &m.modifiers {
                if !registers.insert(r.register) {
                    return Err(SchemaError::RegisterTwice(m.leaf, m.subleaf, r.register.name()));
                }
            }
        }
        let mut msrs = std::collections::BTreeSet::new();
        match self.msr_modifiers.iter().find(|m| !msrs.insert(m.addr)) {
            Some(m) => Err(SchemaError::MsrTwice(m.addr)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{
        "kvm_capabilities": ["171", "!172"],
        "cpuid_modifiers": [
            {"leaf": "0x7", "subleaf": "0x0", "flags": 1,
             "modifiers": [{"register": "ebx", "bitmap": "0bxxxx_xxxx_xxxx_0xxx_xxxx_xxxx_xxxx_xxxx"}]},
            {"leaf": "0b1", "subleaf": "0x0", "flags": 0,
             "modifiers": [{"register": "ecx", "bitmap": "0b1x"}, {"register": "edx", "bitmap": "0b0"}]}
        ],
        "msr_modifiers": [{"addr": "0x10a", "bitmap": "0b0000_0000_0000_0000_0000_0000_0000_0000_0000_0000_0000_0000_0000_0000_0000_0001"}]
    }"#;

    fn fault(json: &str) -> String {
        CustomTemplate::from_json(json.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn firecrackers_schema_parses_and_writes_back_the_same() {
        let t = CustomTemplate::from_json(GOOD.as_bytes()).unwrap();
        assert_eq!(t.kvm_capabilities, [KvmCapability::Add(171), KvmCapability::Remove(172)]);
        assert_eq!((t.cpuid_modifiers[0].leaf, t.cpuid_modifiers[1].leaf), (7, 1));
        assert_eq!(t.cpuid_modifiers[0].modifiers[0].bitmap.zeros(), 1 << 19);
        assert_eq!(t.msr_modifiers[0].bitmap, Bitmap { filter: u64::MAX, value: 1 });
        let again = serde_json::to_vec(&t).unwrap();
        assert_eq!(CustomTemplate::from_json(&again).unwrap(), t);
        assert!(String::from_utf8(again).unwrap().contains(r#""leaf":"0x7""#));
        // Every section may be left out: `{}` is the empty template.
        assert_eq!(CustomTemplate::from_json(b"{}").unwrap(), CustomTemplate::default());
        // "+N" is a number as Rust reads it, as in Firecracker.
        let plus = CustomTemplate::from_json(br#"{"kvm_capabilities": ["+5"]}"#).unwrap();
        assert_eq!(plus.kvm_capabilities, [KvmCapability::Add(5)]);
    }

    #[test]
    fn each_kind_of_bad_template_is_one_clear_error() {
        let leaf = |bitmap: &str, register: &str| {
            format!(
                r#"{{"cpuid_modifiers": [{{"leaf": "0x1", "subleaf": "0x0", "flags": 0,
                    "modifiers": [{{"register": "{register}", "bitmap": "{bitmap}"}}]}}]}}"#
            )
        };
        let too_long = format!("0b{}", "1".repeat(33));
        let e = fault(&leaf(&too_long, "eax"));
        assert!(e.contains("string is too long") && e.contains(&too_long), "{e}");
        let e = fault(&leaf("0b10q1", "eax"));
        assert!(e.contains("unknown character: 'q'"), "{e}");
        let e = fault(&leaf("0b1", "esi"));
        assert!(e.contains("Invalid CPUID register \"esi\""), "{e}");
        let twice = r#"{"cpuid_modifiers": [
            {"leaf": "0x1", "subleaf": "0x0", "flags": 0, "modifiers": []},
            {"leaf": "0x01", "subleaf": "0x0", "flags": 0, "modifiers": []}]}"#;
        assert_eq!(fault(twice), "cpuid_modifiers: leaf 0x1 subleaf 0x0 is given twice");
        let register_twice = r#"{"cpuid_modifiers": [{"leaf": "0x7", "subleaf": "0x0", "flags": 1,
            "modifiers": [{"register": "ebx", "bitmap": "0b0"}, {"register": "ebx", "bitmap": "0b1"}]}]}"#;
        assert_eq!(fault(register_twice), "cpuid_modifiers: leaf 0x7 subleaf 0x0 modifies ebx twice");
        let msr_twice =
            r#"{"msr_modifiers": [{"addr": "0x10a", "bitmap": "0b0"}, {"addr": "0x10a", "bitmap": "0b1"}]}"#;
        assert_eq!(fault(msr_twice), "msr_modifiers: MSR 0x10a is given twice");
        let e = fault(r#"{"cpuid_modifiers": [{"leaf": "7", "subleaf": "0x0", "flags": 0, "modifiers": []}]}"#);
        assert!(e.contains("No supported number system prefix found in value [7]"), "{e}");
        let e =
            fault(r#"{"cpuid_modifiers": [{"leaf": "0x1_0000_0000", "subleaf": "0x0", "flags": 0, "modifiers": []}]}"#);
        assert!(e.contains("as a number for CPU template"), "{e}");
        let e = fault(r#"{"kvm_capabilities": ["!x"]}"#);
        assert!(e.contains("as a kvm capability"), "{e}");
        let e = fault(r#"{"reg_modifiers": []}"#);
        assert!(e.contains("unknown field `reg_modifiers`"), "{e}");
        let e = fault(r#"{"cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0x0", "modifiers": []}]}"#);
        assert!(e.contains("missing field `flags`"), "{e}");
        for garbage in ["", "[]", "null", "{\"cpuid_modifiers\": 3}", "\u{0}"] {
            assert!(CustomTemplate::from_json(garbage.as_bytes()).is_err(), "{garbage:?}");
        }
    }
}
