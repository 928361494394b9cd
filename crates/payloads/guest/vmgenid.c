/*
 * Reads the VMGenID device's generation id: finds `Name (ADDR, Package (2) {low, high})`
 * in the DSDT (Firecracker's VGEN device, as Linux's vmgenid driver reads it), prints the
 * 16 bytes at that address, then watches them at CPL3 and prints each new generation
 * with the PIC pair's request register (IRR, bit n: an edge seen on line n and not yet
 * taken: interrupts stay off), so a snapshot restored into a new VMM shows its new id
 * and that the GED's lines were raised. With each, the VMClock page (the VCLK device's
 * QWord memory descriptor): its magic, disruption marker and VM generation counter.
 * Ends with 0 after `params[0]` new generations (default 0: print the id and exit), 1 if
 * the DSDT has no ADDR package.
 * Results: 0 = generations seen after the first, 1 = the id's address.
 */
#include "runtime.h"
#include "acpi.h"

/* An AML integer at `p` (ZeroOp, OneOp, OnesOp, Byte/Word/DWord/QWordPrefix); its size in *len. */
static u64 aml_int(const volatile u8 *p, u32 *len) {
	u32 n = p[0] == 0x0a ? 1 : p[0] == 0x0b ? 2 : p[0] == 0x0c ? 4 : p[0] == 0x0e ? 8 : 0;
	u64 v = 0;
	if (n == 0) {
		*len = 1;
		return p[0] == 0x01 ? 1 : p[0] == 0xff ? ~0ULL : 0;
	}
	for (u32 i = 0; i < n; i++) v |= (u64)p[1 + i] << (8 * i);
	*len = 1 + n;
	return v;
}

/* The address in the DSDT's ADDR package of two integers, or 0. */
static u64 vgen_addr(void) {
	u64 fadt = acpi_table(acpi_rsdp(), "FACP");
	if (!fadt) return 0;
	u64 dsdt = *(volatile u64 *)(fadt + 140);
	if (!dsdt) dsdt = *(volatile u32 *)(fadt + 40);
	u32 len = *(volatile u32 *)(dsdt + 4);
	const volatile u8 *t = (const volatile u8 *)dsdt;
	for (u32 at = 36; at + 16 <= len; at++) {
		if (t[at] != 'A' || t[at + 1] != 'D' || t[at + 2] != 'D' || t[at + 3] != 'R' || t[at + 4] != 0x12) continue;
		u32 p = at + 5 + 1 + (t[at + 5] >> 6); /* past PkgLength */
		if (t[p] != 2) continue;
		u32 l1, l2;
		u64 low = aml_int(t + p + 1, &l1);
		u64 high = aml_int(t + p + 1 + l1, &l2);
		return (low & 0xffffffffULL) | (high << 32);
	}
	return 0;
}

/* The VMClock page: the first QWord memory descriptor (0x8a, length 43) after the name
 * _SB_VCLK; 0 if none. */
static u64 vclk_addr(void) {
	u64 fadt = acpi_table(acpi_rsdp(), "FACP");
	if (!fadt) return 0;
	u64 dsdt = *(volatile u64 *)(fadt + 140);
	if (!dsdt) dsdt = *(volatile u32 *)(fadt + 40);
	u32 len = *(volatile u32 *)(dsdt + 4), at = 36;
	const volatile u8 *t = (const volatile u8 *)dsdt;
	static const char name[] = "_SB_VCLK";
	for (; at + 8 <= len; at++) {
		u32 i = 0;
		while (i < 8 && t[at + i] == (u8)name[i]) i++;
		if (i == 8) break;
	}
	for (; at + 22 <= len; at++)
		if (t[at] == 0x8a && t[at + 1] == 43 && t[at + 2] == 0) return *(const volatile u64 *)(t + at + 14);
	return 0;
}

static void show_clock(u64 clock) {
	if (!clock) {
		print("vmclock: none\n");
		return;
	}
	const volatile u8 *c = (const volatile u8 *)clock;
	print("vmclock: magic %x seq %u marker %lu gen %lu\n", *(const volatile u32 *)c, *(const volatile u32 *)(c + 12),
	      *(const volatile u64 *)(c + 16), *(const volatile u64 *)(c + 104));
}

static void show(const char *what, const volatile u8 *id, u32 irr) {
	print("vmgenid: %s ", what);
	for (u32 i = 0; i < 16; i++) print("%02x", id[i]);
	print(" irr %x\n", irr);
}

static u32 pic_irr(void) { return inb(0x20) | (u32)inb(0xa0) << 8; }

/* The IRR once VMGenID's and VMClock's lines are both seen, or after a bound: KVM injects
 * an irqfd's edge from a worker of its own, which on a loaded host runs after this guest
 * has already read the new id (written before the vCPUs run). */
static u32 pic_irr_settled(void) {
	u32 irr = pic_irr();
	for (u32 i = 0; i < 1000000 && (irr & (irr - 1)) == 0; i++) irr = pic_irr();
	return irr;
}

int main(void) {
	u64 want = param(0, 0), seen = 0;
	enter_user();
	u64 addr = vgen_addr();
	set_result(1, addr);
	if (!addr) {
		print("vmgenid: no ADDR package in the DSDT\n");
		return 1;
	}
	const volatile u8 *id = (const volatile u8 *)addr;
	u8 last[16];
	for (u32 i = 0; i < 16; i++) last[i] = id[i];
	u64 clock = vclk_addr();
	print("vmgenid: at %lx, vmclock at %lx\n", addr, clock);
	show_clock(clock);
	show("id", last, pic_irr());
	while (seen < want) {
		int changed = 0;
		for (u32 i = 0; i < 16; i++) changed |= id[i] != last[i];
		if (!changed) continue;
		for (u32 i = 0; i < 16; i++) last[i] = id[i];
		seen++;
		set_result(0, seen);
		show_clock(clock);
		show("new", last, pic_irr_settled());
	}
	return 0;
}
