/* Finding ACPI tables from what the boot protocol handed over. */
#pragma once
#include "runtime.h"

/* The RSDP's address from the PVH start info or the Linux zero page; 0 if none. */
u64 acpi_rsdp(void);
/* The table with signature `sig` listed in the XSDT, or 0. */
u64 acpi_table(u64 rsdp, const char *sig);
/* Enabled local APICs in a MADT: the vCPUs the platform has. */
u32 madt_cpus(u64 madt);
