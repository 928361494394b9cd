#include "acpi.h"

u64 acpi_rsdp(void) {
	u64 given = 0;
	if (boot_zero_page) given = *(volatile u64 *)((u64)boot_zero_page + 0x70);
	else if (boot_start_info && *(volatile u32 *)boot_start_info == PVH_MAGIC)
		given = *(volatile u64 *)((u64)boot_start_info + 32);
	if (given) return given;
	/* Not handed over (Firecracker leaves rsdp_paddr 0): the BIOS area, 16-byte aligned. */
	for (u64 at = 0xe0000; at < 0x100000; at += 16)
		if (*(volatile u64 *)at == 0x2052545020445352ULL) /* "RSD PTR " */
			return at;
	return 0;
}

u64 acpi_table(u64 rsdp, const char *sig) {
	if (!rsdp) return 0;
	u64 xsdt = *(volatile u64 *)(rsdp + 24);
	u32 n = (*(volatile u32 *)(xsdt + 4) - 36) / 8;
	for (u32 i = 0; i < n; i++) {
		const char *t = (const char *)*(volatile u64 *)(xsdt + 36 + 8 * i);
		if (t[0] == sig[0] && t[1] == sig[1] && t[2] == sig[2] && t[3] == sig[3]) return (u64)t;
	}
	return 0;
}

u32 madt_cpus(u64 madt) {
	u32 cpus = 0, len = *(volatile u32 *)(madt + 4);
	for (u32 at = 44; at + 2 <= len; at += *(volatile u8 *)(madt + at + 1)) {
		u8 type = *(volatile u8 *)(madt + at), size = *(volatile u8 *)(madt + at + 1);
		if (size < 2) break;
		if (type == 0 && (*(volatile u32 *)(madt + at + 4) & 1)) cpus++;
	}
	return cpus;
}
