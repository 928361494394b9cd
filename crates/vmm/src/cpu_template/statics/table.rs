//! How a static template is written down: its rows in the custom schema's own terms.

use crate::cpu_template::schema::Register;

/// A CPUID row: leaf, subleaf, KVM flags, register, bitmap.
pub type CpuidRow = (u32, u32, u32, Register, &'static str);

/// A static template: its CPUID rows and its MSR rows (address, 64-bit bitmap).
pub struct Table {
    pub cpuid: &'static [CpuidRow],
    pub msrs: &'static [(u32, &'static str)],
}
