/*
 * PCI scan lab guest. Each step (announced on the lab control port; the VMM picks the
 * method and, for ECAM, whether the window is trapped or mapped) enumerates bus 0, copies
 * every function's config space (256 bytes by port I/O, 4 KiB by ECAM), sizes every BAR,
 * then times a run of dword config reads. At the end all steps must have seen the same
 * functions, bytes and BAR sizes.
 * Params: 0 = timed reads per step (default 100000), 2 = steps (default: PIO then ECAM).
 * Results: 0 read cycles, 1 scan cycles, 2 reads, 3 functions; after the last step,
 * 8 = bit i set when step i matched step 0.
 */
#include "runtime.h"
#include "pci.h"

#define MAX_FN 8
#define MAX_STEPS 4

static volatile u64 *const shared = (volatile u64 *)SHARED_PAGE_GPA;
static u32 found[MAX_STEPS][MAX_FN], nfound[MAX_STEPS], bar_size[MAX_STEPS][MAX_FN][6];
static u8 snap[MAX_STEPS][MAX_FN][4096];
static u32 step_method[MAX_STEPS];

/* Enumerate and size, as an OS does at boot: this part is timed. */
static void scan_and_size(u32 s, int method) {
	nfound[s] = pci_scan(method, found[s], MAX_FN);
	for (u32 i = 0; i < nfound[s]; i++) pci_size_bars(method, found[s][i], bar_size[s][i]);
}

/* Copy every function's config space for the comparison (untimed). */
static void snapshot(u32 s, int method) {
	u32 len = method == PCI_PIO ? 256 : 4096;
	for (u32 i = 0; i < nfound[s]; i++)
		for (u32 reg = 0; reg < len; reg += 4) {
			u32 v = pci_read(method, found[s][i], reg, 4);
			for (u32 b = 0; b < 4; b++) snap[s][i][reg + b] = (u8)(v >> (8 * b));
		}
}

static int same_as_first(u32 s) {
	if (nfound[s] != nfound[0]) return 0;
	/* ECAM steps compare all 4 KiB with each other, and the first 256 bytes with PIO. */
	u32 ref = 0;
	for (u32 r = 0; r < s; r++)
		if (step_method[r] == PCI_ECAM) { ref = r; break; }
	for (u32 i = 0; i < nfound[s]; i++) {
		if (found[s][i] != found[0][i]) return 0;
		for (u32 b = 0; b < 6; b++)
			if (bar_size[s][i][b] != bar_size[0][i][b]) return 0;
		for (u32 k = 0; k < 256; k++)
			if (snap[s][i][k] != snap[0][i][k]) return 0;
		if (step_method[s] == PCI_ECAM && step_method[ref] == PCI_ECAM)
			for (u32 k = 0; k < 4096; k++)
				if (snap[s][i][k] != snap[ref][i][k]) return 0;
	}
	return 1;
}

int main(void) {
	u64 reads = param(0, 100000), steps = param(2, 2);
	if (steps > MAX_STEPS) steps = MAX_STEPS;
	enter_user();
	u32 identical = 0;
	for (u32 s = 0; s < steps; s++) {
		lab_op(LAB_OP_BEGIN, s);
		int method = (int)shared[LAB_SPEC_SLOT];
		if (method != PCI_PIO && method != PCI_ECAM) method = s == 0 ? PCI_PIO : PCI_ECAM; /* no lab */
		step_method[s] = (u32)method;
		u64 t0 = rdtsc();
		scan_and_size(s, method);
		u64 scan = rdtsc() - t0;
		snapshot(s, method);
		lab_op(LAB_OP_MARK, s);
		u64 t1 = rdtsc();
		u32 n = nfound[s] ? nfound[s] : 1, sink = 0;
		for (u64 i = 0; i < reads; i++) sink += pci_read(method, found[s][i % n], (u32)(i % 64) * 4, 4);
		u64 t2 = rdtsc();
		set_result(0, t2 - t1);
		set_result(1, scan);
		set_result(2, reads);
		set_result(3, nfound[s]);
		set_result(4, sink);
		lab_op(LAB_OP_END, s);
		if (same_as_first(s)) identical |= 1u << s;
		print("pciscan: step %u (%s): %u functions, scan+size %lu cycles, %lu reads %lu cycles, %s\n", s,
		      method == PCI_PIO ? "pio" : "ecam", nfound[s], scan, reads, t2 - t1,
		      identical & (1u << s) ? "identical" : "DIFFERENT");
	}
	for (u32 i = 0; i < nfound[0]; i++)
		print("pciscan: 00:%02x.%u %04x:%04x class %06x bars %x %x %x %x %x %x bar0 at %x\n", found[0][i] >> 3,
		      found[0][i] & 7, snap[0][i][0] | snap[0][i][1] << 8, snap[0][i][2] | snap[0][i][3] << 8,
		      snap[0][i][9] | snap[0][i][10] << 8 | snap[0][i][11] << 16, bar_size[0][i][0], bar_size[0][i][1],
		      bar_size[0][i][2], bar_size[0][i][3], bar_size[0][i][4], bar_size[0][i][5],
		      (snap[0][i][16] | snap[0][i][17] << 8 | snap[0][i][18] << 16 | (u32)snap[0][i][19] << 24) & ~0xfu);
	set_result(8, identical);
	return identical == (1u << steps) - 1 ? 0 : 1;
}
