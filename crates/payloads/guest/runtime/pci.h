/* PCI config space access for payloads: mechanism #1 (0xCF8/0xCFC, first 256 bytes) or
 * ECAM (the MMIO window, all 4 KiB), any size at any offset inside a dword. */
#pragma once
#include "runtime.h"

enum pci_method { PCI_PIO = 1, PCI_ECAM = 2 };

/* Bus 0's ECAM window: from the ACPI MCFG table where there is one (another VMM puts it
 * elsewhere), exitless's own address otherwise. Set by the runtime before main. */
extern u64 pci_ecam_base;

static inline u32 pci_cf8_address(u32 fn, u32 reg) { return 0x80000000u | (fn << 8) | (reg & 0xfc); }

/* fn is the bus-0 function index: device << 3 | function. */
static inline u32 pci_read(int method, u32 fn, u32 reg, u32 size) {
	if (method == PCI_PIO) {
		outl(0xcf8, pci_cf8_address(fn, reg));
		return port_read((u16)(0xcfc + (reg & 3)), size);
	}
	return (u32)mmio_read(pci_ecam_base + fn * 4096 + reg, size);
}

static inline void pci_write(int method, u32 fn, u32 reg, u32 size, u32 value) {
	if (method == PCI_PIO) {
		outl(0xcf8, pci_cf8_address(fn, reg));
		port_write((u16)(0xcfc + (reg & 3)), size, value);
		return;
	}
	mmio_write(pci_ecam_base + fn * 4096 + reg, size, value);
}

/* Bus 0's functions, as a standard scan finds them (function 0 first, the others only on
 * multi-function devices). Returns how many went into found[]. */
static inline u32 pci_scan(int method, u32 *found, u32 max) {
	u32 n = 0;
	for (u32 dev = 0; dev < 32; dev++)
		for (u32 f = 0; f < 8; f++) {
			u32 fn = dev << 3 | f;
			if ((pci_read(method, fn, 0, 4) & 0xffff) == 0xffff) {
				if (f == 0) break;
				continue;
			}
			if (n < max) found[n++] = fn;
			if (f == 0 && !(pci_read(method, fn, 0x0c, 4) & 0x00800000)) break;
		}
	return n;
}

/* Sizes every BAR of fn the way an OS does (decode off, write all-ones, read back,
 * restore); sizes[i] is 0 for an unimplemented BAR. */
static inline void pci_size_bars(int method, u32 fn, u32 sizes[6]) {
	u32 command = pci_read(method, fn, 4, 2);
	pci_write(method, fn, 4, 2, command & ~3u);
	for (u32 bar = 0; bar < 6; bar++) {
		u32 reg = 0x10 + 4 * bar, orig = pci_read(method, fn, reg, 4);
		pci_write(method, fn, reg, 4, 0xffffffff);
		u32 mask = pci_read(method, fn, reg, 4);
		pci_write(method, fn, reg, 4, orig);
		mask &= (mask & 1) ? ~3u : ~15u;
		sizes[bar] = mask ? ~mask + 1 : 0;
	}
	pci_write(method, fn, 4, 2, command);
}
