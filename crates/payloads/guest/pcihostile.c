/*
 * Hostile config traffic: random values written and read at every offset with every size
 * on every present function (and on missing ones), by port I/O and by ECAM, plus garbage
 * to the 0xCF8 latch. Then the read-only identity of every function must be unchanged and
 * the host bridge must still enumerate. Param 0 = seed.
 */
#include "runtime.h"
#include "pci.h"

/* Read-only header bytes: IDs, revision, class, header type, subsystem, capability
 * pointer, and the capability list itself. */
static const u8 ro_regs[] = {0x00, 0x01, 0x02, 0x03, 0x08, 0x09, 0x0a, 0x0b, 0x0e, 0x2c, 0x2d, 0x2e, 0x2f, 0x34, 0x40, 0x41, 0x42};

static u32 identity(int method, u32 fn, u8 out[sizeof(ro_regs)]) {
	for (u32 i = 0; i < sizeof(ro_regs); i++) out[i] = (u8)pci_read(method, fn, ro_regs[i], 1);
	return pci_read(method, fn, 0, 4);
}

int main(void) {
	u64 seed = param(0, 0xbadc0de) | 1;
	u32 fns[8], n;
	u8 before[8][sizeof(ro_regs)], after[sizeof(ro_regs)];
	enter_user();
	n = pci_scan(PCI_PIO, fns, 8);
	for (u32 i = 0; i < n; i++) identity(PCI_PIO, fns[i], before[i]);

	u64 accesses = 0;
	u32 targets[10];
	for (u32 i = 0; i < n; i++) targets[i] = fns[i];
	targets[n] = 31 << 3; /* a missing function */
	for (int method = PCI_PIO; method <= PCI_ECAM; method++) {
		u32 limit = method == PCI_PIO ? 256 : 4096;
		for (u32 t = 0; t <= n; t++)
			for (u32 reg = 0; reg < limit; reg++)
				for (u32 size = 1; size <= 4; size <<= 1) {
					if (reg % size) continue;
					pci_write(method, targets[t], reg, size, (u32)rand64(&seed));
					(void)pci_read(method, targets[t], reg, size);
					accesses += 2;
				}
	}
	for (u32 i = 0; i < 64; i++) port_write((u16)(0xcf8 + (i & 3)), 1u << (i % 3), (u32)rand64(&seed));

	int failed = 0;
	for (int method = PCI_PIO; method <= PCI_ECAM; method++)
		for (u32 i = 0; i < n; i++) {
			identity(method, fns[i], after);
			for (u32 k = 0; k < sizeof(ro_regs); k++)
				if (after[k] != before[i][k]) {
					print("pcihostile: FAIL: 00:%02x.%u byte %x changed %x -> %x\n", fns[i] >> 3, fns[i] & 7,
					      ro_regs[k], before[i][k], after[k]);
					failed = 1;
				}
		}
	u32 again[8];
	u32 m = pci_scan(PCI_ECAM, again, 8);
	u32 bridge_class = pci_read(PCI_PIO, 0, 8, 4) >> 8;
	if (m != n || bridge_class != 0x060000) {
		print("pcihostile: FAIL: rescan found %u functions (had %u), host bridge class %x\n", m, n, bridge_class);
		failed = 1;
	}
	print("pcihostile: %lu config accesses on %u functions; identity %s, host bridge enumerates\n", accesses, n,
	      failed ? "CHANGED" : "intact");
	return failed;
}
