/* Checks what a kernel would read from the VMM at boot: the PVH start info or the Linux zero
 * page (whichever entry brought us here), its e820 map against the RAM size the test gave,
 * the command line, the initrd's bytes, and the ACPI tables (checksums, one MADT local APIC
 * per vCPU, MCFG at the ECAM window). Exits 0 only if every check holds.
 * Params: 0 RAM bytes, 1 vCPUs, 2 initrd size (0: none), 3 initrd byte sum. */
#include "acpi.h"

static int failures;

static void check(int ok, const char *what) {
	if (!ok) {
		failures++;
		print("bootcheck: FAILED: %s\n", what);
	}
}

static u32 rd32(u64 a) { return *(volatile u32 *)a; }
static u64 rd64(u64 a) { return *(volatile u64 *)a; }

static int sum_ok(u64 at, u32 len) {
	u8 s = 0;
	for (u32 i = 0; i < len; i++) s += *(volatile u8 *)(at + i);
	return s == 0;
}

static int sig(u64 table, const char *s) {
	const char *t = (const char *)table;
	return t[0] == s[0] && t[1] == s[1] && t[2] == s[2] && t[3] == s[3];
}

/* Walks RSDP -> XSDT -> tables; checks checksums, the MADT and MCFG. */
static void check_acpi(u64 rsdp, u64 vcpus) {
	check(rsdp != 0, "an RSDP address is given");
	if (!rsdp) return;
	check(rd64(rsdp) == 0x2052545020445352ULL, "RSDP signature");
	check(sum_ok(rsdp, 20) && sum_ok(rsdp, 36), "RSDP checksums");
	u64 xsdt = rd64(rsdp + 24);
	check(sig(xsdt, "XSDT") && sum_ok(xsdt, rd32(xsdt + 4)), "XSDT signature and checksum");
	u32 n = (rd32(xsdt + 4) - 36) / 8;
	int seen_facp = 0, seen_apic = 0, seen_mcfg = 0;
	print("bootcheck: acpi:");
	for (u32 i = 0; i < n; i++) {
		u64 t = rd64(xsdt + 36 + 8 * i);
		print(" %c%c%c%c", ((char *)t)[0], ((char *)t)[1], ((char *)t)[2], ((char *)t)[3]);
		check(sum_ok(t, rd32(t + 4)), "table checksum");
		if (sig(t, "FACP")) {
			seen_facp = 1;
			u64 dsdt = rd64(t + 140);
			check(sig(dsdt, "DSDT") && sum_ok(dsdt, rd32(dsdt + 4)), "DSDT signature and checksum");
		} else if (sig(t, "APIC")) {
			seen_apic = 1;
			u64 cpus = madt_cpus(t);
			print("(%lu cpus)", cpus);
			check(cpus == vcpus, "one enabled MADT local APIC per vCPU");
		} else if (sig(t, "MCFG")) {
			seen_mcfg = 1;
			check(rd64(t + 44) == ECAM_GPA, "MCFG base is the ECAM window");
		}
	}
	print("\n");
	check(seen_facp && seen_apic && seen_mcfg, "FACP, APIC and MCFG present");
}

/* RAM in an e820-style map (entries of addr, size, type at a given stride). */
static void check_map(u64 map, u32 entries, u32 stride, u64 mem) {
	u64 ram = 0;
	int ecam_reserved = 0;
	for (u32 i = 0; i < entries; i++) {
		u64 e = map + (u64)i * stride;
		u64 addr = rd64(e), size = rd64(e + 8);
		u32 type = rd32(e + 16);
		print("bootcheck: e820 %lx-%lx type %u\n", addr, addr + size - 1, type);
		if (type == 1) ram += size;
		if (type == 2 && addr == ECAM_GPA) ecam_reserved = 1;
	}
	/* All RAM but the BIOS area between 0x9fc00 and 1 MiB is reported. */
	check(ram == mem - (0x100000 - 0x9fc00), "e820 RAM adds up to --mem");
	check(ecam_reserved, "the ECAM window is reserved");
}

static void check_initrd(u64 addr, u64 size) {
	u64 want_size = param(2, 0), want_sum = param(3, 0);
	check(size == want_size, "initrd size");
	if (!size || size != want_size) return;
	u64 sum = 0;
	for (u64 i = 0; i < size; i++) sum += *(volatile u8 *)(addr + i);
	check(sum == want_sum, "initrd bytes");
	print("bootcheck: initrd %lu bytes at %lx\n", size, addr);
}

int main(void) {
	u64 mem = param(0, 128ULL << 20), vcpus = param(1, 1);
	const char *cmdline = 0;
	if (boot_zero_page) {
		u64 zp = (u64)boot_zero_page;
		print("bootcheck: protocol linux (zero page at %lx)\n", zp);
		check(*(u8 *)(zp + 0x210) == 0xff, "type_of_loader");
		cmdline = (const char *)(u64)rd32(zp + 0x228);
		check_map(zp + 0x2d0, *(u8 *)(zp + 0x1e8), 20, mem);
		check_initrd(rd32(zp + 0x218), rd32(zp + 0x21c));
		check_acpi(rd64(zp + 0x70), vcpus);
	} else if (boot_start_info && rd32((u64)boot_start_info) == 0x336ec578) {
		u64 si = (u64)boot_start_info;
		print("bootcheck: protocol pvh (start info at %lx)\n", si);
		cmdline = (const char *)rd64(si + 24);
		check_map(rd64(si + 40), rd32(si + 48), 24, mem);
		u32 modules = rd32(si + 12);
		u64 mod = rd64(si + 16);
		check(modules == (param(2, 0) ? 1u : 0u), "one module per initrd");
		check_initrd(modules ? rd64(mod) : 0, modules ? rd64(mod + 8) : 0);
		check_acpi(rd64(si + 32), vcpus);
	} else {
		check(0, "a zero page or PVH start info");
	}
	print("bootcheck: cmdline [%s]\n", cmdline ? cmdline : "");
	if (failures) {
		print("bootcheck: %d checks failed\n", failures);
		return 1;
	}
	print("bootcheck: all checks passed\n");
	return 0;
}
