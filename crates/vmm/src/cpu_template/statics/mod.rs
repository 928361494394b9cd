//! Firecracker's static CPU templates (`machine-config`'s `cpu_template`): C3, T2, T2S and
//! T2CL for Intel hosts, T2A for AMD ones. Each is a custom template written down here
//! ([`StaticTemplate::template`]); Firecracker also allows each only on a list of CPU
//! models, exitless wherever the host offers every feature the template keeps (a newer
//! or generically named model is fine; crate::cpu_template::apply checks).

mod amd;
mod intel;
mod table;

use crate::cpu_template::bitmap::Bitmap;
use crate::cpu_template::schema::{CpuidLeafModifier, CpuidRegisterModifier, CustomTemplate, MsrModifier};

/// The CPU vendors the templates are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    Intel,
    Amd,
}

impl Vendor {
    /// The vendor string of CPUID leaf 0.
    pub fn id(self) -> &'static str {
        match self {
            Vendor::Intel => "GenuineIntel",
            Vendor::Amd => "AuthenticAMD",
        }
    }
}

/// A static template, by Firecracker's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaticTemplate {
    C3,
    T2,
    T2S,
    T2CL,
    T2A,
}

impl StaticTemplate {
    pub const ALL: [StaticTemplate; 5] =
        [StaticTemplate::C3, StaticTemplate::T2, StaticTemplate::T2S, StaticTemplate::T2CL, StaticTemplate::T2A];

    pub fn name(self) -> &'static str {
        match self {
            StaticTemplate::C3 => "C3",
            StaticTemplate::T2 => "T2",
            StaticTemplate::T2S => "T2S",
            StaticTemplate::T2CL => "T2CL",
            StaticTemplate::T2A => "T2A",
        }
    }

    /// The template named `name` exactly (Firecracker's names are case-sensitive).
    pub fn from_name(name: &str) -> Option<StaticTemplate> {
        StaticTemplate::ALL.into_iter().find(|t| t.name() == name)
    }

    pub fn vendor(self) -> Vendor {
        match self {
            StaticTemplate::T2A => Vendor::Amd,
            _ => Vendor::Intel,
        }
    }

    fn table(self) -> &'static table::Table {
        match self {
            StaticTemplate::C3 => &intel::C3,
            StaticTemplate::T2 => &intel::T2,
            StaticTemplate::T2S => &intel::T2S,
            StaticTemplate::T2CL => &intel::T2CL,
            StaticTemplate::T2A => &amd::T2A,
        }
    }

    /// The template as a custom one: its rows grouped by leaf, in order.
    pub fn template(self) -> CustomTemplate {
        let table = self.table();
        let mut cpuid_modifiers: Vec<CpuidLeafModifier> = Vec::new();
        for &(leaf, subleaf, flags, register, bitmap) in table.cpuid {
            // The tables are constants, each parsed by the tests below.
            let bitmap = Bitmap::parse(bitmap).unwrap_or_default();
            let modifier = CpuidRegisterModifier { register, bitmap };
            match cpuid_modifiers.iter_mut().find(|m| (m.leaf, m.subleaf) == (leaf, subleaf)) {
                Some(m) => m.modifiers.push(modifier),
                None => cpuid_modifiers.push(CpuidLeafModifier { leaf, subleaf, flags, modifiers: vec![modifier] }),
            }
        }
        let msr_modifiers = table
            .msrs
            .iter()
            .map(|&(addr, bitmap)| MsrModifier { addr, bitmap: Bitmap::parse(bitmap).unwrap_or_default() })
            .collect();
        CustomTemplate { kvm_capabilities: Vec::new(), cpuid_modifiers, msr_modifiers }
    }
}

impl std::fmt::Display for StaticTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu_template::schema::Register;

    fn bitmap(t: &CustomTemplate, leaf: u32, subleaf: u32, register: Register) -> Bitmap<32> {
        let l = t.cpuid_modifiers.iter().find(|m| (m.leaf, m.subleaf) == (leaf, subleaf)).unwrap();
        l.modifiers.iter().find(|r| r.register == register).unwrap().bitmap
    }

    #[test]
    fn every_row_of_every_template_parses_and_the_template_is_valid() {
        for t in StaticTemplate::ALL {
            for &(.., text) in t.table().cpuid {
                Bitmap::<32>::parse(text).unwrap_or_else(|e| panic!("{t}: {e}"));
            }
            for &(_, text) in t.table().msrs {
                Bitmap::<64>::parse(text).unwrap_or_else(|e| panic!("{t}: {e}"));
            }
            t.template().validate().unwrap();
            assert_eq!(StaticTemplate::from_name(t.name()), Some(t));
        }
        assert_eq!(StaticTemplate::from_name("t2"), None, "names are case-sensitive");
        assert_eq!(StaticTemplate::from_name("None"), None);
    }

    /// The bits Firecracker v1.16.1's templates decide (its filter and value words).
    #[test]
    fn the_bitmaps_are_firecrackers() {
        let t2 = StaticTemplate::T2.template();
        let eax = bitmap(&t2, 1, 0, Register::Eax);
        assert_eq!((eax.filter, eax.value), (0x0fff_3fff, 0x0003_06f2));
        let ebx7 = bitmap(&t2, 7, 0, Register::Ebx);
        assert_eq!((ebx7.filter, ebx7.value), (0xffef_da14, 0x0000_0200));
        let edx1 = bitmap(&t2, 1, 0, Register::Edx);
        assert_eq!((edx1.filter, edx1.value), (0xe864_1080, 0x0000_1080));
        let c3 = StaticTemplate::C3.template();
        assert_eq!(bitmap(&c3, 7, 0, Register::Ebx).filter, 0xffaf_dd3c);
        assert_eq!(bitmap(&c3, 1, 0, Register::Eax).value, 0x0003_06e4);
        let t2s = StaticTemplate::T2S.template();
        assert_eq!(t2s.msr_modifiers[0].addr, 0x10a);
        assert_eq!((t2s.msr_modifiers[0].bitmap.filter, t2s.msr_modifiers[0].bitmap.value), (u64::MAX, 0x0c08_0c4c));
        let t2cl = StaticTemplate::T2CL.template();
        assert_eq!(t2cl.msr_modifiers[0].bitmap.filter, 0xffff_ffff_e2f5_1e00);
        assert_eq!(bitmap(&t2cl, 0x8000_0001, 0, Register::Edx).filter, 0x07c0_0000);
        let t2a = StaticTemplate::T2A.template();
        let amd = bitmap(&t2a, 0x8000_0008, 0, Register::Ebx);
        assert_eq!((amd.filter, amd.value), (0x001c_0205, 0x001c_0004));
        assert_eq!(bitmap(&t2a, 0x8000_0001, 0, Register::Ecx).filter, 0x2000_01c4);
        assert_eq!(t2.cpuid_modifiers.len(), 6, "leaves 1, 7, 0xd.0, 0xd.1, 0x8000_0001, 0x8000_0008");
        assert_eq!(t2.cpuid_modifiers[1].flags, 1, "leaf 7 has a significant index");
    }
}
