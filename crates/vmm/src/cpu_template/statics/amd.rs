//! Firecracker's AMD template, T2A (its static_cpu_templates/t2a.rs, v1.16.1): an AMD host
//! made to look like the T2 family's CPU, so a guest can move between Intel and AMD hosts.
//! It hides what the T2 family hides, and on the AMD side SVM, SSE4A, MisAlignSse,
//! PREFETCHW, MONITORX, MmxExt, FFXSR, 1-GiB pages, CLZERO and WBNOINVD; it sets
//! RstrFpErrPtrs, IbrsPreferred, IbrsSameMode and EferLmsleUnsupported (leaf 0x8000_0008
//! EBX bits 2, 18, 19, 20), as Milan reports them.

use super::table::Table;
use crate::cpu_template::schema::Register::{Eax, Ebx, Ecx, Edx};

pub const T2A: Table = Table {
    cpuid: &[
        (0x1, 0x0, 0, Eax, "0bxxxx_0000_0000_0011_xx00_0110_1111_0010"),
        (0x1, 0x0, 0, Ecx, "0bxxxx_xxxx_xxxx_x0xx_00xx_00x0_0000_00xx"),
        (0x1, 0x0, 0, Edx, "0b000x_0xxx_x00x_x0xx_xxx1_xxxx_1xxx_xxxx"),
        (0x7, 0x0, 1, Ebx, "0b0000_0000_000x_0000_00x0_0x1x_xxx0_x0xx"),
        (0x7, 0x0, 1, Ecx, "0bx0xx_xxxx_x0xx_xxx0_x0x0_0000_x0x0_000x"),
        (0x7, 0x0, 1, Edx, "0bxxxx_xxxx_xxxx_xxxx_xxxx_xxx0_xxx0_00xx"),
        (0xd, 0x0, 1, Eax, "0bxxxx_xxxx_xxxx_xxxx_xxxx_xx0x_0000_0xxx"),
        (0xd, 0x1, 1, Eax, "0bxxxx_xxxx_xxxx_xxxx_xxxx_xxxx_xxxx_000x"),
        (0x8000_0001, 0x0, 0, Ecx, "0bxx0x_xxxx_xxxx_xxxx_xxxx_xxx0_00xx_x0xx"),
        (0x8000_0001, 0x0, 0, Edx, "0bxxxx_x00x_x0xx_xxxx_xxxx_xxxx_xxxx_xxxx"),
        (0x8000_0008, 0x0, 0, Ebx, "0bxxxx_xxxx_xxx1_11xx_xxxx_xx0x_xxxx_x1x0"),
    ],
    msrs: &[],
};
